"""Decoder-only language model (flax nnx): embeddings, RMSNorm, causal attention with RoPE, MoE.

Parameters are float32 and carry *logical* axis names (``embed``, ``heads``, ``mlp``, ``experts``,
``vocab`` ...), which ``trainer.model.mesh.logical_rules`` maps to mesh axes when the state is built.
Activations run in ``model.dtype``; their batch dimension is pinned to the data-parallel axes at
every block boundary (left to propagation, XLA may replicate the batch after the embedding gather).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import AbstractMesh, AxisType
from jax.sharding import PartitionSpec as P

from trainer.config import Config, ModelConfig, Remat, layer_windows
from trainer.model import remat
from trainer.model.attention import attend, resolve
from trainer.model.mesh import AXES, BATCH_AXES, logical_rules
from trainer.model.moe import MLP, MoE


def pin_batch(x: jax.Array) -> jax.Array:
    """[B, ...]: batch over the data-parallel axes, the rest replicated (inside a mesh context)."""
    return jax.lax.with_sharding_constraint(x, P(BATCH_AXES, *([None] * (x.ndim - 1))))


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        ones = nnx.with_partitioning(nnx.initializers.ones, ("norm",))
        self.scale = nnx.Param(ones(None, (dim,)))  # type: ignore[arg-type]  # `ones` draws nothing: no key
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


def segment_ids(tokens: jax.Array, eos_id: int) -> jax.Array:
    """[B, T] int32: the number of EOS tokens before each position (MaxText's packed segments).

    An EOS belongs to the document it ends; the token after it starts the next segment."""
    eos = (tokens == eos_id).astype(jnp.int32)
    return jnp.cumsum(eos, axis=1) - eos


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, h, hd = cfg.d_model, cfg.n_heads, cfg.head_dim
        kv = cfg.kv_heads or h
        normal = nnx.initializers.normal(cfg.init_std)
        init = nnx.with_partitioning(normal, ("embed", "heads", "head_dim"))
        self.wq = nnx.Param(init(rngs.params(), (d, h, hd)))
        self.wk = nnx.Param(init(rngs.params(), (d, kv, hd)))
        self.wv = nnx.Param(init(rngs.params(), (d, kv, hd)))
        self.wo = nnx.Param(
            nnx.with_partitioning(normal, ("heads", "head_dim", "embed"))(rngs.params(), (h, hd, d))
        )
        # OLMo-core's QK-norm: one RMSNorm over each whole projection (all heads), not per head.
        self.q_norm = RMSNorm(h * hd) if cfg.qk_norm else None
        self.k_norm = RMSNorm(kv * hd) if cfg.qk_norm else None
        self.theta, self.block = cfg.rope_theta, cfg.attention_block
        # Static: the kind resolved for this backend, the kernel's block, every window of the model.
        self.kind, self.kernel_block = resolve(cfg.attention, cfg.seq_len, hd), cfg.splash_block
        self.windows = tuple(sorted(set(layer_windows(cfg))))

    def __call__(
        self, x: jax.Array, segments: jax.Array | None = None, window: jax.Array | None = None
    ) -> jax.Array:
        dt = x.dtype
        q = jnp.einsum("btd,dhk->bthk", x, self.wq[...].astype(dt))
        k = jnp.einsum("btd,dhk->bthk", x, self.wk[...].astype(dt))
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q.reshape(*q.shape[:2], -1)).reshape(q.shape)
            k = self.k_norm(k.reshape(*k.shape[:2], -1)).reshape(k.shape)
        q, k = rope(q, self.theta), rope(k, self.theta)
        v = jnp.einsum("btd,dhk->bthk", x, self.wv[...].astype(dt))
        q, k, v = (remat.name(a, remat.QKV) for a in (q, k, v))
        out = attend(
            q, k, v, kind=self.kind, block=self.block, kernel_block=self.kernel_block,
            segments=segments, window=window, windows=self.windows,
        )  # fmt: skip
        out = jnp.einsum("bthk,hkd->btd", remat.name(out, remat.ATTENTION), self.wo[...].astype(dt))
        return remat.name(out, remat.ATTENTION_OUT)


class Block(nnx.Module):
    def __init__(self, cfg: Config, moe: bool, *, rngs: nnx.Rngs):
        m = cfg.model
        self.attn_norm = RMSNorm(m.d_model)
        self.attn = Attention(m, rngs=rngs)
        self.ffn_norm = RMSNorm(m.d_model)
        self.is_moe = moe
        self.reordered = m.reordered_norm
        self.ffn: MoE | MLP = (
            MoE(m.d_model, cfg.moe, m.init_std, rngs=rngs)
            if moe
            else MLP(m.d_model, m.d_ff, m.init_std, rngs=rngs)
        )

    def __call__(
        self, x: jax.Array, segments: jax.Array | None = None, window: jax.Array | None = None
    ) -> tuple[jax.Array, dict]:
        if self.reordered:  # OLMo 2/3: each sub-layer's output is normed before the residual add
            x = x + self.attn_norm(self.attn(x, segments, window))
            y, aux = self._ffn(x)
            return pin_batch(x + self.ffn_norm(y)), aux
        x = x + self.attn(self.attn_norm(x), segments, window)
        y, aux = self._ffn(self.ffn_norm(x))
        return pin_batch(x + y), aux

    def _ffn(self, x: jax.Array) -> tuple[jax.Array, dict]:
        """The feed-forward sub-layer's output and its auxiliary metrics (none from a dense MLP)."""
        if isinstance(self.ffn, MoE):
            return self.ffn(x)
        return self.ffn(x), {}


class Stack(nnx.Module):
    """``n`` identical blocks whose parameters are stacked on a leading ``layers`` axis and applied
    under ``nnx.scan``: one block is compiled, whatever the depth."""

    def __init__(self, cfg: Config, moe: bool, n: int, *, rngs: nnx.Rngs, windows: tuple[int, ...] = ()):
        @nnx.split_rngs(splits=n)
        @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
        def create(r: nnx.Rngs) -> Block:
            return Block(cfg, moe, rngs=r)

        self.layers = create(rngs)
        self.remat = cfg.model.remat
        # Each layer's window (0: global), or () when no layer has one: a static tuple, scanned as an
        # int32 array beside the stacked parameters (the layers share one compiled body).
        self.windows = tuple(windows) if any(windows) else ()

    def __call__(self, x: jax.Array, segments: jax.Array | None = None) -> tuple[jax.Array, dict]:
        if self.windows:
            return self._scan_with_windows(x, segments)
        if segments is not None:
            return self._scan_with_segments(x, segments)

        def body(block: Block, x: jax.Array) -> tuple[jax.Array, dict]:
            return block(x)

        if self.remat != Remat.NONE:
            body = nnx.remat(body, policy=remat.policy(self.remat))

        @nnx.scan(in_axes=(0, nnx.Carry), out_axes=(nnx.Carry, 0))
        def forward(block: Block, x: jax.Array) -> tuple[jax.Array, dict]:
            return body(block, x)

        return forward(self.layers, x)

    def _scan_with_segments(self, x: jax.Array, segments: jax.Array) -> tuple[jax.Array, dict]:
        """The same scan with the segment ids broadcast to every layer (a separate trace, so that a
        model without document attention compiles exactly the program it did before)."""

        def body(block: Block, x: jax.Array, segments: jax.Array) -> tuple[jax.Array, dict]:
            return block(x, segments)

        if self.remat != Remat.NONE:
            body = nnx.remat(body, policy=remat.policy(self.remat))

        @nnx.scan(in_axes=(0, nnx.Carry, None), out_axes=(nnx.Carry, 0))
        def forward(block: Block, x: jax.Array, segments: jax.Array) -> tuple[jax.Array, dict]:
            return body(block, x, segments)

        return forward(self.layers, x, segments)

    def _scan_with_windows(self, x: jax.Array, segments: jax.Array | None) -> tuple[jax.Array, dict]:
        """The scan with each layer's window as a scanned input (and the segment ids, if any,
        broadcast): a separate trace again, so that a model without windows compiles as before."""

        def body(block: Block, x: jax.Array, segments: jax.Array | None, window: jax.Array):
            return block(x, segments, window)

        if self.remat != Remat.NONE:
            body = nnx.remat(body, policy=remat.policy(self.remat))

        @nnx.scan(in_axes=(0, nnx.Carry, None, 0), out_axes=(nnx.Carry, 0))
        def forward(block: Block, x: jax.Array, segments: jax.Array | None, window: jax.Array):
            return body(block, x, segments, window)

        return forward(self.layers, x, segments, jnp.asarray(self.windows, jnp.int32))


def chunked_cross_entropy(x: jax.Array, w: jax.Array, targets: jax.Array, chunk: int) -> jax.Array:
    """Mean next-token cross entropy of hidden states x [B, T, D] through the head w [D, V],
    ``chunk`` positions at a time: the [B, chunk, V] logits of one chunk exist at once, never the
    whole [B, T, V] (each chunk is rematerialised in the backward pass). 0 or >= T: all at once."""
    b, t, d = x.shape
    if not chunk or chunk >= t:
        logits = jnp.einsum("btd,dv->btv", x, w).astype(jnp.float32)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, targets))
    if t % chunk:
        raise ValueError(f"model.loss_chunk={chunk} must divide model.seq_len={t}")

    @jax.checkpoint
    def one(total: jax.Array, xt: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, None]:
        xc, tc = xt
        logits = jnp.einsum("btd,dv->btv", xc, w).astype(jnp.float32)
        return total + jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, tc)), None

    xs = x.reshape(b, t // chunk, chunk, d).swapaxes(0, 1)
    ts = targets.reshape(b, t // chunk, chunk).swapaxes(0, 1)
    total, _ = jax.lax.scan(one, jnp.zeros((), jnp.float32), (xs, ts))
    return total / (b * t)


def token_losses(
    x: jax.Array, w: jax.Array, targets: jax.Array, weights: jax.Array, chunk: int
) -> tuple[jax.Array, jax.Array]:
    """(Σ weight · cross entropy, Σ weight · logsumexp(logits)²) over the targets [B, T], with the
    logits of at most ``chunk`` positions at once, as ``chunked_cross_entropy``. Sums, not means:
    the train step divides by the whole step's target count (trainer/step.py)."""
    b, t, d = x.shape

    def sums(xc: jax.Array, tc: jax.Array, wc: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits = jnp.einsum("btd,dv->btv", xc, w).astype(jnp.float32)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, tc)
        z = jax.nn.logsumexp(logits, axis=-1) ** 2
        return jnp.sum(ce * wc), jnp.sum(z * wc)

    if not chunk or chunk >= t:
        return sums(x, targets, weights)
    if t % chunk:
        raise ValueError(f"model.loss_chunk={chunk} must divide model.seq_len={t}")

    @jax.checkpoint
    def one(total: tuple[jax.Array, jax.Array], xtw: tuple) -> tuple[tuple[jax.Array, jax.Array], None]:
        ce, z = sums(*xtw)
        return (total[0] + ce, total[1] + z), None

    xs = x.reshape(b, t // chunk, chunk, d).swapaxes(0, 1)
    ts = targets.reshape(b, t // chunk, chunk).swapaxes(0, 1)
    ws = weights.reshape(b, t // chunk, chunk).swapaxes(0, 1)
    zero = jnp.zeros((), jnp.float32)
    total, _ = jax.lax.scan(one, (zero, zero), (xs, ts, ws))
    return total


class Transformer(nnx.Module):
    def __init__(self, cfg: Config, *, rngs: nnx.Rngs):
        m = cfg.model
        init = nnx.initializers.normal(m.init_std)
        self.embed = nnx.Param(
            nnx.with_partitioning(init, ("vocab", "embed"))(rngs.params(), (m.vocab_size, m.d_model))
        )
        n_moe = m.n_layers - m.dense_layers
        windows = layer_windows(m)
        dense_w, moe_w = tuple(windows[: m.dense_layers]), tuple(windows[m.dense_layers :])
        self.dense = Stack(cfg, False, m.dense_layers, rngs=rngs, windows=dense_w) if m.dense_layers else None
        self.moe = Stack(cfg, True, n_moe, rngs=rngs, windows=moe_w) if n_moe else None
        self.final_norm = RMSNorm(m.d_model)
        self.lm_head = nnx.Param(
            nnx.with_partitioning(init, ("embed", "vocab"))(rngs.params(), (m.d_model, m.vocab_size))
        )
        self.dtype = jnp.dtype(m.dtype)
        self.loss_chunk = m.loss_chunk
        self.eos_id = cfg.data.eos_id
        self.documents = m.document_attention and cfg.data.eos_id >= 0
        self.logit_z = m.logit_z_loss > 0

    def hidden(self, tokens: jax.Array) -> tuple[jax.Array, dict]:
        """tokens [B, T] -> final normed hidden states [B, T, D] and the MoE aux outputs, each
        stacked over the MoE layers ({} for a dense model). With document attention a position
        attends only to the earlier positions of its own document."""
        x = pin_batch(self.embed[...][tokens].astype(self.dtype))
        segments = segment_ids(tokens, self.eos_id) if self.documents else None
        if self.dense is not None:
            x, _ = self.dense(x, segments)
        aux: dict = {}
        if self.moe is not None:
            x, aux = self.moe(x, segments)
        return self.final_norm(x), aux

    def __call__(self, tokens: jax.Array) -> tuple[jax.Array, dict]:
        """tokens [B, T] -> float32 logits [B, T, V] (whole: for inspection, not for training)."""
        x, aux = self.hidden(tokens)
        return jnp.einsum("btd,dv->btv", x, self.lm_head[...].astype(self.dtype)).astype(jnp.float32), aux

    def loss(self, tokens: jax.Array, targets: jax.Array) -> tuple[jax.Array, dict]:
        """(mean cross entropy over the targets that count, aux). ``aux`` holds the MoE outputs
        (``lb_loss``, ``z_loss``, ``stats``: MoE models only) and the token sums that a step or an
        evaluation adds up across batches: ``loss_sum`` (Σ cross entropy), ``loss_tokens`` (how
        many targets count) and ``logit_z_sum`` (Σ logsumexp², when model.logit_z_loss > 0).

        With data.eos_id set, the target of a position whose input is EOS (the next document's
        first token) does not count."""
        x, aux = self.hidden(tokens)
        w = self.lm_head[...].astype(self.dtype)
        b, t = targets.shape
        if self.eos_id < 0 and not self.logit_z:  # the program of the configs before these keys
            ce = chunked_cross_entropy(x, w, targets, self.loss_chunk)
            return ce, {**aux, "loss_sum": ce * (b * t), "loss_tokens": jnp.asarray(b * t, jnp.float32)}
        weights = (tokens != self.eos_id).astype(jnp.float32)
        ce_sum, z_sum = token_losses(x, w, targets, weights, self.loss_chunk)
        count = jnp.sum(weights)
        out = {**aux, "loss_sum": ce_sum, "loss_tokens": count}
        if self.logit_z:
            out["logit_z_sum"] = z_sum
        return ce_sum / jnp.maximum(count, 1.0), out


def abstract_model(cfg: Config) -> Transformer:
    """The model with ``ShapeDtypeStruct`` parameters: nothing is allocated, no devices needed."""
    mesh = AbstractMesh((1,) * len(AXES), AXES, axis_types=(AxisType.Auto,) * len(AXES))
    with jax.sharding.use_abstract_mesh(mesh), nnx.logical_axis_rules(logical_rules(cfg.mesh)):
        return nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(cfg.train.seed)))
