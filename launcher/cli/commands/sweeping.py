"""`reslice sweep` and `sweep-report`: the MoE ragged-buffer sweep (`launcher.sweep.driver`) and its table
and plot (`launcher.sweep.results`, `launcher.sweep.files`). Mounted by `launcher.cli.app`."""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Annotated

import typer

from launcher.cli.options import (
    ConfigOpt,
    GracePeriodOpt,
    ImageOpt,
    KubeconfigOpt,
    NamespaceOpt,
    PreflightOpt,
    PresetOpt,
    SetOpt,
    SlicesOpt,
    TrainerOpt,
    console,
)
from launcher.cli.spec_options import check_run_options, for_cluster, run_spec, trainer_config, trainer_image
from launcher.core import inputs
from launcher.core.spec import RunSpec
from launcher.core.words import TrainerProfile
from launcher.sweep.spec import DEFAULT_FACTORS


def sweep(
    preset: PresetOpt,
    steps: Annotated[int, typer.Option("--steps", help="Optimizer steps of every run.")],
    slices: SlicesOpt = None,
    config: ConfigOpt = None,
    trainer: TrainerOpt = RunSpec.trainer,
    factors: Annotated[
        str, typer.Option("--factors", help="Buffer factors, comma-separated; ≤ 0 (e.g. -1) = dropless.")
    ] = DEFAULT_FACTORS,
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
    image: ImageOpt = None,
    namespace: NamespaceOpt = RunSpec.namespace,
    kubeconfig: KubeconfigOpt = None,
    grace_period: GracePeriodOpt = None,
    checks: PreflightOpt = True,
) -> None:
    """Sweep the MoE ragged buffer factor: one run per factor; drops, load and step time side by side.
    `--trainer maxtext` sweeps MaxText's `ragged_buffer_factor` on a MaxText MoE model (docs/maxtext.md)."""
    from launcher.cli.connect import connect
    from launcher.core.record import Knobs
    from launcher.sweep.driver import plan_sweep, run_sweep
    from launcher.sweep.results import sweep_table
    from launcher.sweep.spec import make_sweep

    image = trainer_image(trainer, image)
    check_run_options(
        overrides=overrides, slices=slices, global_batch=global_batch, max_micro_batch=16, max_grad_accum=None,
        image=image, namespace=namespace, grace_period=grace_period,
    )  # fmt: skip
    inputs.integer("--steps", steps, high=inputs.MAX_STEPS)
    inputs.integer("--max-parallel", max_parallel, high=256)
    inputs.integer("--warmup", warmup, low=0, high=inputs.MAX_STEPS)
    inputs.fraction("--max-drop", max_drop)
    if sweep_dir is not None:
        inputs.run_dir("--sweep-dir", sweep_dir)
    config = trainer_config(trainer, config)  # an unknown --trainer: exit 2 here
    spec = make_sweep(
        name=name, preset=preset, slices=slices, config=config, factors=factors, steps=steps,
        global_batch=global_batch, overrides=tuple(overrides or ()), warmup=warmup, max_drop=max_drop,
        max_parallel=max_parallel, sweep_dir=sweep_dir, trainer=trainer,
    )  # fmt: skip
    template = run_spec(
        preset=spec.preset, run=name, run_dir=spec.sweep_dir, global_batch=spec.global_batch, image=image,
        namespace=namespace, trainer=trainer,
    )  # fmt: skip
    knobs = Knobs()
    # The runs differ in their buffer factor only (make_sweep checked them all): one planned here
    # finds what a bad input would break in every run before the cluster is asked anything;
    # run_sweep plans them all before it creates anything.
    (first,) = plan_sweep(spec, template, knobs, spec.factors[:1])
    if trainer == TrainerProfile.MAXTEXT:  # MaxText's keys are checked where they are rendered
        from launcher.adapters.preset_files import make_shape
        from launcher.core.render import render_jobset

        render_jobset(first.record.spec, make_shape(spec.preset, spec.slices), 0)
    conn = connect(kubeconfig, namespace, start_embedded=f"{spec.preset}:{spec.slices}")
    template = for_cluster(template, conn.embedded, grace_period)
    if checks:  # launch's free checks, on the one shape every run of the sweep is measured on
        from launcher.adapters.preset_files import make_shape
        from launcher.core.capacity.checks import Request
        from launcher.preflight.gate import refuse_unready

        refuse_unready(conn.kube, Request(template, (make_shape(spec.preset, spec.slices),)))
    if conn.embedded and spec.max_parallel > 1:
        # One machine: parallel runs would share its cores and every step time would be wrong.
        console.print(f"embedded cluster: runs one at a time (--max-parallel {spec.max_parallel} ignored)")
        spec = replace(spec, max_parallel=1)
    outcome = run_sweep(
        conn.kube, spec, template, knobs,
        console=console, live=sys.stdout.isatty(),
    )  # fmt: skip
    console.print(sweep_table(spec, outcome.results, outcome.recommendation))
    console.print(f"written: {', '.join(outcome.outputs)}")
    if not outcome.complete:
        # SystemExit, not typer.Exit: main() runs the app with standalone_mode=False, where click
        # returns typer.Exit's code instead of exiting with it.
        sys.exit(1)


def sweep_report(
    name: Annotated[str, typer.Argument(help="The sweep.")],
    sweep_dir: Annotated[
        str | None, typer.Option("--sweep-dir", help="Path or gs:// (default ./sweeps/SWEEP).")
    ] = None,
) -> None:
    """Redraw a sweep's table and plot from its stored results (sweep.json)."""
    from launcher.sweep.files import load_sweep, plot_path
    from launcher.sweep.results import plot_sweep, sweep_table
    from launcher.sweep.spec import default_sweep_dir

    spec, results, rec = load_sweep(default_sweep_dir(name, sweep_dir))
    console.print(sweep_table(spec, results, rec))
    png = plot_path(spec)
    plot_sweep(spec, results, rec, png)
    console.print(f"plot: {png}")
