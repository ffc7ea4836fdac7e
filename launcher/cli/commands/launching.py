"""`reslice launch`, `preflight`, `watch` and `demo`: start a run, check a cluster for one, follow
one to its end. Mounted by `launcher.cli.app`; the spec comes from `launcher.cli.spec_options`."""

from __future__ import annotations

import signal
import threading
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from contract.words import RestartMode
from launcher.adapters.preset_files import make_shape
from launcher.cli.commands.ui import require_web_stack
from launcher.cli.options import (
    DEFAULT_INIT_TIMEOUT,
    ConfigOpt,
    CoordinatorPortOpt,
    CpuRequestOpt,
    GlobalBatchOpt,
    GracePeriodOpt,
    ImageOpt,
    InitTimeoutOpt,
    KubeconfigOpt,
    MaxAccumOpt,
    MaxMicroOpt,
    MaxRestartsOpt,
    MemoryRequestOpt,
    NamespaceOpt,
    PlacementOpt,
    PreflightOpt,
    PresetOpt,
    PriorityClassOpt,
    QueueOpt,
    RestartModeOpt,
    RunOpt,
    SaveSecondsOpt,
    ServiceAccountOpt,
    SetOpt,
    ShortNoticeOpt,
    SlicesOpt,
    TasPreferredOpt,
    TasTopologyOpt,
    TrainerOpt,
    console,
    print_json,
)
from launcher.cli.spec_options import check_run_options, for_cluster, run_spec, trainer_config, trainer_image
from launcher.cli.watch import watch_all, watch_run
from launcher.core import inputs
from launcher.core.errors import UserError
from launcher.core.plan import Rung
from launcher.core.policy import rules_for
from launcher.core.presets import Shape
from launcher.core.record import Knobs
from launcher.core.render import render_jobset
from launcher.core.spec import DEFAULT_COORDINATOR_PORT, RunSpec, launch_restart_mode
from launcher.core.words import PodRuntime, RunState, TrainerProfile

if TYPE_CHECKING:
    from launcher.cli.connect import Connection
    from launcher.core.capacity.checks import Check


def finish(kube, run: str, state: str) -> None:
    """The run's summary, then exit 1 unless it finished (`launch` and `watch RUN` end here)."""
    from launcher.report.io import summarize

    summarize(kube, run, console)
    if state != RunState.FINISHED:
        raise typer.Exit(1)


def _knobs(
    unschedulable_grace: float, grow_window: float, grow: bool, app_failure_budget: int, app_backoff: float
) -> Knobs:
    """The controller's knobs from `launch`'s options, each checked."""
    inputs.seconds("--unschedulable-grace", unschedulable_grace)
    inputs.seconds("--grow-window", grow_window)
    inputs.integer("--app-failure-budget", app_failure_budget, low=0, high=10_000)
    inputs.seconds("--app-backoff", app_backoff)
    return Knobs(
        unschedulable_grace_s=unschedulable_grace,
        grow_window_s=grow_window,
        grow=grow,
        app_failure_budget=app_failure_budget,
        app_backoff_s=app_backoff,
    )


def _check_rungs(
    spec: RunSpec, ladder: list[Rung], save_seconds: float | None, short_notice_interval: int | None
) -> None:
    """What the ladder's rungs need before anything is created: MaxText's JobSet renders on every
    feasible rung (its keys depend on the shape), and a note where an emergency save cannot finish
    in a preset's notice."""
    from launcher.controller.launch import short_notice_presets

    if spec.trainer == TrainerProfile.MAXTEXT:
        for rung in ladder:
            if rung.feasible:
                render_jobset(spec, rung.shape, 0)
    if short := short_notice_presets(spec, ladder):
        console.print(
            f"an emergency save ({save_seconds:g} s) cannot finish in the notice of {', '.join(short)}: "
            f"segments there checkpoint every {short_notice_interval} steps"
        )


def _cluster_spec(
    conn: Connection, spec: RunSpec, shape: Shape, grace_period: int | None, checks: bool
) -> RunSpec:
    """The spec as the connected cluster runs it (the embedded cluster's grace period and world
    API), after the free preflight checks (a few GETs) unless they are off."""
    spec = for_cluster(spec, conn.embedded, grace_period)
    if conn.embedded and rules_for(spec).WORLD:
        # Its kubelets mount no service account: the pods read their world at its API server.
        spec = replace(spec, world_api=conn.kube.api_client.configuration.host)
    if checks:
        from launcher.core.capacity.checks import Request
        from launcher.preflight.gate import refuse_unready

        refuse_unready(conn.kube, Request(spec, (shape,)))
    return spec


