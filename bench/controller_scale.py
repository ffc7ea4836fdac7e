"""The controller at scale: a 4 x tpu7x-8x8x48 run (3,072 simulated pods on 3,072 nodes) loses a
node pool, first with the run alone in the cluster, then with unrelated load in the same namespace
and cluster (10,000 nodes of other pools, 20,000 pods of other workloads, 5,000 events). Its cost
should follow the run, not the cluster.

    .venv/bin/python -m bench.controller_scale [--slices 4] [--nodes 10000 --pods 20000 --events 5000] [--rounds 30] [--idle-s 60] [--json]

Three processes, as on a real cluster: the embedded cluster (simulate mode) runs in its own
(bench/scale_cluster.py), so the controller's requests compete with the cluster's work for cores,
not with this process's; the controller runs as `reslice watch RUN` in its own, so its memory is
its own: peak RSS (VmHWM) from /proc; this process submits, injects the fault (the cluster's
/embedded/v1/remove route, as `reslice cluster remove` does) and measures. Per phase, a fresh run
and a fresh controller process (whose caches list what exists then):

- pass_s: one reconcile pass, read from synced caches (a probe Controller in this process, which
  observes and decides but holds no Lease and writes nothing in a steady state), timed once the
  embedded cluster is quiet: the median of 30 rounds of 10 passes spread over ~10 s, each round
  after a pause (`timed_passes`; the reference loop's time beside it is `pass_ref_s`).
- idle_requests_per_min: requests the controller process makes at the embedded API while nothing
  changes (Lease renewals, watch reconnects), counted by the server over --idle-s.
- decision_latency_s: controller-owned, from the first watch event of the node-pool loss reaching
  the controller (the ledger's `woken_at`) to the run record written (the end-segment line); split
  into deciding (`woken_at` -> `decided_at`: the pass reads the caches, observes, decides) and the
  record's PUT (`decided_at` -> written: the API server's answer).
- rss_mb: the controller process's peak RSS.

Each decision line also says how long the embedded cluster's process spent in full cyclic-GC
collections during it: a stalled server delays the record's PUT, which the latency counts. Its heap
is collected and frozen once the run's pods run (POST /bench/v1/freeze), as the controller freezes
its own: a full collection over the loaded store stalls it inside a decision (docs/measurements.md),
a pause a real API server, with Go's concurrent GC, does not take.

With --json the last line printed is one JSON object with both phases and the ratios. With no
unrelated load (`--nodes 0 --pods 0 --events 0`) the run alone is measured once (its ratio 1).
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
from pathlib import Path

from bench import machine
from bench._cli import Parser
from bench.scale_cluster import ClusterProcess
from launcher.adapters.kube import Kube
from launcher.adapters.preset_files import make_shape
from launcher.adapters.rundir import RunDir
from launcher.controller.launch import create_run, prepare
from launcher.controller.loop import Controller
from launcher.core.labels import LABEL_RUN
from launcher.core.record import Knobs
from launcher.core.spec import RunSpec
from launcher.core.words import Action, LedgerKind, PodPhase
from tests.support.wait import wait_for


def proc_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_quiet(pid: int, share: float = 0.05, window_s: float = 0.5, timeout: float = 120.0) -> None:
    """Until process `pid` uses under `share` of a core: the embedded cluster is still encoding
    the probe's lists (20,000 foreign pods: ~9 CPU s) when its caches report synced, and on 2
    cores its work would be timed as the pass's."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = cpu_s(pid)
        time.sleep(window_s)
        if cpu_s(pid) - before < share * window_s:
            return
    print(f"the embedded cluster (pid {pid}) was still busy after {timeout:.0f} s: passes timed beside it")


# A steady pass is short, and a shared machine's speed moves from one second to the next
# (docs/measurements.md): passes in a row measure one moment, and the two phases' ratio swings
# with identical calls. So: rounds spread over seconds, each after a pause
# (the controller passes after waiting on its watches, the CPU's caches cold), the median of the rounds'
# medians, and a reference loop timed at each round to show the machine's speed beside it.
PASS_ROUNDS, PASSES_PER_ROUND, ROUND_PAUSE_S = 30, 10, 0.3


