"""The HTTP API in front of the store: the server, REST routing, streams, discovery, request bodies,
eviction, and the kubeconfig and clients that reach it."""