def launch(
    preset: PresetOpt,
    run: RunOpt,
    global_batch: GlobalBatchOpt,
    slices: SlicesOpt = None,
    config: ConfigOpt = None,
    trainer: TrainerOpt = RunSpec.trainer,
    overrides: SetOpt = None,
    run_dir: Annotated[
        str | None, typer.Option("--run-dir", help="Path or gs:// (default ./runs/RUN).")
    ] = None,
    image: ImageOpt = None,
    detach: Annotated[
        bool,
        typer.Option(
            "--detach",
            help="Submit segment 0 and return; `reslice watch` (or the in-cluster controller) watches.",
        ),
    ] = False,
    namespace: NamespaceOpt = RunSpec.namespace,
    kubeconfig: KubeconfigOpt = None,
    max_micro_batch: MaxMicroOpt = RunSpec.max_micro_batch,
    max_grad_accum: MaxAccumOpt = None,
    grace_period: GracePeriodOpt = None,
    max_restarts: MaxRestartsOpt = RunSpec.max_restarts,
    init_timeout: InitTimeoutOpt = DEFAULT_INIT_TIMEOUT,
    queue: QueueOpt = None,
    tas_topology: TasTopologyOpt = None,
    tas_preferred: TasPreferredOpt = False,
    priority_class: PriorityClassOpt = None,
    service_account: ServiceAccountOpt = None,
    checks: PreflightOpt = True,
    unschedulable_grace: Annotated[
        float, typer.Option("--unschedulable-grace", help="Seconds.")
    ] = Knobs.unschedulable_grace_s,
    grow_window: Annotated[
        float, typer.Option("--grow-window", help="Seconds capacity must hold.")
    ] = Knobs.grow_window_s,
    grow: Annotated[
        bool, typer.Option("--grow/--no-grow", help="Grow back when capacity returns.")
    ] = Knobs.grow,
    app_failure_budget: Annotated[int, typer.Option("--app-failure-budget")] = Knobs.app_failure_budget,
    app_backoff: Annotated[
        float, typer.Option("--app-backoff", help="Seconds, doubled per failure.")
    ] = Knobs.app_backoff_s,
    coordinator_port: CoordinatorPortOpt = DEFAULT_COORDINATOR_PORT,
    placement_policy: PlacementOpt = None,
    cpu_request: CpuRequestOpt = None,
    memory_request: MemoryRequestOpt = None,
    save_seconds: SaveSecondsOpt = None,
    short_notice_interval: ShortNoticeOpt = None,
    restart_mode: RestartModeOpt = RunSpec.restart_mode,
) -> None:
    """Launch a run: plan, submit segment 0, and watch it (shrink, grow back) until it ends."""
    from launcher.cli.connect import connect
    from launcher.controller.launch import create_run, prepare

    image = trainer_image(trainer, image)
    # The shape's numbers here; the spec's options in one place, launch.prepare (core/spec.check).
    inputs.shape_options(slices, global_batch, max_micro_batch, max_grad_accum)
    config = trainer_config(trainer, config)
    knobs = _knobs(unschedulable_grace, grow_window, grow, app_failure_budget, app_backoff)
    inputs.run_dir("--run-dir", run_dir or f"runs/{run}")
    shape = make_shape(preset, slices)
    restart_mode, note = launch_restart_mode(restart_mode, shape.slices, trainer)
    if note:
        console.print(note)
    local = run_dir is None or not run_dir.startswith("gs://")
    directory = str(Path(run_dir or f"runs/{run}").resolve()) if local else run_dir
    spec = run_spec(
        preset=preset, placement_policy=placement_policy, overrides=overrides,
        run=run, run_dir=directory, global_batch=global_batch, image=image, config=config, namespace=namespace,
        max_micro_batch=max_micro_batch, max_grad_accum=max_grad_accum, grace_period_s=grace_period,
        max_restarts=max_restarts, init_timeout_s=init_timeout, queue=queue, tas_topology=tas_topology, tas_preferred=tas_preferred, priority_class=priority_class,
        coordinator_port=coordinator_port, cpu_request=cpu_request, memory_request=memory_request,
        service_account=service_account, save_seconds=save_seconds, short_notice_interval=short_notice_interval,
        trainer=trainer, restart_mode=restart_mode,
    )  # fmt: skip
    rec, ladder = prepare(spec, preset, slices, knobs)  # every check before anything is created
    _check_rungs(spec, ladder, save_seconds, short_notice_interval)
    conn = connect(kubeconfig, namespace, start_embedded=f"{shape.preset.name}:{shape.slices}")
    spec = _cluster_spec(conn, spec, shape, grace_period, checks)
    rec = replace(rec, spec=spec)
    create_run(conn.kube, rec)
    console.print(
        f"run {run}: segment 0 on {shape} at global batch {global_batch}; run directory {directory}"
    )
    if detach:
        from launcher.controller.launch import submit_first_segment

        watcher = submit_first_segment(conn.kube, run)
        console.print(f"detached: segment 0 submitted; {watcher}. `reslice status {run}` reports")
        return
    finish(conn.kube, run, watch_run(conn.kube, run, console=console, own_process=True))


