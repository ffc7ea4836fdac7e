"""The controller runtime: a work queue per controller, fed by store subscriptions, drained by one
worker thread, with delayed requeues. Like controller-runtime, the queue holds keys, not events:
reconcile reads the current state, so coalesced or dropped events lose nothing.

Also the event recorder every component uses (core/v1 Events, aggregated like client-go's
EventCorrelator: a repeat of the same reason and message bumps `count` and `lastTimestamp`).
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from launcher.core import rfc3339
from launcher.embedded.controllers.clock import REAL, Clock
from launcher.embedded.types import objects

log = logging.getLogger("launcher.embedded")


@dataclass(frozen=True)
class Batched:
    """A key from `keys_for` to reconcile once within `seconds`, however often it comes meanwhile."""

    key: Hashable
    seconds: float


class ControllerLoop:
    """One in-process controller's work queue and worker loop (client-go's informer + workqueue);
    subclasses implement `keys_for(event, res, obj)` and `reconcile(key) -> requeue_after | None`."""

    name = "controller"

    def __init__(self, store: Any, events: Any = None, clock: Clock = REAL) -> None:
        self.store = store
        self.events = events if events is not None else store  # where to subscribe (store or Hub)
        self.clock = clock  # requeue delays and batching windows run on it
        self._cv = threading.Condition()
        self._queue: dict[Hashable, None] = {}  # insertion-ordered set
        self._delayed: list[tuple[float, int, Hashable]] = []
        self._batched: dict[Hashable, float] = {}  # key → when its batched sync is due
        self._seq = 0
        self._busy = False
        self._stop = False
        self._thread: threading.Thread | None = None
        self._unsubscribe: Any = None

    # -- wiring --------------------------------------------------------------------------------
    def start(self) -> None:
        self._stop = False
        self._unsubscribe = self.events.subscribe(self._on_event)
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        self.resync()

    def stop(self) -> None:
        if self._unsubscribe:
            self._unsubscribe()
            self._unsubscribe = None
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def resync(self) -> None:
        """Enqueue every object this controller owns (start, API server restart)."""

    def keys_for(self, event: str, res: Any, obj: Mapping[str, Any]) -> list[Hashable]:
        return []

    def reconcile(self, key: Hashable) -> float | None:
        raise NotImplementedError

    # -- queue ---------------------------------------------------------------------------------
    def _on_event(self, event: str, res: Any, obj: Mapping[str, Any]) -> None:
        try:
            keys = self.keys_for(event, res, obj)
        except Exception:  # a bad object must not break the writer that triggered the event
            log.exception("%s: mapping %s event", self.name, event)
            return
        for k in keys:
            if isinstance(k, Batched):
                self.enqueue(k.key, batch=k.seconds)
            else:
                self.enqueue(k)

    def enqueue(self, key: Hashable, after: float = 0.0, batch: float = 0.0) -> None:
        """Reconcile `key` now, `after` seconds from now, or — with `batch` — once within `batch`
        seconds however many times it is enqueued meanwhile (client-go's AddAfter)."""
        with self._cv:
            if batch > 0:
                if key in self._queue or key in self._batched:
                    return
                due = self.clock.monotonic() + batch
                self._batched[key] = due
                self._seq += 1
                heapq.heappush(self._delayed, (due, self._seq, key))
            elif after > 0:
                self._seq += 1
                heapq.heappush(self._delayed, (self.clock.monotonic() + after, self._seq, key))
            else:
                self._queue[key] = None
            self._cv.notify_all()

    def idle(self) -> bool:
        with self._cv:
            return not self._queue and not self._busy and not self._batched

    def _next(self) -> Hashable | None:
        with self._cv:
            while not self._stop:
                now = self.clock.monotonic()
                while self._delayed and self._delayed[0][0] <= now:
                    due, _, key = heapq.heappop(self._delayed)
                    if self._batched.get(key) == due:
                        del self._batched[key]
                    self._queue[key] = None
                if self._queue:
                    key = next(iter(self._queue))
                    del self._queue[key]
                    self._busy = True
                    return key
                timeout = self._delayed[0][0] - now if self._delayed else None
                self.clock.wait(self._cv, timeout)
            return None

    def _run(self) -> None:
        while True:
            key = self._next()
            if key is None:
                return
            try:
                after = self.reconcile(key)
            except Exception as e:
                # 409 Conflict and friends: the state moved under us; read it again shortly.
                if getattr(e, "code", None) not in (404, 409):
                    log.exception("%s: reconcile %s", self.name, key)
                after = 0.05
            finally:
                with self._cv:
                    self._busy = False
            if after is not None:
                self.enqueue(key, after)


class Hub:
    """One store subscription fanned out to every component of the cluster.

    The store hands each subscriber its own parsed copy of every change; with one subscriber for
    all components an event is parsed once, not once per component. The objects handed out are
    shared, so handlers treat them as read-only (as controllers treat informer cache objects).
    """

    def __init__(self, store: Any) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._handlers: list[Callable[[str, Any, dict[str, Any]], None]] = []
        self._unsub: Callable[[], None] | None = None

    def subscribe(self, fn: Callable[[str, Any, dict[str, Any]], None]) -> Callable[[], None]:
        with self._lock:
            self._handlers = [*self._handlers, fn]
            if self._unsub is None:
                self._unsub = self.store.subscribe(self._dispatch)

        def unsubscribe() -> None:
            with self._lock:
                self._handlers = [h for h in self._handlers if h is not fn]

        return unsubscribe

    def _dispatch(self, event: str, res: Any, obj: dict[str, Any]) -> None:
        for h in self._handlers:
            try:
                h(event, res, obj)
            except Exception:  # one component's bug must not starve the others of events
                log.exception("event handler %r", h)

    def close(self) -> None:
        with self._lock:
            if self._unsub is not None:
                self._unsub()
                self._unsub = None
            self._handlers = []


class EventRecorder:
    """Writes core/v1 Events to the store the way client-go's recorder does."""

    def __init__(self, store: Any, component: str, host: str | None = None) -> None:
        self.store = store
        self.component = component
        self.host = host
        self._lock = threading.Lock()
        self._seen: dict[tuple, str] = {}

    def event(
        self, obj: Mapping[str, Any], etype: str, reason: str, message: str, host: str | None = None
    ) -> None:
        from launcher.embedded.store.store import RESOURCES  # late: the store module is the API half's

        m = objects.meta(obj)
        ns = m.get("namespace") or "default"
        ref = {
            "apiVersion": obj.get("apiVersion"),
            "kind": obj.get("kind"),
            "name": m.get("name"),
            "namespace": m.get("namespace"),
            "uid": m.get("uid"),
            "resourceVersion": m.get("resourceVersion"),
        }
        if ref["namespace"] is None:
            del ref["namespace"]
        source: dict[str, Any] = {"component": self.component}
        if host or self.host:
            source["host"] = host or self.host
        key = (m.get("uid"), etype, reason, message, self.component)
        stamp = rfc3339.stamp()
        res = RESOURCES["events"]
        with self._lock:
            name = self._seen.get(key)
        if name:
            try:
                ev = self.store.get(res, ns, name)
                ev["count"] = int(ev.get("count") or 1) + 1
                ev["lastTimestamp"] = stamp
                self.store.update(res, ev)
                return
            except Exception:
                pass  # gone (deleted or the store reloaded): write a fresh one
        name = f"{m.get('name')}.{time.time_ns():x}"
        ev = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": ref,
            "reason": reason,
            "message": message,
            "type": etype,
            "source": source,
            "reportingComponent": self.component,
            "reportingInstance": source.get("host", ""),
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "eventTime": None,
        }
        try:
            self.store.create(res, ev, ns)
        except Exception:
            log.exception("event %s/%s", ns, reason)
            return
        with self._lock:
            if len(self._seen) > 50_000:
                self._seen.clear()
            self._seen[key] = name
