"""What every part of the embedded store shares: a stored object version (`Rec`), a committed
change (`Change`), the watch event types and the compact JSON encoder. Imported by
`launcher/embedded/store/store.py` and the parts of its `Store` (`writes.py`, `deletion.py`, `watches.py`,
`persistence.py`)."""

from __future__ import annotations

import json
from typing import Any

ADDED, MODIFIED, DELETED, BOOKMARK = "ADDED", "MODIFIED", "DELETED", "BOOKMARK"

dumps = json.JSONEncoder(separators=(",", ":")).encode


class Rec:
    """A stored object version: the dict (never handed out) and its JSON text."""

    __slots__ = ("obj", "raw")

    def __init__(self, obj: dict[str, Any], raw: str) -> None:
        self.obj = obj
        self.raw = raw


class Change:
    """One committed change: the watch history holds these, watchers are offered them."""

    __slots__ = ("etype", "plural", "prev", "rec", "rv")

    def __init__(self, rv: int, plural: str, etype: str, rec: Rec, prev: Rec | None) -> None:
        self.rv, self.plural, self.etype, self.rec, self.prev = rv, plural, etype, rec, prev
