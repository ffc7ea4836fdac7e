"""Persistence of the embedded store: load the state directory's snapshot and journal, write a
snapshot, and reload (what an API server restart does). A part of `Store`
(`launcher/embedded/store/store.py`), called from its `__init__` and `_commit` and by
`ApiServer.restart()`; the journal itself is `launcher/embedded/store/journal.py`."""

from __future__ import annotations

from launcher.embedded.store.stored import Rec, dumps
from launcher.embedded.store.tables import Tables
from launcher.embedded.types.resources import RESOURCES


class Persistence(Tables):
    """The persistence half of `Store`: reload(), _load(), _snapshot()."""

    def reload(self) -> None:
        """Re-read the state directory (an API server restart): open watches end, history is gone."""
        with self._lock:
            for watchers in self._watchers.values():
                for w in watchers:
                    w._end()
                watchers.clear()
            if self._journal is not None:
                self._objs = {p: {} for p in RESOURCES}
                self._uids.clear()
                self._dependents.clear()
                self._labels = {p: {} for p in RESOURCES}
                self._fields = {p: {} for p in self._fields}
                self._load()
            self.compact()

    def _load(self) -> None:
        assert self._journal is not None
        rv, objects = self._journal.load()
        self._rv = rv
        for (plural, ns, name), obj in sorted(objects.items()):
            res = RESOURCES[plural]
            self._objs[plural].setdefault(ns, {})[name] = Rec(obj, dumps(obj))
            self._index(res, ns, name, None, obj)
        self._snapshot()
        self._history.clear()
        self._floor = self._rv

    def _snapshot(self) -> None:
        assert self._journal is not None
        raws = (
            (p, rec.raw) for p, buckets in self._objs.items() for b in buckets.values() for rec in b.values()
        )
        self._journal.snapshot(self._rv, raws)
