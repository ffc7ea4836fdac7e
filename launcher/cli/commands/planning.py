"""`reslice presets`, `plan` and `render`: what a run would be, with no cluster asked. Mounted by
`launcher.cli.app`; the tables are `launcher.report.view`'s."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
import yaml

from launcher.adapters.preset_files import load_catalog
from launcher.cli.options import (
    DEFAULT_INIT_TIMEOUT,
    ConfigOpt,
    CoordinatorPortOpt,
    CpuRequestOpt,
    GlobalBatchOpt,
    GracePeriodOpt,
    ImageOpt,
    InitTimeoutOpt,
    MaxAccumOpt,
    MaxMicroOpt,
    MaxRestartsOpt,
    MemoryRequestOpt,
    NamespaceOpt,
    PlacementOpt,
    PresetOpt,
    PriorityClassOpt,
    QueueOpt,
    RestartModeOpt,
    RunOpt,
    ServiceAccountOpt,
    SetOpt,
    SlicesOpt,
    TasPreferredOpt,
    TasTopologyOpt,
    TrainerOpt,
    console,
    print_json,
)
from launcher.cli.spec_options import check_run_options, run_spec, trainer_config, trainer_image
from launcher.core import inputs
from launcher.core.errors import UserError
from launcher.core.plan import Plan, shrink_ladder
from launcher.core.render import render_jobset, render_slice_jobset, render_world_access
from launcher.core.spec import DEFAULT_COORDINATOR_PORT, RunSpec, restart_mode_error
from launcher.core.words import TrainerProfile
from launcher.report.view import ladder_table, presets_table


def presets(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List the topology presets."""
    rows = list(load_catalog().values())
    if as_json:
        print_json(
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
    console.print(presets_table(rows))


def plan(
    preset: PresetOpt,
    global_batch: GlobalBatchOpt,
    slices: SlicesOpt = None,
    max_micro_batch: MaxMicroOpt = RunSpec.max_micro_batch,
    max_grad_accum: MaxAccumOpt = None,
    config: Annotated[
        str | None, typer.Option("--config", "-c", help="Trainer config: its mesh.tensor divides the batch.")
    ] = None,
    overrides: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show the shrink ladder: every shape the run may fall back to, with its batch plan."""
    from launcher.controller.launch import model_parallel, resolve_trainer_config

    inputs.overrides(overrides)
    inputs.shape_options(slices, global_batch, max_micro_batch, max_grad_accum)
    catalog = load_catalog()
    shape = catalog.shape(preset, slices)
    sets = tuple(overrides or ())
    # Without --config or --set: the batch plan alone (no trainer asked, no HBM estimate).
    resolved = resolve_trainer_config(config or "tiny", sets, strict=False) if config or sets else None
    rungs = shrink_ladder(
        shape,
        global_batch,
        max_micro_batch,
        max_grad_accum,
        catalog=catalog,
        model_parallel=model_parallel(resolved, sets),
        trainer_config=resolved,
    )
    if not rungs[0].feasible:
        raise UserError(f"{shape}: {rungs[0].reason}")
    if as_json:
        print_json([_rung_json(r) for r in rungs])
        return
    console.print(ladder_table(shape, global_batch, rungs))


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
        return {**row, "feasible": True, **plan, "plan": plan, "memory": r.hbm}
    return {**row, "feasible": False, "infeasible": r.plan.reason, "plan": None, "memory": r.hbm}


def render(
    preset: PresetOpt,
    run: RunOpt,
    run_dir: Annotated[str, typer.Option("--run-dir", help="Run directory: a path or gs://bucket/prefix.")],
    global_batch: GlobalBatchOpt,
    image: ImageOpt = None,
    slices: SlicesOpt = None,
    segment: Annotated[int, typer.Option("--segment", help="Segment index.")] = 0,
    config: ConfigOpt = None,
    trainer: TrainerOpt = RunSpec.trainer,
    overrides: SetOpt = None,
    namespace: NamespaceOpt = RunSpec.namespace,
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
    pull_policy: Annotated[str, typer.Option("--pull-policy")] = RunSpec.image_pull_policy,
    coordinator_port: CoordinatorPortOpt = DEFAULT_COORDINATOR_PORT,
    placement_policy: PlacementOpt = None,
    cpu_request: CpuRequestOpt = None,
    memory_request: MemoryRequestOpt = None,
    restart_mode: RestartModeOpt = RunSpec.restart_mode,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to a file.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of YAML.")] = False,
) -> None:
    """Render the JobSet of one segment as YAML (or JSON). In place: the run's world access
    (ServiceAccount, Role, RoleBinding) and one JobSet per slice, as documents of one stream (a JSON
    list)."""
    from launcher.controller.launch import ladder_name_error, trainer_model_parallel
    from launcher.core.policy import rules_for
    from launcher.core.record import Knobs

    image = trainer_image(trainer, image)
    check_run_options(
        overrides=overrides, slices=slices, global_batch=global_batch, max_micro_batch=max_micro_batch,
        max_grad_accum=max_grad_accum, image=image, namespace=namespace, grace_period=grace_period,
        max_restarts=max_restarts, init_timeout=init_timeout, queue=queue, priority_class=priority_class,
        tas_topology=tas_topology, tas_preferred=tas_preferred,
        service_account=service_account, cpu_request=cpu_request, memory_request=memory_request,
    )  # fmt: skip
    config = trainer_config(trainer, config)
    if err := restart_mode_error(restart_mode, trainer):
        raise UserError(err)
    inputs.integer("--segment", segment, low=0, high=10_000)
    inputs.run_dir("--run-dir", run_dir)
    if output is not None:
        inputs.output_file("--output", output)
    if pull_policy not in {"Always", "IfNotPresent", "Never"}:
        raise UserError(f"--pull-policy {pull_policy!r}: expected Always, IfNotPresent or Never")
    spec = run_spec(
        preset=preset, placement_policy=placement_policy, overrides=overrides,
        run=run, run_dir=run_dir, global_batch=global_batch, image=image, config=config, namespace=namespace,
        max_micro_batch=max_micro_batch, max_grad_accum=max_grad_accum,
        trainer=trainer,
        model_parallel=1
        if trainer == TrainerProfile.MAXTEXT
        else trainer_model_parallel(config, tuple(overrides or ()), strict=False),
        grace_period_s=grace_period, max_restarts=max_restarts, init_timeout_s=init_timeout, queue=queue,
        tas_topology=tas_topology, tas_preferred=tas_preferred,
        priority_class=priority_class, service_account=service_account, image_pull_policy=pull_policy,
        coordinator_port=coordinator_port, cpu_request=cpu_request, memory_request=memory_request,
        restart_mode=restart_mode,
    )  # fmt: skip
    catalog = load_catalog()
    shape = catalog.shape(preset, slices)
    # The run name's limit as `launch` states it: the last segment any rung of the ladder may take.
    ladder = shrink_ladder(
        shape, global_batch, max_micro_batch, max_grad_accum, catalog=catalog, model_parallel=spec.model_parallel
    )  # fmt: skip
    if err := ladder_name_error(spec, ladder, Knobs().max_segments):
        raise UserError(err)
    if rules_for(spec).WORLD:
        if err := shape.error:
            raise UserError(err)
        objects = render_world_access(spec) + [
            render_slice_jobset(spec, shape.preset, str(i)) for i in range(shape.slices)
        ]
        text = (
            json.dumps(objects, indent=2) + "\n" if as_json else yaml.safe_dump_all(objects, sort_keys=False)
        )
    else:
        jobset = render_jobset(spec, shape, segment)
        text = json.dumps(jobset, indent=2) + "\n" if as_json else yaml.safe_dump(jobset, sort_keys=False)
    if output is None:
        sys.stdout.write(text)
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        try:
            output.write_text(text)
        except OSError as e:
            raise UserError(f"--output {output}: {e.strerror}") from None
