"""Store: the objects of the embedded Kubernetes API, in memory, with the semantics of etcd + the
generic registry of a real API server (see docs/embedded.md for the contract).

Used by the HTTP layer (`apiserver.py`, `rest.py`, `streams.py`), by the in-process controllers of
the cluster half (`cluster.py` wires them) and by tests. The class is composed of one part per
concern: create/update in `writes.py`, deletion and garbage collection in `deletion.py`, watches and
subscribers in `watches.py`, persistence in `persistence.py`; reads, the commit path and the
indexes are here.

Design notes (why it looks like this):
- One `RLock` guards everything; every write is a short critical section that ends in `_commit`,
  which bumps the single global resourceVersion, records the event in a bounded history (watch
  replay), appends it to the journal (persistence), and hands it to watchers (bounded queues, so a
  stalled reader loses its watch instead of slowing writers) and to the subscriber queue.
- Each stored object keeps its JSON text (`Rec.raw`). Reads return `json.loads(raw)`, a private
  copy made by C code, and the HTTP layer writes `raw` as is: a list of 3,000 pods costs a join.
- Subscribers (in-process controllers) are called on one dispatcher thread, in commit order, never
  under the lock: a controller that writes from its callback cannot deadlock the store.
"""

from __future__ import annotations

import base64
import binascii
import builtins  # `list` in the class body below is Store.list
import json
import logging
import queue
import threading
from collections import deque
from pathlib import Path
from typing import Any

from launcher.embedded.admission import decoding, defaults
from launcher.embedded.store.deletion import Deletion
from launcher.embedded.store.journal import Journal
from launcher.embedded.store.patches import apply_patch
from launcher.embedded.store.persistence import Persistence
from launcher.embedded.store.selectors import (
    FieldSelector,
    LabelSelector,
    Matcher,
    combine,
    field_matcher,
    field_value,
    label_matcher,
)
from launcher.embedded.store.stored import DELETED, Change, Rec, dumps
from launcher.embedded.store.tables import Validator
from launcher.embedded.store.watch import Subscriber, Watch
from launcher.embedded.store.watches import WatchFanout
from launcher.embedded.store.writes import Writes
from launcher.embedded.types.errors import (
    ApiError,
    bad_request,
    conflict,
    not_found,
)
from launcher.embedded.types.resources import RESOURCES, Resource

__all__ = ["RESOURCES", "ApiError", "Resource", "Store", "Watch"]

log = logging.getLogger(__name__)

_SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
# The field each resource is indexed by, as kube-apiserver's watch cache indexes pods by node
# (pkg/registry/core/pod/strategy.go, Indexers): a `spec.nodeName=X` list (a node's lifecycle, PodGC,
# a kubelet) reads that node's pods, not every pod of the cluster.
FIELD_INDEXES = {"pods": "spec.nodeName"}


