"""A clock that stands still until the test steps it (k8s.io/utils/clock/testing.FakeClock).

It serves both shapes the code takes a clock in: `monotonic()` / `wait(cond, timeout)` for the
embedded controllers' work queues (launcher.embedded.controllers.clock.Clock) and `monotonic()` / `sleep(s)`
for the trainer's SIGTERM watchdog. A waiter wakes once `step()` has moved the time past its
deadline; `wait_for_waiter()` is how a test knows the other thread has come round to wait again
(HasWaiters upstream), so nothing here waits on wall time except as a safety net.
"""

from __future__ import annotations

import math
import threading


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._lock = threading.Condition()
        self._waiters: list[tuple[float, threading.Condition | None]] = []  # (deadline, the cond it waits on)

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    def step(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
            due = [w for w in self._waiters if w[0] <= self._now]
            self._waiters = [w for w in self._waiters if w[0] > self._now]
            self._lock.notify_all()  # sleep() waiters
        for _, cond in due:
            if cond is not None:
                with cond:
                    cond.notify_all()

    def wait(self, cond: threading.Condition, timeout: float | None) -> None:
        """The caller holds `cond`; returns when notified (by its owner, or by `step` past the
        deadline), as `cond.wait` would. The caller re-checks what it waits for."""
        with self._lock:
            entry = (math.inf if timeout is None else self._now + timeout, cond)
            self._waiters.append(entry)
            self._lock.notify_all()
        cond.wait(30)  # a safety net: a test that forgets to step still ends
        with self._lock:
            if entry in self._waiters:
                self._waiters.remove(entry)

    def sleep(self, seconds: float) -> None:
        with self._lock:
            entry = (self._now + seconds, None)
            self._waiters.append(entry)
            self._lock.notify_all()
            if not self._lock.wait_for(lambda: self._now >= entry[0], timeout=30):
                raise AssertionError("fake clock: slept 30 s of wall time and nobody stepped the clock")

    def has_waiter(self) -> bool:
        """Whether some thread waits on this clock for a time still ahead."""
        with self._lock:
            return any(d > self._now for d, _ in self._waiters)

    def wait_for_waiter(self, timeout: float = 10.0) -> None:
        """Block until some thread waits on this clock for a time still ahead."""
        with self._lock:
            if not self._lock.wait_for(lambda: any(d > self._now for d, _ in self._waiters), timeout):
                raise AssertionError(f"fake clock: nothing waited on it within {timeout:g} s")
