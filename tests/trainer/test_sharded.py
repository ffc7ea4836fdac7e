"""FSDP and tensor parallelism: the mesh decisions, the parameter shardings, and a resume across a
change of sharding that keeps the run on the uninterrupted run's losses and samples."""

from __future__ import annotations

import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.trainer import runs
from trainer import config
from trainer.config import ConfigError, MeshConfig
from trainer.model.attention import blocked_attention
from trainer.model.mesh import mesh_for, mesh_shape, process_block
from trainer.model.transformer import chunked_cross_entropy
from trainer.state.checkpoint import Checkpointer
from trainer.step import abstract_state

# The reference run's schedule (40 steps) while a segment stops early: same config hash.
SCHEDULE = ["--set", "optim.decay_steps=40"]
SHARDED = [*runs.MODEL, "mesh.fsdp=4", "mesh.tensor=2"]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """8 devices (fsdp 4 × tensor 2: 4 data-parallel ranks of 4 sequences), uninterrupted to step 10,
    committed at 5 and 10: the first segment of the cross-shape resume and the yardstick of the
    same-shape one. Tests copy its run directory, never write into it."""
    run_dir = tmp_path_factory.mktemp("sharded") / "run"
    sets = [*SHARDED, "train.steps=10", "checkpoint.interval=5"]
    args = [a for s in sets for a in ("--set", s)] + SCHEDULE
    rc, out = runs.run(
        runs.own_compile_cache(runs.env_for(str(run_dir), 8)), run_dir.parent / "trainer.log", args
    )
    assert rc == 0, out[-4000:]
    assert runs.committed(run_dir) == [5, 10]
    return {"dir": run_dir, "records": runs.parse_metrics(runs.metrics_files(run_dir))}


def sharded_state(run_dir: Path, step: int) -> dict[str, np.ndarray]:
    """The committed state of ``step`` restored onto this process's fsdp 4 × tensor 2 mesh."""
    cfg = config.resolve("tiny", SHARDED, {})
    mesh = mesh_for(cfg)
    with jax.set_mesh(mesh):
        _, abstract = abstract_state(cfg, mesh)
        ckpt = Checkpointer(str(run_dir), keep=3, async_save=False)
        try:
            state = ckpt.restore(step, abstract)
        finally:
            ckpt.close()
    return {
        jax.tree_util.keystr(k, simple=True, separator="/"): np.asarray(v)
        for k, v in jax.tree_util.tree_flatten_with_path(state)[0]
    }


def test_mesh_sizes_default_to_fsdp_and_refuse_what_does_not_divide() -> None:
    assert mesh_shape(8, MeshConfig(), 8).sizes() == (1, 1, 8, 1)  # MoE: experts first, as before
    assert mesh_shape(128, MeshConfig(tensor=4), 8, has_moe=False).sizes() == (1, 32, 1, 4)
    assert mesh_shape(8, MeshConfig(fsdp=4, tensor=2), 8).sizes() == (1, 4, 1, 2)
    assert mesh_shape(16, MeshConfig(data=2, tensor=2), 2).sizes() == (2, 2, 2, 2)
    assert mesh_shape(16, MeshConfig(data=2, tensor=2), 2).dp_ranks == 8
    for bad in (
        MeshConfig(tensor=3),
        MeshConfig(fsdp=3),
        MeshConfig(expert=3),
        MeshConfig(fsdp=2, tensor=2, expert=4),
    ):
        with pytest.raises(ConfigError):
            mesh_shape(8, bad, 8)


