"""`reslice`: the command line. Thin: parse, call one function, print.

User errors (UserError, bad options) print one line on stderr and exit 2, with no traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.console import Console
from rich.table import Table

from launcher.errors import UserError
from launcher.plan import Plan, shrink_ladder
from launcher.presets import load_presets, make_shape
from launcher.render import RunSpec, render_jobset

app = typer.Typer(
    help="Elastic JAX pretraining on GKE TPU slices.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
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
