"""The store: objects in memory with etcd's and the generic registry's semantics (writes, deletion,
watches, selectors, patches) and its persistence."""
