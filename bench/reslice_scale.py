"""Reslice in place at the seeds' scale: a 4 x tpu7x-8x8x48 run (3,072 simulated pods on 3,072
nodes) loses one slice, restarting by recreate and then in place, side by side.

    .venv/bin/python -m bench.reslice_scale [--slices 4] [--watchers 64] [--json]

The embedded cluster (simulate mode: pods run no process) runs in its own process
(bench/scale_cluster.py), the controller as `reslice watch RUN` in its own; this process submits
the run, injects the fault (the cluster's /embedded/v1/remove route) and measures. Per mode, a fresh
run and controller:

- pods_deleted, pods_created: the run's pods (by uid) that existed before the fault and not once the
  next shape runs, and those that exist then and did not before.
- api_writes: create/update/patch/delete requests the API server served from the fault until the
  next shape runs (the controller's; the embedded cluster's own controllers write to its store, not
  through HTTP, as kube-controller-manager would), by verb and resource; the Lease renewals in that
  window (every half lease, whatever happens) are `lease_renewals`, apart.
- in place, epoch_published_s: the controller's part, from the first watch event of the loss
  reaching it (the ledger's `woken_at`) to the world's publication time (`published`, stamped just
  before its one write), split into epoch_decided_s (observing and deciding) and
  epoch_decided_to_published_s (the record's compare-and-swap, then the world built); epoch_seen_max_s / epoch_seen_median_s: from publication until each of
  --watchers sampled supervisors' world sources (trainer.elastic.world_source, the class a pod's supervisor
  runs, each on its own connection as every pod has its own) delivered it. 2,304 watchers would be
  threads of this one process competing for its interpreter; a sample of them measures the API
  server's fan-out of one ConfigMap change, which is what grows with the pods.

With --json the last line printed is one JSON object: per mode its figures.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from bench._cli import Parser
from bench.scale_cluster import ClusterProcess
from contract.words import RestartMode
from launcher.adapters.kube import Kube
from launcher.adapters.preset_files import make_shape
from launcher.adapters.rundir import RunDir
from launcher.controller.launch import create_run, prepare
from launcher.controller.loop import Controller
from launcher.core.labels import LABEL_RUN, world_configmap_name
from launcher.core.record import Knobs
from launcher.core.spec import RunSpec
from launcher.core.words import LedgerKind, PodPhase
from tests.support.wait import wait_for
from trainer.elastic import world_source

WRITES = {"create", "update", "patch", "delete", "deletecollection"}


class Watchers:
    """`n` world sources, as `n` pods' supervisors run them: when each saw each epoch."""

    def __init__(self, url: str, namespace: str, name: str, n: int) -> None:
        self.seen: dict[int, list[float]] = {}
        self.lock = threading.Lock()
        env = {
            "RESLICE_WORLD_CONFIGMAP": name,
            "RESLICE_WORLD_NAMESPACE": namespace,
            "RESLICE_WORLD_API": url,
        }
        self.sources = [world_source.from_env(env) for _ in range(n)]
        for src in self.sources:
            src.start(self._document, lambda problem: None)

    def _document(self, data: bytes) -> None:
        now = time.time()
        epoch = json.loads(data)["epoch"]
        with self.lock:
            self.seen.setdefault(epoch, []).append(now)

    def count(self, epoch: int) -> int:
        with self.lock:
            return len(self.seen.get(epoch, ()))

    def stop(self) -> None:
        for src in self.sources:
            src.stop()


def run_pods(kube: Kube, run: str) -> dict[str, dict]:
    return {p["metadata"]["uid"]: p for p in kube.pods(f"{LABEL_RUN}={run}")}


def running(pods: dict[str, dict]) -> int:
    return sum(
        p["status"].get("phase") == PodPhase.RUNNING and not p["metadata"].get("deletionTimestamp")
        for p in pods.values()
    )


def phase(cluster: ClusterProcess, kube: Kube, tmp: Path, mode: str, args) -> dict:
    run = f"rs-{mode.replace('-', '')}"
    shape = make_shape(args.preset, args.slices)
    spec = RunSpec(
        run=run, run_dir=str(tmp / run), global_batch=shape.devices * 12, grace_period_s=1, restart_mode=mode,
        world_api=cluster.url if mode == RestartMode.IN_PLACE else None,
    )  # fmt: skip
    rec, _ = prepare(spec, args.preset, args.slices, Knobs(unschedulable_grace_s=5, grow=False))
    create_run(kube, rec)
    first = Controller(kube)
    first.pass_once([run])  # segment 0, as `reslice launch` submits it
    first.release(run)
    wait_for(lambda: running(run_pods(kube, run)) == shape.hosts, 900, "all pods", interval=1.0)
    print(f"[{mode}] {shape}: {shape.hosts} pods Running", flush=True)
    cluster.freeze()
    watchers = (
        Watchers(cluster.url, kube.namespace, world_configmap_name(run), args.watchers)
        if mode == RestartMode.IN_PLACE
        else None
    )
    if watchers:
        wait_for(lambda: watchers.count(0) == args.watchers, 120, "every watcher's first world")

    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "RESLICE_RESYNC_S": "30"}
    log = (tmp / f"{run}-controller.log").open("wb")
    ctl = subprocess.Popen([sys.executable, "-m", "launcher", "watch", run], env=env, stdout=log, stderr=log)
    try:
        ledger = lambda: RunDir(spec.run_dir).ledger()  # noqa: E731
        wait_for(lambda: any(e.get("kind") == LedgerKind.OBSERVE and e["controller"] != first.identity for e in ledger()),
                 300, "the controller's first pass")  # fmt: skip
        time.sleep(2.0)
        before = run_pods(kube, run)
        pool = f"{args.preset}-np-{args.slices - 1}"
        cluster.requests(reset=True)
        t_fault = time.time()
        cluster.remove(pool)
        got = wait_for(
            lambda: (g := kube.get_record(run)) is not None and len(g[0].segments) > 1 and g,
            600,
            "the next segment",
            interval=0.2,
        )
        rec = got[0]
        nxt = rec.segments[1]
        want = nxt.slices * shape.preset.hosts

        def settled() -> bool:
            pods = run_pods(kube, run)
            return running(pods) == want and len(pods) == want

        if watchers:
            wait_for(
                lambda: watchers.count(1) == args.watchers, 60, "every watcher's new world", interval=0.01
            )
        wait_for(settled, 900, "the next shape running", interval=1.0)
        writes = cluster.requests()
        after = run_pods(kube, run)
    finally:
        ctl.terminate()
        ctl.wait(timeout=30)
        if watchers:
            watchers.stop()
    act = next(e for e in ledger() if e.get("kind") == LedgerKind.ACT and e["time"] >= t_fault)
    counted = Counter(
        {
            k: v
            for k, v in writes.items()
            if k.split()[0] in WRITES and not k.split()[1].startswith("embedded")
        }
    )
    # Lease renewals come every half lease whatever happens: counted apart, not as the reshape's.
    renewals = sum(v for k, v in counted.items() if k.split()[1] == "leases")
    counted = Counter({k: v for k, v in counted.items() if k.split()[1] != "leases"})
    out = {
        "pods": shape.hosts,
        "pods_deleted": len(set(before) - set(after)),
        "pods_created": len(set(after) - set(before)),
        "api_writes": sum(counted.values()),
        "api_writes_by_kind": dict(sorted(counted.items())),
        "lease_renewals": renewals,
        "decision": act["action"],
        "fault_to_record_s": round(act["time"] - t_fault, 4),
    }
    if watchers:
        world_cm = kube.world(world_configmap_name(run))
        assert world_cm is not None, "the run's world was never published"
        published = json.loads(world_cm["data"]["world.json"])["published"]
        seen = [t - published for t in watchers.seen[1]]
        out |= {
            "epoch_published_s": round(published - act["woken_at"], 4),
            # Of it: observing and deciding, then from the decision to the world's publication
            # (the record's compare-and-swap, then the world document built).
            "epoch_decided_s": round(act["decided_at"] - act["woken_at"], 4),
            "epoch_decided_to_published_s": round(published - act["decided_at"], 4),
            "epoch_seen_max_s": round(max(seen), 4),
            "epoch_seen_median_s": round(statistics.median(seen), 4),
            "watchers": len(seen),
        }
    print(f"[{mode}] " + json.dumps(out), flush=True)
    # Leave the cluster as it was: no JobSet of this run, the pool back.
    for js in kube.jobsets(run):
        kube.delete_jobset(js["metadata"]["name"])
    kube.delete_record(run)
    kube.delete_world(world_configmap_name(run))  # and its access objects (owned by it)
    wait_for(lambda: not kube.pods(f"{LABEL_RUN}={run}"), 900, "the run's pods gone", interval=1.0)
    cluster.restore(pool)
    return out


def main() -> None:
    ap = Parser(prog="python -m bench.reslice_scale")
    ap.add_argument("--slices", type=int, default=4)
    ap.add_argument("--preset", default="tpu7x-8x8x48")
    ap.add_argument("--watchers", type=int, default=64, help="sampled supervisors' world sources")
    ap.add_argument("--modes", default="recreate,in-place")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.slices < 2:  # one slice is lost and the run goes on on the rest
        ap.error(f"--slices {args.slices}: the run loses a slice and goes on, so it needs at least 2")
    ap.at_least(args, 1, "watchers")
    modes = [m for m in args.modes.split(",") if m]
    known = [m.value for m in RestartMode]
    if not modes or any(m not in known for m in modes):
        ap.error(f"--modes {args.modes!r}: one or both of {','.join(known)}")
    ap.shape(args.preset, args.slices)
    results = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        cluster = ClusterProcess(args.slices, args.preset, tmp)
        try:
            kube = Kube(cluster.api_client(), "default")
            for mode in modes:
                results[mode] = phase(cluster, kube, tmp, mode, args)
        finally:
            cluster.stop()
    for mode, r in results.items():
        words = f"{mode}: {r['pods_deleted']} pods deleted, {r['pods_created']} created, {r['api_writes']} API writes"
        if "epoch_published_s" in r:
            words += (
                f"; the new world published {r['epoch_published_s'] * 1e3:.0f} ms after the first watch event,"
                f" seen by all {r['watchers']} sampled supervisors within {r['epoch_seen_max_s'] * 1e3:.0f} ms"
                f" (median {r['epoch_seen_median_s'] * 1e3:.0f} ms)"
            )
        print(words)
    if args.json:
        print(json.dumps(results, sort_keys=True))


if __name__ == "__main__":
    main()
