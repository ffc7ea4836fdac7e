"""Where an in-place run's worlds come from: a ConfigMap watched through the Kubernetes API, or a
file polled (local runs, tests). Standard library only: the trainer image has no Kubernetes client,
and the trainer imports nothing of the launcher.

Each source runs one daemon thread that hands every document it reads to ``on_document`` (the
ConfigMap's ``world.json`` key, or the file's bytes) and every trouble worth a log line to
``on_problem``; it never prints, never logs, and never takes a lock that a forked child could
need (``trainer.elastic.follower`` forks trainer children while it runs). Which document is newer is
the supervisor's business (epochs), so a replay or a duplicate is harmless here.

The ConfigMap source (docs/contract.md "World (in-place restarts)"): a LIST of the one ConfigMap
(``fieldSelector=metadata.name=<name>``, which a Role limited by ``resourceNames`` allows), then a
WATCH from the list's resourceVersion with bookmarks; a closed or timed-out stream is watched again
from the last resourceVersion seen; 410 Gone (history compacted) lists again; a refused connection
or an error status backs off (doubling to ``_BACKOFF_MAX_S``). In a pod it uses the in-cluster
endpoint (``KUBERNETES_SERVICE_HOST``/``PORT``, the service-account token, re-read at every
connection because bound tokens rotate, and ``ca.crt``); ``RESLICE_WORLD_API`` names an endpoint
explicitly (the embedded cluster's, plain HTTP without auth: its kubelet mounts no token).

Called by ``trainer.elastic.follower`` (``from_env``) and the tests.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import ssl
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from contract import envvars
from contract import world as world_doc
from trainer.elastic.world import WorldError

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_WATCH_TIMEOUT_S = 300  # the server ends each watch after this; the source watches again
_READ_TIMEOUT_S = 120  # no byte (not even a bookmark) for this long: the connection is dead
_BACKOFF_MIN_S, _BACKOFF_MAX_S = 0.1, 5.0
_POLL_S = 0.05

Deliver = Callable[[bytes], None]
Problem = Callable[[str], None]


class FileSource:
    """``RESLICE_WORLD_FILE``: the file is read every ``poll_s`` and delivered whenever its bytes
    change and parse as JSON (a publisher should write it whole, e.g. by a rename; a half-written
    file is read again at the next poll)."""

    def __init__(self, path: str | os.PathLike[str], poll_s: float = _POLL_S) -> None:
        self.path = Path(path)
        self.poll_s = poll_s
        self._stop = threading.Event()

    def describe(self) -> str:
        return f"file {self.path}"

    def start(self, on_document: Deliver, on_problem: Problem) -> None:
        threading.Thread(target=self._run, args=(on_document,), name="world-file", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self, on_document: Deliver) -> None:
        last_sig: tuple[int, int, int] | None = None
        last: bytes | None = None
        while not self._stop.is_set():
            try:
                st = self.path.stat()
                sig = (st.st_ino, st.st_mtime_ns, st.st_size)
                if sig != last_sig:
                    data = self.path.read_bytes()
                    json.loads(data)  # a half-written file: not yet
                    last_sig = sig
                    if data != last:
                        last = data
                        on_document(data)
            except (OSError, ValueError):
                pass
            self._stop.wait(self.poll_s)


class _Endpoint:
    """An API server to talk to: base URL, and the token and CA files when it has them."""

    def __init__(self, url: str, token_file: Path | None = None, ca_file: Path | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise WorldError(f"RESLICE_WORLD_API={url!r} must be http(s)://host:port")
        self.url, self.https = url, parts.scheme == "https"
        self.host, self.port = parts.hostname, parts.port or (443 if self.https else 80)
        self.token_file, self.ca_file = token_file, ca_file

    def connect(self, timeout: float) -> http.client.HTTPConnection:
        if self.https:
            context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=context)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.token_file is not None:
            headers["Authorization"] = f"Bearer {self.token_file.read_text().strip()}"
        return headers


class _Gone(Exception):
    """410: the resourceVersion is older than the server's history; list again."""