def timed_passes(probe: Controller, run: str, n_rounds: int = PASS_ROUNDS) -> dict[str, float]:
    rounds, cpus, refs = [], [], []
    t0 = time.perf_counter()
    for _ in range(n_rounds):
        time.sleep(ROUND_PAUSE_S)
        refs.append(machine.loop_s(60_000, best_of=1))
        wall, cpu = [], []
        for _ in range(PASSES_PER_ROUND):
            t, c = time.perf_counter(), time.thread_time()
            probe.reconcile(run)
            wall.append(time.perf_counter() - t)
            cpu.append(time.thread_time() - c)
        rounds.append(statistics.median(wall))
        cpus.append(statistics.median(cpu))
    return {
        "pass_s": statistics.median(rounds),
        "pass_cpu_s": statistics.median(cpus),
        "ref_s": statistics.median(refs),
        "over_s": time.perf_counter() - t0,
    }


def running(kube: Kube, run: str) -> int:
    return sum(p["status"].get("phase") == PodPhase.RUNNING for p in kube.pods(f"{LABEL_RUN}={run}"))


def phase(cluster, kube: Kube, tmp: Path, run: str, args) -> dict:
    shape = make_shape(args.preset, args.slices)
    spec = RunSpec(run=run, run_dir=str(tmp / run), global_batch=shape.devices * 12, grace_period_s=1)
    rec, _ = prepare(spec, args.preset, args.slices, Knobs(unschedulable_grace_s=5))
    create_run(kube, rec)
    first = Controller(kube)
    first.pass_once([run])  # segment 0, as `reslice launch` submits it
    first.release(run)
    t = time.perf_counter()
    wait_for(lambda: running(kube, run) == shape.hosts, 600, "all pods", interval=1.0)
    print(f"[{run}] {shape}: {shape.hosts} pods Running {time.perf_counter() - t:.1f} s after submit")
    print(f"[{run}] the embedded cluster's heap collected and frozen in {cluster.freeze():.2f} s")

    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "RESLICE_RESYNC_S": "30"}
    log = (tmp / f"{run}-controller.log").open("wb")
    ctl = subprocess.Popen([sys.executable, "-m", "launcher", "watch", run], env=env, stdout=log, stderr=log)
    try:
        ledger = lambda: RunDir(spec.run_dir).ledger()  # noqa: E731
        # Its caches are synced once its first pass has written an observation.
        wait_for(lambda: any(e.get("kind") == LedgerKind.OBSERVE and e["controller"] != first.identity for e in ledger()),
             300, "the controller's first pass")  # fmt: skip

        probe, halt = Controller(kube, own_process=True), threading.Event()
        probe.start_caches(halt)
        wait_for(probe.synced, 300, "the probe's caches")
        # Its heap collected and frozen, as `reslice watch` does once its caches have listed: else
        # the cyclic GC walks the 20,000 foreign pods' projections during the timed passes.
        probe._tune_process()
        probe.reconcile(run)
        wait_quiet(cluster.pid)
        woken = sum(probe.wakeups.values())
        passes = timed_passes(probe, run, args.rounds)
        woken = sum(probe.wakeups.values()) - woken
        halt.set()
        pass_s, pass_cpu_s = passes["pass_s"], passes["pass_cpu_s"]
        print(
            f"[{run}] one pass from the caches: median {pass_s * 1e3:.2f} ms"
            f" ({pass_cpu_s * 1e3:.2f} ms CPU of its thread; {args.rounds} rounds over"
            f" {passes['over_s']:.0f} s; the reference loop {passes['ref_s'] * 1e3:.2f} ms;"
            f" {woken} watch events meanwhile)"
        )

        time.sleep(2.0)  # the probe's watches close
        cluster.requests(reset=True)
        time.sleep(args.idle_s)
        idle = cluster.requests()
        per_min = sum(idle.values()) * 60 / args.idle_s
        print(f"[{run}] idle for {args.idle_s:.0f} s: {per_min:.1f} requests/min {idle}")

        pool = f"{args.preset}-np-{args.slices - 1}"
        t_fault = time.time()
        cluster.remove(pool)

        def ends() -> list[dict]:
            return [e for e in ledger() if e.get("action") == Action.END and e["time"] >= t_fault]

        wait_for(ends, 120, "the shrink decision", interval=0.05)
        end = ends()[0]
        latency = end["time"] - end["woken_at"]
        decide_s = end["decided_at"] - end["woken_at"]
        server_gc = cluster.gc_within(end["woken_at"], end["time"])
        print(f"[{run}] lost {pool}: record written {latency * 1e3:.0f} ms after the first watch event "
              f"(deciding {decide_s * 1e3:.0f} ms, the record's PUT {(latency - decide_s) * 1e3:.0f} ms) "
              f"({(end['time'] - t_fault) * 1e3:.0f} ms after the fault; zero-grace: {end.get('zero_grace', False)}; "
              f"the API server's process in full GC for {server_gc * 1e3:.0f} ms of it)")  # fmt: skip
        wait_for(
            lambda: (g := kube.get_record(run)) is not None and len(g[0].segments) > 1,
            600,
            "the next segment",
            interval=1.0,
        )
        rss = proc_mib(ctl.pid, "VmHWM")
    finally:
        ctl.terminate()
        ctl.wait(timeout=30)
    # Leave the cluster as it was: no JobSet of this run, the pool back.
    for js in kube.jobsets(run):
        kube.delete_jobset(js["metadata"]["name"])
    kube.delete_record(run)
    wait_for(lambda: not kube.pods(f"{LABEL_RUN}={run}"), 600, "the run's pods gone", interval=1.0)
    cluster.restore(pool)
    return {
        "pods": shape.hosts,
        "pass_s": round(pass_s, 6),
        "pass_cpu_s": round(pass_cpu_s, 6),
        "pass_ref_s": round(passes["ref_s"], 5),
        "decision_latency_s": round(latency, 4),
        "deciding_s": round(decide_s, 4),
        "fault_to_decision_s": round(end["time"] - t_fault, 4),
        "server_gc_during_decision_s": round(server_gc, 4),
        "rss_mb": round(rss),
        "idle_requests_per_min": round(per_min, 1),
    }


