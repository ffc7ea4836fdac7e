"""ApiServer: the Kubernetes REST API over HTTP/1.1 on loopback, in front of a Store.

Standard library only (`ThreadingHTTPServer`, one thread per connection, keep-alive). Serves what
the official python client and kubectl use: discovery, the REST verbs on every resource of
`resources.RESOURCES` (status subresources, `pods/log`), watch streams (chunked, one JSON event per
line, BOOKMARKs, `timeoutSeconds`, a 410 `ERROR` event for an expired resourceVersion, as the real
server sends it), `meta.k8s.io/v1` Tables for kubectl, and `Status` bodies for errors. JobSet
admission (CRD schema and webhook checks) is installed on the store.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import select
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from launcher import rfc3339
from launcher.embedded import admission, bodies, discovery, eviction
from launcher.embedded import objects as o
from launcher.embedded.errors import ApiError, bad_request
from launcher.embedded.patches import PATCH_TYPES
from launcher.embedded.resources import GROUPS, RESOURCES, Resource, lookup
from launcher.embedded.store import Store

log = logging.getLogger(__name__)

RouteHandler = Callable[[str, str, dict[str, str], bytes | None], tuple[int, dict[str, Any]]]
LogSource = Callable[[str, str, str, bool], Iterator[bytes]]

# Kinds whose DELETE answers with the object rather than a Status once it is gone: the registries
# that set ReturnDeletedObject (pkg/registry/core/{pod,serviceaccount}/storage) and namespaces, whose
# REST Delete returns the object. A custom resource's store leaves it unset
# (apiextensions-apiserver pkg/registry/customresource/etcd.go): a JobSet removed at once answers
# with a Status, one kept by finalizers (foreground, orphan) with the object, as every kind.
_DELETE_RETURNS_OBJECT = {"pods", "namespaces", "serviceaccounts"}
_TRUE = ("true", "1")
# The finalizer the API server puts on an object deleted with these propagation policies
# (staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go, deletionFinalizersForGarbageCollection).
_GC_FINALIZERS = {"Foreground": "foregroundDeletion", "Orphan": "orphan"}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], api: ApiServer) -> None:
        self.api = api
        super().__init__(address, _Handler)

    def handle_error(self, request, client_address) -> None:
        # A client that hangs up (a watch closed at shutdown) is normal; anything else is a bug.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class ApiServer:
    """See docs/embedded.md. `bookmark_interval`: seconds between watch BOOKMARKs."""

    def __init__(
        self,
        store: Store,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        bookmark_interval: float | None = None,
    ) -> None:
        self.store = store
        self.host = host
        self.port = port
        self.bookmark_interval = bookmark_interval
        self._routes: list[tuple[str, str, RouteHandler]] = []
        self._log_source: LogSource | None = None
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        # Bumped by restart/stop: streams opened in an older epoch end.
        self.epoch = 0
        # Every (verb, resource) any client used, as an RBAC rule names them: what a
        # least-privilege Role must allow, measured rather than guessed.
        self.audit: set[tuple[str, str, str]] = set()
        # Requests per (verb, resource), counted as they arrive: what a client costs the server
        # (a controller's idle rate, a pass that must not LIST).
        self.requests: Counter[tuple[str, str]] = Counter()
        self._requests_lock = threading.Lock()
        admission.install(store)

    # ---- lifecycle --------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> ApiServer:
        self._httpd = _Server((self.host, self.port), self)
        self.port = self._httpd.server_address[1]
        # A short poll interval: stop() and restart() wait for the serving loop to notice.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.05,), name=f"apiserver:{self.port}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.epoch += 1
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        with self._conns_lock:
            conns, self._conns = list(self._conns), set()
        for conn in conns:
            _shutdown(conn)

    def restart(self, downtime_s: float = 0.5) -> None:
        """Close the listener and every connection (watches end), reload the store from its state
        dir (history compacted: older resourceVersions answer 410), serve again on the same port."""
        self.stop()
        self.store.reload()
        time.sleep(downtime_s)
        self.start()

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- extension points -------------------------------------------------------------------------

    def add_route(self, method: str, prefix: str, handler: RouteHandler) -> None:
        """handler(method, path, query, body) -> (status, json body) for paths under `prefix`."""
        self._routes.append((method.upper(), prefix, handler))

    def set_log_source(self, fn: LogSource) -> None:
        """fn(namespace, pod, container, follow) -> iterator of log bytes (the kubelet's logs)."""
        self._log_source = fn

    # ---- connection tracking (so restart/stop can cut open watches) ------------------------------

    def _track(self, conn: socket.socket) -> None:
        with self._conns_lock:
            self._conns.add(conn)

    def _untrack(self, conn: socket.socket) -> None:
        with self._conns_lock:
            self._conns.discard(conn)


def _shutdown(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "reslice-embedded-apiserver"
    server: _Server

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes: without NODELAY, Nagle + delayed ACK add
        # 40 ms to every response.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.api._track(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.api._untrack(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request would drown test output; errors are logged where they happen

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # ---- plumbing ---------------------------------------------------------------------------------

    def _handle(self, method: str) -> None:
        self.streaming = False
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        try:
            body = self._read_body()
            _Request(self, method, url.path, query, body).dispatch()
        except ApiError as e:
            self._fail(e)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True
        except Exception as e:
            log.exception("%s %s failed", method, self.path)
            self._fail(
                ApiError(
                    500,
                    "InternalError",
                    f"an error on the server has prevented the request from succeeding: {e}",
                )
            )

    def _fail(self, err: ApiError) -> None:
        if self.streaming:
            self.close_connection = True  # headers are gone; all we can do is end the stream
            return
        try:
            self.send_json(err.code, err.status())
        except OSError:
            self.close_connection = True

    def _read_body(self) -> bytes | None:
        try:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                parts = []
                while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                    parts.append(self.rfile.read(size))
                    self.rfile.readline()
                self.rfile.readline()
                return b"".join(parts)
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.close_connection = True  # the framing is lost: the next request cannot be found
            raise bad_request("the request body could not be read") from None
        return self.rfile.read(length) if length > 0 else None

    def send_body(self, code: int, data: bytes, content_type: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.wfile.write(data)

    def send_json(self, code: int, body: dict[str, Any] | str) -> None:
        text = body if isinstance(body, str) else json.dumps(body, separators=(",", ":"))
        self.send_body(code, text.encode())

    def start_stream(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.streaming = True

    def chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def end_stream(self) -> None:
        try:
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True

    def peer_closed(self) -> bool:
        """Whether the client hung up (a readable socket with nothing to read)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True


class _Request:
    """One API request: parse the path, route it, answer it."""

    def __init__(
        self, h: _Handler, method: str, path: str, query: dict[str, str], body: bytes | None
    ) -> None:
        self.h, self.method, self.path, self.query, self.raw_body = h, method, path, query, body
        self.api: ApiServer = h.server.api
        self.store = self.api.store

    # ---- routing ------------------------------------------------------------------------------------

    def dispatch(self) -> None:
        for method, prefix, handler in self.api._routes:
            if method == self.method and self.path.startswith(prefix):
                code, body = handler(self.method, self.path, self.query, self.raw_body)
                self.h.send_json(code, body)
                return
        segs = [s for s in self.path.split("/") if s]
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
            doc = discovery.KUBE_VERSION
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
        watching = watch_path or (self.method == "GET" and self.query.get("watch") in _TRUE)
        verb, resource = _verb(self.method, name, watching), f"{res.plural}/{sub}" if sub else res.plural
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
                propagation = "Orphan" if str(orphan).lower() in _TRUE else "Background"
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
            meta = {**meta, "deletionTimestamp": rfc3339.stamp(o.now()), "deletionGracePeriodSeconds": 0}
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

    # ---- watch --------------------------------------------------------------------------------------

    def _watch(self, res: Resource, namespace: str | None) -> None:
        q = self.query
        initial = q.get("sendInitialEvents") in _TRUE
        bookmarks = q.get("allowWatchBookmarks") in _TRUE
        seconds = bodies.int_param(q, "timeoutSeconds")
        timeout = float(seconds) if seconds is not None else random.uniform(1800, 3600)
        try:
            w = self.store.watch(
                res,
                namespace,
                None if initial else q.get("resourceVersion"),
                q.get("labelSelector"),
                q.get("fieldSelector"),
                bookmarks=bookmarks,
                bookmark_interval=self.api.bookmark_interval,
                initial_events_end=initial and bookmarks,
            )
        except ApiError as e:
            if e.code != 410:
                raise
            # The API server answers an expired watch with 200 and one ERROR event (client-go and
            # the python client's Watch look for exactly that).
            self.h.start_stream("application/json")
            self.h.chunk(_event("ERROR", json.dumps(e.status())))
            self.h.end_stream()
            return
        table = self._wants_table()
        self.h.start_stream("application/json")
        try:
            self._pump(w, res, timeout, table)
        finally:
            w.close()
        self.h.end_stream()

    def _pump(self, w: Any, res: Resource, timeout: float, table: bool) -> None:
        epoch, deadline = self.api.epoch, time.monotonic() + timeout
        while self.api.epoch == epoch:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                item = w.get(timeout=min(remaining, 1.0))
            except EOFError:
                return
            if item is None:
                if self.h.peer_closed():
                    return
                continue
            batch, ended = _drain(w, [item])
            self.h.chunk(
                b"".join(_event(t, self._as_table(res, t, raw) if table else raw) for t, raw in batch)
            )
            if ended:
                return

    @staticmethod
    def _as_table(res: Resource, etype: str, raw: str) -> str:
        obj = json.loads(raw)
        if etype == "BOOKMARK":
            return raw
        return json.dumps(discovery.table(res, [obj], obj["metadata"].get("resourceVersion", "")))

    # ---- pods/log -----------------------------------------------------------------------------------

    def _log(self, namespace: str, name: str) -> None:
        if self.method != "GET":
            raise ApiError(
                405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
            )
        pod = self.store.get(RESOURCES["pods"], namespace, name)
        container = self._container(pod)
        follow = self.query.get("follow") in _TRUE
        tail = bodies.int_param(self.query, "tailLines")
        limit = bodies.int_param(self.query, "limitBytes")
        source = self.api._log_source
        existing = b"".join(source(namespace, name, container, False)) if source else b""
        head = _tail(existing, tail) if tail is not None else existing
        if not follow or source is None:
            self.h.send_body(200, head[:limit] if limit else head, "text/plain")
            return
        self.h.start_stream("text/plain")
        sent = self._send_limited(head, limit, 0)
        stream = source(namespace, name, container, True)
        skip, epoch = len(existing), self.api.epoch  # the follow stream starts from the beginning
        try:
            for data in stream:
                if skip:
                    data, skip = data[skip:], max(0, skip - len(data))
                sent = self._send_limited(data, limit, sent)
                if (limit and sent >= limit) or self.api.epoch != epoch:
                    break
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        self.h.end_stream()

    def _send_limited(self, data: bytes, limit: int | None, sent: int) -> int:
        if limit:
            data = data[: max(0, limit - sent)]
        self.h.chunk(data)
        return sent + len(data)

    def _container(self, pod: dict[str, Any]) -> str:
        name = pod["metadata"]["name"]
        containers = [c["name"] for c in (pod.get("spec") or {}).get("containers") or []]
        container = self.query.get("container")
        if not container:
            if len(containers) != 1:
                raise bad_request(
                    f"a container name must be specified for pod {name}, choose one of: [{' '.join(containers)}]"
                )
            return containers[0]
        if container not in containers:
            raise bad_request(f"container {container} is not valid for pod {name}")
        return container

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


def _verb(method: str, name: str | None, watching: bool) -> str:
    """The RBAC verb of a request (Kubernetes authorization's mapping of HTTP methods)."""
    if watching:
        return "watch"
    if method == "GET":
        return "get" if name else "list"
    if method == "DELETE":
        return "delete" if name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}[method]


def _drain(w: Any, batch: list[tuple[str, str]], most: int = 500) -> tuple[list[tuple[str, str]], bool]:
    """Add what is already queued on `w` to `batch` (sent in one write); True once `w` has ended."""
    try:
        while len(batch) < most and (more := w.get(timeout=0)) is not None:
            batch.append(more)
    except EOFError:
        return batch, True
    return batch, False


def _event(etype: str, raw: str) -> bytes:
    return f'{{"type":"{etype}","object":{raw}}}\n'.encode()


def _tail(data: bytes, lines: int) -> bytes:
    if lines <= 0:
        return b""
    parts = data.splitlines(keepends=True)
    return b"".join(parts[-lines:])
