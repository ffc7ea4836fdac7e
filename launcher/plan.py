"""The batch plan and the shrink ladder.

The global batch GB (sequences per optimizer step) is fixed for the life of a run. On a shape with D
devices the trainer runs A micro-steps of b sequences per device, D·b·A = GB, so that losing a slice
changes step time but not the optimisation. The plan prefers the largest micro-batch that fits
(fewest micro-steps, best device utilisation).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from launcher.presets import Preset, Shape, load_presets


@dataclass(frozen=True)
class Plan:
    devices: int
    micro_batch: int  # b: sequences per device per micro-step
    grad_accum: int  # A: micro-steps per optimizer step

    @property
    def global_batch(self) -> int:
        return self.devices * self.micro_batch * self.grad_accum


@dataclass(frozen=True)
class Infeasible:
    reason: str


def plan_batch(
    global_batch: int, devices: int, max_micro_batch: int, max_grad_accum: int | None = None
) -> Plan | Infeasible:
    """(b, A) with devices·b·A = global_batch, b <= max_micro_batch, largest b; else why not."""
    if global_batch < 1 or devices < 1 or max_micro_batch < 1:
        return Infeasible("global batch, devices and maximum micro-batch must be positive")
    if global_batch % devices:
        return Infeasible(f"global batch {global_batch} is not divisible by {devices} devices")
    per_device = global_batch // devices
    micro = max(b for b in range(1, min(per_device, max_micro_batch) + 1) if per_device % b == 0)
    accum = per_device // micro
    if max_grad_accum is not None and accum > max_grad_accum:
        return Infeasible(
            f"needs {accum} micro-steps of {micro} per device, more than the {max_grad_accum} allowed"
        )
    return Plan(devices=devices, micro_batch=micro, grad_accum=accum)


@dataclass(frozen=True)
class Rung:
    """One shape a run may run on, with its plan or the reason it cannot."""

    shape: Shape
    plan: Plan | Infeasible

    @property
    def feasible(self) -> bool:
        return isinstance(self.plan, Plan)


def ladder_shapes(requested: Shape, presets: dict[str, Preset]) -> list[Shape]:
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
    presets_dir: Path | None = None,
) -> list[Rung]:
    presets = load_presets(presets_dir)
    return [
        Rung(
            shape,
            Infeasible(shape.error)
            if shape.error
            else plan_batch(global_batch, shape.devices, max_micro_batch, max_grad_accum),
        )
        for shape in ladder_shapes(requested, presets)
    ]
