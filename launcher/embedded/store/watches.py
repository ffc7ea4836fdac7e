"""Watches and subscribers of the embedded store: `Watch` (one watch stream, read by the HTTP
layer and by in-process readers) and `WatchFanout`, the part of `Store` (`launcher/embedded/store/store.py`)
that opens watches, replays the history, sends bookmarks and runs the subscriber dispatcher. It
works on the store's tables, lock and history, which `Store.__init__` sets up."""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from launcher.embedded.store.selectors import Matcher, combine, field_matcher, label_matcher
from launcher.embedded.store.stored import ADDED, BOOKMARK, DELETED, MODIFIED, Change, Rec, dumps
from launcher.embedded.types.errors import bad_request, expired
from launcher.embedded.types.resources import Resource

log = logging.getLogger("launcher.embedded.store.store")

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
        store: WatchFanout,
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
            raw = ev.rec.raw if ev.etype == DELETED else _with_rv(ev.prev, ev.rv)  # type: ignore[arg-type]
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


class WatchFanout:
    """The watch half of `Store`: watch(), subscribe(), flush(), compact() and their internals."""

    def watch(
        self,
        res: Resource,
        namespace: str | None = None,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        bookmarks: bool = False,
        bookmark_interval: float | None = None,
        initial_events_end: bool = False,
    ) -> Watch:
        """Without a resourceVersion (or with "0") the watch starts with an ADDED event for each
        object that exists now (then, with `initial_events_end`, a BOOKMARK annotated
        `k8s.io/initial-events-end`); with one, it replays every change after it, or raises 410
        Expired when the history no longer reaches back that far."""
        matcher = combine(label_matcher(label_selector), field_matcher(res, field_selector))
        interval = self.bookmark_interval if bookmark_interval is None else bookmark_interval
        with self._lock:
            w = Watch(self, res, namespace, matcher, bookmarks, interval, self.watch_queue)
            if resource_version in (None, "", "0"):
                for rec in self._select(res, namespace, matcher):
                    w._push((ADDED, rec.raw), replay=True)
                if initial_events_end:  # the watch-list protocol (sendInitialEvents=true)
                    meta = {
                        "resourceVersion": str(self._rv),
                        "annotations": {"k8s.io/initial-events-end": "true"},
                    }
                    body = {"kind": res.kind, "apiVersion": res.api_version, "metadata": meta}
                    w._push((BOOKMARK, dumps(body)), replay=True)
            else:
                for ev in self._history_since(_parse_rv(resource_version)):
                    if ev.plural == res.plural:
                        w._offer(ev, replay=True)
            self._watchers[res.plural].add(w)
        return w

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """fn(event_type, res, obj) for every change committed from now on, in commit order, on the
        store's dispatcher thread (never under the lock; obj is the subscriber's own copy)."""
        with self._lock:
            self._subscribers = [*self._subscribers, fn]
            if self._dispatcher is None:
                self._dispatcher = threading.Thread(
                    target=self._dispatch_loop, name="store-dispatch", daemon=True
                )
                self._dispatcher.start()

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers = [s for s in self._subscribers if s is not fn]

        return unsubscribe

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until subscribers have seen every change committed before the call (tests)."""
        if threading.current_thread() is self._dispatcher:
            return True
        with self._lock:
            target = self._enqueued
        with self._progress:
            return self._progress.wait_for(lambda: self._delivered >= target, timeout)

    def compact(self) -> None:
        """Drop the watch history: a watch from any older resourceVersion now gets 410 Gone."""
        with self._lock:
            self._history.clear()
            self._floor = self._rv

    def _history_since(self, rv: int) -> Iterator[Change]:
        if rv < self._floor:
            raise expired(f"too old resource version: {rv} ({self._floor + 1})")
        if not self._history:
            return iter(())
        return itertools.islice(self._history, max(0, rv + 1 - self._history[0].rv), None)

    def _bookmark(self, w: Watch) -> tuple[str, str] | None:
        """A BOOKMARK at the current resourceVersion, when nothing is queued for `w` (so no event
        at or before that version is still on its way to the reader)."""
        with self._lock, w._cond:
            if w._items or w._closed:
                return None
            body = {
                "kind": w.res.kind,
                "apiVersion": w.res.api_version,
                "metadata": {"resourceVersion": str(self._rv)},
            }
            return BOOKMARK, dumps(body)

    def _drop_watch(self, w: Watch) -> None:
        with self._lock:
            self._watchers[w.res.plural].discard(w)

    def _dispatch_loop(self) -> None:
        while (item := self._dispatch.get()) is not None:
            etype, res, raw = item
            for fn in self._subscribers:
                try:
                    fn(etype, res, json.loads(raw))
                except Exception:
                    log.exception("store subscriber %r failed on %s %s", fn, etype, res.plural)
            with self._progress:
                self._delivered += 1
                self._progress.notify_all()


def _parse_rv(value: str) -> int:
    try:
        rv = int(value)
    except (TypeError, ValueError):
        raise bad_request(f'invalid resource version "{value}"') from None
    if rv < 0:
        raise bad_request(f'invalid resource version "{value}"')
    return rv
