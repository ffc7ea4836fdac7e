"""The train step in-process: gradient accumulation, a dense first layer and a shared expert."""

from __future__ import annotations

import math
import re

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from trainer import config
from trainer.data import pipeline
from trainer.loop import unpack
from trainer.model.mesh import BATCH_AXES, batch_sharding, make_mesh
from trainer.step import abstract_state, init_state, make_train_step, plain


def test_accumulating_two_micro_batches_equals_one_batch(cpu8: list) -> None:
    cfg = config.resolve("tiny", ["model.dense_layers=1", "moe.shared_expert_dim=32"], {})
    mesh = make_mesh(cfg.moe.num_experts)
    batch = next(
        iter(
            pipeline.make_dataset(
                cfg.data, cfg.model.vocab_size, cfg.model.seq_len, pipeline.Layout(16, 1), 0, 1
            )
        )
    )
    out = {}
    with jax.set_mesh(mesh):
        graphdef, abstract = abstract_state(cfg, mesh)
        stop = jax.device_put(np.zeros(8, np.int32), NamedSharding(mesh, P(BATCH_AXES)))
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


def _group_size(collective: str, n_devices: int) -> int:
    """Devices in each replica group of one collective of the compiled HLO text, in the forms
    XLA prints: ``{{0,1},{2,3}}``, iota ``[groups,size]<=[...]`` and ``mesh[...] {'axes'}``."""
    groups = collective.split("replica_groups=", 1)[1]
    if groups.startswith("{{"):
        return groups[2 : groups.index("}")].count(",") + 1
    if groups.startswith("["):
        return int(re.match(r"\[\d+,(\d+)\]", groups).group(1))
    if groups.startswith("mesh["):
        sizes = dict(re.findall(r"'(\w+)'=(\d+)", groups[: groups.index("]")]))
        over = re.match(r"mesh\[[^\]]*\] \{([^}]*)\}", groups)
        if over is None:  # no axes named: one group of the whole mesh
            return n_devices
        return math.prod(int(sizes[a.strip(" '")]) for a in over.group(1).split(","))
    return n_devices  # {}: every device


def test_moe_layers_forward_runs_no_collective_over_every_device(cpu8: list) -> None:
    """Routing and the layers' statistics stay on the devices that hold the tokens: inside the
    scanned layers' forward pass, collectives span the expert-parallel group or the FSDP pair,
    never the whole mesh (GSPMD's top_k gathered every token's router probabilities to every
    device, and each layer reduced its statistics over all of them: per layer, on every step)."""
    cfg = config.resolve("tiny", ["mesh.fsdp=2"], {})  # 8 devices: fsdp 2 × expert 4
    mesh = make_mesh(cfg.moe.num_experts, mesh_cfg=cfg.mesh)
    with jax.set_mesh(mesh):
        graphdef, abstract = abstract_state(cfg, mesh)
        step = make_train_step(cfg, graphdef, mesh, abstract)
        tokens = jax.ShapeDtypeStruct((1, 16, cfg.model.seq_len + 1), np.int32, sharding=batch_sharding(mesh))
        stop = jax.ShapeDtypeStruct((8,), np.int32, sharding=NamedSharding(mesh, P(BATCH_AXES)))
        hlo = step.lower(plain(abstract), tokens, stop).compile().as_text()
    kinds = r" (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(-start)?\("
    collectives = [line for line in hlo.splitlines() if re.search(kinds, line) and "replica_groups=" in line]
    forward = [c for c in collectives if "while/body" in c and "transpose(" not in c]
    sizes = {_group_size(c, 8) for c in forward}
    assert any("all-to-all" in c for c in forward) and 4 in sizes  # the dispatch, in groups of 4
    assert 8 not in sizes, [c.split("=", 1)[0] for c in forward if _group_size(c, 8) == 8]
    assert any(_group_size(c, 8) == 8 for c in collectives)  # the loss mean: the parser sees them
