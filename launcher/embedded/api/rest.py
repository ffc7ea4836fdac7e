"""The REST half of the embedded API server: one request's routing (discovery, resource paths,
subresources) and its verbs (list, get, create, update, patch, delete, deletecollection, eviction),
answered from the Store. Called by `launcher/embedded/api/apiserver.py`'s handler for every request;
watch streams and pods/log are `launcher/embedded/api/streams.py`'s."""

from __future__ import annotations

import json
from typing import Any

from launcher.core import rfc3339
from launcher.embedded.api import bodies, discovery, eviction
from launcher.embedded.api.streams import Streams
from launcher.embedded.auth.identity import Attributes, User
from launcher.embedded.store.patches import PATCH_TYPES
from launcher.embedded.types import objects
from launcher.embedded.types.errors import ApiError, bad_request
from launcher.embedded.types.resources import GROUPS, Resource, lookup

# Kinds whose DELETE answers with the object rather than a Status once it is gone: the registries
# that set ReturnDeletedObject (pkg/registry/core/{pod,service,serviceaccount}/storage) and namespaces, whose
# REST Delete returns the object. A custom resource's store leaves it unset
# (apiextensions-apiserver pkg/registry/customresource/etcd.go): a JobSet removed at once answers
# with a Status, one kept by finalizers (foreground, orphan) with the object, as every kind.
_DELETE_RETURNS_OBJECT = {"pods", "namespaces", "serviceaccounts", "services"}
# The finalizer the API server puts on an object deleted with these propagation policies
# (staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go, deletionFinalizersForGarbageCollection).
_GC_FINALIZERS = {"Foreground": "foregroundDeletion", "Orphan": "orphan"}


