"""The streaming answers of the embedded API server: watch streams (chunked, one JSON event per
line, BOOKMARKs, `timeoutSeconds`, the 410 `ERROR` event) and pods/log (tail, limit, follow). A part
of `ApiRequest` (`launcher/embedded/api/rest.py`), which routes to it; it writes through the HTTP handler
of `launcher/embedded/api/apiserver.py`."""

from __future__ import annotations

import json
import random
import time
from typing import TYPE_CHECKING, Any

from launcher.embedded.api import bodies, discovery
from launcher.embedded.store.store import Store
from launcher.embedded.types.errors import ApiError, bad_request
from launcher.embedded.types.resources import RESOURCES, Resource


class Streams:
    """The watch and pods/log verbs of `ApiRequest`."""

    # What `ApiRequest.__init__` sets: the HTTP handler and the ApiServer are Any, as there (their
    # module imports this one, through rest.py).
    h: Any
    api: Any
    store: Store
    method: str
    query: dict[str, str]

    if TYPE_CHECKING:

        def _wants_table(self) -> bool: ...  # rest.py

    def _watch(self, res: Resource, namespace: str | None) -> None:
        q = self.query
        initial = q.get("sendInitialEvents") in bodies.TRUE
        bookmarks = q.get("allowWatchBookmarks") in bodies.TRUE
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

    def _log(self, namespace: str, name: str) -> None:
        if self.method != "GET":
            raise ApiError(
                405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
            )
        pod = self.store.get(RESOURCES["pods"], namespace, name)
        container = self._container(pod)
        follow = self.query.get("follow") in bodies.TRUE
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