def preflight(
    preset: PresetOpt,
    run_dir: Annotated[str, typer.Option("--run-dir", help="Run directory: a path or gs://bucket/prefix.")],
    slices: SlicesOpt = None,
    run: Annotated[str, typer.Option("--run", help="Run name (names the probe pod).")] = "preflight",
    global_batch: Annotated[
        int | None,
        typer.Option("--global-batch", "-b", help="Sequences per step (default: every shape GKE can run)."),
    ] = None,
    max_micro_batch: MaxMicroOpt = RunSpec.max_micro_batch,
    max_grad_accum: MaxAccumOpt = None,
    image: ImageOpt = None,
    namespace: NamespaceOpt = RunSpec.namespace,
    kubeconfig: KubeconfigOpt = None,
    queue: QueueOpt = None,
    priority_class: PriorityClassOpt = None,
    service_account: ServiceAccountOpt = None,
    placement_policy: PlacementOpt = None,
    cpu_request: CpuRequestOpt = None,
    memory_request: MemoryRequestOpt = None,
    probe: Annotated[
        bool, typer.Option("--probe/--no-probe", help="Write the run directory from a pod on the node pools.")
    ] = True,
    probe_timeout: Annotated[
        float,
        typer.Option("--probe-timeout", help="Seconds to wait for the probe pod (image pull included)."),
    ] = 300.0,
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            "-c",
            help="Trainer config: with -b, its mesh.tensor and HBM estimate shape the ladder.",
        ),
    ] = None,
    overrides: SetOpt = None,
    trainer: TrainerOpt = RunSpec.trainer,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
) -> None:
    """Check that the cluster can run a run before anything is created (exit 1 if it cannot)."""
    from launcher.cli.connect import connect
    from launcher.controller.launch import model_parallel
    from launcher.core.capacity.checks import Request
    from launcher.core.render import DNS1035
    from launcher.preflight.gate import check_requests, failed, ladder
    from launcher.preflight.gate import preflight as run_preflight

    if not DNS1035.match(run) or len(run) > 63:  # the probe pod carries it as a label value
        raise UserError(f"--run {run!r} is not a DNS-1035 label of at most 63 characters")
    image = trainer_image(trainer, image)
    check_run_options(
        overrides=overrides, slices=slices, global_batch=global_batch, max_micro_batch=max_micro_batch,
        max_grad_accum=max_grad_accum, image=image, namespace=namespace, queue=queue,
        priority_class=priority_class, service_account=service_account, cpu_request=cpu_request,
        memory_request=memory_request,
    )  # fmt: skip
    inputs.seconds("--probe-timeout", probe_timeout, positive=True)
    inputs.run_dir("--run-dir", run_dir, here=False)
    shape = make_shape(preset, slices)
    sets = tuple(overrides or ())
    resolved = _ladder_config(trainer, config, sets)
    shapes, skipped = ladder(
        shape, global_batch, max_micro_batch, max_grad_accum, model_parallel(resolved, sets), resolved
    )
    directory = run_dir if run_dir.startswith("gs://") else str(Path(run_dir).resolve())
    spec = run_spec(
        preset=preset,
        placement_policy=placement_policy,
        run=run,
        run_dir=directory,
        global_batch=global_batch or 0,  # only the ladder above depends on it
        image=image,
        namespace=namespace,
        queue=queue,
        priority_class=priority_class,
        service_account=service_account,
        cpu_request=cpu_request,
        memory_request=memory_request,
        trainer=trainer,
    )
    check_requests(spec)
    conn = connect(kubeconfig, namespace)
    spec = for_cluster(spec, conn.embedded, pulled=False)
    req = Request(spec, shapes, skipped)
    checks = run_preflight(conn.kube, req, probe=probe, probe_timeout_s=probe_timeout)
    if as_json:
        print_json([asdict(c) for c in checks])
    else:
        _print_checks(checks, f"preflight: {shape} in namespace {namespace}, run directory {directory}")
    if failed(checks):
        raise typer.Exit(1)


