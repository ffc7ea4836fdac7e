"""Helpers for the cluster-half tests: a running EmbeddedCluster with the official client's APIs,
rendered JobSets with a tiny command instead of the trainer, and polling.

Several slices need a multi-host preset (GKE runs multislice only on multi-host slice node pools),
so the rendered default is 2 slices of tpu7x-2x2x2: 2 child Jobs of HOSTS pods each."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from launcher.adapters.preset_files import make_shape
from launcher.core.render import render_jobset
from launcher.core.spec import RunSpec
from launcher.embedded.cluster import EmbeddedCluster, NodePoolSpec
from tests.support.wait import wait_for

GROUP, VERSION = "jobset.x-k8s.io", "v1alpha2"
PRESET = "tpu7x-2x2x2"  # the smallest multi-host tpu7x slice
HOSTS = make_shape(PRESET).preset.hosts  # 2: pods per child Job (one per host)


@dataclass
class Kube:
    cluster: EmbeddedCluster
    core: client.CoreV1Api
    batch: client.BatchV1Api
    custom: client.CustomObjectsApi

    def jobset(self, name: str, ns: str = "default") -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "jobsets", name)

    def create_jobset(self, js: dict[str, Any], ns: str = "default") -> dict[str, Any]:
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, ns, "jobsets", js)

    def pods(self, selector: str | None = None, ns: str = "default") -> list[client.V1Pod]:
        return self.core.list_namespaced_pod(ns, label_selector=selector).items

    def events(
        self, reason: str | None = None, kind: str | None = None, ns: str = "default"
    ) -> list[client.CoreV1Event]:
        out = self.core.list_namespaced_event(ns).items
        return [
            e
            for e in out
            if (reason is None or e.reason == reason) and (kind is None or e.involved_object.kind == kind)
        ]

    def pool_nodes(self, pool: str) -> list[client.V1Node]:
        return self.core.list_node(label_selector=f"cloud.google.com/gke-nodepool={pool}").items


@contextlib.contextmanager
def running(nodepools: str, mode: str = "process", **kw: Any) -> Iterator[Kube]:
    specs = [NodePoolSpec(p.split(":")[0], int(p.split(":")[1])) for p in nodepools.split(",")]
    with EmbeddedCluster(specs, mode=mode, **kw) as cluster:
        api = cluster.api_client()
        yield Kube(cluster, client.CoreV1Api(api), client.BatchV1Api(api), client.CustomObjectsApi(api))


def rendered(
    run: str,
    script: str,
    preset: str = PRESET,
    slices: int = 2,
    grace_s: int = 5,
    max_restarts: int = 3,
    segment: int = 0,
) -> dict[str, Any]:
    """The renderer's JobSet for the run, with `python -c script` as the container command."""
    spec = RunSpec(
        run=run, run_dir=f"/tmp/{run}", global_batch=49152, grace_period_s=grace_s, max_restarts=max_restarts
    )
    js = render_jobset(spec, make_shape(preset, slices), segment)
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["containers"][0]["command"] = ["python", "-c", script]
    return js


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), None)


def terminal(kube: Kube, name: str, timeout: float = 30.0) -> dict[str, Any]:
    return wait_for(
        lambda: (js := kube.jobset(name)).get("status", {}).get("terminalState") and js,
        timeout,
        what=f"{name} to finish",
    )


class PodRecorder:
    """Every pod event the API server's watch delivers, in order (kubernetes.watch over HTTP), so
    a test sees states that last only milliseconds."""

    def __init__(self, kube: Kube, ns: str = "default") -> None:
        import threading

        from kubernetes import watch

        self.events: list[tuple[str, client.V1Pod]] = []
        self._stop = threading.Event()
        self._w = watch.Watch()

        def run() -> None:
            try:
                for ev in self._w.stream(kube.core.list_namespaced_pod, ns, timeout_seconds=60):
                    self.events.append((ev["type"], ev["object"]))
            except Exception:
                if not self._stop.is_set():  # the stream ends when the cluster stops
                    raise

        self._t = threading.Thread(target=run, daemon=True)
        self._t.start()

    def states(self, name: str) -> list[tuple[str, client.V1Pod]]:
        return [(t, p) for t, p in self.events if p.metadata.name == name]

    def close(self) -> None:
        self._stop.set()
        self._w.stop()
