"""The embedded cluster at scale: 4 x tpu7x-8x8x48 in simulate mode — 3,072 pods on 3,072 fake nodes
in 4 node pools. Prints figures; not a timed test.

    .venv/bin/python -m bench.embedded_scale [--slices 4] [--preset tpu7x-8x8x48] [--samples 20]

Measured: time to create the nodes, to create and schedule every pod of one JobSet (and to see them
all Running), list latency at that size through the official client (typed and raw), watch latency
(a write to its event on an open watch), the time to open a watch that replays everything, and the
process's memory (RSS; the store's share with --tracemalloc, which slows everything down).

`build_cluster()` is the fixture for the controller's scale benchmark: the same cluster, started.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

from kubernetes import client, watch

from bench._cli import Parser
from launcher.adapters.preset_files import make_shape
from launcher.core.render import render_jobset
from launcher.core.spec import RunSpec
from launcher.core.words import PodPhase
from launcher.embedded.cluster import EmbeddedCluster, NodePoolSpec


def build_cluster(
    slices: int = 4, preset: str = "tpu7x-8x8x48", state_dir: Path | None = None, **kw: Any
) -> EmbeddedCluster:
    """A started simulate-mode cluster with `slices` node pools of `preset` (stop it when done)."""
    return EmbeddedCluster(
        [NodePoolSpec(preset, count=slices)], mode="simulate", state_dir=state_dir, **kw
    ).start()


def scale_jobset(slices: int = 4, preset: str = "tpu7x-8x8x48", run: str = "scale") -> dict[str, Any]:
    """The renderer's JobSet for `slices` x `preset` (the pods never run in simulate mode)."""
    shape = make_shape(preset, slices)
    spec = RunSpec(run=run, run_dir=f"/tmp/{run}", global_batch=shape.devices * 2)
    return render_jobset(spec, shape)


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _ms(xs: list[float]) -> str:
    xs = sorted(xs)
    p95 = xs[min(len(xs) - 1, int(0.95 * len(xs)))]
    return f"median {statistics.median(xs) * 1e3:7.1f} ms   p95 {p95 * 1e3:7.1f} ms   (n={len(xs)})"


def _wait(pred: Any, timeout: float, poll: float = 0.02) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(poll)
    raise TimeoutError(f"not reached in {timeout:.0f} s")


def main(argv: list[str] | None = None) -> None:
    ap = Parser(prog="python -m bench.embedded_scale")
    ap.add_argument("--slices", type=int, default=4)
    ap.add_argument("--preset", default="tpu7x-8x8x48")
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--tracemalloc", action="store_true", help="Also trace Python allocations (slow).")
    args = ap.parse_args(argv)
    ap.at_least(args, 1, "slices", "samples")
    ap.shape(args.preset, args.slices)
    if args.tracemalloc:
        tracemalloc.start()
    rss0 = rss_mib()
    t0 = time.monotonic()
    cluster = build_cluster(args.slices, args.preset)
    t_nodes = time.monotonic() - t0
    try:
        _run(cluster, args, t_nodes, rss0)
    finally:
        cluster.stop()


def _run(cluster: EmbeddedCluster, args: argparse.Namespace, t_nodes: float, rss0: float) -> None:
    store, res = cluster.store, cluster.res
    n_nodes = len(store.list(res["nodes"])[0])
    api = cluster.api_client()
    # Any: with _preload_content=False the client answers urllib3's response, which its
    # annotations do not model (they name the decoded list).
    core: Any = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    js = scale_jobset(args.slices, args.preset)
    hosts = make_shape(args.preset, args.slices).hosts
    print(
        f"embedded cluster: {len(cluster.pools)} node pools x {args.preset}, {n_nodes} nodes ({t_nodes:.2f} s to start)"
    )

    # Progress from the cluster's event hub (cheap), not by listing 3,072 pods in a loop (that
    # costs more CPU than the cluster itself and slows what is being measured).
    created: set[str] = set()
    bound: set[str] = set()
    running: set[str] = set()
    ready = threading.Event()

    def on_event(ev: str, r: Any, obj: dict[str, Any]) -> None:
        if r.plural == "pods" and ev != "DELETED":
            uid = obj["metadata"]["uid"]
            created.add(uid)
            if obj["spec"].get("nodeName"):
                bound.add(uid)
            if (obj.get("status") or {}).get("phase") == PodPhase.RUNNING:
                running.add(uid)
        elif r.plural == "jobsets":
            rjs = (obj.get("status") or {}).get("replicatedJobsStatus") or [{}]
            if rjs[0].get("ready") == args.slices:
                ready.set()

    unsub = cluster.hub.subscribe(on_event)
    t0 = time.monotonic()
    custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "default", "jobsets", js)
    t_created = _wait(lambda: len(created) == hosts, 600)
    t_bound = _wait(lambda: len(bound) == hosts, 600) + t_created
    t_running = _wait(lambda: len(running) == hosts, 600) + t_bound
    t_ready = _wait(ready.is_set, 600) + t_running
    unsub()
    cluster.settle(120)
    print(
        f"JobSet of {hosts} pods: all created {t_created:6.2f} s, all scheduled {t_bound:6.2f} s, "
        f"all Running {t_running:6.2f} s, JobSet ready {t_ready:6.2f} s (from create)"
    )
    print(f"  ({time.monotonic() - t0:.2f} s until every component was idle)")
    rss_settled = rss_mib()
    print(
        f"memory after scheduling: RSS {rss_settled:.0f} MiB ({rss_settled - rss0:+.0f} MiB since start: store, "
        f"API server, controllers' caches, {n_nodes} nodes, {hosts} pods, their events)"
    )
    # The client's objects live in this process too: move what exists now out of the cyclic GC's
    # way, or full collections over the store's ~1 GB of dicts dominate the tail latencies below.
    gc.collect()
    gc.freeze()

    n = args.samples
    typed, raw, nodes_l, sel = [], [], [], []
    for _ in range(n):
        t = time.monotonic()
        items = core.list_namespaced_pod("default").items
        typed.append(time.monotonic() - t)
        assert len(items) == hosts
        t = time.monotonic()
        data = core.list_namespaced_pod("default", _preload_content=False).data
        raw.append(time.monotonic() - t)
        body = json.loads(data)
        assert len(body["items"]) == hosts
        t = time.monotonic()
        core.list_node(_preload_content=False).data  # noqa: B018 - the transfer is what is timed
        nodes_l.append(time.monotonic() - t)
        t = time.monotonic()
        _ = core.list_namespaced_pod(
            "default", label_selector="jobset.sigs.k8s.io/job-index=1", _preload_content=False
        ).data
        sel.append(time.monotonic() - t)
    print(f"list {hosts} pods, typed client objects : {_ms(typed)}")
    print(f"list {hosts} pods, response bytes        : {_ms(raw)}  ({len(data) / 2**20:.1f} MiB)")
    print(f"list {n_nodes} nodes, response bytes       : {_ms(nodes_l)}")
    print(f"list {hosts // args.slices} pods by label selector, bytes : {_ms(sel)}")

    # Watch latency: write a label, time until the event arrives on an open watch.
    rv = core.list_namespaced_pod("default", limit=1).metadata.resource_version
    target = store.list(res["pods"])[0][0]["metadata"]["name"]
    got: dict[str, float] = {}
    w = watch.Watch()
    stop = threading.Event()

    def reader() -> None:
        try:
            for ev in w.stream(
                core.list_namespaced_pod,
                "default",
                resource_version=rv,
                timeout_seconds=120,
                _preload_content=False,
            ):
                lbl = (ev["raw_object"]["metadata"].get("labels") or {}).get("bench")
                if lbl and lbl not in got:
                    got[lbl] = time.monotonic()
        except Exception:
            if not stop.is_set():
                raise

    threading.Thread(target=reader, daemon=True).start()
    time.sleep(0.3)
    lat = []
    for i in range(n):
        t = time.monotonic()
        core.patch_namespaced_pod(target, "default", {"metadata": {"labels": {"bench": str(i)}}})
        _wait(lambda i=i: str(i) in got, 30, 0.001)
        lat.append(got[str(i)] - t)
    stop.set()
    w.stop()
    print(f"watch latency (patch -> event)          : {_ms(lat)}")
    replay = []
    for _ in range(max(3, n // 5)):
        t = time.monotonic()
        resp = core.list_namespaced_pod("default", watch=True, timeout_seconds=30, _preload_content=False)
        k = 0
        for chunk in resp.stream(1 << 16):
            k += chunk.count(b"\n")
            if k >= hosts:
                break
        resp.release_conn()
        replay.append(time.monotonic() - t)
    print(f"watch from scratch, {hosts} ADDED events : {_ms(replay)} (raw stream, no client decoding)")
    print(
        f"memory at the end: RSS {rss_mib():.0f} MiB (with the client's objects); "
        f"store resourceVersion {store.resource_version}"
    )
    if tracemalloc.is_tracing():
        cur, peak = tracemalloc.get_traced_memory()
        print(f"tracemalloc: {cur / 2**20:.0f} MiB live, {peak / 2**20:.0f} MiB peak")


if __name__ == "__main__":
    main()