def _ladder_config(trainer: str, config: str | None, sets: tuple[str, ...]) -> dict | None:
    """The trainer config that shapes `preflight`'s ladder: with --config or --set, the resolved
    config (its mesh.tensor and HBM estimate); None for the batch plan alone, and for MaxText,
    whose keys and config are checked here (an unknown --trainer: exit 2)."""
    from launcher.controller.launch import resolve_trainer_config

    profile_config = trainer_config(trainer, config)  # an unknown --trainer: exit 2 here
    if trainer == TrainerProfile.MAXTEXT:
        # MaxText's keys and config (launcher.core.maxtext); its batch plan is one device per rank.
        from launcher.core.maxtext import config_args, parse_overrides

        config_args(profile_config)
        parse_overrides(sets)
        return None
    # As `plan`: without --config or --set, the batch plan alone (no trainer asked, no HBM estimate).
    return resolve_trainer_config(config or "tiny", sets, strict=False) if config or sets else None


def _print_checks(checks: list[Check], title: str) -> None:
    """Preflight's rows as a table under `title`, then its verdict: ready, or what cannot run."""
    from launcher.core.capacity.checks import FAIL
    from launcher.preflight.gate import table

    console.print(table(checks, title))
    bad = [c.name for c in checks if c.status == FAIL]
    console.print(f"preflight: {'cannot run: ' + ', '.join(bad) if bad else 'ready'}")


def demo(
    workdir: Annotated[Path, typer.Option("--workdir", help="Where runs and pod logs go.")] = Path(
        "runs/demo"
    ),
    steps: Annotated[int, typer.Option("--steps", help="Training steps.")] = 30,
    runtime: Annotated[
        str,
        typer.Option(
            "--runtime",
            help="process: the trainer pods as local processes; podman: the trainer image "
            "(`python3.11 dev.py images`) with podman.",
        ),
    ] = PodRuntime.PROCESS,
    restart_mode: Annotated[
        str,
        typer.Option(
            "--restart-mode",
            help="in-place: the surviving slice keeps its pods, the state from memory and peers; "
            "recreate: a new JobSet per shape, the state from storage.",
        ),
    ] = RestartMode.IN_PLACE,
    ui: Annotated[
        bool, typer.Option("--ui", help="Serve `reslice ui` beside it (on --ui-port) and print its address.")
    ] = False,
    ui_port: Annotated[int, typer.Option("--ui-port", help="Port of --ui (0: any free one).")] = 8470,
) -> None:
    """The elastic demo on the embedded cluster: 2 slices of tpu7x-2x2x2, lose 1, resume on 1, grow back."""
    if runtime not in tuple(PodRuntime):
        raise UserError(f"--runtime must be {' or '.join(PodRuntime)}, got {runtime!r}")
    if restart_mode not in tuple(RestartMode):
        raise UserError(f"--restart-mode must be {' or '.join(RestartMode)}, got {restart_mode!r}")
    from launcher.cli.demo import run_demo

    inputs.directory("--workdir", workdir)
    if not 25 <= steps <= 100_000:
        raise UserError(
            "--steps must be between 25 and 100000 (capacity goes at step 5; the run must outlive the regrowth)"
        )
    if ui:
        require_web_stack()
    if run_demo(workdir, steps, console, runtime, restart_mode, ui_port if ui else None) != RunState.FINISHED:
        raise typer.Exit(1)


def watch(
    run: Annotated[str | None, typer.Argument(help="The run to attach to.")] = None,
    all_runs: Annotated[
        bool, typer.Option("--all", help="Every run of the namespace (in-cluster mode).")
    ] = False,
    namespace: NamespaceOpt = RunSpec.namespace,
    kubeconfig: KubeconfigOpt = None,
    resync: Annotated[float, typer.Option("--resync", envvar="RESLICE_RESYNC_S", help="Seconds.")] = 5.0,
    lease: Annotated[int, typer.Option("--lease", envvar="RESLICE_LEASE_S", help="Lease seconds.")] = 15,
    health_port: Annotated[
        int,
        typer.Option(
            "--health-port",
            envvar="RESLICE_HEALTH_PORT",
            help="With --all: serve /healthz and /readyz on this port (0: off).",
        ),
    ] = 0,
) -> None:
    """Attach to a run (live view) or, with --all, control every run of the namespace."""
    from launcher.cli.connect import connect

    if (run is None) == (not all_runs):
        raise UserError("give a RUN or --all (not both)")
    inputs.namespace(namespace)
    inputs.seconds("--resync", resync, positive=True)
    inputs.integer("--lease", lease, low=1, high=3600)
    if not 0 <= health_port <= 65535:
        raise UserError(f"--health-port must be a TCP port (0-65535, 0 = off), not {health_port}")
    if health_port and not all_runs:
        raise UserError("--health-port is for the in-cluster controller: use it with --all")
    kube = connect(kubeconfig, namespace).kube
    if all_runs:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        watch_all(kube, stop, resync_s=resync, lease_s=lease, health_port=health_port, own_process=True)
        return
    assert run is not None  # checked above: a RUN or --all
    finish(kube, run, watch_run(kube, run, console=console, resync_s=resync, lease_s=lease, own_process=True))
