"""`reslice`: the command line. Thin: parse, call one function, print.

User errors (UserError, bad options) print one line on stderr and exit 2, with no traceback.
"""

from __future__ import annotations

import functools
import json
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.table import Table

from launcher import inputs
from launcher.embedded.cli import app as cluster_app
from launcher.errors import ClusterNotReady, UserError, environment_error
from launcher.plan import Plan, shrink_ladder
from launcher.presets import load_presets, make_shape
from launcher.render import DEFAULT_COORDINATOR_PORT, RunSpec, render_jobset
from launcher.watch import watch_all, watch_run

app = typer.Typer(
    help="Elastic JAX pretraining on GKE TPU slices.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(cluster_app, name="cluster")
# Piped output (CI logs, tests) gets a wide fixed width instead of rich's 80-column default.
console = Console(width=None if sys.stdout.isatty() else 160)


def _print_json(obj: object) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


@app.command()
def presets(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List the topology presets."""
    rows = list(load_presets().values())
    if as_json:
        _print_json(
            [
                {
                    "name": p.name,
                    "accelerator": p.accelerator,
                    "machine_type": p.machine_type,
                    "topology": p.topology,
                    "chips": p.chips,
                    "hosts": p.hosts,
                    "devices": p.devices,
                    "peak_tflops_per_chip": p.peak_tflops_per_chip,
                    "slices": p.slices,
                    "spot": p.spot,
                    "fallbacks": list(p.fallbacks),
                }
                for p in rows
            ]
        )
        return
    table = Table(title="reslice presets (per slice)")
    for col in ("preset", "accelerator", "topology", "chips", "hosts", "devices", "peak TFLOP/s/chip"):
        table.add_column(col, justify="right" if col in {"chips", "hosts", "devices"} else "left")
    table.add_column("slices", justify="right")
    table.add_column("spot")
    table.add_column("fallbacks")
    for p in rows:
        table.add_row(
            p.name,
            p.accelerator,
            p.topology,
            str(p.chips),
            str(p.hosts),
            str(p.devices),
            f"{p.peak_tflops_per_chip:g}",
            str(p.slices),
            "yes" if p.spot else "",
            ", ".join(p.fallbacks),
        )
    console.print(table)


PresetOpt = Annotated[str, typer.Option("--preset", "-p", help="Topology preset (see `reslice presets`).")]
SlicesOpt = Annotated[int | None, typer.Option("--slices", "-n", help="Slices (default: the preset's).")]
GlobalBatchOpt = Annotated[int, typer.Option("--global-batch", "-b", help="Sequences per optimizer step.")]
MaxMicroOpt = Annotated[int, typer.Option("--max-micro-batch", help="Largest per-device micro-batch.")]
MaxAccumOpt = Annotated[int | None, typer.Option("--max-grad-accum", help="Most micro-steps per step.")]
# What render, launch and sweep share (a run's spec).
RunOpt = Annotated[str, typer.Option("--run", help="Run name (DNS-1035).")]
ConfigOpt = Annotated[str, typer.Option("--config", "-c", help="Trainer config name or path.")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Trainer override key=value.")]
ImageOpt = Annotated[str, typer.Option("--image", help="Trainer image.")]
NamespaceOpt = Annotated[str, typer.Option("--namespace", help="Namespace of the run.")]
GracePeriodOpt = Annotated[
    int | None,
    typer.Option(
        "--grace-period",
        help="Seconds from SIGTERM to SIGKILL (default: the capacity's notice, 15 s on spot).",
    ),
]
MaxRestartsOpt = Annotated[
    int, typer.Option("--max-restarts", help="JobSet restarts per segment (preemptions do not count).")
]
InitTimeoutOpt = Annotated[
    int,
    typer.Option(
        "--init-timeout", help="Seconds jax.distributed waits for the last host to join (JAX's default: 300)."
    ),
]
QueueOpt = Annotated[str | None, typer.Option("--queue", help="Kueue LocalQueue.")]
PriorityClassOpt = Annotated[str | None, typer.Option("--priority-class")]
ServiceAccountOpt = Annotated[
    str | None,
    typer.Option(
        "--service-account",
        help="Kubernetes ServiceAccount of the trainer pods. Not a Google identity: host-network pods "
        "write gs:// as the node's service account (README).",
    ),
]
CoordinatorPortOpt = Annotated[
    int,
    typer.Option(
        "--coordinator-port", help="JAX coordinator port on the host network (not 8431, 8080, 8470-8482)."
    ),
]
PlacementOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--placement-policy",
        help="The placement (workload) policy the node pools carry: NAME for the requested preset, or "
        "PRESET=NAME (repeatable). Default: none is selected.",
    ),
]
CpuRequestOpt = Annotated[
    str | None, typer.Option("--cpu-request", help="Trainer cpu request (default: from the machine type).")
]
MemoryRequestOpt = Annotated[
    str | None,
    typer.Option(
        "--memory-request", help="Trainer memory request, e.g. 200Gi (default: from the machine type)."
    ),
]


SaveSecondsOpt = Annotated[
    float | None,
    typer.Option(
        "--save-seconds",
        help="Measured seconds from SIGTERM to a committed emergency checkpoint (a step plus the save). "
        "Checked against each shape's termination notice (15 s on spot).",
    ),
]
ShortNoticeOpt = Annotated[
    int | None,
    typer.Option(
        "--short-notice-interval",
        help="Checkpoint every N steps on capacity whose notice cannot hold an emergency save "
        "(without it, such a launch is refused).",
    ),
]


def placement_policies(preset: str, values: list[str] | None) -> tuple[tuple[str, str], ...]:
    """`--placement-policy NAME` (the requested preset) or `PRESET=NAME`, as (preset, policy) pairs."""
    out = {}
    for v in values or []:
        name, _, policy = v.rpartition("=") if "=" in v else (preset, "", v)
        if not name.strip() or not policy.strip():
            raise UserError(f"--placement-policy {v!r}: expected NAME or PRESET=NAME")
        out[name.strip()] = policy.strip()
    known = load_presets()
    for name in out:
        if name not in known:
            raise UserError(f"--placement-policy {name}=...: unknown preset {name!r}")
    return tuple(out.items())


DEFAULT_IMAGE = "reslice-trainer:latest"
DEFAULT_INIT_TIMEOUT = RunSpec.init_timeout_s


@app.command()
def plan(
    preset: PresetOpt,
    global_batch: GlobalBatchOpt,
    slices: SlicesOpt = None,
    max_micro_batch: MaxMicroOpt = 16,
    max_grad_accum: MaxAccumOpt = None,
    config: Annotated[
        str | None, typer.Option("--config", "-c", help="Trainer config: its mesh.tensor divides the batch.")
    ] = None,
    overrides: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show the shrink ladder: every shape the run may fall back to, with its batch plan."""
    from launcher.launch import model_parallel, resolve_trainer_config

    inputs.overrides(overrides)
    inputs.shape_options(slices, global_batch, max_micro_batch, max_grad_accum)
    shape = make_shape(preset, slices)
    sets = tuple(overrides or ())
    # Without --config or --set: the batch plan alone (no trainer asked, no memory estimate).
    resolved = resolve_trainer_config(config or "tiny", sets, strict=False) if config or sets else None
    rungs = shrink_ladder(
        shape,
        global_batch,
        max_micro_batch,
        max_grad_accum,
        model_parallel=model_parallel(resolved, sets),
        trainer_config=resolved,
    )
    if not rungs[0].feasible:
        raise UserError(f"{shape}: {rungs[0].plan.reason}")
    if as_json:
        _print_json([_rung_json(r) for r in rungs])
        return
    table = Table(title=f"shrink ladder of {shape} at global batch {global_batch}")
    cols = ("preset", "slices", "chips", "hosts", "devices", "dp ranks", "micro-batch", "grad accum")
    for col in cols:
        table.add_column(col, justify="left" if col == "preset" else "right")
    table.add_column("note")
    for r in rungs:
        s = r.shape
        cells = [s.preset.name, str(s.slices), str(s.chips), str(s.hosts), str(s.devices)]
        if isinstance(r.plan, Plan):
            mem = f"~{r.memory['total'] / 2**30:.1f} GiB/device" if r.memory else ""
            table.add_row(*cells, str(r.plan.dp_ranks), str(r.plan.micro_batch), str(r.plan.grad_accum), mem)
        else:
            table.add_row(*cells, "-", "-", "-", f"[dim]{r.plan.reason}[/dim]")
    console.print(table)


def _rung_json(r) -> dict:
    s = r.shape
    row = {
        "preset": s.preset.name,
        "slices": s.slices,
        "chips": s.chips,
        "hosts": s.hosts,
        "devices": s.devices,
    }
    if isinstance(r.plan, Plan):
        plan = {
            "micro_batch": r.plan.micro_batch,
            "grad_accum": r.plan.grad_accum,
            "dp_ranks": r.plan.dp_ranks,
            "model_parallel": r.plan.model_parallel,
        }
        return {**row, "feasible": True, **plan, "plan": plan, "memory": r.memory}
    return {**row, "feasible": False, "infeasible": r.plan.reason, "plan": None, "memory": r.memory}


@app.command()
def render(
    preset: PresetOpt,
    run: RunOpt,
    run_dir: Annotated[str, typer.Option("--run-dir", help="Run directory: a path or gs://bucket/prefix.")],
    global_batch: GlobalBatchOpt,
    image: ImageOpt = DEFAULT_IMAGE,
    slices: SlicesOpt = None,
    segment: Annotated[int, typer.Option("--segment", help="Segment index.")] = 0,
    config: ConfigOpt = "tiny",
    overrides: SetOpt = None,
    namespace: NamespaceOpt = "default",
    max_micro_batch: MaxMicroOpt = 16,
    max_grad_accum: MaxAccumOpt = None,
    grace_period: GracePeriodOpt = None,
    max_restarts: MaxRestartsOpt = 10,
    init_timeout: InitTimeoutOpt = DEFAULT_INIT_TIMEOUT,
    queue: QueueOpt = None,
    priority_class: PriorityClassOpt = None,
    service_account: ServiceAccountOpt = None,
    pull_policy: Annotated[str, typer.Option("--pull-policy")] = "IfNotPresent",
    coordinator_port: CoordinatorPortOpt = DEFAULT_COORDINATOR_PORT,
    placement_policy: PlacementOpt = None,
    cpu_request: CpuRequestOpt = None,
    memory_request: MemoryRequestOpt = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to a file.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of YAML.")] = False,
) -> None:
    """Render the JobSet of one segment as YAML (or JSON)."""
    from launcher.launch import trainer_model_parallel

    inputs.overrides(overrides)
    inputs.shape_options(slices, global_batch, max_micro_batch, max_grad_accum)
    inputs.spec_options(
        image_ref=image, ns=namespace, grace_period=grace_period, max_restarts=max_restarts,
        init_timeout=init_timeout, queue=queue, priority_class=priority_class, service_account=service_account,
        cpu_request=cpu_request, memory_request=memory_request,
    )  # fmt: skip
    inputs.integer("--segment", segment, low=0, high=10_000)
    inputs.run_dir("--run-dir", run_dir)
    if output is not None:
        inputs.output_file("--output", output)
    if pull_policy not in {"Always", "IfNotPresent", "Never"}:
        raise UserError(f"--pull-policy {pull_policy!r}: expected Always, IfNotPresent or Never")
    spec = RunSpec(
        run=run,
        run_dir=run_dir,
        global_batch=global_batch,
        image=image,
        config=config,
        overrides=tuple(overrides or ()),
        namespace=namespace,
        max_micro_batch=max_micro_batch,
        max_grad_accum=max_grad_accum,
        model_parallel=trainer_model_parallel(config, tuple(overrides or ()), strict=False),
        grace_period_s=grace_period,
        max_restarts=max_restarts,
        init_timeout_s=init_timeout,
        queue=queue,
        priority_class=priority_class,
        service_account=service_account,
        image_pull_policy=pull_policy,
        coordinator_port=coordinator_port,
        placement_policies=placement_policies(preset, placement_policy),
        cpu_request=cpu_request,
        memory_request=memory_request,
    )
    jobset = render_jobset(spec, make_shape(preset, slices), segment)
    text = json.dumps(jobset, indent=2) + "\n" if as_json else yaml.safe_dump(jobset, sort_keys=False)
    if output is None:
        sys.stdout.write(text)
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        try:
            output.write_text(text)
        except OSError as e:
            raise UserError(f"--output {output}: {e.strerror}") from None


# --- runs -------------------------------------------------------------------------------------

KubeconfigOpt = Annotated[str | None, typer.Option("--kubeconfig", help="Kubeconfig (default: $KUBECONFIG).")]


@app.command()
def launch(
    preset: PresetOpt,
    run: RunOpt,
    global_batch: GlobalBatchOpt,
    slices: SlicesOpt = None,
    config: ConfigOpt = "tiny",
    overrides: SetOpt = None,
    run_dir: Annotated[
        str | None, typer.Option("--run-dir", help="Path or gs:// (default ./runs/RUN).")
    ] = None,
    image: ImageOpt = DEFAULT_IMAGE,
    detach: Annotated[
        bool,
        typer.Option(
            "--detach",
            help="Submit segment 0 and return; `reslice watch` (or the in-cluster controller) watches.",
        ),
    ] = False,
    namespace: NamespaceOpt = "default",
    kubeconfig: KubeconfigOpt = None,
    max_micro_batch: MaxMicroOpt = 16,
    max_grad_accum: MaxAccumOpt = None,
    grace_period: GracePeriodOpt = None,
    max_restarts: MaxRestartsOpt = 3,
    init_timeout: InitTimeoutOpt = DEFAULT_INIT_TIMEOUT,
    queue: QueueOpt = None,
    priority_class: PriorityClassOpt = None,
    service_account: ServiceAccountOpt = None,
    checks: Annotated[
        bool,
        typer.Option(
            "--preflight/--no-preflight",
            help="Refuse a cluster that cannot run it (no JobSet, no node pools of the shape...); "
            "--no-preflight e.g. for node pools that autoscale from zero.",
        ),
    ] = True,
    unschedulable_grace: Annotated[float, typer.Option("--unschedulable-grace", help="Seconds.")] = 120.0,
    grow_window: Annotated[float, typer.Option("--grow-window", help="Seconds capacity must hold.")] = 300.0,
    grow: Annotated[bool, typer.Option("--grow/--no-grow", help="Grow back when capacity returns.")] = True,
    app_failure_budget: Annotated[int, typer.Option("--app-failure-budget")] = 3,
    app_backoff: Annotated[float, typer.Option("--app-backoff", help="Seconds, doubled per failure.")] = 30.0,
    coordinator_port: CoordinatorPortOpt = DEFAULT_COORDINATOR_PORT,
    placement_policy: PlacementOpt = None,
    cpu_request: CpuRequestOpt = None,
    memory_request: MemoryRequestOpt = None,
    save_seconds: SaveSecondsOpt = None,
    short_notice_interval: ShortNoticeOpt = None,
) -> None:
    """Launch a run: plan, submit segment 0, and watch it (shrink, grow back) until it ends."""
    from launcher.connect import connect
    from launcher.launch import create_run, prepare, short_notice_presets
    from launcher.record import Policy

    inputs.overrides(overrides)
    inputs.shape_options(slices, global_batch, max_micro_batch, max_grad_accum)
    inputs.spec_options(
        image_ref=image, ns=namespace, grace_period=grace_period, max_restarts=max_restarts,
        init_timeout=init_timeout, queue=queue, priority_class=priority_class, service_account=service_account,
        cpu_request=cpu_request, memory_request=memory_request,
    )  # fmt: skip
    inputs.seconds("--unschedulable-grace", unschedulable_grace)
    inputs.seconds("--grow-window", grow_window)
    inputs.integer("--app-failure-budget", app_failure_budget, low=0, high=10_000)
    inputs.seconds("--app-backoff", app_backoff)
    inputs.seconds("--save-seconds", save_seconds, positive=True)
    inputs.integer("--short-notice-interval", short_notice_interval, high=inputs.MAX_STEPS)
    inputs.run_dir("--run-dir", run_dir or f"runs/{run}")
    shape = make_shape(preset, slices)
    local = run_dir is None or not run_dir.startswith("gs://")
    directory = str(Path(run_dir or f"runs/{run}").resolve()) if local else run_dir
    policy = Policy(
        unschedulable_grace_s=unschedulable_grace,
        grow_window_s=grow_window,
        grow=grow,
        app_failure_budget=app_failure_budget,
        app_backoff_s=app_backoff,
    )
    spec = RunSpec(
        run=run,
        run_dir=directory,
        global_batch=global_batch,
        image=image,
        config=config,
        overrides=tuple(overrides or ()),
        namespace=namespace,
        max_micro_batch=max_micro_batch,
        max_grad_accum=max_grad_accum,
        grace_period_s=grace_period,
        max_restarts=max_restarts,
        init_timeout_s=init_timeout,
        queue=queue,
        priority_class=priority_class,
        coordinator_port=coordinator_port,
        placement_policies=placement_policies(preset, placement_policy),
        cpu_request=cpu_request,
        memory_request=memory_request,
        service_account=service_account,
        save_seconds=save_seconds,
        short_notice_interval=short_notice_interval,
    )
    rec, ladder = prepare(spec, preset, slices, policy)  # every check before anything is created
    if short := short_notice_presets(spec, ladder):
        console.print(
            f"an emergency save ({save_seconds:g} s) cannot finish in the notice of {', '.join(short)}: "
            f"segments there checkpoint every {short_notice_interval} steps"
        )
    conn = connect(kubeconfig, namespace, start_embedded=f"{shape.preset.name}:{shape.slices}")
    spec = for_cluster(spec, conn.embedded, grace_period)
    if checks:
        from launcher.checks import Request
        from launcher.preflight import refuse_unready

        refuse_unready(conn.kube, Request(spec, (shape,)))  # the free checks: a few GETs
    rec = replace(rec, spec=spec)
    create_run(conn.kube, rec)
    console.print(
        f"run {run}: segment 0 on {shape} at global batch {global_batch}; run directory {directory}"
    )
    if detach:
        from launcher.launch import submit_first_segment

        watcher = submit_first_segment(conn.kube, run)
        console.print(f"detached: segment 0 submitted; {watcher}. `reslice status {run}` reports")
        return
    _finish(conn.kube, run, watch_run(conn.kube, run, console=console))


def for_cluster(spec: RunSpec, embedded: bool, grace_period: int | None = None) -> RunSpec:
    """The spec as it must run where it runs. On the embedded cluster the trainers are processes on
    this machine: short grace period and heartbeat timeout, and no image to pull."""
    if embedded:
        return replace(
            spec, grace_period_s=grace_period or 30, heartbeat_timeout_s=10, image_pull_policy="Never"
        )
    if grace_period is not None:
        return replace(spec, grace_period_s=grace_period)
    return spec


@app.command()
def preflight(
    preset: PresetOpt,
    run_dir: Annotated[str, typer.Option("--run-dir", help="Run directory: a path or gs://bucket/prefix.")],
    slices: SlicesOpt = None,
    run: Annotated[str, typer.Option("--run", help="Run name (names the probe pod).")] = "preflight",
    global_batch: Annotated[
        int | None,
        typer.Option("--global-batch", "-b", help="Sequences per step (default: every shape GKE can run)."),
    ] = None,
    max_micro_batch: MaxMicroOpt = 16,
    max_grad_accum: MaxAccumOpt = None,
    image: ImageOpt = DEFAULT_IMAGE,
    namespace: NamespaceOpt = "default",
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
            help="Trainer config: with -b, its mesh.tensor and memory estimate shape the ladder.",
        ),
    ] = None,
    overrides: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
) -> None:
    """Check that the cluster can run a run before anything is created (exit 1 if it cannot)."""
    from launcher.checks import FAIL, Request
    from launcher.connect import connect
    from launcher.launch import model_parallel, resolve_trainer_config
    from launcher.preflight import check_requests, failed, ladder, table
    from launcher.preflight import preflight as run_preflight
    from launcher.render import DNS1035

    if not DNS1035.match(run) or len(run) > 63:  # the probe pod carries it as a label value
        raise UserError(f"--run {run!r} is not a DNS-1035 label of at most 63 characters")
    inputs.shape_options(slices, global_batch, max_micro_batch, max_grad_accum)
    inputs.spec_options(
        image_ref=image,
        ns=namespace,
        queue=queue,
        priority_class=priority_class,
        service_account=service_account,
        cpu_request=cpu_request,
        memory_request=memory_request,
    )
    inputs.seconds("--probe-timeout", probe_timeout, positive=True)
    inputs.run_dir("--run-dir", run_dir, here=False)
    inputs.overrides(overrides)
    shape = make_shape(preset, slices)
    sets = tuple(overrides or ())
    # As `plan`: without --config or --set, the batch plan alone (no trainer asked, no memory estimate).
    resolved = resolve_trainer_config(config or "tiny", sets, strict=False) if config or sets else None
    shapes, skipped = ladder(
        shape, global_batch, max_micro_batch, max_grad_accum, model_parallel(resolved, sets), resolved
    )
    directory = run_dir if run_dir.startswith("gs://") else str(Path(run_dir).resolve())
    spec = RunSpec(
        run=run,
        run_dir=directory,
        global_batch=global_batch or 0,  # only the ladder above depends on it
        image=image,
        namespace=namespace,
        queue=queue,
        priority_class=priority_class,
        service_account=service_account,
        placement_policies=placement_policies(preset, placement_policy),
        cpu_request=cpu_request,
        memory_request=memory_request,
    )
    check_requests(spec)
    conn = connect(kubeconfig, namespace)
    spec = for_cluster(spec, conn.embedded)
    req = Request(spec, shapes, skipped)
    checks = run_preflight(conn.kube, req, probe=probe, probe_timeout_s=probe_timeout)
    if as_json:
        _print_json([asdict(c) for c in checks])
    else:
        console.print(
            table(checks, f"preflight: {shape} in namespace {namespace}, run directory {directory}")
        )
        bad = [c.name for c in checks if c.status == FAIL]
        console.print(f"preflight: {'cannot run: ' + ', '.join(bad) if bad else 'ready'}")
    if failed(checks):
        raise typer.Exit(1)


