"""The controller at scale: a 4 x tpu7x-8x8x48 run (3,072 simulated pods on 3,072 nodes) loses a
node pool; how long until the controller decides, and how much memory does it take?

    .venv/bin/python -m bench.controller_scale [--slices 4] [--losses 3]

The embedded cluster runs in simulate mode in this process; the controller runs as `reslice watch
RUN` in its own process (as in a cluster), so its memory is its own: peak RSS (VmHWM) from /proc.
Decision latency = the ledger time of the end-segment decision minus the time the node pool was
removed (watch delivery, one full observation of 3,072 pods + 3,072 nodes, the policy, the
record's compare-and-swap). Pass time = how long one reconcile pass takes at that size.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.embedded_scale import build_cluster, rss_mib
from launcher.controller import Controller
from launcher.kube import Kube
from launcher.launch import create_run, prepare
from launcher.presets import make_shape
from launcher.record import Policy
from launcher.render import RunSpec
from launcher.runs import RunDir


def wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def proc_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slices", type=int, default=4)
    ap.add_argument("--preset", default="tpu7x-8x8x48")
    ap.add_argument("--losses", type=int, default=3, help="node pools lost one after another")
    args = ap.parse_args()
    shape = make_shape(args.preset, args.slices)
    # A global batch every rung of the ladder down to one slice can divide.
    gb = shape.preset.devices * 12
    cluster = build_cluster(args.slices, args.preset)
    tmp = Path(tempfile.mkdtemp())
    try:
        kube = Kube(cluster.api_client(), "default")
        spec = RunSpec(run="scale", run_dir=str(tmp / "scale"), global_batch=gb, grace_period_s=1)
        rec, _ = prepare(spec, args.preset, args.slices, Policy(unschedulable_grace_s=5))
        create_run(kube, rec)
        pods = lambda: kube.pods("reslice.dev/run=scale")  # noqa: E731
        t = time.perf_counter()
        passes = Controller(kube)
        passes.pass_once(["scale"])  # segment 0, from this process: measures one pass
        wait(
            lambda: sum(p["status"].get("phase") == "Running" for p in pods()) == shape.hosts, 300, "all pods"
        )
        print(f"{shape}: {shape.hosts} pods Running {time.perf_counter() - t:.1f} s after submit")
        pass_times = []
        for _ in range(5):
            t = time.perf_counter()
            passes.reconcile("scale")
            pass_times.append(time.perf_counter() - t)
        print(f"one reconcile pass at {shape.hosts} pods / {len(kube.nodes())} nodes: "
              f"median {statistics.median(pass_times) * 1e3:.0f} ms")  # fmt: skip
        passes.release("scale")  # hand the run to the controller process below
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "RESLICE_RESYNC_S": "30"}
        log = (tmp / "controller.log").open("wb")
        ctl = subprocess.Popen(
            [sys.executable, "-m", "launcher", "watch", "scale"], env=env, stdout=log, stderr=log
        )
        time.sleep(5)
        latencies = []
        for i in range(1, args.losses + 1):
            pool = f"{args.preset}-np-{args.slices - i}"
            before = len(kube.get_record("scale")[0].segments)
            t_fault = time.time()
            cluster.remove(pool)

            def ends(t: float = t_fault) -> list[dict]:
                ledger = RunDir(spec.run_dir).ledger()
                return [e for e in ledger if e.get("action") == "end-segment" and e["time"] >= t]

            wait(ends, 120, "the shrink decision")
            latencies.append(ends()[0]["time"] - t_fault)
            wait(lambda b=before: len(kube.get_record("scale")[0].segments) > b, 600, "the next segment")
            seg = kube.get_record("scale")[0].current
            print(
                f"lost {pool}: decided in {latencies[-1] * 1e3:.0f} ms -> {seg.preset} x{seg.slices}, submitted "
                f"{seg.submitted_at - t_fault:.1f} s after the loss (once the old pods were gone)"
            )
            want = seg.slices * shape.preset.hosts
            wait(
                lambda w=want: sum(p["status"].get("phase") == "Running" for p in pods()) == w,
                300,
                "new pods",
            )
        print(f"decision latency after a node-pool loss: median {statistics.median(latencies) * 1e3:.0f} ms "
              f"(n={len(latencies)})")  # fmt: skip
        print(f"controller process memory: peak RSS {proc_mib(ctl.pid, 'VmHWM'):.0f} MiB, "
              f"now {proc_mib(ctl.pid, 'VmRSS'):.0f} MiB; embedded cluster + bench process RSS {rss_mib():.0f} MiB")  # fmt: skip
        ctl.terminate()
        ctl.wait(timeout=30)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