def main() -> None:
    ap = Parser(prog="python -m bench.controller_scale")
    ap.add_argument("--slices", type=int, default=4)
    ap.add_argument("--preset", default="tpu7x-8x8x48")
    ap.add_argument("--nodes", type=int, default=10_000, help="unrelated nodes (other pools)")
    ap.add_argument("--pods", type=int, default=20_000, help="unrelated pods (another workload)")
    ap.add_argument("--events", type=int, default=5_000, help="unrelated events")
    ap.add_argument("--idle-s", type=float, default=60.0, help="how long to count idle requests")
    ap.add_argument("--rounds", type=int, default=PASS_ROUNDS, help="timed rounds of passes per phase")
    ap.add_argument("--json", action="store_true", help="print one JSON line last")
    args = ap.parse_args()
    if args.slices < 2:  # the run loses a node pool: with one slice there is nothing to shrink to
        ap.error(f"--slices {args.slices}: the run loses a slice and shrinks, so it needs at least 2")
    ap.at_least(args, 0, "nodes", "pods", "events")
    ap.at_least(args, 1, "rounds")
    if args.idle_s <= 0:
        ap.error(f"--idle-s {args.idle_s}: nothing to count idle requests over (more than 0)")
    ap.shape(args.preset, args.slices)
    tmp = Path(tempfile.mkdtemp())
    loop_before = machine.loop_s()
    cluster = ClusterProcess(args.slices, args.preset, tmp)
    try:
        kube = Kube(cluster.api_client(), "default")
        alone = phase(cluster, kube, tmp, "alone", args)
        if args.nodes or args.pods or args.events:
            embedded = cluster.add_load(args.nodes, args.pods, args.events)
            print(f"unrelated load: {embedded}")
            loaded = phase(cluster, kube, tmp, "loaded", args)
        else:  # no unrelated load: a second phase would repeat the first
            embedded, loaded = {"unrelated_objects": 0}, alone
        embedded["rss_mb_end"] = round(cluster.rss_mib())
    finally:
        cluster.stop()
    out = {
        "pods": loaded["pods"],
        "unrelated_objects": embedded["unrelated_objects"],
        **{k: loaded[k] for k in ("pass_s", "decision_latency_s", "rss_mb", "idle_requests_per_min")},
        "unrelated_ratio": round(loaded["pass_s"] / alone["pass_s"], 2),
        "alone": alone,
        "loaded": loaded,
        "embedded": embedded,
        # Seconds of bench/machine.py's reference loop before and after: the hour's speed.
        "machine_loop_s": [round(loop_before, 3), round(machine.loop_s(), 3)],
    }
    print(f"with {out['unrelated_objects']} unrelated objects: pass {loaded['pass_s'] * 1e3:.1f} ms "
          f"(x{out['unrelated_ratio']} alone), decision {loaded['decision_latency_s'] * 1e3:.0f} ms, "
          f"controller peak RSS {loaded['rss_mb']} MiB, {loaded['idle_requests_per_min']} idle requests/min")  # fmt: skip
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
