"""The MoE dispatch plan and transports against a plain numpy reference (8 simulated CPU devices)."""

from __future__ import annotations

import itertools
from functools import lru_cache, partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh
from jax.sharding import PartitionSpec as P

from trainer.model import moe, sizes

E, K, D_MODEL, D_FF = 8, 2, 8, 16
DATA, EP = 2, 4  # 8 devices: two expert-parallel groups of four
N = 24  # tokens per device


def reference_plan(ids: np.ndarray, buffer: int) -> tuple[np.ndarray, np.ndarray]:
    """Plain-Python dispatch for one expert-parallel group.

    ids: [EP, N, K] expert of each (token, slot) on each source shard. Returns
    (sent [src, dst], kept mask [EP, N, K]) following docs/platform.md §6: a source's rows go out sorted by
    expert (then token, then slot); each destination accepts rows in source order until full.
    """
    e_loc = E // EP
    sent = np.zeros((EP, EP), int)
    kept = np.zeros(ids.shape, bool)
    room = [buffer] * EP
    for src in range(EP):
        rows = sorted((ids[src, t, s], t, s) for t in range(N) for s in range(K))
        for expert, t, s in rows:
            dst = expert // e_loc
            sent[src, dst] += 1
            if room[dst] > 0:
                room[dst] -= 1
                kept[src, t, s] = True
    return sent, kept


