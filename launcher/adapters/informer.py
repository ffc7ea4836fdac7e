"""A cache of one kind, kept by its watch: list once, then apply each event in order.

What client-go's informers do, in the small: the reconcile loop reads the cache and never the API.
The watch resumes from the last resourceVersion it saw (an interrupted connection costs no list),
and only a 410 Gone (history compacted) or another API error makes it list again. Selectors are
the server's (label and field selectors), so unrelated objects never travel. `keep` projects
what is stored, as client-go's transforms do (launcher/adapters/projections.py: the fields the signals read;
of a pod of another workload only its node), and `index` keeps, as client-go's indexers do, the set of one key over the cached objects up to date
event by event (the nodes other workloads' pods are on): a pass reads it instead of walking 20,000
pods. `items()` is one tuple per change of the cache, so that a pass over unchanged caches gets the
very same objects (and core/signals/ can skip what it computed from them last time).

The python client's SharedInformer does not exist and its Watch deserializes every event into the
typed models (a millisecond per pod); events here stay plain dicts, as `kubectl get -o json` shows.
"""

from __future__ import annotations

import random
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from launcher.adapters.listwatch import ListWatch

# A watch the server ends after this long is resumed from its resourceVersion: each reconnect is
# one request, so few of them while idle. client-go's reflector also picks its timeout at random
# between its minWatchTimeout and twice that.
WATCH_TIMEOUT_S = (300, 600)
# Objects per LIST page (client-go's reflector: 500): a relist of 20,000 pods never sits in memory
# as one response.
LIST_PAGE = 500
# Departed objects kept for the next pass, at most (the oldest go first).
DEPARTED_MAX = 1000


@dataclass(frozen=True)
class Source:
    """What one cache holds: a kind (launcher.adapters.listwatch.ListWatch.list_raw names them) and its selectors."""

    kind: str
    label_selector: str | None = None
    field_selector: str | None = None
    keep: Callable[[dict], Any] | None = None  # what is cached of each object (all of it: None)
    index: Callable[[Any], str | None] | None = None  # of what `keep` made
    # Keep the last state of what is deleted until `take_departed()` (what client-go hands an
    # informer's OnDelete): an object may be updated and deleted between two passes.
    departed: bool = False

    @property
    def name(self) -> str:
        return "|".join(filter(None, [self.kind, self.label_selector, self.field_selector]))


def key(obj: dict) -> tuple[str, str]:
    meta = obj["metadata"]
    return sys.intern(meta.get("namespace") or ""), meta["name"]  # one "default" for 20,000 pods


@dataclass
class Cache:
    source: Source
    _items: dict[tuple[str, str], Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    resource_version: str | None = None
    synced: threading.Event = field(default_factory=threading.Event)
    lists: int = 0  # how many times it listed: 1 + one per 410 or API error
    _tuple: tuple[Any, ...] | None = None  # items() until the next change
    _counts: Counter = field(default_factory=Counter)  # index value -> cached objects with it
    _keys: frozenset[str] | None = None  # indexed() until the set of index values changes
    _departed: dict[tuple[str, str], Any] = field(default_factory=dict)

    def items(self) -> tuple[Any, ...]:
        with self._lock:
            if self._tuple is None:
                self._tuple = tuple(self._items.values())
            return self._tuple

    def take_departed(self) -> tuple[Any, ...]:
        """The last state of each object deleted since the last call (Source.departed)."""
        with self._lock:
            if not self._departed:
                return ()
            out, self._departed = tuple(self._departed.values()), {}
            return out

    def indexed(self) -> frozenset[str]:
        """The index values (Source.index) of the cached objects."""
        with self._lock:
            if self._keys is None:
                self._keys = frozenset(self._counts)
            return self._keys

    def get(self, namespace: str, name: str) -> Any:
        with self._lock:
            return self._items.get((namespace, name))

    def _value(self, obj: Any) -> str | None:
        return self.source.index(obj) if obj is not None and self.source.index else None

    def _count(self, value: str | None, by: int) -> None:
        if not value:
            return
        self._counts[value] += by
        if self._counts[value] <= 0:
            del self._counts[value]
            self._keys = None
        elif self._counts[value] == by:
            self._keys = None

    def replace(self, pages: Iterable[tuple[list[dict], str]]) -> None:
        keep = self.source.keep or (lambda o: o)
        fresh: dict[Any, Any] = {}
        resource_version = None
        for items, page_version in pages:
            fresh.update((key(o), keep(o)) for o in items)
            resource_version = page_version
        with self._lock:
            self._items, self.resource_version = fresh, resource_version
            self._tuple, self._keys, self._counts = None, None, Counter()
            for o in fresh.values():
                self._count(self._value(o), 1)
        self.lists += 1
        self.synced.set()

    def apply(self, etype: str, obj: dict) -> bool:
        """Apply one watch event; True when the cached set changed (not a bookmark)."""
        rv = obj["metadata"].get("resourceVersion")
        with self._lock:
            if rv:
                self.resource_version = rv
            if etype == "BOOKMARK":
                return False
            self._tuple = None
            was = self._value(self._items.get(key(obj)))
            if etype == "DELETED":
                self._items.pop(key(obj), None)
                if self.source.departed:
                    self._departed[key(obj)] = self.source.keep(obj) if self.source.keep else obj
                    if len(self._departed) > DEPARTED_MAX:  # nobody took them: no run is reconciled
                        self._departed.pop(next(iter(self._departed)))
                now = None
            else:
                kept = self._items[key(obj)] = self.source.keep(obj) if self.source.keep else obj
                now = self._value(kept)
            if now != was:
                self._count(was, -1)
                self._count(now, 1)
        return True

    def run(
        self,
        lists: ListWatch,
        wake: Callable[[str], None],
        stop: threading.Event,
        gate: Callable[[], object] = lambda: None,
    ) -> None:
        """List, then watch and apply, until `stop`; `wake(kind)` after every change. `gate()`
        returns when the next event may be applied (the controller holds events off while it
        decides).

        Errors wake with words (the health probe tells a synced watch by a bare-kind wake-up)."""
        kind, src = self.source.kind, self.source
        while not stop.is_set():
            try:
                if self.resource_version is None:
                    self.replace(lists.list_raw(kind, src.label_selector, src.field_selector, page=LIST_PAGE))
                    wake(kind)
                timeout = random.randint(*WATCH_TIMEOUT_S)
                since = self.resource_version or ""  # set by the list above
                for etype, obj in lists.watch_raw(
                    kind, since, timeout, src.label_selector, src.field_selector, stop
                ):
                    if etype == "ERROR":
                        self.resource_version = None  # 410 Gone: the history is compacted, relist
                        wake(f"{kind}: watch error {obj.get('code')}")
                        break
                    gate()
                    if self.apply(etype, obj):
                        wake(kind)
            except Exception as e:  # connection refused/reset while the API server restarts
                status = getattr(e, "status", None)
                if status:  # an API error answer (not a dropped connection): start over from a list
                    self.resource_version = None
                wake(f"{kind}: watch interrupted ({type(e).__name__}{f' {status}' if status else ''})")
                stop.wait(0.5)
