"""One watch stream of the embedded store (`Watch`), read by the HTTP layer and by in-process
readers, and what a subscriber is. `WatchFanout` (launcher/embedded/store/watches.py), the part of
`Store` that opens watches, feeds them under the store's lock."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from launcher.embedded.store.selectors import Matcher
from launcher.embedded.store.stored import ADDED, DELETED, MODIFIED, Change, Rec, dumps
from launcher.embedded.types.resources import Resource

log = logging.getLogger("launcher.embedded.store.store")


class WatchOwner(Protocol):
    """What a watch asks of the store that opened it (`WatchFanout`)."""

    def _bookmark(self, w: Watch) -> tuple[str, str] | None: ...
    def _drop_watch(self, w: Watch) -> None: ...


Subscriber = Callable[[str, Resource, dict[str, Any]], None]


def _with_rv(rec: Rec, rv: int) -> str:
    obj = json.loads(rec.raw)
    obj["metadata"]["resourceVersion"] = str(rv)
    return dumps(obj)


class Watch:
    """One watch: iterate `(type, object)`; `get()` is the raw form the HTTP layer streams.

    Ends when closed by the reader, by the store (reload), or when its queue overflows because the
    reader fell behind (the reader then re-watches from the last resourceVersion it saw).
    """

    def __init__(
        self,
        store: WatchOwner,
        res: Resource,
        namespace: str | None,
        matcher: Matcher | None,
        bookmarks: bool,
        bookmark_interval: float,
        maxsize: int,
    ) -> None:
        self.res = res
        self._store = store
        self._namespace = namespace
        self._matcher = matcher
        self._bookmarks = bookmarks
        self._bookmark_interval = bookmark_interval
        self._next_bookmark = time.monotonic() + bookmark_interval
        self._maxsize = maxsize
        self._items: deque[tuple[str, str]] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self.overflowed = False

    # ---- called by the store, under its lock ---------------------------------------------------

    def _passes(self, rec: Rec | None) -> bool:
        if rec is None:
            return False
        if self._namespace is not None and rec.obj["metadata"].get("namespace") != self._namespace:
            return False
        return self._matcher is None or self._matcher(rec.obj)

    def _offer(self, ev: Change, *, replay: bool = False) -> None:
        """Queue `ev` as this watch sees it: a change that moves an object into or out of the
        selected set is an ADDED or DELETED here, as in the API server's watch cache."""
        now = ev.etype != DELETED and self._passes(ev.rec)
        before = ev.etype != ADDED and self._passes(ev.prev)
        if now:
            self._push((ADDED if not before else MODIFIED, ev.rec.raw), replay)
        elif before:
            # `before` holds only of an event with a previous version
            raw = ev.rec.raw if ev.etype == DELETED or ev.prev is None else _with_rv(ev.prev, ev.rv)
            self._push((DELETED, raw), replay)

    def _push(self, item: tuple[str, str], replay: bool = False) -> None:
        with self._cond:
            if self._closed:
                return
            if not replay and len(self._items) >= self._maxsize:
                self._closed = self.overflowed = True
                log.warning("watch on %s fell %d events behind; closing it", self.res.plural, self._maxsize)
            else:
                self._items.append(item)
            self._cond.notify()

    # ---- reader side ---------------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> tuple[str, str] | None:
        """The next `(type, raw JSON object)`, or None after `timeout` seconds with nothing to say.
        Raises EOFError once the watch is closed and drained."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cond:
                if self._items:
                    return self._items.popleft()
                if self._closed:
                    raise EOFError
                now = time.monotonic()
                bookmark_due = self._bookmarks and now >= self._next_bookmark
                if not bookmark_due:
                    waits = [d - now for d in (deadline,) if d is not None]
                    if self._bookmarks:
                        waits.append(self._next_bookmark - now)
                    if waits and min(waits) <= 0:
                        return None
                    self._cond.wait(min(waits) if waits else None)
                    continue
            if (bookmark := self._store._bookmark(self)) is not None:
                self._next_bookmark = time.monotonic() + self._bookmark_interval
                return bookmark

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        while True:
            try:
                item = self.get()
            except EOFError:
                return
            if item is not None:
                yield item[0], json.loads(item[1])

    def close(self) -> None:
        self._store._drop_watch(self)
        self._end()

    def _end(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed
