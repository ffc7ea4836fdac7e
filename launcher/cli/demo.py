"""`reslice demo`: the whole story on this machine, in a few minutes.

An embedded cluster with two node pools of tpu7x-2x2x2 (two hosts each: the smallest slice GKE
runs as a multislice); a run of the MoE `tiny` config on 2 slices (32 JAX devices, 4 trainer
processes); slice 1's capacity removed part-way — the controller resumes the run on slice 0 at the
same global batch (micro-batch 2 per device instead of 1); capacity restored — it grows back to 2
slices; then the segment table (where each segment's state came from, the steps recomputed), what
became of slice 0's pods, the goodput and the plots.

`restart_mode`: in place (the default) slice 0's pods stay and follow each new world, the state
from their own memory on the shrink and from a peer on the grow, and the storage checkpoint is
sparse (every IN_PLACE_INTERVAL steps) so that neither needs it; recreate every shape change is a
new JobSet that restores from the run directory (a checkpoint every INTERVAL steps).

`runtime`: the kubelet runs each trainer pod as local processes (the default) or as `podman run` of
the trainer image `python3.11 dev.py images` built (PodRuntime.PODMAN), the run directory mounted
at its own path in each container.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from contract.words import RestartMode
from launcher.adapters.kube import Kube
from launcher.adapters.rundir import RunDir
from launcher.cli.watch import watch_run
from launcher.controller.launch import create_run, prepare
from launcher.core.errors import ClusterNotReady, UserError
from launcher.core.labels import LABEL_JOB_INDEX, LABEL_RUN, LABEL_SLICE
from launcher.core.plan import Plan, Rung
from launcher.core.record import Knobs, RunRecord
from launcher.core.spec import RunSpec
from launcher.core.words import PodRuntime
from launcher.embedded.cluster import EmbeddedCluster, NodePoolSpec, runtime_unavailable
from launcher.report.io import summarize

PRESET = "tpu7x-2x2x2"
SLICES = 2
GLOBAL_BATCH = 32
INTERVAL = 5  # recreate: a storage checkpoint every 5 steps
IN_PLACE_INTERVAL = 20  # in place: the state comes from memory and peers, not from these
LOSE_AT = 5  # lose slice 1 once step 5 is committed (recreate) or trained (in place)
SURVIVOR = "0"  # the slice whose pods the demo follows
DEFAULT_STEPS = 30


def _wait(cond, stop: threading.Event, poll: float = 0.5) -> bool:
    while not stop.is_set():
        if cond():
            return True
        stop.wait(poll)
    return False


def _record(kube: Kube, run: str) -> RunRecord:
    """The demo's run record, which the demo created and nothing deletes while it runs."""
    got = kube.get_record(run)
    if got is None:
        raise UserError(f"the demo's run record {run} is gone")
    return got[0]


def fault_script(cluster: EmbeddedCluster, kube: Kube, run: str, console: Console, stop: threading.Event,
                 lose_at: int) -> None:  # fmt: skip
    """Take the node pools under every slice but SURVIVOR away once the run has reached step `lose_at`
    (committed in recreate, where the next segment restores it from storage; trained in place);
    give them back as soon as the trainer has taken a step on the smaller shape. The controller then
    grows the run back (in recreate at that segment's first checkpoint: it never tears down a
    segment that has not committed one), so the resume at the same global batch is always there to
    see, however fast this machine is."""
    rec = _record(kube, run)
    rundir = RunDir(rec.spec.run_dir)
    in_place = rec.spec.restart_mode == RestartMode.IN_PLACE

    def reached() -> bool:
        if in_place:
            return max((m["step"] for m in rundir.metrics()), default=0) >= lose_at
        return (rundir.latest_committed_step() or 0) >= lose_at

    if not _wait(reached, stop):
        return
    pool_of = cluster.node_pool_of
    pools = sorted(
        {pool_of[n] for p in _pods(kube, run) if _slice(p) != SURVIVOR and (n := p["spec"].get("nodeName"))}
    ) or [f"{PRESET}-np-{i}" for i in range(1, SLICES)]
    console.log(f"[bold red]fault:[/] node pools {', '.join(pools)} lost (nodes deleted, pods killed)")
    for pool in pools:
        cluster.remove(pool)

    def stepping_on_one_slice() -> bool:
        seg = _record(kube, run).current
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


def _pods(kube: Kube, run: str) -> list[dict]:
    return kube.pods(f"{LABEL_RUN}={run}")


def _slice(pod: dict) -> str | None:
    """The pod's slice: its stable slice id in place (one JobSet a slice), its Job's index in the
    segment's JobSet in recreate."""
    labels = pod["metadata"].get("labels") or {}
    return labels.get(LABEL_SLICE) or labels.get(LABEL_JOB_INDEX)


def follow_pods(kube: Kube, run: str, stop: threading.Event, seen: dict[str, set[str]]) -> None:
    """Every pod UID each slice has had, until `stop`: what the demo says of the surviving slice's
    pods at the end (finished pods may be gone by then)."""
    while not stop.is_set():
        try:
            for pod in _pods(kube, run):
                if not pod["metadata"].get("deletionTimestamp"):
                    seen.setdefault(_slice(pod) or "?", set()).add(pod["metadata"]["uid"])
        except Exception:  # a missed sample is fine: the next one comes at the next wait
            pass
        stop.wait(0.5)


def pods_line(seen: dict[str, set[str]], hosts: int, restart_mode: str) -> str:
    """What became of SURVIVOR's pods across the run's segments, in one line."""
    uids = sorted(seen.get(SURVIVOR, ()))
    short = ", ".join(u[:8] for u in uids)
    if len(uids) == hosts:
        return f"slice {SURVIVOR}: its {hosts} pods kept through every segment (same UIDs: {short})"
    return f"slice {SURVIVOR}: {len(uids)} pods over the run ({restart_mode}: recreated at each shape change)"


def print_plan(console: Console, restart_mode: str, interval: int, ladder: list[Rung]) -> None:
    """What the restart mode keeps at a shape change, and the shrink ladder's batch plan per shape."""
    console.print(
        f"restart mode {restart_mode}: "
        + (
            f"slice {SURVIVOR}'s pods stay, the state comes from memory and peers "
            f"(storage checkpoint every {interval} steps)"
            if restart_mode == RestartMode.IN_PLACE
            else f"every shape change is a new JobSet, restored from storage (checkpoint every {interval} steps)"
        )
    )
    console.print(
        "shrink ladder: "
        + "; ".join(
            f"{r.shape}: {r.plan.micro_batch}×{r.plan.grad_accum}"
            if isinstance(r.plan, Plan)
            else f"{r.shape}: infeasible"
            for r in ladder
        )
    )


def run_demo(
    workdir: Path,
    steps: int = DEFAULT_STEPS,
    console: Console | None = None,
    runtime: str = PodRuntime.PROCESS,
    restart_mode: str = RestartMode.IN_PLACE,
    ui_port: int | None = None,
) -> str:
    """`ui_port`: serve `reslice ui` (launcher/ui) beside the demo on it (0: any free port)."""
    console = console or Console()
    if why := runtime_unavailable(runtime, RunSpec.image):
        raise ClusterNotReady(f"--runtime podman: {why}")
    ui = None
    if ui_port is not None:  # bound now: a port in use is one line before any cluster starts
        from launcher.ui.server import UiServer

        ui = UiServer(lambda: kube, port=ui_port)
    # Trainer processes started by the embedded kubelet share one compilation cache: a shape
    # compiled once is loaded by every later segment.
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path.home() / ".cache" / "reslice" / "jax"))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    workdir.mkdir(parents=True, exist_ok=True)
    run = f"demo-{time.strftime('%H%M%S')}"
    in_place = restart_mode == RestartMode.IN_PLACE
    interval = IN_PLACE_INTERVAL if in_place else INTERVAL
    spec = RunSpec(
        run=run,
        run_dir=str((workdir / run).resolve()),
        global_batch=GLOBAL_BATCH,
        config="tiny",
        overrides=(f"train.steps={steps}", f"checkpoint.interval={interval}", "moe.ragged_buffer_factor=0"),
        grace_period_s=30,
        heartbeat_timeout_s=10,
        image_pull_policy="Never",
        restart_mode=restart_mode,
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
        if in_place:  # its kubelets mount no service account: the pods read their world at its API server
            rec = replace(rec, spec=replace(spec, world_api=cluster.api_client().configuration.host))
        console.rule(f"reslice demo: {run}")
        console.print(
            f"embedded cluster at {cluster.url} with {SLICES} node pools of {PRESET} ({runtime} runtime"
            + (f", image {spec.image}" if runtime == PodRuntime.PODMAN else "")
            + ") "
            f"(kubeconfig {cluster.kubeconfig}); run directory {spec.run_dir}"
        )
        print_plan(console, restart_mode, interval, ladder)
        create_run(kube, rec)
        if ui is not None:
            console.print(f"reslice ui: watch the run at {ui.start().url}run/{run}", soft_wrap=True)
        stop = threading.Event()
        faults = threading.Thread(
            target=fault_script,
            args=(cluster, kube, run, console, stop, LOSE_AT),
            name="faults",
            daemon=True,
        )
        seen: dict[str, set[str]] = {}
        pods = threading.Thread(target=follow_pods, args=(kube, run, stop, seen), name="pods", daemon=True)
        faults.start()
        pods.start()
        try:
            state = watch_run(kube, run, console=console, resync_s=1.0, lease_s=10)
        finally:
            stop.set()
            faults.join(timeout=5)
            pods.join(timeout=5)
            if ui is not None:
                ui.stop()
        summarize(kube, run, console)
        console.print(pods_line(seen, ladder[0].shape.preset.hosts, restart_mode))
        return state
