"""The device mesh: axes ``data`` × ``expert`` over every device; the batch is split over both.

Devices are laid out in process order with ``expert`` innermost, so process p's devices hold the
contiguous block p of every micro-batch (what ``jax.make_array_from_process_local_data`` needs) and
an expert-parallel group stays inside one host whenever it fits.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from trainer.config import ConfigError
from trainer.moe import BATCH_AXES


def expert_parallel_size(num_devices: int, num_experts: int, requested: int = 0) -> int:
    """The requested size, or the largest divisor of the device count that divides the experts."""
    if requested:
        if num_devices % requested or num_experts % requested:
            raise ConfigError(
                f"mesh.expert={requested} must divide both the device count ({num_devices})"
                f" and moe.num_experts ({num_experts})"
            )
        return requested
    return max(d for d in range(1, num_devices + 1) if num_devices % d == 0 and num_experts % d == 0)


def make_mesh(num_experts: int, requested_ep: int = 0, devices: list | None = None) -> Mesh:
    devices = devices if devices is not None else jax.devices()
    devices = sorted(devices, key=lambda d: (d.process_index, d.id))
    ep = expert_parallel_size(len(devices), num_experts, requested_ep)
    grid = np.array(devices, dtype=object).reshape(len(devices) // ep, ep)
    return Mesh(grid, ("data", "expert"), axis_types=(AxisType.Auto, AxisType.Auto))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """[A, micro-batch, seq]: micro-batch rows split over every device, A and seq whole."""
    return NamedSharding(mesh, P(None, BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())
