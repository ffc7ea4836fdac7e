"""Causal self-attention on [B, T, H, hd]: the Pallas TPU splash kernel, query blocks, or all at once.

``model.attention`` (config.AttentionKind) picks how; every kind computes the same function (within
rounding: tests/trainer/test_attention.py runs the kernel in Pallas interpret mode on CPU against
the blocked path, forward and gradients):

- ``splash``: ``jax.experimental.pallas.ops.tpu.splash_attention``, flash attention that skips the
  blocks its mask leaves empty (the upper triangle; outside a sliding window). It runs per device:
  ``jax.shard_map`` hands each device its batch rows (the data-parallel axes) and its heads
  (``tensor``), and the kernel is vmapped over the local batch, as MaxText's attention op does. Its
  q/k/v blocks are ``model.splash_block`` (0: ``splash_block`` below). Grouped-query attention
  goes in as is (the kernel maps query head i to key/value head i // groups).
- ``blocked``: ``model.attention_block`` queries at a time in plain JAX (XLA on any backend);
  ``dense``: the whole T × T scores (``jax.nn.dot_product_attention``).
- ``auto``: ``splash`` on a TPU backend for shapes the kernel tiles, ``blocked`` elsewhere: on CPU
  the program is the one the trainer compiled before the kernel existed.

Masks: causal; with segment ids (``model.document_attention``) a query sees only keys of its own
segment; with a window W (``model.sliding_window``) only the last W positions, itself included
(OLMo-core's window: flash-attn's ``window_size=(W - 1, 0)``). A layer's window arrives as a traced
int32 (0: global) because the layers run under one ``nnx.scan``; the blocked path masks with it
directly, the kernel path switches between one kernel per distinct window (``lax.switch``: each
kernel's block-sparsity tables are built from a static mask).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import PartitionSpec as P

from trainer.config import AttentionKind, ConfigError
from trainer.model import remat
from trainer.model.mesh import BATCH_AXES

TENSOR_AXIS = "tensor"
# The kernel's block: the largest of these that divides the sequence. 512 is MaxText's default
# for its splash blocks on TPU; 128 is the lane width, below which the kernel's tiles do not go.
SPLASH_BLOCKS = (512, 256, 128)
LANES = 128


def resolve(kind: str, seq_len: int, head_dim: int) -> AttentionKind:
    """``auto`` -> ``splash`` on a TPU backend for shapes the kernel tiles (the sequence and the
    head a multiple of the 128 lanes: every pretraining config), ``blocked`` elsewhere (CPU, GPU,
    the toy configs); other kinds as they are."""
    kind = AttentionKind(kind)
    if kind != AttentionKind.AUTO:
        return kind
    tiles = seq_len % LANES == 0 and head_dim % LANES == 0
    return AttentionKind.SPLASH if jax.default_backend() == "tpu" and tiles else AttentionKind.BLOCKED


def splash_block(seq_len: int, requested: int = 0) -> int:
    """The splash kernel's q/kv block for ``seq_len``: ``requested`` (model.splash_block) or the
    largest of SPLASH_BLOCKS that divides it, capped at the sequence."""
    if requested:
        return requested
    for b in SPLASH_BLOCKS:
        if seq_len % b == 0:
            return b
    raise ConfigError(
        f"model.attention=splash needs model.seq_len ({seq_len}) to be a multiple of 128;"
        " use model.attention=blocked"
    )


def _local(window: jax.Array | None, q_pos: jax.Array, k_pos: jax.Array) -> jax.Array | None:
    """[..., Tq, Tk] bool: key within the query's window (a traced int32, 0: global), or None."""
    if window is None:
        return None
    return (window <= 0) | (q_pos[:, None] - k_pos[None, :] < window)


