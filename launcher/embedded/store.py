"""Store: the objects of the embedded Kubernetes API, in memory, with the semantics of etcd + the
generic registry of a real API server (see docs/embedded.md for the contract).

Design notes (why it looks like this):
- One `RLock` guards everything; every write is a short critical section that ends in `_commit`,
  which bumps the single global resourceVersion, records the event in a bounded history (watch
  replay), appends it to the journal (persistence), and hands it to watchers (bounded queues, so a
  stalled reader loses its watch instead of slowing writers) and to the subscriber queue.
- Each stored object keeps its JSON text (`_Rec.raw`). Reads return `json.loads(raw)`, a private
  copy made by C code, and the HTTP layer writes `raw` as is: a list of 3,000 pods costs a join.
- Subscribers (in-process controllers) are called on one dispatcher thread, in commit order, never
  under the lock: a controller that writes from its callback cannot deadlock the store.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import logging
import queue
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from launcher.embedded import decoding, defaults, rules
from launcher.embedded.errors import (
    STALE,
    ApiError,
    already_exists,
    bad_request,
    conflict,
    expired,
    invalid,
    not_found,
)
from launcher.embedded.journal import Journal
from launcher.embedded.patches import apply_patch
from launcher.embedded.resources import RESOURCES, Resource
from launcher.embedded.selectors import LabelSelector, Matcher, combine, field_matcher, label_matcher

__all__ = ["RESOURCES", "ApiError", "Resource", "Store", "Watch"]

log = logging.getLogger(__name__)

ADDED, MODIFIED, DELETED, BOOKMARK = "ADDED", "MODIFIED", "DELETED", "BOOKMARK"
Validator = Callable[[dict[str, Any] | None, dict[str, Any]], None]
Subscriber = Callable[[str, Resource, dict[str, Any]], None]

_dumps = json.JSONEncoder(separators=(",", ":")).encode
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_TERMINAL = ("Succeeded", "Failed")


def now_rfc3339(t: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if t is None else t))


class _Rec:
    """A stored object version: the dict (never handed out) and its JSON text."""

    __slots__ = ("obj", "raw")

    def __init__(self, obj: dict[str, Any], raw: str) -> None:
        self.obj = obj
        self.raw = raw


class _Event:
    __slots__ = ("etype", "plural", "prev", "rec", "rv")

    def __init__(self, rv: int, plural: str, etype: str, rec: _Rec, prev: _Rec | None) -> None:
        self.rv, self.plural, self.etype, self.rec, self.prev = rv, plural, etype, rec, prev


def _with_rv(rec: _Rec, rv: int) -> str:
    obj = json.loads(rec.raw)
    obj["metadata"]["resourceVersion"] = str(rv)
    return _dumps(obj)


class Watch:
    """One watch: iterate `(type, object)`; `get()` is the raw form the HTTP layer streams.

    Ends when closed by the reader, by the store (reload), or when its queue overflows because the
    reader fell behind (the reader then re-watches from the last resourceVersion it saw).
    """

    def __init__(
        self,
        store: Store,
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

    def _passes(self, rec: _Rec | None) -> bool:
        if rec is None:
            return False
        if self._namespace is not None and rec.obj["metadata"].get("namespace") != self._namespace:
            return False
        return self._matcher is None or self._matcher(rec.obj)

    def _offer(self, ev: _Event, *, replay: bool = False) -> None:
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


class Store:
    """In-memory Kubernetes objects; see docs/embedded.md for the contract."""

    def __init__(
        self,
        state_dir: Path | None = None,
        history: int = 10_000,
        *,
        watch_queue: int = 50_000,
        bookmark_interval: float = 60.0,
    ) -> None:
        self._lock = threading.RLock()
        self.default_toleration_s = defaults.DEFAULT_TOLERATION_S  # the cluster may start it otherwise
        self._rv = 0
        self._objs: dict[str, dict[str, dict[str, _Rec]]] = {p: {} for p in RESOURCES}
        self._uids: dict[str, tuple[Resource, str, str]] = {}
        # plural -> (label key, value) -> keys (namespace, name): answers `k=v` selectors directly
        self._labels: dict[str, dict[tuple[str, str], set[tuple[str, str]]]] = {p: {} for p in RESOURCES}
        self._dependents: dict[str, set[tuple[Resource, str, str]]] = {}
        self._history: deque[_Event] = deque(maxlen=history)
        self._floor = 0  # events after this resourceVersion are all in the history
        self._watchers: dict[str, set[Watch]] = {p: set() for p in RESOURCES}
        self._validators: dict[tuple[str, bool], list[Validator]] = {}
        self._subscribers: list[Subscriber] = []
        self._dispatch: queue.SimpleQueue[tuple[str, Resource, str] | None] = queue.SimpleQueue()
        self._dispatcher: threading.Thread | None = None
        self._progress = threading.Condition()
        self._enqueued = self._delivered = 0
        self.watch_queue = watch_queue
        self.bookmark_interval = bookmark_interval
        self._journal = Journal(state_dir) if state_dir is not None else None
        if self._journal is not None:
            self._load()
        for ns in _SYSTEM_NAMESPACES:
            if ns not in self._objs["namespaces"].get("", {}):
                self.create(RESOURCES["namespaces"], {"metadata": {"name": ns}})

    # ---- public API: reads ------------------------------------------------------------------------

    @property
    def resource_version(self) -> str:
        return str(self._rv)

    def get(self, res: Resource, namespace: str | None, name: str) -> dict[str, Any]:
        with self._lock:
            return json.loads(self._lookup(res, namespace, name).raw)

    def list(
        self,
        res: Resource,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[dict[str, Any]], str]:
        raws, rv, _, _ = self.list_raw(res, namespace, label_selector, field_selector)
        return [json.loads(r) for r in raws], rv

    def list_raw(
        self,
        res: Resource,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_: str | None = None,
    ) -> tuple[list[str], str, str | None, int | None]:
        """JSON texts of the matching objects in key order, the list resourceVersion, the continue
        token for the next page (None at the end) and how many items remain after this page."""
        labels = label_matcher(label_selector)
        matcher = combine(labels, field_matcher(res, field_selector))
        start = _decode_continue(continue_) if continue_ else None
        with self._lock:
            recs = self._select(res, namespace, matcher, start, self._candidates(res, labels))
            rv = str(self._rv)
        if limit and len(recs) > limit:
            last = recs[limit - 1].obj["metadata"]
            token = _encode_continue(rv, last.get("namespace", ""), last["name"])
            return [r.raw for r in recs[:limit]], rv, token, len(recs) - limit
        return [r.raw for r in recs], rv, None, None

    def _select(
        self,
        res: Resource,
        namespace: str | None,
        matcher: Matcher | None,
        after: tuple[str, str] | None = None,
        candidates: set[tuple[str, str]] | None = None,
    ) -> list[_Rec]:
        """Matching objects in (namespace, name) order, after `after`, among `candidates` (keys
        from the label index) when given."""
        buckets = self._objs[res.plural]
        if candidates is not None:
            keys = [
                k for k in candidates if namespace is None or not res.namespaced or k[0] == (namespace or "")
            ]
        elif namespace is not None or not res.namespaced:
            keys = [(namespace or "", n) for n in buckets.get(namespace or "", ())]
        else:
            keys = [(ns, n) for ns, bucket in buckets.items() for n in bucket]
        if after is not None:
            keys = [k for k in keys if k > after]
        recs = ((k, buckets[k[0]][k[1]]) for k in keys)
        return [rec for _, rec in sorted(r for r in recs if matcher is None or matcher(r[1].obj))]

    def _candidates(self, res: Resource, labels: LabelSelector | None) -> set[tuple[str, str]] | None:
        """Keys holding every `k=v` label of the selector, from the index; None without any."""
        if labels is None or not labels.equalities:
            return None
        index = self._labels[res.plural]
        sets = sorted((index.get(eq, set()) for eq in labels.equalities), key=len)
        return set(sets[0]).intersection(*sets[1:])

    # ---- public API: writes -----------------------------------------------------------------------

    def add_validator(self, res: Resource, fn: Validator, *, status: bool = False) -> None:
        """Admission for `res`: fn(old or None, new) on create and on main-resource update/patch,
        or with `status` on status writes instead; it may default fields of `new` and raises
        ApiError to refuse."""
        with self._lock:
            self._validators.setdefault((res.plural, status), []).append(fn)

    def create(self, res: Resource, obj: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        obj = json.loads(_dumps(obj))
        decoding.check(res, obj, decoding.CREATE)
        with self._lock:
            rec = self._create(res, obj, namespace)
        return json.loads(rec.raw)

    def update(self, res: Resource, obj: dict[str, Any], subresource: str | None = None) -> dict[str, Any]:
        obj = json.loads(_dumps(obj))
        decoding.check(res, obj, decoding.UPDATE)
        meta = obj.get("metadata") or {}
        with self._lock:
            rec = self._lookup(res, meta.get("namespace"), meta.get("name", ""))
            return json.loads(self._update(res, rec, obj, subresource).raw)

    def patch(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        patch: Any,
        patch_type: str,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """patch_type: "merge" | "json" | "strategic". A patch that sets metadata.resourceVersion
        is a precondition (409 when stale), as on a real server."""
        if patch_type == "strategic" and res.custom:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: "
                "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            )
        with self._lock:
            rec = self._lookup(res, namespace, name)
            current = json.loads(rec.raw)
            patched = apply_patch(current, patch, patch_type)
            decoding.check(res, patched, decoding.PATCH, patch, patch_type)
            meta = patched.setdefault("metadata", {})
            if meta.get("name") != name or meta.get("namespace") != current["metadata"].get("namespace"):
                raise bad_request("metadata.name and metadata.namespace cannot be changed by a patch")
            if meta.get("resourceVersion") is None:
                meta["resourceVersion"] = rec.obj["metadata"]["resourceVersion"]
            return json.loads(self._update(res, rec, patched, subresource).raw)

    def delete(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        propagation: str = "Background",
        grace_period_seconds: int | None = None,
        preconditions: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Returns the object as deletion left it: gone (its last state) or, for a graceful pod
        deletion, finalizers or foreground propagation, still there with a deletionTimestamp."""
        if propagation not in ("Background", "Foreground", "Orphan"):
            raise bad_request(f'propagationPolicy "{propagation}" is not supported')
        with self._lock:
            rec = self._lookup(res, namespace, name)
            _check_preconditions(res, rec.obj, preconditions or {})
            return json.loads(self._delete(res, rec, propagation, grace_period_seconds).raw)

    # ---- watch and subscribe ----------------------------------------------------------------------

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
                    w._push((BOOKMARK, _dumps(body)), replay=True)
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
                self._load()
            self.compact()

    def close(self) -> None:
        with self._lock:
            if self._dispatcher is not None:
                self._dispatch.put(None)
            if self._journal is not None:
                self._journal.close()
            for watchers in self._watchers.values():
                for w in watchers:
                    w._end()

    # ---- internals: lookup ------------------------------------------------------------------------

    def _lookup(self, res: Resource, namespace: str | None, name: str) -> _Rec:
        ns = (namespace or "default") if res.namespaced else ""
        rec = self._objs[res.plural].get(ns, {}).get(name)
        if rec is None:
            raise not_found(res.qualified, name)
        return rec

    def _find(self, res: Resource, ns: str, name: str) -> _Rec | None:
        return self._objs[res.plural].get(ns, {}).get(name)

    # ---- internals: create / update ---------------------------------------------------------------

    def _create(self, res: Resource, obj: dict[str, Any], namespace: str | None) -> _Rec:
        _check_type(res, obj)
        meta = obj.setdefault("metadata", {})
        ns = self._create_namespace(res, meta, namespace)
        if meta.get("resourceVersion"):
            raise bad_request("resourceVersion should not be set on objects to be created")
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise invalid(
                    res.kind, "", [("metadata.name", "Required value: name or generateName is required")]
                )
            meta["name"] = self._generate_name(res, ns, meta["generateName"])
        if self._find(res, ns, meta["name"]) is not None:
            raise already_exists(res.qualified, meta["name"])
        for key in ("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"):
            meta.pop(key, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        meta["generation"] = 1
        defaults.on_create(res, obj, self.default_toleration_s)
        defaults.normalize(res, obj)
        self._admit(res, None, obj)
        rec = self._commit(res, ADDED, obj, None)
        refs = meta.get("ownerReferences") or []
        if refs and not any(r.get("uid") in self._uids for r in refs):
            # The garbage collector deletes an object whose owners are all gone: a controller that
            # acted on a stale read of an owner deleted meanwhile must not leave orphans behind.
            self._delete(res, rec, "Background", None)
        return rec

    def _create_namespace(self, res: Resource, meta: dict[str, Any], namespace: str | None) -> str:
        if not res.namespaced:
            meta.pop("namespace", None)
            return ""
        if namespace and meta.get("namespace") and meta["namespace"] != namespace:
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        ns = namespace or meta.get("namespace") or "default"
        meta["namespace"] = ns
        ns_rec = self._find(RESOURCES["namespaces"], "", ns)
        if ns_rec is None:
            raise not_found("namespaces", ns)
        if ns_rec.obj["metadata"].get("deletionTimestamp"):
            raise ApiError(
                403,
                "Forbidden",
                f'{res.qualified} "{meta.get("name") or meta.get("generateName", "")}" is forbidden: '
                f"unable to create new content in namespace {ns} because it is being terminated",
            )
        return ns

    def _generate_name(self, res: Resource, ns: str, prefix: str) -> str:
        while True:
            name = prefix + "".join(random.choices(_GENERATE_ALPHABET, k=5))
            if self._find(res, ns, name) is None:
                return name

    def _admit(
        self, res: Resource, old: dict[str, Any] | None, new: dict[str, Any], status: bool = False
    ) -> None:
        """Admission (the registered validators) and validation, on every write of `new` (already
        decoded, defaulted on create, and for status writes merged with the old object)."""
        for fn in self._validators.get((res.plural, status), ()):
            fn(old, new)
        rules.check(res, new)
        if old is not None and not status:
            rules.check_update(res, old, new)

    def _update(self, res: Resource, rec: _Rec, new: dict[str, Any], subresource: str | None) -> _Rec:
        old = rec.obj
        meta = new.setdefault("metadata", {})
        name = old["metadata"]["name"]
        if meta.get("resourceVersion") and meta["resourceVersion"] != old["metadata"]["resourceVersion"]:
            raise conflict(res.qualified, name, STALE)
        if meta.get("uid") and meta["uid"] != old["metadata"]["uid"]:
            raise conflict(
                res.qualified,
                name,
                f"Precondition failed: UID in precondition: {meta['uid']}, UID in object meta: {old['metadata']['uid']}",
            )
        if subresource == "status":
            merged = json.loads(rec.raw)
            if "status" in new:
                merged["status"] = new["status"]
            else:
                merged.pop("status", None)
            self._admit(res, old, merged, status=True)
        elif subresource is None:
            merged = self._merge_main(res, old, new)
        else:
            raise not_found(res.qualified, name)
        defaults.normalize(res, merged)
        merged["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if merged == old:
            return rec  # a no-op write commits nothing, as on a real server
        finalized = old["metadata"].get("finalizers") and not merged["metadata"].get("finalizers")
        # The last finalizer is gone: removed, unless a graceful deletion is still running (a pod
        # the kubelet has not finished terminating), as upstream's shouldDeleteDuringUpdate.
        grace = merged["metadata"].get("deletionGracePeriodSeconds")
        if finalized and merged["metadata"].get("deletionTimestamp") and not grace:
            return self._remove(res, rec, merged)
        return self._commit(res, MODIFIED, merged, rec)

    def _merge_main(self, res: Resource, old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
        """A main-resource update: server-owned metadata kept, status kept when it has its own
        subresource, generation bumped when anything outside metadata and status changed."""
        _check_type(res, new)
        meta, old_meta = new["metadata"], old["metadata"]
        if res.namespaced and meta.get("namespace", old_meta["namespace"]) != old_meta["namespace"]:
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        for key in (
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ):
            if key in old_meta:
                meta[key] = old_meta[key]
            else:
                meta.pop(key, None)
        if res.has_status:
            if "status" in old:
                new["status"] = old["status"]
            else:
                new.pop("status", None)
        spec_changed = any(new.get(k) != old.get(k) for k in {*new, *old} - {"metadata", "status"})
        meta["generation"] = old_meta.get("generation", 1) + (1 if spec_changed else 0)
        self._admit(res, old, new)
        return new

    # ---- internals: delete and garbage collection -------------------------------------------------

    def _delete(self, res: Resource, rec: _Rec, propagation: str, grace: int | None) -> _Rec:
        obj = rec.obj
        meta = obj["metadata"]
        if res.plural == "pods":
            grace = _pod_grace(obj, grace)
            if (
                grace > 0
                and obj.get("spec", {}).get("nodeName")
                and obj.get("status", {}).get("phase") not in _TERMINAL
            ):
                return self._mark_deleting(res, rec, grace)
        if res.plural == "namespaces":
            return self._delete_namespace(rec)
        if propagation == "Orphan":
            self._orphan(meta["uid"])
        elif propagation == "Foreground" and self._blocking(meta["uid"]):
            rec = self._mark_deleting(res, rec, 0, "foregroundDeletion")
            for dep_res, ns, name in list(self._dependents.get(meta["uid"], ())):
                if (dep := self._find(dep_res, ns, name)) is not None:
                    self._delete(dep_res, dep, "Foreground", None)
            return self._find(res, meta.get("namespace", ""), meta["name"]) or rec
        if meta.get("finalizers"):
            return self._mark_deleting(res, rec, 0)
        return self._remove(res, rec)

    def _mark_deleting(self, res: Resource, rec: _Rec, grace: int, finalizer: str | None = None) -> _Rec:
        obj = json.loads(rec.raw)
        meta = obj["metadata"]
        if not meta.get("deletionTimestamp") or grace < meta.get("deletionGracePeriodSeconds", grace + 1):
            meta["deletionTimestamp"] = now_rfc3339(time.time() + grace)
            meta["deletionGracePeriodSeconds"] = grace
        if finalizer and finalizer not in meta.setdefault("finalizers", []):
            meta["finalizers"].append(finalizer)
        if obj == rec.obj:
            return rec
        return self._commit(res, MODIFIED, obj, rec)

    def _remove(self, res: Resource, rec: _Rec, content: dict[str, Any] | None = None) -> _Rec:
        """Take the object out; then collect its dependents and let owners waiting on it go."""
        obj = content if content is not None else json.loads(rec.raw)
        gone = self._commit(res, DELETED, obj, rec)
        meta = obj["metadata"]
        for dep_res, ns, name in list(self._dependents.pop(meta["uid"], ())):
            if (dep := self._find(dep_res, ns, name)) is not None:
                self._collect(dep_res, dep, meta["uid"])
        for ref in meta.get("ownerReferences") or []:
            self._release_owner(ref.get("uid"))
        if res.namespaced:
            self._release_namespace(meta["namespace"])
        return gone

    def _collect(self, res: Resource, rec: _Rec, owner_uid: str) -> None:
        """The garbage collector on a dependent whose owner is gone: deleted (in the background)
        unless another owner of it still exists, in which case only the dangling reference goes."""
        refs = rec.obj["metadata"].get("ownerReferences") or []
        if any(r.get("uid") != owner_uid and r.get("uid") in self._uids for r in refs):
            obj = json.loads(rec.raw)
            obj["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != owner_uid]
            self._commit(res, MODIFIED, obj, rec)
        else:
            self._delete(res, rec, "Background", None)

    def _orphan(self, owner_uid: str) -> None:
        for dep_res, ns, name in list(self._dependents.get(owner_uid, ())):
            if (dep := self._find(dep_res, ns, name)) is not None:
                obj = json.loads(dep.raw)
                refs = [r for r in obj["metadata"].get("ownerReferences") or [] if r.get("uid") != owner_uid]
                if refs:
                    obj["metadata"]["ownerReferences"] = refs
                else:
                    obj["metadata"].pop("ownerReferences", None)
                self._commit(dep_res, MODIFIED, obj, dep)

    def _blocking(self, owner_uid: str) -> bool:
        """Whether a dependent with blockOwnerDeletion still holds up a foreground deletion."""
        for dep_res, ns, name in self._dependents.get(owner_uid, ()):
            dep = self._find(dep_res, ns, name)
            refs = dep.obj["metadata"].get("ownerReferences") or [] if dep else []
            if any(r.get("uid") == owner_uid and r.get("blockOwnerDeletion") for r in refs):
                return True
        return False

    def _release_owner(self, owner_uid: str | None) -> None:
        where = self._uids.get(owner_uid or "")
        if where is None:
            return
        res, ns, name = where
        owner = self._find(res, ns, name)
        if owner is None or "foregroundDeletion" not in (owner.obj["metadata"].get("finalizers") or []):
            return
        if not self._blocking(owner_uid):  # type: ignore[arg-type]
            obj = json.loads(owner.raw)
            obj["metadata"]["finalizers"].remove("foregroundDeletion")
            if obj["metadata"]["finalizers"]:
                self._commit(res, MODIFIED, obj, owner)
            else:
                obj["metadata"].pop("finalizers")
                self._remove(res, owner, obj)

    def _delete_namespace(self, rec: _Rec) -> _Rec:
        name = rec.obj["metadata"]["name"]
        if name in ("default", "kube-system", "kube-public"):
            raise ApiError(
                403, "Forbidden", f'namespaces "{name}" is forbidden: this namespace may not be deleted'
            )
        ns_res = RESOURCES["namespaces"]
        obj = json.loads(rec.raw)
        if not obj["metadata"].get("deletionTimestamp"):
            obj["metadata"]["deletionTimestamp"] = now_rfc3339()
            obj["metadata"]["deletionGracePeriodSeconds"] = 0
            obj["status"] = {"phase": "Terminating"}
            rec = self._commit(ns_res, MODIFIED, obj, rec)
        for res in RESOURCES.values():
            for obj_name in list(self._objs[res.plural].get(name, {})):
                if (dep := self._find(res, name, obj_name)) is not None:
                    self._delete(res, dep, "Background", None)
        return self._release_namespace(name) or rec

    def _release_namespace(self, name: str) -> _Rec | None:
        """Remove a terminating namespace once nothing is left in it."""
        ns_res = RESOURCES["namespaces"]
        rec = self._find(ns_res, "", name)
        if rec is None or not rec.obj["metadata"].get("deletionTimestamp"):
            return None
        if any(self._objs[r.plural].get(name) for r in RESOURCES.values() if r.namespaced):
            return None
        return self._remove(ns_res, rec)

    # ---- internals: commit ------------------------------------------------------------------------

    def _commit(self, res: Resource, etype: str, obj: dict[str, Any], prev: _Rec | None) -> _Rec:
        """The one place a change happens: new resourceVersion, table, indexes, history, journal,
        watchers, subscribers."""
        self._rv += 1
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self._rv)
        rec = _Rec(obj, _dumps(obj))
        ns, name = meta.get("namespace", ""), meta["name"]
        bucket = self._objs[res.plural].setdefault(ns, {})
        if etype == DELETED:
            bucket.pop(name, None)
            if not bucket:
                del self._objs[res.plural][ns]
        else:
            bucket[name] = rec
        self._index(res, ns, name, prev.obj if prev else None, None if etype == DELETED else obj)
        ev = _Event(self._rv, res.plural, etype, rec, prev)
        self._history.append(ev)
        if len(self._history) == self._history.maxlen:  # full: the oldest event just fell off
            self._floor = self._history[0].rv - 1 if self._history else self._rv
        if self._journal is not None:
            if etype == DELETED:
                self._journal.remove(self._rv, res.plural, ns, name)
            else:
                self._journal.put(self._rv, res.plural, rec.raw)
            if self._journal.wants_compaction():
                self._snapshot()
        for w in self._watchers[res.plural]:
            w._offer(ev)
        if self._subscribers:
            self._enqueued += 1
            self._dispatch.put((etype, res, rec.raw))
        return rec

    def _index(
        self, res: Resource, ns: str, name: str, old: dict[str, Any] | None, new: dict[str, Any] | None
    ) -> None:
        key = (res, ns, name)
        if old is not None and new is None:
            self._uids.pop(old["metadata"]["uid"], None)
        if new is not None:
            self._uids[new["metadata"]["uid"]] = key
        self._index_labels(res.plural, (ns, name), old, new)
        old_owners = {r.get("uid") for r in (old or {}).get("metadata", {}).get("ownerReferences") or []}
        new_owners = {r.get("uid") for r in (new or {}).get("metadata", {}).get("ownerReferences") or []}
        for uid in old_owners - new_owners:
            deps = self._dependents.get(uid)
            if deps is not None:
                deps.discard(key)
                if not deps:
                    del self._dependents[uid]
        for uid in new_owners - old_owners:
            self._dependents.setdefault(uid, set()).add(key)

    def _index_labels(
        self, plural: str, key: tuple[str, str], old: dict[str, Any] | None, new: dict[str, Any] | None
    ) -> None:
        before = set(((old or {}).get("metadata", {}).get("labels") or {}).items())
        after = set(((new or {}).get("metadata", {}).get("labels") or {}).items())
        index = self._labels[plural]
        for pair in before - after:
            keys = index.get(pair)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del index[pair]
        for pair in after - before:
            index.setdefault(pair, set()).add(key)

    def _history_since(self, rv: int) -> Iterator[_Event]:
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
            return BOOKMARK, _dumps(body)

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

    # ---- internals: persistence -------------------------------------------------------------------

    def _load(self) -> None:
        assert self._journal is not None
        rv, objects = self._journal.load()
        self._rv = rv
        for (plural, ns, name), obj in sorted(objects.items()):
            res = RESOURCES[plural]
            self._objs[plural].setdefault(ns, {})[name] = _Rec(obj, _dumps(obj))
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


# ---- helpers ----------------------------------------------------------------------------------------


def _check_type(res: Resource, obj: dict[str, Any]) -> None:
    api_version, kind = obj.get("apiVersion") or res.api_version, obj.get("kind") or res.kind
    if (api_version, kind) != (res.api_version, res.kind):
        raise bad_request(
            f"the API version in the data ({api_version}) does not match the expected API version "
            f"({res.api_version})"
            if api_version != res.api_version
            else f"the kind in the data ({kind}) does not match the expected kind ({res.kind})"
        )
    obj["apiVersion"], obj["kind"] = res.api_version, res.kind


def _check_preconditions(res: Resource, obj: dict[str, Any], pre: dict[str, str]) -> None:
    meta = obj["metadata"]
    for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
        if pre.get(field) and pre[field] != meta[field]:
            raise conflict(
                res.qualified,
                meta["name"],
                f"Precondition failed: {label} in precondition: {pre[field]}, {label} in object meta: {meta[field]}",
            )


def _pod_grace(pod: dict[str, Any], grace: int | None) -> int:
    if grace is not None:
        return max(0, int(grace))
    spec_grace = pod.get("spec", {}).get("terminationGracePeriodSeconds")
    return 30 if spec_grace is None else int(spec_grace)


def _parse_rv(value: str) -> int:
    try:
        rv = int(value)
    except (TypeError, ValueError):
        raise bad_request(f'invalid resource version "{value}"') from None
    if rv < 0:
        raise bad_request(f'invalid resource version "{value}"')
    return rv


def _encode_continue(rv: str, ns: str, name: str) -> str:
    return base64.urlsafe_b64encode(_dumps({"rv": rv, "start": [ns, name]}).encode()).decode()


def _decode_continue(token: str) -> tuple[str, str]:
    try:
        start = json.loads(base64.urlsafe_b64decode(token.encode()))["start"]
        return str(start[0]), str(start[1])
    except (ValueError, KeyError, IndexError, TypeError, binascii.Error):
        raise bad_request("continue key is not valid") from None
