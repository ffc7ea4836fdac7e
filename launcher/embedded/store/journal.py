"""Persistence of the store to a directory: a snapshot plus an append-only journal.

Every committed write appends one JSON line to `journal.jsonl` with a single unbuffered `write`, so
a hard kill (SIGKILL) loses nothing the store acknowledged; a line cut short by the kill is ignored
on load. Loading reads `snapshot.jsonl`, replays the journal over it, and then compacts: a new
snapshot is written next to the old one and renamed over it, and only then is the journal emptied
(a kill in between replays journal lines the snapshot already holds, which is harmless because each
line carries its resourceVersion and older ones are skipped).

Line shapes:
  snapshot:  {"rv": N} first, then {"r": plural, "o": object} per object
  journal:   {"rv": N, "r": plural, "o": object}   (create/update)
             {"rv": N, "r": plural, "d": [namespace, name]}   (removal)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SNAPSHOT = "snapshot.jsonl"
JOURNAL = "journal.jsonl"

Key = tuple[str, str, str]  # plural, namespace ("" when cluster-scoped), name


def _key(plural: str, obj: dict[str, Any]) -> Key:
    meta = obj["metadata"]
    return plural, meta.get("namespace", ""), meta["name"]


class Journal:
    def __init__(self, state_dir: Path, compact_bytes: int = 256 << 20) -> None:
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = None
        self._written = 0
        self.compact_bytes = compact_bytes

    # ---- load ---------------------------------------------------------------------------------

    def load(self) -> tuple[int, dict[Key, dict[str, Any]]]:
        """The last resourceVersion and every object, as persisted."""
        rv, objects = self._read_snapshot()
        for entry in _lines(self.dir / JOURNAL):
            entry_rv = entry.get("rv", 0)
            if entry_rv <= rv:
                continue
            rv = entry_rv
            if "o" in entry:
                objects[_key(entry["r"], entry["o"])] = entry["o"]
            elif "d" in entry:
                objects.pop((entry["r"], entry["d"][0], entry["d"][1]), None)
        return rv, objects

    def _read_snapshot(self) -> tuple[int, dict[Key, dict[str, Any]]]:
        rv, objects = 0, {}
        for entry in _lines(self.dir / SNAPSHOT):
            if "o" in entry:
                objects[_key(entry["r"], entry["o"])] = entry["o"]
            elif "rv" in entry:
                rv = entry["rv"]
        return rv, objects

    # ---- write --------------------------------------------------------------------------------

    def snapshot(self, rv: int, raws: Iterable[tuple[str, str]]) -> None:
        """Write a snapshot of (plural, raw JSON) pairs at `rv` and empty the journal."""
        tmp = self.dir / (SNAPSHOT + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps({"rv": rv}) + "\n")
            for plural, raw in raws:
                f.write(f'{{"r":"{plural}","o":{raw}}}\n')
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.dir / SNAPSHOT)
        self.close()
        self._fd = os.open(self.dir / JOURNAL, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        self._written = 0

    def put(self, rv: int, plural: str, raw: str) -> None:
        self._append(f'{{"rv":{rv},"r":"{plural}","o":{raw}}}\n')

    def remove(self, rv: int, plural: str, namespace: str, name: str) -> None:
        self._append(json.dumps({"rv": rv, "r": plural, "d": [namespace, name]}) + "\n")

    def wants_compaction(self) -> bool:
        return self._written > self.compact_bytes

    def _append(self, line: str) -> None:
        if self._fd is None:
            self._fd = os.open(self.dir / JOURNAL, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        data = memoryview(line.encode())
        while data:  # one write for a regular file in practice; loop for the rare short write
            data = data[os.write(self._fd, data) :]
        self._written += len(line)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _lines(path: Path) -> Iterable[dict[str, Any]]:
    """Parsed lines of a JSON-lines file; a torn last line (hard kill mid-write) is skipped."""
    if not path.exists():
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.endswith("\n"):
                return
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue
