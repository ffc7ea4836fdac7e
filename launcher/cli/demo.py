"""`reslice demo`: the whole story on this machine, in a few minutes.

An embedded cluster with two node pools of tpu7x-2x2x2 (two hosts each: the smallest slice GKE
runs as a multislice); a run of the MoE `tiny` config on 2 slices (32 JAX devices, 4 trainer
processes); one slice's capacity removed part-way — the controller resumes the run on the other
slice at the same global batch (micro-batch 2 per device instead of 1); capacity restored — it
grows back to 2 slices; then the segment table, the goodput and the plots.

`runtime`: the kubelet runs each trainer pod as local processes (the default) or as `podman run` of
the trainer image `python3.11 dev.py images` built (PodRuntime.PODMAN), the run directory mounted
at its own path in each container.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from rich.console import Console

from launcher.adapters.kube import Kube
from launcher.adapters.rundir import RunDir
from launcher.cli.watch import watch_run
from launcher.controller.launch import create_run, prepare
from launcher.core.errors import ClusterNotReady
from launcher.core.record import Knobs
from launcher.core.spec import RunSpec
from launcher.core.words import PodRuntime
from launcher.embedded.cluster import EmbeddedCluster, NodePoolSpec, runtime_unavailable
from launcher.report.io import summarize

PRESET = "tpu7x-2x2x2"
SLICES = 2
GLOBAL_BATCH = 32
INTERVAL = 5  # checkpoint every 5 steps
LOSE_AT = 5  # lose one slice once step 5 is committed
DEFAULT_STEPS = 30


def _wait(cond, stop: threading.Event, poll: float = 0.5) -> bool:
    while not stop.is_set():
        if cond():
            return True
        stop.wait(poll)
    return False


def fault_script(cluster: EmbeddedCluster, kube: Kube, run: str, console: Console, stop: threading.Event,
                 lose_at: int) -> None:  # fmt: skip
    """Take all slices but one away once the run has committed step `lose_at`; give them back as soon as
    the trainer has taken a step on the smaller shape. The controller then grows the run back at
    that segment's first checkpoint (it never tears down a segment that has not committed one), so
    the resume at the same global batch is always there to see, however fast this machine is."""
    rundir = RunDir(kube.get_record(run)[0].spec.run_dir)
    pools = [f"{PRESET}-np-{i}" for i in range(1, SLICES)]
    if not _wait(lambda: (rundir.latest_committed_step() or 0) >= lose_at, stop):
        return
    console.log(f"[bold red]fault:[/] node pools {', '.join(pools)} lost (nodes deleted, pods killed)")
    for pool in pools:
        cluster.remove(pool)

    def stepping_on_one_slice() -> bool:
        seg = kube.get_record(run)[0].current
        return (
            seg is not None
            and seg.slices == 1
            and (rundir.latest_metrics() or {}).get("segment") == seg.index
        )

    if not _wait(stepping_on_one_slice, stop, poll=0.2):
        return
    console.log(f"[bold green]capacity back:[/] node pools {', '.join(pools)} restored")
    for pool in pools:
        cluster.restore(pool)


def run_demo(
    workdir: Path,
    steps: int = DEFAULT_STEPS,
    console: Console | None = None,
    runtime: str = PodRuntime.PROCESS,
) -> str:
    console = console or Console()
    if why := runtime_unavailable(runtime, RunSpec.image):
        raise ClusterNotReady(f"--runtime podman: {why}")
    # Trainer processes started by the embedded kubelet share one compilation cache: a shape
    # compiled once is loaded by every later segment.
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path.home() / ".cache" / "reslice" / "jax"))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    workdir.mkdir(parents=True, exist_ok=True)
    run = f"demo-{time.strftime('%H%M%S')}"
    spec = RunSpec(
        run=run,
        run_dir=str((workdir / run).resolve()),
        global_batch=GLOBAL_BATCH,
        config="tiny",
        overrides=(f"train.steps={steps}", f"checkpoint.interval={INTERVAL}", "moe.ragged_buffer_factor=0"),
        grace_period_s=30,
        heartbeat_timeout_s=10,
        image_pull_policy="Never",
    )
    # A short stability window: the run grows back at the first checkpoint after capacity returns.
    knobs = Knobs(unschedulable_grace_s=30, grow_window_s=1, app_backoff_s=2)
    rec, ladder = prepare(spec, PRESET, SLICES, knobs)
    (workdir / "pods").mkdir(exist_ok=True)
    nodepools = [NodePoolSpec(PRESET, count=SLICES)]
    cluster = EmbeddedCluster(
        nodepools=nodepools,
        mode="process",
        workdir=workdir / "pods",
        runtime=runtime,
        shared=(workdir.resolve(),),
    )
    with cluster:
        kube = Kube(cluster.api_client(), "default")
        console.rule(f"reslice demo: {run}")
        console.print(
            f"embedded cluster at {cluster.url} with {SLICES} node pools of {PRESET} ({runtime} runtime"
            + (f", image {spec.image}" if runtime == PodRuntime.PODMAN else "")
            + ") "
            f"(kubeconfig {cluster.kubeconfig}); run directory {spec.run_dir}"
        )
        console.print(
            "shrink ladder: "
            + "; ".join(
                f"{r.shape}: {r.plan.micro_batch}×{r.plan.grad_accum}"
                if r.feasible
                else f"{r.shape}: infeasible"
                for r in ladder
            )
        )
        create_run(kube, rec)
        stop = threading.Event()
        faults = threading.Thread(
            target=fault_script,
            args=(cluster, kube, run, console, stop, LOSE_AT),
            name="faults",
            daemon=True,
        )
        faults.start()
        try:
            state = watch_run(kube, run, console=console, resync_s=1.0, lease_s=10)
        finally:
            stop.set()
            faults.join(timeout=5)
        summarize(kube, run, console)
        return state
