"""Not a benchmark: the embedded cluster that bench.controller_scale starts in a process of its own.

On a real cluster the API server is not in the process that injects faults and measures, so the
controller's requests should compete with the cluster's own work for cores, not with the benchmark
for one interpreter.

    python -m bench.scale_cluster --slices 4 --preset tpu7x-8x8x48 --info DIR/cluster.json

Started and driven by bench/controller_scale.py through `ClusterProcess`. It serves the embedded
cluster (simulate mode, no state directory, as `bench.embedded_scale.build_cluster` makes it) with
its fault routes (/embedded/v1/remove, restore: what `reslice cluster` calls) and these routes for
the benchmark only, under /bench/v1/:

- POST load {"nodes", "pods", "events"}: unrelated objects written to the store directly (35,000
  POSTs would take minutes), answered with what the cluster needed for them (seconds, RSS);
- GET requests: requests per (verb, resource) the API server counted since the last POST requests;
- POST freeze: this process's heap collected and frozen (gc.freeze), answered with the seconds;
- GET gc?start=T0&end=T1: seconds this process spent in full cyclic-GC collections between two
  time.time() instants (a stalled server delays the controller's PUT);
- GET rss: this process's RSS now, MiB.

Once serving it writes --info (pid, URL, kubeconfig) atomically; it stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench._cli import Parser

ROUTE = "/bench/v1/"


def add_load(cluster: Any, nodes: int, pods: int, events: int) -> dict[str, Any]:
    """Unrelated objects, written to the store directly: CPU nodes of other pools, pods of another
    workload bound to them, events about those pods."""
    from bench.embedded_scale import rss_mib
    from launcher.core.presets import LABEL_NODEPOOL

    rss0, t = rss_mib(), time.perf_counter()
    store, res = cluster.store, cluster.res
    ready = [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
    for i in range(nodes):
        labels = {
            LABEL_NODEPOOL: f"other-pool-{i // 100}",
            "node.kubernetes.io/instance-type": "n2-standard-8",
        }
        store.create(
            res["nodes"], {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"other-{i}", "labels": labels},
                           "status": {"conditions": ready}},
        )  # fmt: skip
    for i in range(pods):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"web-{i}", "labels": {"app": "web", "shard": str(i % 50)}},
            "spec": {
                "nodeName": f"other-{i % max(nodes, 1)}",
                "containers": [{"name": "web", "image": "nginx"}],
            },
        }
        store.create(res["pods"], pod, "default")
    for i in range(events):
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"web-{i}.{i:x}"},
            "involvedObject": {"kind": "Pod", "name": f"web-{i % max(pods, 1)}", "namespace": "default"},
            "reason": ("Pulled", "Created", "Started")[i % 3],
            "message": "container web",
            "type": "Normal",
        }
        store.create(res["events"], event, "default")
    return {
        "unrelated_objects": nodes + pods + events,
        "load_s": round(time.perf_counter() - t, 1),
        "rss_mb_before": round(rss0),
        "rss_mb_after": round(rss_mib()),
    }


class Pauses:
    """This process's full cyclic-GC collections (time.time() start, seconds): a full collection
    over the store stops the API server from answering the controller."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, float]] = []
        self._t = 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t = time.time()
        elif info["generation"] == 2:
            self.seen.append((self._t, time.time() - self._t))

    def within(self, t0: float, t1: float) -> float:
        return sum(d for t, d in self.seen if t < t1 and t + d > t0)


