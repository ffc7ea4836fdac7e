"""Fixtures for the embedded API tests: a running ApiServer over a fresh Store, and clients for it.

Every API test talks to the server the way reslice and kubectl do: the official `kubernetes`
client over HTTP on loopback.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from launcher.embedded.api.apiserver import ApiServer
from launcher.embedded.api.kubeconfig import api_client
from launcher.embedded.store.store import Store

# Short enough that a test sees several bookmarks in a second; real servers send one a minute.
BOOKMARK_INTERVAL_S = 0.2


@dataclass
class Api:
    store: Store
    server: ApiServer
    client: client.ApiClient

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.client)

    @property
    def batch(self) -> client.BatchV1Api:
        return client.BatchV1Api(self.client)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.client)

    @property
    def coordination(self) -> client.CoordinationV1Api:
        return client.CoordinationV1Api(self.client)


def start_api(state_dir: Path | None = None, **store_kwargs: Any) -> Api:
    store = Store(state_dir, **store_kwargs)
    server = ApiServer(store, bookmark_interval=BOOKMARK_INTERVAL_S).start()
    return Api(store, server, api_client(server.url))


def stop_api(api: Api) -> None:
    api.client.close()
    api.server.stop()
    api.store.close()


@pytest.fixture
def api() -> Iterator[Api]:
    """A fresh store behind a running API server; `api.core` etc. are clients over HTTP."""
    running = start_api()
    yield running
    stop_api(running)


def pod(
    name: str, labels: dict[str, str] | None = None, node: str | None = None, **spec: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}], **spec},
    }
    if node:
        body["spec"]["nodeName"] = node
    return body


def job(name: str, completions: int = 1, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completions": completions,
            "parallelism": completions,
            "completionMode": "Indexed",
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox:1.36"}]}
            },
        },
    }
    if owner:
        body["metadata"]["ownerReferences"] = [owner_ref(owner)]
    return body


def owner_ref(owner: dict[str, Any]) -> dict[str, Any]:
    """A controller reference to `owner` (a dict as the API returns it) that blocks its deletion."""
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def jobset(name: str = "train", replicas: int = 2, hosts: int = 2) -> dict[str, Any]:
    """A JobSet shaped like reslice's rendered ones: one replicated job per slice shape."""
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "labels": {"app": "reslice"}},
        "spec": {
            "failurePolicy": {
                "maxRestarts": 3,
                "rules": [
                    {
                        "name": "preempted",
                        "action": "RestartJobSetAndIgnoreMaxRestarts",
                        "onJobFailureReasons": ["PodFailurePolicy"],
                    }
                ],
            },
            "replicatedJobs": [
                {
                    "name": "slice",
                    "replicas": replicas,
                    "template": {
                        "spec": {
                            "parallelism": hosts,
                            "completions": hosts,
                            "completionMode": "Indexed",
                            "backoffLimit": 0,
                            "template": {
                                "spec": {
                                    "restartPolicy": "Never",
                                    "containers": [{"name": "trainer", "image": "trainer:1", "args": None}],
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
