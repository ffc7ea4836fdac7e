"""Preflight: will a run fit and start (the gate over the pure checks, and the probe pod)."""
