"""The kubelet of every fake node: a pod's environment, its processes (or a simulated run), and the
status it reports."""
