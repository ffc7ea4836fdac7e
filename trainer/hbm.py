"""Per-device HBM of the train step, known before launching (``python -m trainer --hbm``).

The step is lowered and compiled ahead of time for the shape of this environment (the devices JAX
sees: simulated CPU devices are fine) from abstract arguments that carry their shardings, so no
state is allocated; ``compiled.memory_analysis()`` gives what XLA reserves on one device.
Per-device bytes = arguments + outputs − aliased (the donated state is updated in place) +
temporaries. The figures are XLA:CPU's buffer assignment for this program; an accelerator backend
fuses differently, so treat them as an estimate of the same order, not a guarantee.
``xla_peak_bytes`` is XLA's own peak of the program (``peak_memory_in_bytes``): compiled for a TPU
it matched the chip's measured peak, where the sum above, whose temporaries are a total and not a
peak, was well over (docs/measurements.md "On a TPU").
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

from trainer.config import Config


def aot_hbm(cfg: Config) -> dict[str, Any]:
    """Compile the train step for this environment's devices and report its HBM per device."""
    from trainer.model.mesh import batch_plan, batch_sharding, device_sharding, dp_ranks, mesh_for
    from trainer.step import abstract_state, make_train_step, plain

    mesh = mesh_for(cfg)
    plan = batch_plan(cfg, mesh.size, 1, mesh.shape["expert"], dp_ranks(mesh), mesh.shape["fsdp"])
    gb, seq = cfg.train.global_batch, cfg.model.seq_len
    with jax.set_mesh(mesh):
        graphdef, abstract = abstract_state(cfg, mesh)
        step = make_train_step(cfg, graphdef, mesh, abstract)
        tokens = jax.ShapeDtypeStruct(
            (plan.grad_accum, gb // plan.grad_accum, seq + 1), np.int32, sharding=batch_sharding(mesh)
        )
        stop = jax.ShapeDtypeStruct((mesh.size,), np.int32, sharding=device_sharding(mesh))
        t0 = time.perf_counter()
        compiled = step.lower(plain(abstract), tokens, stop).compile()
        seconds = time.perf_counter() - t0
    m = compiled.memory_analysis()
    if m is None:
        raise RuntimeError(f"{jax.default_backend()}'s compiler reports no memory analysis for the step")
    args, out, alias, temp = (
        int(m.argument_size_in_bytes),
        int(m.output_size_in_bytes),
        int(m.alias_size_in_bytes),
        int(m.temp_size_in_bytes),
    )
    state_bytes = sum(
        int(np.prod(a.sharding.shard_shape(a.shape))) * a.dtype.itemsize for a in jax.tree.leaves(abstract)
    )
    per_device = args + out - alias + temp
    return {
        "config": cfg.name,
        "devices": mesh.size,
        "mesh": dict(mesh.shape),
        "dp_ranks": plan.dp_ranks,
        "micro_batch": plan.micro_batch,
        "grad_accum": plan.grad_accum,
        "global_batch": gb,
        "argument_bytes": args,
        "output_bytes": out,
        "alias_bytes": alias,
        "temp_bytes": temp,
        "state_bytes": state_bytes,
        "per_device_bytes": per_device,
        "per_device_gib": per_device / 2**30,
        "xla_peak_bytes": int(getattr(m, "peak_memory_in_bytes", 0) or per_device),
        "compile_seconds": seconds,
        "backend": jax.default_backend(),
    }