def blocked_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    block: int,
    segments: jax.Array | None = None,
    window: jax.Array | None = None,
) -> jax.Array:
    """Causal attention on [B, T, H, hd], ``block`` queries at a time: the [B, H, block, T] scores
    of one block exist at once, never the whole T × T (each block is rematerialised in the backward
    pass). ``block`` 0 or >= T: ``jax.nn.dot_product_attention`` (XLA's, or the platform's fused
    kernel), which on CPU materialises the whole score matrix. ``segments`` [B, T] (segment_ids):
    a query attends only to keys of its own segment (document). ``window`` (a scalar int32, 0:
    global): only to the last ``window`` positions, itself included. k and v have H heads."""
    b, t, h, hd = q.shape
    if not block or block >= t:
        pos = jnp.arange(t)
        local = _local(window, pos, pos)
        if segments is None and local is None:
            return jax.nn.dot_product_attention(q, k, v, is_causal=True)
        mask = jnp.ones((1, 1, t, t), bool)
        if segments is not None:
            mask = segments[:, None, :, None] == segments[:, None, None, :]  # [B, 1, T, T]
        if local is not None:
            mask = mask & local[None, None]
        return jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True)
    if t % block:
        raise ValueError(f"model.attention_block={block} must divide model.seq_len={t}")
    scale = hd**-0.5
    keys = jnp.arange(t)

    @jax.checkpoint
    def one(args: tuple[jax.Array, jax.Array]) -> jax.Array:
        i, qi = args  # qi [B, block, H, hd]
        scores = jnp.einsum("bqhd,bkhd->bhqk", qi, k, preferred_element_type=jnp.float32) * scale
        q_pos = i * block + jnp.arange(block)
        causal = q_pos[:, None] >= keys[None, :]
        local = _local(window, q_pos, keys)
        if local is not None:
            causal = causal & local
        if segments is not None:
            seg_q = jax.lax.dynamic_slice_in_dim(segments, i * block, block, axis=1)  # [B, block]
            causal = causal[None, None] & (seg_q[:, None, :, None] == segments[:, None, None, :])
        probs = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1).astype(v.dtype)
        return jnp.einsum("bhqk,bkhd->bqhd", probs, v)

    qb = q.reshape(b, t // block, block, h, hd).swapaxes(0, 1)
    out = jax.lax.map(one, (jnp.arange(t // block), qb))
    return out.swapaxes(0, 1).reshape(b, t, h, hd)


def splash_kernel(heads: int, seq_len: int, window: int, block: int, interpret: bool):
    """The splash kernel for ``heads`` local heads: causal, or a window of ``window`` tokens."""
    shape = (seq_len, seq_len)
    mask = splash.LocalMask(shape, (window - 1, 0), 0) if window else splash.CausalMask(shape)
    sizes = splash.BlockSizes(
        block_q=block, block_kv=block, block_kv_compute=block,
        block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
        block_q_dq=block, block_kv_dq=block,
    )  # fmt: skip
    return splash.make_splash_mha(
        splash.MultiHeadMask([mask] * heads),
        block_sizes=sizes,
        head_shards=1,
        q_seq_shards=1,
        interpret=interpret,
        # The kernel's residuals (its output and log-sum-exp) under the attention's name: a remat
        # policy that keeps them never runs the kernel's forward again in the backward pass.
        residual_checkpoint_name=remat.ATTENTION,
    )


def splash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    block: int,
    segments: jax.Array | None = None,
    window: jax.Array | None = None,
    windows: Sequence[int] = (0,),
    interpret: bool | None = None,
) -> jax.Array:
    """The splash kernel on q [B, T, H, hd] and k, v [B, T, KV, hd] (KV divides H), per device.

    ``windows``: the distinct windows this call can be given (static; 0: global); ``window``: this
    layer's (traced; None: ``windows[0]``). Inside a mesh context (jax.set_mesh), batch over the
    data-parallel axes and heads over ``tensor``."""
    _, t, h, hd = q.shape
    kv = k.shape[2]
    if interpret is None:  # off a TPU the kernel runs in Pallas's interpreter (tests)
        interpret = jax.default_backend() != "tpu"
    mesh = jax.sharding.get_abstract_mesh()
    tensor = mesh.shape.get(TENSOR_AXIS, 1) if not mesh.empty else 1
    if h % tensor:
        raise ConfigError(f"model.n_heads ({h}) must be a multiple of mesh.tensor ({tensor})")
    if kv % tensor:  # fewer key/value heads than tensor shards: give every query head its own
        k, v = jnp.repeat(k, h // kv, axis=2), jnp.repeat(v, h // kv, axis=2)
    # [B, H, T, hd]; the kernel takes unscaled logits (scale the queries, as MaxText does).
    q = (q * jnp.asarray(hd**-0.5, q.dtype)).swapaxes(1, 2)
    k, v = k.swapaxes(1, 2), v.swapaxes(1, 2)
    windows = tuple(windows)

    def run(kernel, q, k, v, *seg):
        if not seg:
            return jax.vmap(kernel)(q, k, v)
        return jax.vmap(kernel)(q, k, v, splash.SegmentIds(q=seg[0], kv=seg[0]))

    def local(index, q, k, v, *seg):
        # Built here, for the heads this device holds: the kernel's tables are per local head.
        kernels = [splash_kernel(q.shape[1], t, w, block, interpret) for w in windows]
        if len(kernels) == 1:
            return run(kernels[0], q, k, v, *seg)
        return jax.lax.switch(index, [partial(run, kern) for kern in kernels], q, k, v, *seg)

    index = jnp.zeros((), jnp.int32)
    if window is not None and len(windows) > 1:  # which kernel: the position of window in windows
        index = jnp.asarray(sum(i * (window == w) for i, w in enumerate(windows))).astype(jnp.int32)
    args = (index, q, k, v) if segments is None else (index, q, k, v, segments)
    if mesh.empty:
        out = local(*args)
    else:
        heads = P(BATCH_AXES, TENSOR_AXIS, None, None)
        specs = (P(), heads, heads, heads, P(BATCH_AXES, None))[: len(args)]
        # check_vma off: the vma of a pallas_call's outputs is not inferred (as MaxText's check_rep).
        out = jax.shard_map(local, in_specs=specs, out_specs=heads, check_vma=False)(*args)
    return out.swapaxes(1, 2)


def attend(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    kind: AttentionKind,
    block: int = 0,
    kernel_block: int = 0,
    segments: jax.Array | None = None,
    window: jax.Array | None = None,
    windows: Sequence[int] = (0,),
) -> jax.Array:
    """Causal attention of q [B, T, H, hd] over k, v [B, T, KV, hd] by ``kind`` (resolved: not auto).

    ``block``: model.attention_block (blocked); ``kernel_block``: the splash kernel's block
    (``splash_block``); ``window``: this layer's window (traced, 0: global; None: no window)."""
    if kind == AttentionKind.SPLASH:
        return splash_attention(
            q, k, v, block=kernel_block or splash_block(q.shape[1]), segments=segments,
            window=window, windows=windows,
        )  # fmt: skip
    groups = q.shape[2] // k.shape[2]
    if groups > 1:  # grouped-query attention: query head i reads key/value head i // groups
        k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
    return blocked_attention(q, k, v, 0 if kind == AttentionKind.DENSE else block, segments, window)
