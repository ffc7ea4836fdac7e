"""Deletion and garbage collection in the embedded store: graceful pod deletion, finalizers,
foreground/background/orphan propagation through ownerReferences, namespace termination. A part
of `Store` (`launcher/embedded/store/store.py`), called from its `delete()` and writes; it works on the
store's tables and commits through `Store._commit`."""

from __future__ import annotations

import json
import time
from typing import Any

from launcher.core import rfc3339
from launcher.embedded.store.stored import DELETED, MODIFIED, Rec
from launcher.embedded.store.tables import Tables
from launcher.embedded.types.errors import ApiError
from launcher.embedded.types.resources import RESOURCES, Resource

_TERMINAL = ("Succeeded", "Failed")


class Deletion(Tables):
    """The deletion half of `Store`: what `delete()` and the garbage collector do."""

    def _delete(self, res: Resource, rec: Rec, propagation: str, grace: int | None) -> Rec:
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

    def _mark_deleting(self, res: Resource, rec: Rec, grace: int, finalizer: str | None = None) -> Rec:
        obj = json.loads(rec.raw)
        meta = obj["metadata"]
        if not meta.get("deletionTimestamp") or grace < meta.get("deletionGracePeriodSeconds", grace + 1):
            meta["deletionTimestamp"] = rfc3339.stamp(time.time() + grace)
            meta["deletionGracePeriodSeconds"] = grace
        if finalizer and finalizer not in meta.setdefault("finalizers", []):
            meta["finalizers"].append(finalizer)
        if obj == rec.obj:
            return rec
        return self._commit(res, MODIFIED, obj, rec)

    def _remove(self, res: Resource, rec: Rec, content: dict[str, Any] | None = None) -> Rec:
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

    def _collect(self, res: Resource, rec: Rec, owner_uid: str) -> None:
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
        if not self._blocking(owner_uid or ""):
            obj = json.loads(owner.raw)
            obj["metadata"]["finalizers"].remove("foregroundDeletion")
            if obj["metadata"]["finalizers"]:
                self._commit(res, MODIFIED, obj, owner)
            else:
                obj["metadata"].pop("finalizers")
                self._remove(res, owner, obj)

    def _delete_namespace(self, rec: Rec) -> Rec:
        name = rec.obj["metadata"]["name"]
        if name in ("default", "kube-system", "kube-public"):
            raise ApiError(
                403, "Forbidden", f'namespaces "{name}" is forbidden: this namespace may not be deleted'
            )
        ns_res = RESOURCES["namespaces"]
        obj = json.loads(rec.raw)
        if not obj["metadata"].get("deletionTimestamp"):
            obj["metadata"]["deletionTimestamp"] = rfc3339.stamp()
            obj["metadata"]["deletionGracePeriodSeconds"] = 0
            obj["status"] = {"phase": "Terminating"}
            rec = self._commit(ns_res, MODIFIED, obj, rec)
        for res in RESOURCES.values():
            for obj_name in list(self._objs[res.plural].get(name, {})):
                if (dep := self._find(res, name, obj_name)) is not None:
                    self._delete(res, dep, "Background", None)
        return self._release_namespace(name) or rec

    def _release_namespace(self, name: str) -> Rec | None:
        """Remove a terminating namespace once nothing is left in it."""
        ns_res = RESOURCES["namespaces"]
        rec = self._find(ns_res, "", name)
        if rec is None or not rec.obj["metadata"].get("deletionTimestamp"):
            return None
        if any(self._objs[r.plural].get(name) for r in RESOURCES.values() if r.namespaced):
            return None
        return self._remove(ns_res, rec)


def _pod_grace(pod: dict[str, Any], grace: int | None) -> int:
    if grace is not None:
        return max(0, int(grace))
    spec_grace = pod.get("spec", {}).get("terminationGracePeriodSeconds")
    return 30 if spec_grace is None else int(spec_grace)
