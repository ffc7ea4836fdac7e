"""RFC 3339 timestamps as the API server writes them (metav1.Time: whole seconds, UTC, "Z"), for the
controller's signals (launcher/core/signals/observation.py) and the embedded cluster (launcher/embedded/types/objects.py,
store.py, discovery.py). A leaf: it imports nothing of the project, so either side may use it.
"""

from __future__ import annotations

import datetime as dt

_LAYOUT = "%Y-%m-%dT%H:%M:%SZ"


def stamp(t: float | dt.datetime | None = None) -> str:
    """`t` (epoch seconds or an aware datetime; now when None) as metav1.Time writes it."""
    if t is None:
        t = dt.datetime.now(dt.UTC)
    elif not isinstance(t, dt.datetime):
        t = dt.datetime.fromtimestamp(t, dt.UTC)
    return t.astimezone(dt.UTC).strftime(_LAYOUT)


def parse(value: str | None) -> dt.datetime | None:
    """An RFC 3339 time (also metav1.MicroTime's fractions, or an offset), or None for none.
    ValueError for text that is not one."""
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def seconds(value: str | None) -> float | None:
    """`parse` as epoch seconds."""
    parsed = parse(value)
    return None if parsed is None else parsed.timestamp()