class ApiRequest(Streams):
    """One API request: parse the path, route it, answer it. `h` is the ApiServer's HTTP handler
    (`apiserver._Handler`: headers, send_json, send_body, start_stream, chunk, end_stream,
    peer_closed), `h.server.api` the ApiServer; `user` who asks (None: nobody is asked, the embedded
    cluster's own mode)."""

    def __init__(
        self,
        h: Any,
        method: str,
        path: str,
        query: dict[str, str],
        body: bytes | None,
        user: User | None = None,
    ) -> None:
        self.h, self.method, self.path, self.query, self.raw_body = h, method, path, query, body
        self.user = user
        self.api = h.server.api
        self.store = self.api.store

    # ---- routing ------------------------------------------------------------------------------------

    def dispatch(self) -> None:
        for method, prefix, handler in self.api._routes:
            if method == self.method and self.path.startswith(prefix):
                if self.user is not None:
                    self.api.authorize(self.user, Attributes(verb=self.method.lower(), path=self.path))
                code, body = handler(self.method, self.path, self.query, self.raw_body)
                self.h.send_json(code, body)
                return
        segs = [s for s in self.path.split("/") if s]
        if self.user is not None and self.method == "GET" and _is_discovery(segs):
            self.api.authorize(self.user, Attributes(verb="get", path=self.path))
        if self.method == "GET" and self._discovery(segs):
            return
        if segs[:2] == ["api", "v1"]:
            self._resource("", "v1", segs[2:])
        elif len(segs) >= 3 and segs[0] == "apis":
            self._resource(segs[1], segs[2], segs[3:])
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def _discovery(self, segs: list[str]) -> bool:
        address = f"{self.api.host}:{self.api.port}"
        doc: dict[str, Any] | None = None
        if segs == ["version"]:
            doc = self.api.version
        elif segs in (["healthz"], ["livez"], ["readyz"]):
            self.h.send_body(200, b"ok", "text/plain; charset=utf-8")
            return True
        elif segs == ["openapi", "v2"]:
            if "protobuf" in (self.h.headers.get("Accept") or ""):
                self.h.send_body(200, discovery.OPENAPI_V2_PROTOBUF, discovery.OPENAPI_V2_PROTOBUF_TYPE)
                return True
            doc = discovery.OPENAPI_V2_JSON
        elif segs == ["api"]:
            doc = discovery.api_versions(address)
        elif segs == ["api", "v1"]:
            doc = discovery.resource_list("", "v1")
        elif segs == ["apis"]:
            doc = discovery.api_group_list()
        elif len(segs) == 2 and segs[0] == "apis" and segs[1] in GROUPS and segs[1]:
            doc = discovery.api_group(segs[1])
        elif len(segs) == 3 and segs[0] == "apis" and segs[2] in GROUPS.get(segs[1], {}) and segs[1]:
            doc = discovery.resource_list(segs[1], segs[2])
        if doc is None:
            return False
        self.h.send_json(200, doc)
        return True

    def _resource(self, group: str, version: str, segs: list[str]) -> None:
        if version not in GROUPS.get(group, {}):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        watch_path = bool(segs) and segs[0] == "watch"
        if watch_path:
            segs = segs[1:]
        namespace = None
        if len(segs) >= 3 and segs[0] == "namespaces" and lookup(group, version, segs[2]) is not None:
            namespace, segs = segs[1], segs[2:]
        res = lookup(group, version, segs[0]) if segs else None
        if res is None or len(segs) > 3:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if namespace is not None and not res.namespaced:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        name = segs[1] if len(segs) > 1 else None
        sub = segs[2] if len(segs) > 2 else None
        if sub is not None and sub not in res.subresources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        watching = watch_path or (self.method == "GET" and self.query.get("watch") in bodies.TRUE)
        verb, resource = _verb(self.method, name, watching), f"{res.plural}/{sub}" if sub else res.plural
        if self.user is not None:  # outside mode: who asks is authorized (embedded: nobody is asked)
            asked = Attributes(
                verb=verb, path=self.path, resource_request=True, group=group, resource=res.plural,
                subresource=sub or "", namespace=namespace or "",
                name=name or (_selected_name(self.query.get("fieldSelector")) if verb in ("list", "watch") else ""),
            )  # fmt: skip
            self.api.authorize(self.user, asked)
        self.api.audit.add((verb, group, resource))
        with self.api._requests_lock:
            self.api.requests[verb, resource] += 1
        if watching:
            if name is not None:  # a watch of one object: a field selector on its name
                self.query["fieldSelector"] = ",".join(
                    filter(None, [self.query.get("fieldSelector"), f"metadata.name={name}"])
                )
            self._watch(res, namespace)
        elif name is None:
            self._collection(res, namespace)
        elif sub == "log":
            self._log(namespace or "default", name)
        elif sub == "eviction":
            if self.method != "POST":
                raise ApiError(
                    405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
                )
            body = self._body(kind="Eviction")
            self.h.send_json(201, eviction.evict(self.store, namespace or "default", name, body))
        else:
            self._object(res, namespace, name, sub)

    # ---- verbs --------------------------------------------------------------------------------------

    def _collection(self, res: Resource, namespace: str | None) -> None:
        if self.method == "GET":
            self._list(res, namespace)
        elif self.method == "POST":
            obj = self._body(kind=res.kind)
            self.h.send_json(201, self.store.create(res, obj, namespace))
        elif self.method == "DELETE":
            items, _ = self.store.list(
                res, namespace, self.query.get("labelSelector"), self.query.get("fieldSelector")
            )
            for item in items:
                meta = item["metadata"]
                try:
                    self._delete_one(res, meta.get("namespace"), meta["name"])
                except ApiError as e:
                    if e.code != 404:
                        raise
            self.h.send_json(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})
        else:
            raise ApiError(
                405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
            )

    def _list(self, res: Resource, namespace: str | None) -> None:
        limit = bodies.int_param(self.query, "limit")
        raws, rv, token, remaining = self.store.list_raw(
            res,
            namespace,
            self.query.get("labelSelector"),
            self.query.get("fieldSelector"),
            limit=limit,
            continue_=self.query.get("continue") or None,
        )
        if self._wants_table():
            body = discovery.table(res, [json.loads(r) for r in raws], rv)
            if token:
                body["metadata"]["continue"] = token
            self.h.send_json(200, body)
            return
        meta: dict[str, Any] = {"resourceVersion": rv}
        if token:
            meta["continue"] = token
            meta["remainingItemCount"] = remaining
        head = json.dumps(
            {"kind": f"{res.kind}List", "apiVersion": res.api_version, "metadata": meta},
            separators=(",", ":"),
        )
        self.h.send_body(200, (head[:-1] + ',"items":[' + ",".join(raws) + "]}").encode())

    def _object(self, res: Resource, namespace: str | None, name: str, sub: str | None) -> None:
        if self.method == "GET":
            obj = self.store.get(res, namespace, name)
            if self._wants_table():
                self.h.send_json(200, discovery.table(res, [obj], obj["metadata"]["resourceVersion"]))
            else:
                self.h.send_json(200, obj)
        elif self.method == "PUT":
            obj = self._body(kind=res.kind)
            meta = obj.setdefault("metadata", {})
            # Only names Go could decode are compared with the URL: the store refuses the rest (400).
            if isinstance(meta, dict):
                body_name, body_ns = meta.get("name"), meta.get("namespace")
                if isinstance(body_name, str) and body_name != name:
                    raise bad_request(
                        f"the name of the object ({body_name}) does not match the name on the URL ({name})"
                    )
                if res.namespaced and isinstance(body_ns, str) and body_ns != namespace:
                    raise bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request"
                    )
                if body_name is None or isinstance(body_name, str):
                    meta["name"] = name
                if res.namespaced and (body_ns is None or isinstance(body_ns, str)):
                    meta["namespace"] = namespace
            self.h.send_json(200, self.store.update(res, obj, subresource=sub))
        elif self.method == "PATCH":
            content_type = (self.h.headers.get("Content-Type") or "").split(";")[0].strip()
            patch_type = PATCH_TYPES.get(content_type)
            if patch_type is None:
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    f"the body of the request was in an unknown format - accepted media types include: {', '.join(PATCH_TYPES)}",
                )
            # An undecodable merge patch is jsonpatch.ErrBadJSONPatch upstream.
            undecodable = "Invalid JSON Patch" if patch_type == "merge" else None
            body = self._body(any_json=True, undecodable=undecodable)
            patched = self.store.patch(res, namespace, name, body, patch_type, subresource=sub)
            self.h.send_json(200, patched)
        elif self.method == "DELETE" and sub is None:
            self.h.send_json(*self._delete_one(res, namespace, name))
        else:
            raise ApiError(
                405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
            )

    def _delete_one(self, res: Resource, namespace: str | None, name: str) -> tuple[int, dict[str, Any]]:
        opts = bodies.delete_options(self._body(optional=True) or {})
        grace = bodies.int_param(self.query, "gracePeriodSeconds")
        if grace is None:
            grace = opts.get("gracePeriodSeconds")
        propagation = self.query.get("propagationPolicy") or opts.get("propagationPolicy")
        orphan = self.query.get("orphanDependents", opts.get("orphanDependents"))
        if propagation is None:
            if orphan is not None:
                propagation = "Orphan" if str(orphan).lower() in bodies.TRUE else "Background"
            else:
                # batch/v1 Jobs orphan their pods unless asked otherwise (upstream, for back compat).
                propagation = "Orphan" if res.plural == "jobs" else "Background"
        obj = self.store.delete(
            res,
            namespace,
            name,
            propagation=propagation,
            grace_period_seconds=grace,
            preconditions=opts.get("preconditions"),
        )
        meta = obj["metadata"]
        # kube-apiserver answers before the garbage collector acts: an object that a finalizer kept
        # (foreground, orphan) is answered with, even if the embedded GC has removed it since.
        still_there = bool(meta.get("deletionTimestamp")) and (
            bool(meta.get("finalizers")) or self._exists(res, meta)
        )
        if still_there or res.plural in _DELETE_RETURNS_OBJECT:
            return 200, obj
        if propagation in _GC_FINALIZERS and meta.get("deletionTimestamp") is None:
            # Upstream the API server only adds the GC's finalizer and answers with the object; the
            # garbage collector removes it afterwards (the embedded store does both at once).
            meta = {
                **meta,
                "deletionTimestamp": rfc3339.stamp(objects.now()),
                "deletionGracePeriodSeconds": 0,
            }
            meta["finalizers"] = [*(meta.get("finalizers") or []), _GC_FINALIZERS[propagation]]
            return 200, {**obj, "metadata": meta}
        details = {"name": name, "group": res.group, "kind": res.plural, "uid": meta.get("uid")}
        return 200, {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": details,
        }

    def _exists(self, res: Resource, meta: dict[str, Any]) -> bool:
        try:
            current = self.store.get(res, meta.get("namespace"), meta["name"])
        except ApiError:
            return False
        return current["metadata"]["uid"] == meta["uid"]

    # ---- helpers ------------------------------------------------------------------------------------

    def _wants_table(self) -> bool:
        return "as=Table" in (self.h.headers.get("Accept") or "")

    def _body(
        self, optional: bool = False, any_json: bool = False, kind: str = "", undecodable: str | None = None
    ) -> Any:
        """The decoded body: an object, or with `any_json` (a patch) any JSON value; 400 when Go's
        decoder could not read it (with the decoder's words, or `undecodable`)."""
        if not self.raw_body:
            if optional:
                return None
            raise bad_request("the request body is empty")
        yaml_body = not any_json and "yaml" in (self.h.headers.get("Content-Type") or "").lower()
        try:
            body = bodies.load(self.raw_body, yaml_body)
        except bodies.Undecodable as e:
            if any_json:
                raise bad_request(undecodable or str(e)) from None
            raise bodies.unrecognized(kind, self.raw_body, str(e)) from None
        if not any_json and not isinstance(body, dict):
            raise bodies.unrecognized(kind, self.raw_body, bodies.not_an_object(body))
        return body


