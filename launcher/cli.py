"""`reslice`: the command line. Thin: parse, call one function, print.

User errors (UserError, bad options) print one line on stderr and exit 2, with no traceback.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.console import Console
from rich.table import Table

from launcher.embedded.cli import app as cluster_app
from launcher.errors import UserError
from launcher.plan import Plan, shrink_ladder
from launcher.presets import load_presets, make_shape
from launcher.render import RunSpec, render_jobset
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


@app.command()
def plan(
    preset: PresetOpt,
    global_batch: GlobalBatchOpt,
    slices: SlicesOpt = None,
    max_micro_batch: MaxMicroOpt = 16,
    max_grad_accum: MaxAccumOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show the shrink ladder: every shape the run may fall back to, with its batch plan."""
    shape = make_shape(preset, slices)
    rungs = shrink_ladder(shape, global_batch, max_micro_batch, max_grad_accum)
    if not rungs[0].feasible:
        raise UserError(f"{shape}: {rungs[0].plan.reason}")
    if as_json:
        _print_json(
            [
                {
                    "preset": r.shape.preset.name,
                    "slices": r.shape.slices,
                    "chips": r.shape.chips,
                    "hosts": r.shape.hosts,
                    "devices": r.shape.devices,
                    **(
                        {"micro_batch": r.plan.micro_batch, "grad_accum": r.plan.grad_accum}
                        if isinstance(r.plan, Plan)
                        else {"infeasible": r.plan.reason}
                    ),
                }
                for r in rungs
            ]
        )
        return
    table = Table(title=f"shrink ladder of {shape} at global batch {global_batch}")
    for col in ("preset", "slices", "chips", "hosts", "devices", "micro-batch", "grad accum"):
        table.add_column(col, justify="left" if col == "preset" else "right")
    table.add_column("note")
    for r in rungs:
        s = r.shape
        cells = [s.preset.name, str(s.slices), str(s.chips), str(s.hosts), str(s.devices)]
        if isinstance(r.plan, Plan):
            table.add_row(*cells, str(r.plan.micro_batch), str(r.plan.grad_accum), "")
        else:
            table.add_row(*cells, "-", "-", f"[dim]{r.plan.reason}[/dim]")
    console.print(table)


@app.command()
def render(
    preset: PresetOpt,
    run: Annotated[str, typer.Option("--run", help="Run name (DNS-1035).")],
    run_dir: Annotated[str, typer.Option("--run-dir", help="Run directory: a path or gs://bucket/prefix.")],
    global_batch: GlobalBatchOpt,
    image: Annotated[str, typer.Option("--image", help="Trainer image.")] = "reslice-trainer:latest",
    slices: SlicesOpt = None,
    segment: Annotated[int, typer.Option("--segment", help="Segment index.")] = 0,
    config: Annotated[str, typer.Option("--config", "-c", help="Trainer config name or path.")] = "tiny",
    overrides: Annotated[list[str] | None, typer.Option("--set", help="Trainer override key=value.")] = None,
    namespace: Annotated[str, typer.Option("--namespace")] = "default",
    max_micro_batch: MaxMicroOpt = 16,
    max_grad_accum: MaxAccumOpt = None,
    grace_period: Annotated[int, typer.Option("--grace-period", help="Seconds to save on SIGTERM.")] = 120,
    max_restarts: Annotated[int, typer.Option("--max-restarts")] = 10,
    queue: Annotated[str | None, typer.Option("--queue", help="Kueue LocalQueue.")] = None,
    priority_class: Annotated[str | None, typer.Option("--priority-class")] = None,
    pull_policy: Annotated[str, typer.Option("--pull-policy")] = "IfNotPresent",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to a file.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of YAML.")] = False,
) -> None:
    """Render the JobSet of one segment as YAML (or JSON)."""
    for kv in overrides or []:
        if "=" not in kv:
            raise UserError(f"--set {kv!r}: expected key=value")
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
        grace_period_s=grace_period,
        max_restarts=max_restarts,
        queue=queue,
        priority_class=priority_class,
        image_pull_policy=pull_policy,
    )
    jobset = render_jobset(spec, make_shape(preset, slices), segment)
    text = json.dumps(jobset, indent=2) + "\n" if as_json else yaml.safe_dump(jobset, sort_keys=False)
    if output is None:
        sys.stdout.write(text)
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)


# --- runs -------------------------------------------------------------------------------------

KubeconfigOpt = Annotated[str | None, typer.Option("--kubeconfig", help="Kubeconfig (default: $KUBECONFIG).")]
NamespaceOpt = Annotated[str, typer.Option("--namespace", help="Namespace of the run.")]


