"""Capacity, pure: a pod's requests and tolerations, node pools, quota, and the checks preflight runs."""