class Store(Writes, Deletion, WatchFanout, Persistence):
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
        # The ServiceAccount admission plugin's token volume on created pods: outside mode's.
        self.service_account_tokens = False
        self._rv = 0
        self._objs: dict[str, dict[str, dict[str, Rec]]] = {p: {} for p in RESOURCES}
        self._uids: dict[str, tuple[Resource, str, str]] = {}
        # plural -> (label key, value) -> keys (namespace, name): answers `k=v` selectors directly
        self._labels: dict[str, dict[tuple[str, str], set[tuple[str, str]]]] = {p: {} for p in RESOURCES}
        # plural -> value of its FIELD_INDEXES field -> keys: answers `path=value` field selectors
        self._fields: dict[str, dict[str, set[tuple[str, str]]]] = {p: {} for p in FIELD_INDEXES}
        self._dependents: dict[str, set[tuple[Resource, str, str]]] = {}
        self._history: deque[Change] = deque(maxlen=history)
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
    ) -> tuple[builtins.list[str], str, str | None, int | None]:
        """JSON texts of the matching objects in key order, the list resourceVersion, the continue
        token for the next page (None at the end) and how many items remain after this page."""
        labels, fields = label_matcher(label_selector), field_matcher(res, field_selector)
        matcher = combine(labels, fields)
        start = _decode_continue(continue_) if continue_ else None
        with self._lock:
            recs = self._select(res, namespace, matcher, start, self._candidates(res, labels, fields))
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
    ) -> builtins.list[Rec]:
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

    def _candidates(
        self, res: Resource, labels: LabelSelector | None, fields: FieldSelector | None = None
    ) -> set[tuple[str, str]] | None:
        """Keys holding every `k=v` label and indexed `path=value` field of the selectors, from
        the indexes; None without any."""
        index = self._labels[res.plural]
        sets = [index.get(eq, set()) for eq in labels.equalities] if labels is not None else []
        indexed = FIELD_INDEXES.get(res.plural)
        for path, value in fields.equalities if fields is not None else ():
            if path == indexed and value:
                sets.append(self._fields[res.plural].get(value, set()))
        if not sets:
            return None
        sets.sort(key=len)
        return set(sets[0]).intersection(*sets[1:])

    # ---- public API: writes -----------------------------------------------------------------------

    def add_validator(self, res: Resource, fn: Validator, *, status: bool = False) -> None:
        """Admission for `res`: fn(old or None, new) on create and on main-resource update/patch,
        or with `status` on status writes instead; it may default fields of `new` and raises
        ApiError to refuse."""
        with self._lock:
            self._validators.setdefault((res.plural, status), []).append(fn)

    def create(self, res: Resource, obj: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        obj = json.loads(dumps(obj))
        decoding.check(res, obj, decoding.CREATE)
        with self._lock:
            rec = self._create(res, obj, namespace)
        return json.loads(rec.raw)

    def update(self, res: Resource, obj: dict[str, Any], subresource: str | None = None) -> dict[str, Any]:
        obj = json.loads(dumps(obj))
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

    def _lookup(self, res: Resource, namespace: str | None, name: str) -> Rec:
        ns = (namespace or "default") if res.namespaced else ""
        rec = self._objs[res.plural].get(ns, {}).get(name)
        if rec is None:
            raise not_found(res.qualified, name)
        return rec

    def _find(self, res: Resource, ns: str, name: str) -> Rec | None:
        return self._objs[res.plural].get(ns, {}).get(name)

    # ---- internals: commit ------------------------------------------------------------------------

    def _commit(self, res: Resource, etype: str, obj: dict[str, Any], prev: Rec | None) -> Rec:
        """The one place a change happens: new resourceVersion, table, indexes, history, journal,
        watchers, subscribers."""
        self._rv += 1
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self._rv)
        rec = Rec(obj, dumps(obj))
        ns, name = meta.get("namespace", ""), meta["name"]
        bucket = self._objs[res.plural].setdefault(ns, {})
        if etype == DELETED:
            bucket.pop(name, None)
            if not bucket:
                del self._objs[res.plural][ns]
        else:
            bucket[name] = rec
        self._index(res, ns, name, prev.obj if prev else None, None if etype == DELETED else obj)
        ev = Change(self._rv, res.plural, etype, rec, prev)
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
        if res.plural in FIELD_INDEXES:
            self._index_field(res.plural, (ns, name), old, new)
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

    def _index_field(
        self, plural: str, key: tuple[str, str], old: dict[str, Any] | None, new: dict[str, Any] | None
    ) -> None:
        path, index = FIELD_INDEXES[plural], self._fields[plural]
        before = field_value(old, path) if old is not None else ""
        after = field_value(new, path) if new is not None else ""
        if before == after:
            return
        if before and (keys := index.get(before)) is not None:
            keys.discard(key)
            if not keys:
                del index[before]
        if after:
            index.setdefault(after, set()).add(key)


# ---- helpers ----------------------------------------------------------------------------------------


def _check_preconditions(res: Resource, obj: dict[str, Any], pre: dict[str, str]) -> None:
    meta = obj["metadata"]
    for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
        if pre.get(field) and pre[field] != meta[field]:
            raise conflict(
                res.qualified,
                meta["name"],
                f"Precondition failed: {label} in precondition: {pre[field]}, {label} in object meta: {meta[field]}",
            )


def _encode_continue(rv: str, ns: str, name: str) -> str:
    return base64.urlsafe_b64encode(dumps({"rv": rv, "start": [ns, name]}).encode()).decode()


def _decode_continue(token: str) -> tuple[str, str]:
    try:
        start = json.loads(base64.urlsafe_b64decode(token.encode()))["start"]
        return str(start[0]), str(start[1])
    except (ValueError, KeyError, IndexError, TypeError, binascii.Error):
        raise bad_request("continue key is not valid") from None
