"""Every attention path computes the same function: the Pallas splash kernel (in interpret mode on
CPU), the query-blocked path and the dense one, against a reference written out here, with and without
document segments, sliding windows and grouped-query heads; forward and the gradients of q, k, v."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from trainer import config
from trainer.config import AttentionKind, ConfigError
from trainer.model.attention import attend, resolve, splash_block
from trainer.model.mesh import logical_rules, mesh_for
from trainer.model.transformer import Transformer

B, T, H, HD = 2, 256, 4, 64  # the kernel's blocks are multiples of 128: T = two of them
TOL = 2e-5  # float32: the kernel's online softmax sums in another order than a whole-row softmax


def reference(q, k, v, segments=None, window=0):
    """Causal softmax attention written out: [B, T, H, hd], k/v grouped over their heads."""
    groups = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    pos = np.arange(q.shape[1])
    mask = pos[:, None] >= pos[None, :]
    if window:
        mask = mask & (pos[:, None] - pos[None, :] < window)
    mask = jnp.asarray(mask)[None, None]
    if segments is not None:
        mask = mask & (segments[:, None, :, None] == segments[:, None, None, :])
    probs = jax.nn.softmax(jnp.where(mask, scores, -jnp.inf), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


def inputs(kv: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.normal(size=(B, T, n, HD)), jnp.float32) for n in (H, kv, kv))
    segments = jnp.asarray(np.cumsum(rng.random((B, T)) < 0.02, axis=1), jnp.int32)  # ~5 documents
    cotangent = jnp.asarray(rng.normal(size=(B, T, H, HD)), jnp.float32)
    return q, k, v, segments, cotangent


def value_and_grads(fn, q, k, v, cotangent):
    out, vjp = jax.vjp(fn, q, k, v)
    return out, vjp(cotangent)


CASES = {  # (kv heads, document segments, window)
    "causal": (H, False, 0),
    "gqa+segments": (2, True, 0),
    "gqa+window+segments": (1, True, 96),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_equals_the_reference_forward_and_gradients(case: str) -> None:
    kv, documents, window = CASES[case]
    q, k, v, segments, cot = inputs(kv)
    seg = segments if documents else None
    want = value_and_grads(lambda q, k, v: reference(q, k, v, seg, window), q, k, v, cot)
    win = jnp.int32(window) if window else None
    paths = {
        "splash": dict(kind=AttentionKind.SPLASH, kernel_block=128, windows=(window,)),
        "blocked": dict(kind=AttentionKind.BLOCKED, block=64),
        "dense": dict(kind=AttentionKind.DENSE),
    }
    for name, kw in paths.items():
        got = value_and_grads(
            jax.jit(lambda q, k, v, kw=kw: attend(q, k, v, segments=seg, window=win, **kw)), q, k, v, cot
        )
        for label, a, b in zip(
            ("out", "dq", "dk", "dv"), [got[0], *got[1]], [want[0], *want[1]], strict=True
        ):
            err = float(jnp.abs(a - b).max())
            assert err < TOL, f"{name} {label}: max |diff| {err:.2e}"


def test_the_window_changes_the_output_and_the_kernel_switches_per_layer_window() -> None:
    """A window that is ignored must fail: the windowed output differs from the causal one (both in
    the reference and in each path), and the kernel path picks the kernel of the window it is given."""
    q, k, v, _, _ = inputs(H, seed=1)
    assert float(jnp.abs(reference(q, k, v, window=32) - reference(q, k, v)).max()) > 1e-2
    for w in (0, 32):
        want = reference(q, k, v, window=w)
        splash = attend(
            q, k, v, kind=AttentionKind.SPLASH, kernel_block=128, window=jnp.int32(w), windows=(0, 32)
        )
        blocked = attend(q, k, v, kind=AttentionKind.BLOCKED, block=64, window=jnp.int32(w))
        assert float(jnp.abs(splash - want).max()) < TOL, w
        assert float(jnp.abs(blocked - want).max()) < TOL, w


def test_the_kernel_per_device_splits_heads_and_repeats_too_few_key_value_heads(cpu8: list) -> None:
    """Under a mesh (fsdp 4 × tensor 2) the kernel runs per device on its batch rows and heads; one
    key/value head cannot be split over 2 tensor shards, so it is repeated first: same numbers."""
    cfg = config.resolve("tiny", ["mesh.fsdp=4", "mesh.tensor=2"], {})
    q, k, v, segments, cot = inputs(1, seed=2)
    q, k, v, segments, cot = (jnp.concatenate([a, a]) for a in (q, k, v, segments, cot))  # 4 rows
    want = value_and_grads(lambda q, k, v: reference(q, k, v, segments, 48), q, k, v, cot)
    with jax.set_mesh(mesh_for(cfg, cpu8)):
        fn = jax.jit(
            lambda q, k, v: attend(
                q, k, v, kind=AttentionKind.SPLASH, kernel_block=128, segments=segments,
                window=jnp.int32(48), windows=(0, 48),
            )
        )  # fmt: skip
        got = value_and_grads(fn, q, k, v, cot)
    for label, a, b in zip(("out", "dq", "dk", "dv"), [got[0], *got[1]], [want[0], *want[1]], strict=True):
        assert float(jnp.abs(a - b).max()) < TOL, label


def _model_loss(cfg: config.Config, mesh) -> tuple[float, dict]:
    tokens = jax.random.randint(jax.random.key(1), (4, cfg.model.seq_len + 1), 0, cfg.model.vocab_size)
    tokens = tokens.at[:, 17::29].set(cfg.data.eos_id)  # documents of 29 tokens, shorter than the window
    with jax.set_mesh(mesh), nnx.logical_axis_rules(logical_rules(cfg.mesh)):
        model = Transformer(cfg, rngs=nnx.Rngs(0))
        graphdef, params = nnx.split(model, nnx.Param)

        def loss(params):
            return nnx.merge(graphdef, params).loss(tokens[:, :-1], tokens[:, 1:])[0]

        value, grads = jax.jit(jax.value_and_grad(loss))(params)
    return float(value), jax.device_get(nnx.to_pure_dict(grads))


def test_model_with_olmo3_windows_trains_the_same_through_the_kernel(cpu8: list) -> None:
    """The whole model with OLMo 3's pattern (windowed and global layers in one scanned stack),
    documents and GQA, on 8 devices (fsdp 4 × tensor 2: the kernel's shard_map splits heads): loss and
    gradients through the splash kernel equal the blocked path's; without the windows they differ."""
    sets = ["model.seq_len=128", "model.n_layers=2", "model.n_heads=4", "model.kv_heads=2",
            "model.sliding_window=8", "model.global_every=2", "model.document_attention=true",
            "data.eos_id=3", "model.attention_block=32", "mesh.fsdp=4", "mesh.tensor=2"]  # fmt: skip
    runs = {}
    for kind in ("splash", "blocked"):
        cfg = config.resolve("tiny", [*sets, f"model.attention={kind}"], {})
        runs[kind] = _model_loss(cfg, mesh_for(cfg, cpu8))
    (l_s, g_s), (l_b, g_b) = runs["splash"], runs["blocked"]
    assert abs(l_s - l_b) < 1e-5
    diffs = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), g_s, g_b)
    assert max(jax.tree.leaves(diffs)) < 1e-5, diffs
    cfg = config.resolve(
        "tiny", [*sets, "model.attention=blocked", "model.sliding_window=0", "model.global_every=0"], {}
    )
    l_g, g_g = _model_loss(cfg, mesh_for(cfg, cpu8))
    changed = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), g_g, g_b)
    assert l_g != l_b and max(jax.tree.leaves(changed)) > 100 * max(jax.tree.leaves(diffs)), (changed, diffs)


