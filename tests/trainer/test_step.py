"""The train step in-process: gradient accumulation, a dense first layer and a shared expert."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from trainer import config, data, moe
from trainer.mesh import batch_sharding, make_mesh
from trainer.step import abstract_state, init_state, make_train_step, unpack


def test_accumulating_two_micro_batches_equals_one_batch(cpu8: list) -> None:
    cfg = config.resolve("tiny", ["model.dense_layers=1", "moe.shared_expert_dim=32"], {})
    mesh = make_mesh(cfg.moe.num_experts)
    batch = next(
        iter(data.make_dataset(cfg.data, cfg.model.vocab_size, cfg.model.seq_len, data.Layout(16, 1), 0, 1))
    )
    out = {}
    with jax.set_mesh(mesh):
        graphdef, abstract = abstract_state(cfg, mesh)
        stop = jax.device_put(np.zeros(8, np.int32), NamedSharding(mesh, P(moe.BATCH_AXES)))
        for accum in (1, 2):
            state = init_state(cfg, mesh, abstract)
            step = make_train_step(cfg, graphdef, mesh, abstract)
            tokens = jax.device_put(batch["tokens"].reshape(accum, 16 // accum, -1), batch_sharding(mesh))
            for _ in range(2):  # the first step has lr 0 (warmup): take a real update too
                state, metrics = step(state, tokens, stop)
            out[accum] = (unpack(jax.device_get(metrics)), jax.device_get(jax.tree.leaves(state)))
    (m1, p1), (m2, p2) = out[1], out[2]
    assert m1["layers"].shape == (1, 3)  # one MoE layer after the dense one
    assert m1["layers"][0, 1] == 16 * 32 * 2 and m2["layers"][0, 1] == m1["layers"][0, 1]
    assert float(m1["stop"]) == 0.0
    for key in ("loss", "total_loss", "lb_loss", "z_loss", "grad_norm"):
        assert abs(float(m1[key]) - float(m2[key])) < 1e-5, key
    assert max(float(np.abs(a - b).max()) for a, b in zip(p1, p2, strict=True)) < 1e-5
    assert np.isfinite(float(m1["loss"])) and float(m1["lr"]) > 0
