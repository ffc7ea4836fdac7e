"""How fast this machine runs Python right now, printed beside wall-clock figures.

A shared VM's speed drifts by the hour (docs/measurements.md): a wall-clock goal read without this
figure says as much about the hour as about the code."""

from __future__ import annotations

import time


def loop_s(n: int = 3_000_000, best_of: int = 3) -> float:
    """Seconds one core takes for a fixed pure-Python loop of `n` additions (the best of
    `best_of` tries)."""
    best = float("inf")
    for _ in range(best_of):
        t, total = time.perf_counter(), 0
        for i in range(n):
            total += i
        best = min(best, time.perf_counter() - t)
    return best