def _finish(kube, run: str, state: str) -> None:
    from launcher.status import summarize

    summarize(kube, run, console)
    if state != "Finished":
        raise typer.Exit(1)


@app.command()
def demo(
    workdir: Annotated[Path, typer.Option("--workdir", help="Where runs and pod logs go.")] = Path(
        "runs/demo"
    ),
    steps: Annotated[int, typer.Option("--steps", help="Training steps.")] = 30,
) -> None:
    """The elastic demo on the embedded cluster: 2 slices of tpu7x-2x2x2, lose 1, resume on 1, grow back."""
    from launcher.demo import run_demo

    inputs.directory("--workdir", workdir)
    if not 25 <= steps <= 100_000:
        raise UserError(
            "--steps must be between 25 and 100000 (capacity goes at step 5; the run must outlive the regrowth)"
        )
    if run_demo(workdir, steps, console) != "Finished":
        raise typer.Exit(1)


@app.command()
def watch(
    run: Annotated[str | None, typer.Argument(help="The run to attach to.")] = None,
    all_runs: Annotated[
        bool, typer.Option("--all", help="Every run of the namespace (in-cluster mode).")
    ] = False,
    namespace: NamespaceOpt = "default",
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
    from launcher.connect import connect

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
        watch_all(kube, stop, resync_s=resync, lease_s=lease, health_port=health_port)
        return
    _finish(kube, run, watch_run(kube, run, console=console, resync_s=resync, lease_s=lease))


@app.command()
def status(
    run: Annotated[str, typer.Argument(help="The run.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    namespace: NamespaceOpt = "default",
    kubeconfig: KubeconfigOpt = None,
) -> None:
    """State, segments, latest committed checkpoint, restarts by cause and goodput of a run."""
    from launcher.connect import connect
    from launcher.status import run_report
    from launcher.view import badput_table, segments_table

    inputs.namespace(namespace)
    rec, report, rundir = run_report(connect(kubeconfig, namespace).kube, run)
    committed = rundir.latest_committed_step()
    if as_json:
        _print_json({**report.as_dict(), "latest_committed_step": committed, "total_steps": rec.total_steps})
        return
    console.print(f"[bold]{run}[/bold]: {rec.state} — {rec.reason}")
    console.print(
        f"latest committed checkpoint: step {committed} of {rec.total_steps or '?'}; "
        f"restarts: {', '.join(f'{k.replace(chr(95), chr(32))} {v}' for k, v in report.restarts.items())}"
    )
    console.print(segments_table(rec, report))
    console.print(badput_table(report))


@app.command()
def runs(namespace: NamespaceOpt = "default", kubeconfig: KubeconfigOpt = None) -> None:
    """List the runs of the namespace."""
    from launcher.connect import connect

    inputs.namespace(namespace)
    table = Table(title=f"runs in {namespace}")
    for col in ("run", "state", "shape now", "requested", "segments", "global batch", "reason"):
        table.add_column(col, overflow="fold")
    for rec in connect(kubeconfig, namespace).kube.records():
        seg = rec.current
        table.add_row(
            rec.name,
            rec.state,
            f"{seg.preset} x{seg.slices}" if seg else "-",
            f"{rec.preset} x{rec.slices}",
            str(len(rec.segments)),
            str(rec.spec.global_batch),
            rec.reason,
        )
    console.print(table)


@app.command()
def stop(
    run: Annotated[str, typer.Argument(help="The run.")],
    namespace: NamespaceOpt = "default",
    kubeconfig: KubeconfigOpt = None,
) -> None:
    """Stop a run: delete its JobSet (the trainer checkpoints), keep its record and run directory."""
    from launcher.connect import connect
    from launcher.launch import stop_run

    inputs.namespace(namespace)
    kube = connect(kubeconfig, namespace).kube
    deleted = stop_run(kube, run)
    console.print(
        f"{run}: stopped; deleted {', '.join(deleted) or 'no JobSet'}; record and run directory kept"
    )


@app.command()
def report(
    run: Annotated[str, typer.Argument(help="The run.")],
    out: Annotated[Path | None, typer.Option("--out", help="Directory for the PNGs.")] = None,
    namespace: NamespaceOpt = "default",
    kubeconfig: KubeconfigOpt = None,
) -> None:
    """Write the plots of a run: loss across segments, and the timeline with its badput."""
    from launcher.connect import connect
    from launcher.status import write_plots

    inputs.namespace(namespace)
    if out is not None:
        inputs.directory("--out", out)
    for path in write_plots(connect(kubeconfig, namespace).kube, run, out):
        console.print(str(path))


# --- ragged-buffer sweep ---------------------------------------------------------------------


@app.command()
def sweep(
    preset: PresetOpt,
    steps: Annotated[int, typer.Option("--steps", help="Optimizer steps of every run.")],
    slices: SlicesOpt = None,
    config: ConfigOpt = "tiny",
    factors: Annotated[
        str, typer.Option("--factors", help="Buffer factors, comma-separated; ≤ 0 (e.g. -1) = dropless.")
    ] = "1.0,1.0625,1.125,1.25,1.5,2.0,-1",
    global_batch: Annotated[
        int | None, typer.Option("--global-batch", "-b", help="Sequences per step (default: 2 per device).")
    ] = None,
    max_parallel: Annotated[
        int, typer.Option("--max-parallel", help="Runs at once on a real cluster (embedded: 1).")
    ] = 1,
    name: Annotated[str, typer.Option("--name", help="Sweep name; runs are NAME-f<factor>.")] = "sweep",
    overrides: SetOpt = None,
    max_drop: Annotated[
        float, typer.Option("--max-drop", help="Largest dropped fraction to recommend (0.001 = 0.1 %).")
    ] = 0.001,
    warmup: Annotated[int, typer.Option("--warmup", help="Steps left out of the aggregates.")] = 10,
    sweep_dir: Annotated[
        str | None, typer.Option("--sweep-dir", help="Path or gs:// (default ./sweeps/NAME).")
    ] = None,
    image: ImageOpt = DEFAULT_IMAGE,
    namespace: NamespaceOpt = "default",
    kubeconfig: KubeconfigOpt = None,
    grace_period: GracePeriodOpt = None,
) -> None:
    """Sweep the MoE ragged buffer factor: one run per factor; drops, load and step time side by side."""
    from launcher.connect import connect
    from launcher.record import Policy
    from launcher.sweep import make_sweep, plan_sweep, run_sweep
    from launcher.sweep_results import sweep_table

    inputs.overrides(overrides)
    inputs.shape_options(slices, global_batch, 16, None)
    inputs.spec_options(image_ref=image, ns=namespace, grace_period=grace_period)
    inputs.integer("--steps", steps, high=inputs.MAX_STEPS)
    inputs.integer("--max-parallel", max_parallel, high=256)
    inputs.integer("--warmup", warmup, low=0, high=inputs.MAX_STEPS)
    inputs.fraction("--max-drop", max_drop)
    if sweep_dir is not None:
        inputs.run_dir("--sweep-dir", sweep_dir)
    spec = make_sweep(
        name=name, preset=preset, slices=slices, config=config, factors=factors, steps=steps,
        global_batch=global_batch, overrides=tuple(overrides or ()), warmup=warmup, max_drop=max_drop,
        max_parallel=max_parallel, sweep_dir=sweep_dir,
    )  # fmt: skip
    template = RunSpec(
        run=name, run_dir=spec.sweep_dir, global_batch=spec.global_batch, image=image, namespace=namespace
    )
    policy = Policy()
    plan_sweep(spec, template, policy)  # every run planned and checked before anything starts
    conn = connect(kubeconfig, namespace, start_embedded=f"{spec.preset}:{spec.slices}")
    if conn.embedded and spec.max_parallel > 1:
        # One machine: parallel runs would share its cores and every step time would be wrong.
        console.print(f"embedded cluster: runs one at a time (--max-parallel {spec.max_parallel} ignored)")
        spec = replace(spec, max_parallel=1)
    outcome = run_sweep(
        conn.kube, spec, for_cluster(template, conn.embedded, grace_period), policy,
        console=console, live=sys.stdout.isatty(),
    )  # fmt: skip
    console.print(sweep_table(spec, outcome.results, outcome.recommendation))
    console.print(f"written: {', '.join(outcome.outputs)}")
    if not outcome.complete:
        # SystemExit, not typer.Exit: main() runs the app with standalone_mode=False, where click
        # returns typer.Exit's code instead of exiting with it.
        sys.exit(1)


@app.command("sweep-report")
def sweep_report(
    name: Annotated[str, typer.Argument(help="The sweep.")],
    sweep_dir: Annotated[
        str | None, typer.Option("--sweep-dir", help="Path or gs:// (default ./sweeps/SWEEP).")
    ] = None,
) -> None:
    """Redraw a sweep's table and plot from its stored results (sweep.json)."""
    from launcher.sweep import default_sweep_dir, load_sweep, plot_path
    from launcher.sweep_results import plot_sweep, sweep_table

    spec, results, rec = load_sweep(default_sweep_dir(name, sweep_dir))
    console.print(sweep_table(spec, results, rec))
    png = plot_path(spec)
    plot_sweep(spec, results, rec, png)
    console.print(f"plot: {png}")


@functools.cache
def _command() -> Callable[..., Any]:
    """The click command of `app`, built once: building it is most of the cost of a refused input
    (56 ms), which the bad-input suite pays for hundreds of cases in one process."""
    return typer.main.get_command(app)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: one line and exit 2 for every user error."""
    try:
        # Without standalone mode, typer returns a command's exit code instead of exiting.
        code = _command()(args=argv, prog_name="reslice", standalone_mode=False)
    except UserError as e:
        print(f"reslice: error: {e}", file=sys.stderr)
        sys.exit(2)
    except ClusterNotReady as e:
        print(f"reslice: {e}", file=sys.stderr)
        sys.exit(1)
    except typer.TyperException as e:  # usage errors: missing or malformed options (exit code 2)
        print(f"reslice: error: {' '.join(e.format_message().split())}", file=sys.stderr)
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        print("reslice: aborted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:
        known = environment_error(e)
        if known is None:
            raise
        print(f"reslice: {'error: ' if known[0] == 2 else ''}{known[1]}", file=sys.stderr)
        sys.exit(known[0])
    if isinstance(code, int) and code:
        sys.exit(code)


if __name__ == "__main__":
    main()
