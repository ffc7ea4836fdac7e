"""The batch plan and the shrink ladder.

The global batch GB (sequences per optimizer step) is fixed for the life of a run. On a shape with D
devices and a model-parallel (tensor-parallel) degree T from the trainer config, the batch is split
over R = D / T data-parallel ranks (the T devices of a rank share one slice of the batch), and the
trainer runs A micro-steps of b sequences per rank, R·b·A = GB, so that losing a slice changes step
time but not the optimisation. The plan prefers the largest micro-batch that fits (fewest
micro-steps, best device utilisation).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.core.hbm import GIB, estimate
from launcher.core.presets import Preset, Shape

if TYPE_CHECKING:
    from launcher.core.spec import RunSpec

# The sections of the trainer's resolved config that the HBM estimate reads (launcher/core/hbm.py):
# what a run record keeps of it (RunSpec.trainer_config).
HBM_SECTIONS = ("model", "moe", "mesh")


@dataclass(frozen=True)
class Plan:
    devices: int
    micro_batch: int  # b: sequences per data-parallel rank per micro-step
    grad_accum: int  # A: micro-steps per optimizer step
    model_parallel: int = 1  # T: devices per data-parallel rank (mesh.tensor)

    @property
    def dp_ranks(self) -> int:
        return self.devices // self.model_parallel

    @property
    def global_batch(self) -> int:
        return self.dp_ranks * self.micro_batch * self.grad_accum


@dataclass(frozen=True)
class Infeasible:
    reason: str


def plan_batch(
    global_batch: int,
    devices: int,
    max_micro_batch: int,
    max_grad_accum: int | None = None,
    model_parallel: int = 1,
) -> Plan | Infeasible:
    """(b, A) with (devices / model_parallel)·b·A = global_batch, b <= max_micro_batch, largest b;
    else why not."""
    if global_batch < 1 or devices < 1 or max_micro_batch < 1 or model_parallel < 1:
        return Infeasible(
            "global batch, devices, maximum micro-batch and tensor parallelism must be positive"
        )
    if devices % model_parallel:
        return Infeasible(f"tensor parallelism {model_parallel} does not divide {devices} devices")
    ranks = devices // model_parallel
    what = f"{ranks} data-parallel ranks" if model_parallel > 1 else f"{devices} devices"
    if global_batch % ranks:
        return Infeasible(f"global batch {global_batch} is not divisible by {what}")
    per_rank = global_batch // ranks
    micro = max(b for b in range(1, min(per_rank, max_micro_batch) + 1) if per_rank % b == 0)
    accum = per_rank // micro
    if max_grad_accum is not None and accum > max_grad_accum:
        unit = "data-parallel rank" if model_parallel > 1 else "device"
        return Infeasible(
            f"needs {accum} micro-steps of {micro} per {unit}, more than the {max_grad_accum} allowed"
        )
    return Plan(devices=devices, micro_batch=micro, grad_accum=accum, model_parallel=model_parallel)


@dataclass(frozen=True)
class Rung:
    """One shape a run may run on, with its plan or the reason it cannot."""

    shape: Shape
    plan: Plan | Infeasible
    hbm: dict[str, float] | None = (
        None  # bytes per device by term (launcher.core.hbm.estimate), given the config
    )

    @property
    def feasible(self) -> bool:
        return isinstance(self.plan, Plan)

    @property
    def reason(self) -> str:
        """Why the shape cannot run ("" when it can)."""
        return self.plan.reason if isinstance(self.plan, Infeasible) else ""


def ladder_shapes(requested: Shape, presets: Mapping[str, Preset]) -> list[Shape]:
    """Every shape reachable from `requested`, largest first.

    Fewer slices of the requested preset, then its fallbacks (transitively), each with at most as
    many slices as requested. Sorted by devices, descending; on a tie the requested preset and then
    fewer slices come first (fewer slices = fewer node pools that must all be healthy at once).
    """
    order = [requested.preset]
    queue = list(requested.preset.fallbacks)
    while queue:
        preset = presets[queue.pop(0)]
        if preset not in order:
            order.append(preset)
            queue.extend(preset.fallbacks)
    shapes = [Shape(p, n) for p in order for n in range(requested.slices, 0, -1)]
    shapes = [s for s in shapes if s.devices <= requested.devices]
    rank = {p.name: i for i, p in enumerate(order)}
    return sorted(shapes, key=lambda s: (-s.devices, rank[s.preset.name], s.slices))


def shrink_ladder(
    requested: Shape,
    global_batch: int,
    max_micro_batch: int,
    max_grad_accum: int | None = None,
    *,
    catalog: Mapping[str, Preset],
    model_parallel: int = 1,
    trainer_config: dict | None = None,
) -> list[Rung]:
    """Every rung with its plan (the fallbacks looked up in `catalog`); given the trainer config,
    with its HBM estimate per device, and infeasible where that does not fit the preset's HBM
    (the run never shrinks onto it). The first rung is the requested shape."""
    return [
        _rung(shape, global_batch, max_micro_batch, max_grad_accum, model_parallel, trainer_config)
        for shape in ladder_shapes(requested, catalog)
    ]


def _rung(
    shape: Shape,
    global_batch: int,
    max_micro_batch: int,
    max_grad_accum: int | None,
    model_parallel: int,
    trainer_config: dict | None,
) -> Rung:
    if shape.error:
        return Rung(shape, Infeasible(shape.error))
    plan = plan_batch(global_batch, shape.devices, max_micro_batch, max_grad_accum, model_parallel)
    if trainer_config is None or not isinstance(plan, Plan):
        return Rung(shape, plan)
    needs = estimate(trainer_config, plan)
    has = shape.preset.hbm_bytes_per_device
    if has is not None and needs["total"] > has:
        return Rung(
            shape,
            Infeasible(
                f"needs ~{needs['total'] / GIB:.1f} GiB per device (estimate),"
                f" more than its {has / GIB:.0f} GiB of HBM"
            ),
            needs,
        )
    return Rung(shape, plan, needs)


def hbm_sections(resolved: dict) -> str:
    """What `RunSpec.trainer_config` keeps of the trainer's resolved config: the sections the HBM
    estimate reads, as JSON (sorted keys, so that one config is one string)."""
    return json.dumps({k: resolved[k] for k in HBM_SECTIONS if k in resolved}, sort_keys=True)


def run_ladder(spec: RunSpec, requested: Shape, catalog: Mapping[str, Preset]) -> list[Rung]:
    """The run's ladder, as `plan` shows it: the one that launch checks and every controller pass
    decides on, so that a rung `plan` marks infeasible (its batch plan, or its HBM estimate over
    the preset's HBM) is never chosen."""
    return shrink_ladder(
        requested,
        spec.global_batch,
        spec.max_micro_batch,
        spec.max_grad_accum,
        catalog=catalog,
        model_parallel=spec.model_parallel,
        trainer_config=json.loads(spec.trainer_config) if spec.trainer_config else None,
    )