def test_config_keys() -> None:
    assert config.layer_windows(config.resolve("olmo-7b", [], {}).model) == [4096, 4096, 4096, 0] * 8
    cfg = config.resolve("tiny", ["model.sliding_window=8"], {})
    assert config.layer_windows(cfg.model) == [8, 8]
    assert resolve("auto", 32, 16) == AttentionKind.BLOCKED  # a toy shape: blocked on any backend
    assert resolve("auto", 8192, 128) == (
        AttentionKind.SPLASH if jax.default_backend() == "tpu" else AttentionKind.BLOCKED
    )
    assert splash_block(8192) == 512 and splash_block(384) == 128 and splash_block(8192, 256) == 256
    with pytest.raises(ConfigError, match=r"model\.attention must be one of auto, splash, blocked, dense"):
        config.resolve("tiny", ["model.attention=flash"], {})
    with pytest.raises(ConfigError, match=r"model\.attention=splash needs model\.seq_len"):
        config.resolve("tiny", ["model.attention=splash"], {})  # seq_len 32: no 128-token tile
    with pytest.raises(ConfigError, match="global_every needs"):
        config.resolve("tiny", ["model.global_every=4"], {})
    with pytest.raises(ConfigError, match="expert_matmul"):
        config.resolve("tiny", ["moe.expert_matmul=sparse"], {})
    # How attention is computed is not the run's identity; the window is (and absent at its default).
    base = config.config_hash(config.resolve("tiny", ["model.seq_len=256"], {}))
    for how in ("model.attention=dense", "model.splash_block=128", "moe.expert_matmul=dense"):
        assert config.config_hash(config.resolve("tiny", ["model.seq_len=256", how], {})) == base, how
    assert config.config_hash(cfg) != config.config_hash(config.resolve("tiny", [], {}))
