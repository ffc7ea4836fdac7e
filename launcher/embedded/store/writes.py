"""Create and update in the embedded store: naming, namespaces, server-owned metadata,
generations, admission (the registered validators and `rules`) and resourceVersion preconditions.
A part of `Store` (`launcher/embedded/store/store.py`), called from its create(), update() and patch();
it commits through `Store._commit`."""

from __future__ import annotations

import json
import random
import uuid
from typing import Any

from launcher.core import rfc3339
from launcher.embedded.admission import defaults, rules, serviceaccount
from launcher.embedded.store.stored import ADDED, MODIFIED, Rec
from launcher.embedded.store.tables import Tables
from launcher.embedded.types.errors import (
    STALE,
    ApiError,
    already_exists,
    bad_request,
    conflict,
    invalid,
    not_found,
)
from launcher.embedded.types.gotypes import go_equal
from launcher.embedded.types.resources import RESOURCES, Resource

_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


class Writes(Tables):
    """The create/update half of `Store`."""

    def _create(self, res: Resource, obj: dict[str, Any], namespace: str | None) -> Rec:
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
        meta["creationTimestamp"] = rfc3339.stamp()
        meta["generation"] = 1
        defaults.on_create(res, obj, self.default_toleration_s)
        if res.plural == "pods" and self.service_account_tokens:
            account = self._find(RESOURCES["serviceaccounts"], ns, obj["spec"]["serviceAccountName"])
            suffix = "".join(random.choices(_GENERATE_ALPHABET, k=5))
            serviceaccount.mount_token(obj, account.obj if account is not None else None, suffix)
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

    def _update(self, res: Resource, rec: Rec, new: dict[str, Any], subresource: str | None) -> Rec:
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
        # A built-in kind's strategy compares its typed spec (Semantic.DeepEqual: absent and empty
        # alike); a custom resource's compares the unstructured content, where they differ.
        same = (lambda a, b: a == b) if res.custom else go_equal
        spec_changed = any(not same(new.get(k), old.get(k)) for k in {*new, *old} - {"metadata", "status"})
        meta["generation"] = old_meta.get("generation", 1) + (1 if spec_changed else 0)
        self._admit(res, old, new)
        return new


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
