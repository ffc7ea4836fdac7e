"""Capacity, pure: node pools, quota, and the checks preflight runs (over core/podfit)."""