def serve(args: argparse.Namespace) -> int:
    from bench.embedded_scale import build_cluster, rss_mib

    pauses = Pauses()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    cluster = build_cluster(args.slices, args.preset)

    def route(method: str, path: str, query: dict, body: bytes | None) -> tuple[int, dict]:
        action = path[len(ROUTE) :].strip("/")
        if method == "POST" and action == "load":
            got = json.loads(body or b"{}")
            return 200, add_load(cluster, int(got["nodes"]), int(got["pods"]), int(got["events"]))
        if action == "requests":
            with cluster.server._requests_lock:
                counted = [[verb, res, n] for (verb, res), n in cluster.server.requests.items()]
                if method == "POST":
                    cluster.server.requests.clear()
            return 200, {"requests": counted}
        if method == "POST" and action == "freeze":
            # Before the timed part, as the controller does with its own heap: a full collection
            # over the loaded store stalls this API server (the route answers how long), a pause a real
            # one (Go's concurrent GC) does not take, and the controller's PUT waited on it.
            t = time.perf_counter()
            gc.collect()
            gc.freeze()
            return 200, {"seconds": time.perf_counter() - t}
        if action == "gc":
            return 200, {"seconds": pauses.within(float(query["start"]), float(query["end"]))}
        if action == "rss":
            return 200, {"rss_mb": rss_mib()}
        return 404, {"message": f"no bench route {method} {action!r}"}

    cluster.server.add_route("POST", ROUTE, route)
    cluster.server.add_route("GET", ROUTE, route)
    try:
        info = {"pid": os.getpid(), "url": cluster.url, "kubeconfig": str(cluster.kubeconfig)}
        tmp = args.info.with_suffix(".tmp")
        tmp.write_text(json.dumps(info))
        tmp.replace(args.info)
        stop.wait()
    finally:
        cluster.stop()
    return 0


class ClusterProcess:
    """bench.scale_cluster started as a child process, and the calls the benchmark makes to it."""

    def __init__(self, slices: int, preset: str, workdir: Path, timeout: float = 300.0) -> None:
        info_file = workdir / "cluster.json"
        self.log = workdir / "cluster.log"
        cmd = [sys.executable, "-m", "bench.scale_cluster", "--slices", str(slices), "--preset", preset]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [*cmd, "--info", str(info_file)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout
        while not info_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"the embedded cluster did not come up (see {self.log})")
            time.sleep(0.1)
        info = json.loads(info_file.read_text())
        self.url, self.kubeconfig, self.pid = info["url"], Path(info["kubeconfig"]), info["pid"]

    def api_client(self) -> Any:
        from launcher.embedded.api import kubeconfig

        return kubeconfig.api_client(self.url)

    def _call(self, path: str, body: dict | None = None, timeout: float = 600.0) -> dict[str, Any]:
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode() if body is not None else None,
            method="POST" if body is not None else "GET",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read() or b"{}")

    def remove(self, pool: str) -> dict[str, Any]:
        return self._call("/embedded/v1/remove", {"nodepool": pool})

    def restore(self, pool: str) -> dict[str, Any]:
        return self._call("/embedded/v1/restore", {"nodepool": pool})

    def add_load(self, nodes: int, pods: int, events: int) -> dict[str, Any]:
        return self._call(ROUTE + "load", {"nodes": nodes, "pods": pods, "events": events})

    def requests(self, reset: bool = False) -> dict[str, int]:
        got = self._call(ROUTE + "requests", {} if reset else None)["requests"]
        return {f"{verb} {res}": n for verb, res, n in got}

    def freeze(self) -> float:
        return self._call(ROUTE + "freeze", {})["seconds"]

    def gc_within(self, t0: float, t1: float) -> float:
        return self._call(f"{ROUTE}gc?start={t0!r}&end={t1!r}")["seconds"]

    def rss_mib(self) -> float:
        return self._call(ROUTE + "rss")["rss_mb"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def main() -> int:
    ap = Parser(prog="python -m bench.scale_cluster")
    ap.add_argument("--slices", type=int, default=4)
    ap.add_argument("--preset", default="tpu7x-8x8x48")
    ap.add_argument("--info", type=Path, required=True, help="where to write pid, URL and kubeconfig")
    args = ap.parse_args()
    ap.at_least(args, 1, "slices")
    ap.shape(args.preset, args.slices)
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
