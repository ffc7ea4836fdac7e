"""LIST and WATCH of the kinds the controller's caches hold, as plain dicts exactly as the API
serves them (camelCase): paged lists and watch requests that a stop event closes at once. Called by
launcher/adapters/informer.py (the caches' watches) and launcher/controller/loop.py (a pass without caches),
through `Kube.lists`.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

from launcher.core.labels import API_VERSION

GROUP, VERSION = API_VERSION.split("/")


class ListWatch:
    """The lists and watches of one namespace (and the cluster's nodes)."""

    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        self.namespace = namespace
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    def _list_fn(self, kind: str) -> tuple[Callable, tuple]:
        fns: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
            "pods": (self.core.list_namespaced_pod, (self.namespace,)),
            "nodes": (self.core.list_node, ()),
            "events": (self.core.list_namespaced_event, (self.namespace,)),
            "configmaps": (self.core.list_namespaced_config_map, (self.namespace,)),
            "jobsets": (
                self.custom.list_namespaced_custom_object,
                (GROUP, VERSION, self.namespace, "jobsets"),
            ),
        }
        return fns[kind]

    @staticmethod
    def _selectors(label_selector: str | None, field_selector: str | None) -> dict:
        return {
            k: v for k, v in (("label_selector", label_selector), ("field_selector", field_selector)) if v
        }

    def list_raw(
        self,
        kind: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page: int | None = None,
    ) -> Iterator[tuple[list[dict], str]]:
        """LIST `kind` (the namespace's, or the cluster's nodes) in pages of `page` objects, as
        client-go's reflector does (a page at a time keeps a big list's memory bounded): (items,
        resourceVersion) per page; the last page's resourceVersion is the list's."""
        fn, args = self._list_fn(kind)
        token = None
        while True:
            paging = {"limit": page, **({"_continue": token} if token else {})} if page else {}
            resp = fn(
                *args, _preload_content=False, **self._selectors(label_selector, field_selector), **paging
            )
            got = json.loads(resp.data)
            yield got["items"], got["metadata"]["resourceVersion"]
            token = got["metadata"].get("continue")
            if not token:
                return

    def watch_raw(
        self,
        kind: str,
        resource_version: str,
        timeout_s: int,
        label_selector: str | None,
        field_selector: str | None,
        stop: threading.Event,
    ) -> Iterator[tuple[str, dict]]:
        """(type, object) of each event of one watch request from `resource_version`, until the
        server ends it or `stop` is set (which closes the connection at once)."""
        fn, args = self._list_fn(kind)
        resp = fn(
            *args,
            watch=True,
            resource_version=resource_version,
            timeout_seconds=timeout_s,
            allow_watch_bookmarks=True,
            _preload_content=False,
            **self._selectors(label_selector, field_selector),
        )
        closer = threading.Thread(target=_close_on, args=(stop, resp), daemon=True)
        closer.start()
        try:
            for line in iter_resp_lines(resp):
                if stop.is_set():
                    return
                if line:
                    event = json.loads(line)
                    yield event["type"], event["object"]
        finally:
            resp.close()
            resp.release_conn()


def _close_on(stop: threading.Event, resp) -> None:
    """Shut a watch's connection when `stop` is set, so that its reader returns at once (a watch
    otherwise blocks until the server next speaks, minutes when nothing changes)."""
    while not stop.wait(1.0):
        if resp.closed:
            return
    # The reader may close the response between the test and the call: its socket is gone, and
    # urllib3's shutdown then fails (EBADF, or a ValueError once its connection is released).
    with contextlib.suppress(OSError, ValueError):
        resp.shutdown()
