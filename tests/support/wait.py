"""Polling until something holds, for tests that watch a cluster or a run from outside."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    cond: Callable[[], Any], timeout: float = 20.0, what: str = "condition", interval: float = 0.1
) -> Any:
    """The first truthy value of `cond()`, polled every `interval` s; AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")
