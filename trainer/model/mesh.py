"""The device mesh: axes ``data`` × ``fsdp`` × ``expert`` × ``tensor``, and the logical-axis rules.

- ``data``: across slices (DCN), outermost; parameters are replicated over it unless
  ``mesh.shard_over_data``.
- ``fsdp``: inside a slice; splits the batch *and* the parameters, gradients and Adam moments
  (ZeRO-3: XLA all-gathers a weight where it is used and reduce-scatters its gradient).
- ``expert``: splits the batch and the experts of an MoE layer (the dispatch in ``trainer.model.moe``).
- ``tensor``: innermost (the most traffic, the nearest neighbours); splits attention heads, the MLP
  hidden width and the vocabulary; the devices of one ``tensor`` group share one slice of the batch.

A *data-parallel rank* is one slice of the batch: ``data × fsdp × expert`` of them, each of
``tensor`` devices. Devices are laid out in process order (slice-major, as process ids are), so a
process holds a contiguous block of data-parallel ranks (what
``jax.make_array_from_process_local_data`` needs) and a tensor group stays inside a host whenever it
fits.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from trainer.config import Config, ConfigError, MeshConfig

AXES = ("data", "fsdp", "expert", "tensor")
BATCH_AXES = ("data", "fsdp", "expert")  # the token/batch dimension: every axis but ``tensor``


def logical_rules(mesh_cfg: MeshConfig) -> tuple[tuple[str, str | tuple[str, ...] | None], ...]:
    """Logical parameter axis -> mesh axes (as MaxText's ``logical_axis_rules``); one table for all."""
    fsdp: str | tuple[str, ...] = ("data", "fsdp") if mesh_cfg.shard_over_data else "fsdp"
    return (
        ("embed", fsdp),  # d_model of every weight: FSDP
        ("vocab", "tensor"),
        ("heads", "tensor"),
        ("head_dim", None),
        ("mlp", "tensor"),  # dense MLP, shared expert and expert hidden width
        ("experts", "expert"),
        ("router", None),  # the router's expert dimension: small, used whole on every device
        ("norm", None),
        ("layers", None),  # the stacked-layer axis of a scanned stack
    )


@dataclass(frozen=True)
class MeshShape:
    data: int
    fsdp: int
    expert: int
    tensor: int

    @property
    def dp_ranks(self) -> int:
        return self.data * self.fsdp * self.expert

    def sizes(self) -> tuple[int, int, int, int]:
        return (self.data, self.fsdp, self.expert, self.tensor)


def _largest_divisor(n: int, of: int) -> int:
    return max(d for d in range(1, n + 1) if n % d == 0 and of % d == 0)


def mesh_shape(num_devices: int, cfg: MeshConfig, num_experts: int, has_moe: bool = True) -> MeshShape:
    """Sizes from ``mesh.*`` (0: automatic). ``data`` defaults to 1, ``tensor`` to 1, ``expert`` to
    the largest divisor of what is left that divides the experts (1 for a dense model), ``fsdp`` to
    the rest."""
    data, tensor = cfg.data or 1, cfg.tensor or 1
    for name, size in (("mesh.data", data), ("mesh.tensor", tensor)):
        if num_devices % size:
            raise ConfigError(f"{name}={size} does not divide the device count ({num_devices})")
    rest = num_devices // (data * tensor)
    if rest * data * tensor != num_devices:
        raise ConfigError(f"mesh.data × mesh.tensor = {data * tensor} does not divide {num_devices} devices")
    if cfg.expert:
        expert = cfg.expert
        if rest % expert or num_experts % expert:
            raise ConfigError(
                f"mesh.expert={expert} must divide both the devices left by data × tensor ({rest})"
                f" and moe.num_experts ({num_experts})"
            )
    elif cfg.fsdp:
        if rest % cfg.fsdp:
            raise ConfigError(
                f"mesh.fsdp={cfg.fsdp} does not divide the devices left by data × tensor ({rest})"
            )
        expert = rest // cfg.fsdp
        if num_experts % expert:
            raise ConfigError(
                f"the devices left for mesh.expert ({expert}) must divide moe.num_experts ({num_experts})"
            )
    else:
        expert = _largest_divisor(rest, num_experts) if has_moe else 1
    fsdp = cfg.fsdp or rest // expert
    if data * fsdp * expert * tensor != num_devices:
        raise ConfigError(
            f"mesh data × fsdp × expert × tensor = {data} × {fsdp} × {expert} × {tensor}"
            f" ≠ {num_devices} devices"
        )
    return MeshShape(data, fsdp, expert, tensor)


def has_moe_layers(cfg: Config) -> bool:
    return cfg.model.dense_layers < cfg.model.n_layers


def make_mesh(
    num_experts: int,
    requested_ep: int = 0,
    devices: list | None = None,
    *,
    mesh_cfg: MeshConfig | None = None,
    has_moe: bool = True,
) -> Mesh:
    devices = devices if devices is not None else jax.devices()
    # slice_index exists on multislice TPU devices; process ids are slice-major anyway.
    devices = sorted(devices, key=lambda d: (getattr(d, "slice_index", 0), d.process_index, d.id))
    mcfg = mesh_cfg if mesh_cfg is not None else MeshConfig(expert=requested_ep)
    shape = mesh_shape(len(devices), mcfg, num_experts, has_moe)
    grid = np.array(devices, dtype=object).reshape(shape.sizes())
    return Mesh(grid, AXES, axis_types=(AxisType.Auto,) * len(AXES))


def mesh_for(cfg: Config, devices: list | None = None) -> Mesh:
    return make_mesh(cfg.moe.num_experts, devices=devices, mesh_cfg=cfg.mesh, has_moe=has_moe_layers(cfg))


def dp_ranks(mesh: Mesh) -> int:
    return mesh.size // mesh.shape["tensor"]


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """[A, micro-batch, seq]: micro-batch rows split over the data-parallel ranks, A and seq whole."""
    return NamedSharding(mesh, P(None, BATCH_AXES))


def device_sharding(mesh: Mesh) -> NamedSharding:
    """A [devices] vector, one element per device (the SIGTERM flags)."""
    return NamedSharding(mesh, P(AXES))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def process_block(mesh: Mesh, process_index: int) -> tuple[int, int]:
    """(blocks, block): the batch splits into ``blocks`` equal contiguous blocks of data-parallel
    ranks and this process's devices hold block ``block`` (processes of one tensor group share it)."""
    ranks = mesh.devices.reshape(-1, mesh.shape["tensor"])  # [dp rank, tensor], AXES order
    mine = sorted({r for r, row in enumerate(ranks) for d in row if d.process_index == process_index})
    per = len(mine)
    if not per or mine != list(range(mine[0], mine[0] + per)) or mine[0] % per or len(ranks) % per:
        raise ConfigError(f"process {process_index} does not hold a contiguous block of data-parallel ranks")
    return len(ranks) // per, mine[0] // per


@dataclass(frozen=True)
class BatchPlan:
    """How one optimizer step's global batch splits over this segment's devices and processes."""

    devices: int
    micro_batch: int  # sequences per data-parallel rank per micro-step
    grad_accum: int
    num_processes: int
    expert_parallel: int
    dp_ranks: int  # data-parallel ranks = devices / tensor
    fsdp: int = 1
    tensor: int = 1


def batch_plan(
    cfg: Config, devices: int, num_processes: int, expert_parallel: int, ranks: int = 0, fsdp: int = 1
) -> BatchPlan:
    """Check dp ranks × micro-batch × grad-accum = global batch against the mesh JAX gives.

    A data-parallel rank is the ``tensor`` devices that share one slice of the batch."""
    t = cfg.train
    ranks = ranks or devices
    b = t.micro_batch or t.global_batch // (ranks * t.grad_accum)
    if b < 1 or ranks * b * t.grad_accum != t.global_batch:
        raise ConfigError(
            f"data-parallel ranks × micro-batch × grad-accum = {ranks} × {b} × {t.grad_accum}"
            f" = {ranks * b * t.grad_accum} ≠ global batch {t.global_batch}"
            f" ({devices} devices, tensor parallel {devices // ranks})"
        )
    if (ranks * b) % cfg.moe.balance_group:
        raise ConfigError(
            f"moe.balance_group={cfg.moe.balance_group} must divide the micro-batch {ranks * b}"
        )
    return BatchPlan(devices, b, t.grad_accum, num_processes, expert_parallel, ranks, fsdp, devices // ranks)
