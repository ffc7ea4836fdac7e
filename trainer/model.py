"""Decoder-only language model (flax nnx): embeddings, RMSNorm, causal attention with RoPE, MoE.

Parameters are float32 and carry *logical* axis names (``embed``, ``heads``, ``mlp``, ``experts``,
``vocab`` ...), which ``trainer.mesh.logical_rules`` maps to mesh axes when the state is built.
Activations run in ``model.dtype``; their batch dimension is pinned to the data-parallel axes at
every block boundary (left to propagation, XLA may replicate the batch after the embedding gather).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import AbstractMesh, AxisType
from jax.sharding import PartitionSpec as P

from trainer.config import Config, ModelConfig
from trainer.mesh import AXES, logical_rules
from trainer.moe import BATCH_AXES, MLP, MoE


def pin_batch(x: jax.Array) -> jax.Array:
    """[B, ...]: batch over the data-parallel axes, the rest replicated (inside a mesh context)."""
    return jax.lax.with_sharding_constraint(x, P(BATCH_AXES, *([None] * (x.ndim - 1))))


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        self.scale = nnx.Param(nnx.with_partitioning(nnx.initializers.ones, ("norm",))(None, (dim,)))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (y * self.scale[...]).astype(x.dtype)


def rope(x: jax.Array, theta: float) -> jax.Array:
    """Rotary position embedding on [B, T, H, hd] (rotate-half convention)."""
    t, hd = x.shape[1], x.shape[-1]
    freqs = theta ** (-jnp.arange(0, hd, 2, dtype=jnp.float32) / hd)
    angles = jnp.arange(t, dtype=jnp.float32)[:, None] * freqs[None, :]  # [T, hd/2]
    cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, h, hd = cfg.d_model, cfg.n_heads, cfg.head_dim
        normal = nnx.initializers.normal(cfg.init_std)
        init = nnx.with_partitioning(normal, ("embed", "heads", "head_dim"))
        self.wq = nnx.Param(init(rngs.params(), (d, h, hd)))
        self.wk = nnx.Param(init(rngs.params(), (d, h, hd)))
        self.wv = nnx.Param(init(rngs.params(), (d, h, hd)))
        self.wo = nnx.Param(
            nnx.with_partitioning(normal, ("heads", "head_dim", "embed"))(rngs.params(), (h, hd, d))
        )
        self.theta = cfg.rope_theta

    def __call__(self, x: jax.Array) -> jax.Array:
        dt = x.dtype
        q = rope(jnp.einsum("btd,dhk->bthk", x, self.wq[...].astype(dt)), self.theta)
        k = rope(jnp.einsum("btd,dhk->bthk", x, self.wk[...].astype(dt)), self.theta)
        v = jnp.einsum("btd,dhk->bthk", x, self.wv[...].astype(dt))
        out = jax.nn.dot_product_attention(q, k, v, is_causal=True)  # fused kernels where available
        return jnp.einsum("bthk,hkd->btd", out, self.wo[...].astype(dt))


class Block(nnx.Module):
    def __init__(self, cfg: Config, moe: bool, *, rngs: nnx.Rngs):
        m = cfg.model
        self.attn_norm = RMSNorm(m.d_model)
        self.attn = Attention(m, rngs=rngs)
        self.ffn_norm = RMSNorm(m.d_model)
        self.is_moe = moe
        if moe:
            self.ffn = MoE(m.d_model, cfg.moe, m.init_std, rngs=rngs)
        else:
            self.ffn = MLP(m.d_model, m.d_ff, m.init_std, rngs=rngs)

    def __call__(self, x: jax.Array) -> tuple[jax.Array, dict | None]:
        x = x + self.attn(self.attn_norm(x))
        if self.is_moe:
            y, aux = self.ffn(self.ffn_norm(x))
            return x + y, aux
        return x + self.ffn(self.ffn_norm(x)), None


class Transformer(nnx.Module):
    def __init__(self, cfg: Config, *, rngs: nnx.Rngs):
        m = cfg.model
        init = nnx.initializers.normal(m.init_std)
        self.embed = nnx.Param(
            nnx.with_partitioning(init, ("vocab", "embed"))(rngs.params(), (m.vocab_size, m.d_model))
        )
        self.blocks = nnx.List([Block(cfg, i >= m.dense_layers, rngs=rngs) for i in range(m.n_layers)])
        self.final_norm = RMSNorm(m.d_model)
        self.lm_head = nnx.Param(
            nnx.with_partitioning(init, ("embed", "vocab"))(rngs.params(), (m.d_model, m.vocab_size))
        )
        self.dtype = jnp.dtype(m.dtype)

    def __call__(self, tokens: jax.Array) -> tuple[jax.Array, list[dict]]:
        """tokens [B, T] -> float32 logits [B, T, V] and the MoE aux outputs of every MoE layer."""
        x = pin_batch(self.embed[...][tokens].astype(self.dtype))
        aux = []
        for block in self.blocks:
            x, a = block(x)
            x = pin_batch(x)
            if a is not None:
                aux.append(a)
        x = self.final_norm(x)
        return jnp.einsum("btd,dv->btv", x, self.lm_head[...].astype(self.dtype)).astype(jnp.float32), aux


def abstract_model(cfg: Config) -> Transformer:
    """The model with ``ShapeDtypeStruct`` parameters: nothing is allocated, no devices needed."""
    mesh = AbstractMesh((1,) * len(AXES), AXES, axis_types=(AxisType.Auto,) * len(AXES))
    with jax.sharding.use_abstract_mesh(mesh), nnx.logical_axis_rules(logical_rules(cfg.mesh)):
        return nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(cfg.train.seed)))


def param_counts(cfg: Config) -> tuple[int, int]:
    """(total, active per token) parameters, from the config alone."""
    m, e = cfg.model, cfg.moe
    attn = 4 * m.d_model * m.n_heads * m.head_dim
    norms = 2 * m.d_model
    dense_ffn = 3 * m.d_model * m.d_ff
    shared = 3 * m.d_model * e.shared_expert_dim
    expert = 3 * m.d_model * e.d_expert
    router = m.d_model * e.num_experts
    n_moe = m.n_layers - m.dense_layers
    base = 2 * m.vocab_size * m.d_model + m.d_model + m.n_layers * (attn + norms) + m.dense_layers * dense_ffn
    total = base + n_moe * (router + shared + e.num_experts * expert)
    active = base + n_moe * (router + shared + e.top_k * expert)
    return total, active


def flops_per_token(cfg: Config) -> float:
    """Training FLOPs per token: 6 × matmul parameters used per token + causal attention.

    Matmul parameters exclude the embedding lookup; attention scores and values add
    ``12 · layers · heads · head_dim · seq_len / 2`` (causal: half the score matrix), as in MaxText.
    """
    m = cfg.model
    _, active = param_counts(cfg)
    matmul = active - m.vocab_size * m.d_model - m.d_model - m.n_layers * 2 * m.d_model
    attention = 12 * m.n_layers * m.n_heads * m.head_dim * m.seq_len / 2
    return 6.0 * matmul + attention