def _is_discovery(segs: list[str]) -> bool:
    """A path that is no resource request (requestinfo.go): /version, /healthz, /openapi/...,
    /api and /api/v1, /apis, /apis/GROUP and /apis/GROUP/VERSION."""
    if not segs or segs[0] not in ("api", "apis"):
        return True
    return len(segs) < (3 if segs[0] == "api" else 4)


def _selected_name(field_selector: str | None) -> str:
    """The name a list or watch asks for by its `metadata.name=NAME` field selector, which RBAC
    matches against `resourceNames` as it matches a named get (requestinfo.go: the selector's
    RequiresExactMatch, a name that is a valid path segment)."""
    for term in (field_selector or "").split(","):
        key, op, value = term.partition("==") if "==" in term else term.partition("=")
        if op and key.strip() == "metadata.name":  # `!=` leaves the key "metadata.name!"
            value = value.strip()
            if value and value not in (".", "..") and "/" not in value and "%" not in value:
                return value
    return ""


def _verb(method: str, name: str | None, watching: bool) -> str:
    """The RBAC verb of a request (Kubernetes authorization's mapping of HTTP methods)."""
    if watching:
        return "watch"
    if method == "GET":
        return "get" if name else "list"
    if method == "DELETE":
        return "delete" if name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}[method]