class ConfigMapSource:
    """``RESLICE_WORLD_CONFIGMAP``: the ``world.json`` key of one ConfigMap, listed then watched."""

    def __init__(self, endpoint: _Endpoint, namespace: str, name: str) -> None:
        self.endpoint, self.namespace, self.name = endpoint, namespace, name
        self._stop = threading.Event()
        self._conn: http.client.HTTPConnection | None = None
        self.lists = 0  # how many LISTs it made (tests: a 410 lists again)

    def describe(self) -> str:
        return f"ConfigMap {self.namespace}/{self.name} at {self.endpoint.url}"

    def start(self, on_document: Deliver, on_problem: Problem) -> None:
        threading.Thread(
            target=self._run, args=(on_document, on_problem), name="world-watch", daemon=True
        ).start()

    def stop(self) -> None:
        self._stop.set()
        conn = self._conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)

    def _path(self, **query: str) -> str:
        q = {"fieldSelector": f"metadata.name={self.name}", **query}
        qs = "&".join(f"{k}={quote(v, safe='')}" for k, v in q.items())
        return f"/api/v1/namespaces/{quote(self.namespace)}/configmaps?{qs}"

    def _open(self, path: str, timeout: float) -> http.client.HTTPResponse:
        self._close()
        conn = self.endpoint.connect(timeout)
        self._conn = conn
        conn.request("GET", path, headers=self.endpoint.headers())
        resp = conn.getresponse()
        if resp.status == 410:
            self._close()
            raise _Gone()
        if resp.status != 200:
            body = resp.read(2000).decode(errors="replace")
            self._close()
            raise OSError(f"HTTP {resp.status} for GET {path}: {_message(body)}")
        return resp

    def _deliver(self, obj: Mapping[str, Any], on_document: Deliver) -> None:
        doc = (obj.get("data") or {}).get(world_doc.DATA_KEY)
        if isinstance(doc, str):
            on_document(doc.encode())

    def _list(self, on_document: Deliver) -> str:
        resp = self._open(self._path(), _READ_TIMEOUT_S)
        try:
            body = json.loads(resp.read())
        finally:
            self._close()
        self.lists += 1
        for item in body.get("items") or []:
            self._deliver(item, on_document)
        return str(body["metadata"]["resourceVersion"])

    def _watch(self, rv: str, on_document: Deliver) -> str:
        """Follow one watch stream until it ends; the last resourceVersion seen."""
        path = self._path(
            watch="1", resourceVersion=rv, allowWatchBookmarks="true", timeoutSeconds=str(_WATCH_TIMEOUT_S)
        )
        resp = self._open(path, _READ_TIMEOUT_S)
        try:
            while not self._stop.is_set() and (line := resp.readline()):
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone()
                    raise OSError(f"watch error: {obj.get('message') or obj}")
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                if kind in ("ADDED", "MODIFIED"):
                    self._deliver(obj, on_document)
        finally:
            self._close()
        return rv

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _run(self, on_document: Deliver, on_problem: Problem) -> None:
        rv: str | None = None
        backoff = _BACKOFF_MIN_S
        reported = ""
        while not self._stop.is_set():
            try:
                if rv is None:
                    rv = self._list(on_document)
                rv = self._watch(rv, on_document)
                backoff, reported = _BACKOFF_MIN_S, ""
            except _Gone:
                rv = None  # history compacted: list again, at once
            except TimeoutError:
                pass  # nothing for a long while: watch again from the same resourceVersion
            except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
                if self._stop.is_set():
                    break
                problem = f"{type(e).__name__}: {e}"
                if problem != reported:  # one line per new trouble, not one per retry
                    on_problem(f"world watch of {self.describe()}: {problem}; retrying")
                    reported = problem
                self._stop.wait(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX_S)


def _message(body: str) -> str:
    try:
        return str(json.loads(body).get("message") or body)
    except (ValueError, AttributeError):
        return body.strip()[:300]


Source = FileSource | ConfigMapSource


def from_env(env: Mapping[str, str], sa_dir: Path = SA_DIR) -> Source:
    """The source the environment names (docs/contract.md); WorldError when it names none."""
    if env.get(envvars.WORLD_FILE):
        return FileSource(env[envvars.WORLD_FILE])
    name = env.get(envvars.WORLD_CONFIGMAP, "")
    if not name:
        raise WorldError(
            "in-place mode needs RESLICE_WORLD_CONFIGMAP (or RESLICE_WORLD_FILE): where the worlds are"
        )
    namespace = env.get(envvars.WORLD_NAMESPACE, "")
    if not namespace:
        with contextlib.suppress(OSError):
            namespace = (sa_dir / "namespace").read_text().strip()
    if not namespace:
        raise WorldError("in-place mode needs RESLICE_WORLD_NAMESPACE, or a service-account namespace file")
    if env.get(envvars.WORLD_API):
        # A bearer token only over TLS: the embedded cluster's plain HTTP endpoint takes none.
        url, token = env[envvars.WORLD_API], sa_dir / "token"
        with_token = url.startswith("https:") and token.exists()
        ca = sa_dir / "ca.crt"
        return ConfigMapSource(
            _Endpoint(url, token if with_token else None, ca if with_token and ca.exists() else None),
            namespace,
            name,
        )
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise WorldError(
            "in-place mode needs the in-cluster API (KUBERNETES_SERVICE_HOST/PORT) or RESLICE_WORLD_API"
        )
    if ":" in host:  # an IPv6 service address
        host = f"[{host}]"
    ca = sa_dir / "ca.crt"
    return ConfigMapSource(
        _Endpoint(f"https://{host}:{port}", sa_dir / "token", ca if ca.exists() else None), namespace, name
    )