@app.command()
def launch(
    preset: PresetOpt,
    run: Annotated[str, typer.Option("--run", help="Run name (DNS-1035).")],
    global_batch: GlobalBatchOpt,
    slices: SlicesOpt = None,
    config: Annotated[str, typer.Option("--config", "-c", help="Trainer config name or path.")] = "tiny",
    overrides: Annotated[list[str] | None, typer.Option("--set", help="Trainer override key=value.")] = None,
    run_dir: Annotated[
        str | None, typer.Option("--run-dir", help="Path or gs:// (default ./runs/RUN).")
    ] = None,
    image: Annotated[str, typer.Option("--image", help="Trainer image.")] = "reslice-trainer:latest",
    detach: Annotated[
        bool, typer.Option("--detach", help="Submit and return; `reslice watch` later.")
    ] = False,
    namespace: NamespaceOpt = "default",
    kubeconfig: KubeconfigOpt = None,
    max_micro_batch: MaxMicroOpt = 16,
    max_grad_accum: MaxAccumOpt = None,
    grace_period: Annotated[
        int | None, typer.Option("--grace-period", help="Seconds to save on SIGTERM.")
    ] = None,
    max_restarts: Annotated[int, typer.Option("--max-restarts", help="JobSet restarts per segment.")] = 3,
    queue: Annotated[str | None, typer.Option("--queue", help="Kueue LocalQueue.")] = None,
    priority_class: Annotated[str | None, typer.Option("--priority-class")] = None,
    unschedulable_grace: Annotated[float, typer.Option("--unschedulable-grace", help="Seconds.")] = 120.0,
    grow_window: Annotated[float, typer.Option("--grow-window", help="Seconds capacity must hold.")] = 300.0,
    grow: Annotated[bool, typer.Option("--grow/--no-grow", help="Grow back when capacity returns.")] = True,
    app_failure_budget: Annotated[int, typer.Option("--app-failure-budget")] = 3,
    app_backoff: Annotated[float, typer.Option("--app-backoff", help="Seconds, doubled per failure.")] = 30.0,
) -> None:
    """Launch a run: plan, submit segment 0, and watch it (shrink, grow back) until it ends."""
    from launcher.connect import connect
    from launcher.launch import create_run, prepare
    from launcher.record import Policy

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
        max_restarts=max_restarts,
        queue=queue,
        priority_class=priority_class,
    )
    rec, _ = prepare(spec, preset, slices, policy)  # every check before anything is created
    conn = connect(kubeconfig, namespace, start_embedded=f"{shape.preset.name}:{shape.slices}")
    if conn.embedded:
        # Trainer processes on this machine: short timeouts, no image.
        spec = replace(
            spec, grace_period_s=grace_period or 30, heartbeat_timeout_s=10, image_pull_policy="Never"
        )
    elif grace_period is not None:
        spec = replace(spec, grace_period_s=grace_period)
    rec = replace(rec, spec=spec)
    create_run(conn.kube, rec)
    console.print(
        f"run {run}: segment 0 on {shape} at global batch {global_batch}; run directory {directory}"
    )
    if detach:
        console.print(f"detached: `reslice watch {run}` attaches, `reslice status {run}` reports")
        return
    _finish(conn.kube, run, watch_run(conn.kube, run, console=console))


def _finish(kube, run: str, state: str) -> None:
    from launcher.status import run_report, write_plots
    from launcher.view import badput_table, segments_table

    rec, report, _ = run_report(kube, run)
    console.print(segments_table(rec, report))
    console.print(badput_table(report))
    paths = write_plots(kube, run)
    console.print(f"{run}: {state} — {rec.reason}. Plots: {', '.join(map(str, paths))}")
    if state != "Finished":
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
) -> None:
    """Attach to a run (live view) or, with --all, control every run of the namespace."""
    from launcher.connect import connect

    if (run is None) == (not all_runs):
        raise UserError("give a RUN or --all (not both)")
    kube = connect(kubeconfig, namespace).kube
    if all_runs:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        watch_all(kube, stop, resync_s=resync, lease_s=lease)
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

    for path in write_plots(connect(kubeconfig, namespace).kube, run, out):
        console.print(str(path))


def main(argv: list[str] | None = None) -> None:
    """Console entry point: one line and exit 2 for every user error."""
    try:
        app(args=argv, prog_name="reslice", standalone_mode=False)
    except UserError as e:
        print(f"reslice: error: {e}", file=sys.stderr)
        sys.exit(2)
    except typer.TyperException as e:  # usage errors: missing or malformed options (exit code 2)
        print(f"reslice: error: {' '.join(e.format_message().split())}", file=sys.stderr)
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        print("reslice: aborted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
