"""The adapters: one kind of I/O each (the Kubernetes client, its caches, the run directory, the preset
files, the connection). They build on the core only."""
