"""Watches and subscribers of the embedded store: `WatchFanout`, the part of `Store`
(`launcher/embedded/store/store.py`) that opens watches (`Watch`, launcher/embedded/store/watch.py),
replays the history, sends bookmarks and runs the subscriber dispatcher. It works on the store's
tables, lock and history (launcher/embedded/store/tables.py), which `Store.__init__` sets up."""

from __future__ import annotations

import itertools
import json
import logging
import threading
from collections.abc import Callable, Iterator

from launcher.embedded.store.selectors import combine, field_matcher, label_matcher
from launcher.embedded.store.stored import ADDED, BOOKMARK, Change, dumps
from launcher.embedded.store.tables import Tables
from launcher.embedded.store.watch import Subscriber, Watch
from launcher.embedded.types.errors import bad_request, expired
from launcher.embedded.types.resources import Resource

log = logging.getLogger("launcher.embedded.store.store")


class WatchFanout(Tables):
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