def test_parameters_and_adam_moments_are_sharded_by_the_logical_rules(cpu8: list) -> None:
    cfg = config.resolve("tiny", ["mesh.fsdp=4", "mesh.tensor=2", "model.dense_layers=1"], {})
    mesh = mesh_for(cfg)
    assert dict(mesh.shape) == {"data": 1, "fsdp": 4, "expert": 1, "tensor": 2}
    with jax.set_mesh(mesh):
        _, state = abstract_state(cfg, mesh)
    flat = {
        jax.tree_util.keystr(k, simple=True, separator="/"): v
        for k, v in jax.tree_util.tree_flatten_with_path(state)[0]
    }

    def shard(suffix: str) -> tuple[int, ...]:
        (leaf,) = [v for k, v in flat.items() if k.endswith(suffix)]
        return leaf.sharding.shard_shape(leaf.shape)

    m = cfg.model
    # embed over fsdp (4), vocab/heads/mlp over tensor (2); moments (mu, nu) as their parameters.
    # Scanned stacks: a leading layer axis, never split.
    assert shard("0/embed/value") == (m.vocab_size // 2, m.d_model // 4)
    assert shard("0/dense/layers/attn/wq/value") == (1, m.d_model // 4, m.n_heads // 2, m.head_dim)
    assert shard("0/dense/layers/ffn/w_down/value") == (1, m.d_ff // 2, m.d_model // 4)
    assert shard("mu/dense/layers/ffn/w_down/value") == (1, m.d_ff // 2, m.d_model // 4)
    assert shard("nu/lm_head/value") == (m.d_model // 4, m.vocab_size // 2)
    assert shard("0/moe/layers/ffn/w_up/value") == (
        1,
        cfg.moe.num_experts,
        m.d_model // 4,
        cfg.moe.d_expert // 2,
    )
    assert shard("0/final_norm/scale/value") == (m.d_model,)


def test_query_blocked_attention_and_chunked_loss_equal_the_whole_computation(cpu8: list) -> None:
    q, k, v = (jax.random.normal(jax.random.key(i), (2, 64, 4, 16)) for i in range(3))
    whole = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    assert float(jnp.abs(blocked_attention(q, k, v, 16) - whole).max()) < 1e-5
    x, w = jax.random.normal(jax.random.key(3), (2, 64, 32)), jax.random.normal(jax.random.key(4), (32, 100))
    targets = jax.random.randint(jax.random.key(5), (2, 64), 0, 100)

    def loss(chunk: int):
        return jax.value_and_grad(chunked_cross_entropy, argnums=(0, 1))(x, w, targets, chunk)

    (l_all, g_all), (l_chunk, g_chunk) = loss(0), loss(16)
    assert abs(float(l_all) - float(l_chunk)) < 1e-5
    assert max(float(jnp.abs(a - b).max()) for a, b in zip(g_all, g_chunk, strict=True)) < 1e-5


def test_process_blocks_of_a_tensor_group_spanning_processes() -> None:
    class Dev:
        def __init__(self, i: int, per_process: int):
            self.id, self.process_index = i, i // per_process

    cfg = config.resolve("tiny", ["mesh.fsdp=2", "mesh.tensor=4"], {})
    devices = [Dev(i, 2) for i in range(8)]  # 4 processes of 2 devices; a tensor group spans 2
    mesh = mesh_for(cfg, devices)
    assert [process_block(mesh, p) for p in range(4)] == [(2, 0), (2, 0), (2, 1), (2, 1)]
    mesh = mesh_for(config.resolve("tiny", ["mesh.fsdp=8"], {}), [Dev(i, 4) for i in range(8)])
    assert [process_block(mesh, p) for p in range(2)] == [(2, 0), (2, 1)]


def test_same_shape_resume_on_fsdp_and_tensor_parallel_is_bitwise_equal(
    sharded: dict, tmp_path: Path, cpu8: list
) -> None:
    """Killed after step 5 committed (its later checkpoint never committed), resumed on the same
    sharded shape: the uninterrupted run's losses and parameters, bit for bit."""
    run_dir = tmp_path / "run"
    # What a SIGKILL between steps 6 and 10 leaves, made without a race: metrics past the
    # resume step, no commit after it. Copying the fixture keeps the test to one short segment.
    shutil.copytree(sharded["dir"], run_dir)
    shutil.rmtree(run_dir / "checkpoints" / "10")
    args = [a for s in [*SHARDED, "train.steps=10"] for a in ("--set", s)] + SCHEDULE
    rc, out = runs.run(runs.env_for(str(run_dir), 8), tmp_path / "second.log", args)
    assert rc == 0, out[-4000:]
    assert "resumed step 5 " in out
    newest = sorted((run_dir / "metrics").glob("*.jsonl"))[-1]
    resumed = runs.parse_metrics({newest.name: newest.read_text()})
    assert sorted(resumed) == list(range(6, 11))
    assert {(r["devices"], r["dp_ranks"], r["micro_batch"]) for r in resumed.values()} == {(8, 4, 4)}
    runs.assert_matches_reference(resumed, sharded, exact=True)
    expected, got = sharded_state(sharded["dir"], 10), sharded_state(run_dir, 10)
    assert sorted(got) == sorted(expected)
    different = [k for k in expected if not np.array_equal(got[k], expected[k])]
    assert not different, f"parameters or moments differ after the resume: {different[:5]}"
    # The resume also changes them from step 5's (a no-op resume would pass the comparison above).
    assert not np.array_equal(sharded_state(run_dir, 5)["0/embed/value"], got["0/embed/value"])


def test_resume_from_fsdp_and_tensor_parallel_onto_two_devices_matches_the_uninterrupted_run(
    sharded: dict, reference: dict, tmp_path: Path
) -> None:
    """8 devices (fsdp 4 × tensor 2: 4 data-parallel ranks of 4 sequences) to step 10, then 2
    devices (fsdp 2, no tensor parallelism, 2 × 4 accumulation) to step 30, global batch 16."""
    run_dir = tmp_path / "run"
    shutil.copytree(sharded["dir"], run_dir)
    first = sharded["records"]
    assert sorted(first) == list(range(1, 11))
    assert {(r["devices"], r["dp_ranks"], r["micro_batch"], r["grad_accum"]) for r in first.values()} == {
        (8, 4, 4, 1)
    }

    second_args = ["--set", "mesh.fsdp=2", "--set", "mesh.tensor=1", "--set", "train.steps=30", *SCHEDULE]
    rc, out = runs.run(
        runs.own_compile_cache(runs.env_for(str(run_dir), 2, grad_accum=4)),
        tmp_path / "second.log",
        second_args,
    )
    assert rc == 0, out[-4000:]
    assert "resumed step 10 " in out
    newest = sorted((run_dir / "metrics").glob("*.jsonl"))[-1]
    resumed = runs.parse_metrics({newest.name: newest.read_text()})
    assert sorted(resumed) == list(range(11, 31))
    assert {(r["devices"], r["dp_ranks"], r["micro_batch"], r["grad_accum"]) for r in resumed.values()} == {
        (2, 2, 2, 4)
    }
    runs.assert_matches_reference(first, reference, exact=False)
    runs.assert_matches_reference(resumed, reference, exact=False)
    # A shape this run has not compiled for misses the compile cache.
    assert first[1]["perf/compile_cache_hits"] == resumed[11]["perf/compile_cache_hits"] == 0


def test_a_mesh_axis_that_does_not_divide_a_dimension_leaves_it_whole(cpu8: list) -> None:
    # Three processes of one device each (the start-barrier tests): fsdp 3 cannot split a
    # 64-wide dimension, so that dimension is replicated and the divisible ones stay sharded.
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from trainer.step import _fitted

    mesh = Mesh(np.array(cpu8[:6]).reshape(3, 2), ("fsdp", "tensor"))
    rule = NamedSharding(mesh, P("tensor", "fsdp"))
    assert _fitted(rule, (256, 64)).spec == P("tensor", None)
    assert _fitted(rule, (256, 96)).spec == P("tensor", "fsdp")
    assert _fitted(NamedSharding(mesh, P(("fsdp", "tensor"))), (6,)).spec == P(("fsdp", "tensor"))
    assert _fitted(NamedSharding(mesh, P(("fsdp", "tensor"))), (4,)).spec == P(None)