def skewed_routing(seed: int = 0) -> np.ndarray:
    """[devices · N, K] distinct experts per token, Zipf-skewed towards low expert ids."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, E + 1) ** 1.2
    p /= p.sum()
    return np.stack([rng.choice(E, size=K, replace=False, p=p) for _ in range(DATA * EP * N)]).astype(
        np.int32
    )


@pytest.fixture(scope="module")
def mesh(cpu8: list) -> Mesh:
    return Mesh(
        np.array(cpu8).reshape(DATA, 1, EP, 1),
        ("data", "fsdp", "expert", "tensor"),
        axis_types=(AxisType.Auto,) * 4,
    )


@pytest.fixture(scope="module")
def inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        "x": rng.normal(size=(DATA * EP * N, D_MODEL)).astype(np.float32),
        "ids": skewed_routing(),
        "gates": rng.uniform(0.1, 1.0, size=(DATA * EP * N, K)).astype(np.float32),
        "w_gate": rng.normal(size=(E, D_MODEL, D_FF)).astype(np.float32) / 3,
        "w_up": rng.normal(size=(E, D_MODEL, D_FF)).astype(np.float32) / 3,
        "w_down": rng.normal(size=(E, D_FF, D_MODEL)).astype(np.float32) / 4,
    }


@lru_cache
def moe_fn(mesh: Mesh, factor: float, transport: str = "dense", expert_matmul: str = "ragged"):
    body = partial(
        moe.dispatch_combine, num_experts=E, factor=factor, transport=transport, expert_matmul=expert_matmul
    )
    tok, ex = P(moe.BATCH_AXES), P(moe.EXPERT_AXIS)
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(tok,) * 3 + (ex,) * 3, out_specs=(tok,) * 3))


def dense_reference(inp: dict, kept: np.ndarray) -> np.ndarray:
    """Every expert on every token in float64; only kept (token, slot) pairs are summed."""
    x = inp["x"].astype(np.float64)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for s in range(K):
            if kept[t, s]:
                e = inp["ids"][t, s]
                g, u = x[t] @ inp["w_gate"][e], x[t] @ inp["w_up"][e]
                out[t] += inp["gates"][t, s] * ((g / (1 + np.exp(-g)) * u) @ inp["w_down"][e])
    return out


def run(mesh: Mesh, inp: dict, factor: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    y, kept, stats = moe_fn(mesh, factor)(
        *(inp[k] for k in ("x", "ids", "gates", "w_gate", "w_up", "w_down"))
    )
    return np.asarray(y), np.asarray(kept), np.asarray(stats)


@pytest.mark.parametrize("factor", [0.5, 1.0])
def test_plan_matches_numpy_reference_on_skewed_routing(mesh: Mesh, inputs: dict, factor: float) -> None:
    y, kept, stats = run(mesh, inputs, factor)
    buffer = sizes.buffer_rows(N, K, factor, EP, E)
    assert buffer == int(N * K * factor)
    ids = inputs["ids"].reshape(DATA, EP, N, K)
    for g in range(DATA):
        sent, ref_kept = reference_plan(ids[g], buffer)
        got = stats[g * EP : (g + 1) * EP]  # device (g, dst): dropped, received, load
        np.testing.assert_array_equal(got[:, 1], sent.sum(0))
        np.testing.assert_array_equal(got[:, 0], np.maximum(sent.sum(0) - buffer, 0))
        np.testing.assert_allclose(got[:, 2], sent.sum(0) / (N * K))
        np.testing.assert_array_equal(kept.reshape(DATA, EP, N, K)[g], ref_kept)  # exactly which rows
    assert stats[:, 0].sum() == (~kept).sum() > 0
    np.testing.assert_allclose(y, dense_reference(inputs, kept), rtol=2e-5, atol=2e-5)
    # A token whose every row was dropped gets exactly zero, not uninitialised memory.
    all_dropped = ~kept.any(axis=1)
    assert all_dropped.any()
    assert (y[all_dropped] == 0.0).all()


def test_drops_fall_as_the_factor_rises_and_vanish_when_dropless(mesh: Mesh, inputs: dict) -> None:
    drops = [int(run(mesh, inputs, f)[2][:, 0].sum()) for f in (0.25, 0.5, 1.0, 1.5)]
    assert all(a > b for a, b in itertools.pairwise(drops)), drops
    y, kept, stats = run(mesh, inputs, 0.0)
    assert stats[:, 0].sum() == 0 and kept.all()
    assert stats[:, 2].max() > 1.5  # the routing really is skewed
    assert sizes.buffer_rows(N, K, 0.0, EP, E) == N * K * min(EP, E // K)
    np.testing.assert_allclose(y, dense_reference(inputs, kept), rtol=2e-5, atol=2e-5)


def test_gradients_match_the_dense_reference(mesh: Mesh, inputs: dict) -> None:
    _, kept, _ = run(mesh, inputs, 1.0)
    fn = moe_fn(mesh, 1.0)
    mask = jnp.asarray(kept, jnp.float32)

    def loss(x, w_gate, gates):
        y, _, _ = fn(x, inputs["ids"], gates, w_gate, inputs["w_up"], inputs["w_down"])
        return jnp.sum(y**2)

    def dense_loss(x, w_gate, gates):
        def expert(e, xx):
            return (jax.nn.silu(xx @ w_gate[e]) * (xx @ inputs["w_up"][e])) @ inputs["w_down"][e]

        every = jnp.stack([expert(e, x) for e in range(E)], axis=1)  # [T, E, d]
        picked = jnp.take_along_axis(every, inputs["ids"][:, :, None], axis=1)
        return jnp.sum(jnp.sum(picked * (gates * mask)[..., None], axis=1) ** 2)

    args = (inputs["x"], inputs["w_gate"], inputs["gates"])
    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*args)
    want = jax.jit(jax.grad(dense_loss, argnums=(0, 1, 2)))(*args)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * float(jnp.abs(w).max()))
    assert float(jnp.abs(got[2] * (1 - mask)).max()) == 0.0  # no gradient through dropped rows


@pytest.mark.parametrize("factor", [-1.0, 0.5])
def test_dense_expert_matmul_equals_the_grouped_one(mesh: Mesh, inputs: dict, factor: float) -> None:
    """moe.expert_matmul=dense (every local expert over every row, masked) against ragged_dot's
    grouped matmul: the same outputs, kept rows and gradients, dropless and with drops."""
    args = tuple(inputs[k] for k in ("x", "ids", "gates", "w_gate", "w_up", "w_down"))

    def grads(kind: str):
        fn = moe_fn(mesh, factor, "dense", kind)

        def loss(x, ids, gates, *w):
            y, kept, _ = fn(x, ids, gates, *w)
            return jnp.sum(y**2), (y, kept)

        return jax.jit(jax.grad(loss, argnums=(0, 2, 3, 4, 5), has_aux=True))(*args)

    (g_r, (y_r, kept_r)), (g_d, (y_d, kept_d)) = grads("ragged"), grads("dense")
    assert np.array_equal(kept_r, kept_d)
    np.testing.assert_allclose(y_d, y_r, rtol=1e-5, atol=1e-5)
    for a, b in zip(g_d, g_r, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(jnp.abs(b).max()))


def test_ragged_transport_lowers_with_the_same_plan(mesh: Mesh, inputs: dict) -> None:
    """XLA:CPU cannot compile ragged_all_to_all (docs/platform.md §5), but forward and backward must lower."""
    args = tuple(inputs[k] for k in ("x", "ids", "gates", "w_gate", "w_up", "w_down"))
    fwd = moe_fn(mesh, 1.0, "ragged").lower(*args).as_text()
    assert fwd.count("ragged_all_to_all") == 2  # dispatch and return
    assert "all_to_all" not in fwd.replace("ragged_all_to_all", "")

    def loss(x, *rest):
        return jnp.sum(moe_fn(mesh, 1.0, "ragged")(x, *rest)[0] ** 2)

    bwd = jax.jit(jax.grad(loss)).lower(*args).as_text()
    assert bwd.count("ragged_all_to_all") == 4
    # The dense expert matmul lowers behind the ragged transport too (a carry type that varies over
    # the mesh like the received rows: found on a TPU, where the ragged transport runs).
    assert (
        "ragged_all_to_all"
        in jax.jit(jax.grad(lambda x, *rest: jnp.sum(moe_fn(mesh, 1.0, "ragged", "dense")(x, *rest)[0] ** 2)))
        .lower(*args)
        .as_text()
    )
    assert moe.resolve_transport("auto") == "dense"  # on CPU


def test_balance_loss_is_independent_of_micro_batching() -> None:
    rng = np.random.default_rng(2)
    probs = jax.nn.softmax(jnp.asarray(rng.normal(size=(16, 8, E)) * 3), axis=-1)
    _, idx = jax.lax.top_k(probs, K)
    loss = jax.jit(lambda p, i, g: jnp.mean(moe.balance_loss(p, i, g)), static_argnums=2)
    whole = loss(probs, idx, 1)
    for a in (2, 4, 8):
        size = 16 // a
        parts = [loss(probs[j : j + size], idx[j : j + size], 1) for j in range(0, 16, size)]
        assert abs(float(jnp.mean(jnp.stack(parts))) - float(whole)) < 1e-6
    # A loss over the whole micro-batch would not be: that is why groups are fixed.
    classic = loss(probs, idx, 16)
    halves = (loss(probs[:8], idx[:8], 8) + loss(probs[8:], idx[8:], 8)) / 2
    assert abs(float(classic) - float(halves)) > 1e-4
