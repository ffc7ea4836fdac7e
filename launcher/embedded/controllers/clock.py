"""The time the embedded controllers' work queues see (`runtime.ControllerLoop`), passed in so that a
test can hold it still and step it: a batching window is then asserted exactly, without sleeping.
Like k8s.io/utils/clock (RealClock / testing.FakeClock), which client-go's delaying queue takes."""

from __future__ import annotations

import threading
import time


class Clock:
    """Monotonic seconds, and a condition wait bounded in those seconds."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wait(self, cond: threading.Condition, timeout: float | None) -> None:
        """`cond.wait(timeout)`: the caller holds `cond` and re-checks what it waits for."""
        cond.wait(timeout)


REAL = Clock()
