"""Mixture-of-experts feed-forward with expert parallelism and a fixed-size receive buffer.

Experts are split over the mesh axis ``expert`` (EP shards, ``num_experts / EP`` experts each). Every
device routes its own tokens, sends each (token, expert) *row* to the shard that owns the expert,
the shard runs its experts on what it received, and the results travel back the same way.

The dispatch plan (docs/platform.md §6), identical on every device of an expert-parallel group:

- ``counts[src, e]``: rows source shard ``src`` routes to expert ``e`` (all-gathered);
  ``M[src, dst]``: rows ``src`` sends to shard ``dst`` (summed over the experts of ``dst``).
- Every shard receives into a buffer of ``buffer_rows(...)`` rows. Destination ``dst`` keeps rows in
  source order until the buffer is full: ``kept = diff(min(cumsum(M, axis=src), buffer))``. Within a
  source's chunk rows are ordered by expert, then token, so the dropped rows are the tail of each
  source's chunk (the highest experts of that shard, last tokens first).
- A dropped (token, expert) row contributes exactly zero to the output: the return buffers start as
  zeros and only kept rows are written back.

Two transports carry the same plan: ``jax.lax.ragged_all_to_all`` (TPU, GPU) and, because XLA:CPU
cannot compile that, a dense ``all_to_all`` of fixed-size chunks that is scattered into the very same
buffer layout. The choice is ``moe.transport``: ``auto`` picks by backend.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from trainer.config import ExpertMatmul, MoEConfig, Transport
from trainer.model import remat
from trainer.model.mesh import BATCH_AXES
from trainer.model.sizes import buffer_rows

EXPERT_AXIS = "expert"


def resolve_transport(transport: str) -> str:
    if transport != Transport.AUTO:
        return transport
    return Transport.RAGGED if jax.default_backend() in ("tpu", "gpu", "cuda", "rocm") else Transport.DENSE


class DispatchPlan(NamedTuple):
    """Where each of this device's routed rows goes and lands in the expert-parallel all-to-all."""

    order: jax.Array  # [R] local rows sorted by expert (stable): row r = token r // k, slot r % k
    counts: jax.Array  # [EP, E] rows each source routes to each expert
    sent: jax.Array  # [EP, EP] M[src, dst]
    kept: jax.Array  # [EP, EP] rows of src kept by dst
    send_off: jax.Array  # [EP, EP] start of src's chunk for dst within src's sorted rows
    recv_off: jax.Array  # [EP, EP] where src's kept rows start in dst's buffer


def _exclusive_cumsum(x: jax.Array, axis: int) -> jax.Array:
    return jnp.cumsum(x, axis=axis) - x


def make_plan(expert_ids: jax.Array, num_experts: int, buffer: int, axis: str = EXPERT_AXIS) -> DispatchPlan:
    """The dispatch plan for this device's rows ``expert_ids`` [R] (inside ``shard_map``)."""
    ep = jax.lax.axis_size(axis)
    order = jnp.argsort(expert_ids, stable=True)
    counts = jax.lax.all_gather(jnp.bincount(expert_ids, length=num_experts), axis)
    sent = counts.reshape(ep, ep, num_experts // ep).sum(-1)
    filled = jnp.minimum(jnp.cumsum(sent, axis=0), buffer)
    kept = jnp.diff(filled, axis=0, prepend=jnp.zeros((1, ep), filled.dtype))
    return DispatchPlan(order, counts, sent, kept, _exclusive_cumsum(sent, 1), _exclusive_cumsum(kept, 0))


def _dense_send(rows, offsets, sizes, cap, axis):
    """Chunk ``rows[offsets[i] : offsets[i] + sizes[i]]`` to peer i with one dense all_to_all."""
    j = jnp.arange(cap)
    idx = offsets[:, None] + j[None, :]
    valid = j[None, :] < sizes[:, None]
    packed = jnp.where(valid[..., None], rows[jnp.clip(idx, 0, rows.shape[0] - 1)], 0)
    return jax.lax.all_to_all(packed, axis, 0, 0)  # [peer, cap, d]: what each peer sent to me


def _dense_place(chunks, offsets, sizes, out_rows):
    """Write chunk i's first ``sizes[i]`` rows at ``offsets[i]`` of a zero buffer of ``out_rows``."""
    cap = chunks.shape[1]
    j = jnp.arange(cap)
    valid = j[None, :] < sizes[:, None]
    pos = jnp.where(valid, offsets[:, None] + j[None, :], out_rows)  # out of range: dropped
    out = jnp.zeros((out_rows, chunks.shape[-1]), chunks.dtype)
    return out.at[pos.reshape(-1)].add(chunks.reshape(-1, chunks.shape[-1]), mode="drop")


def _transport(rows, out_rows, send_off, send_sizes, out_off, recv_off, recv_sizes, cap, axis, kind):
    """Send ``rows[send_off[p] : +send_sizes[p]]`` to peer p, landing at ``out_off[p]`` there.

    ``recv_off``/``recv_sizes`` describe what arrives here (offset in this device's output, size).
    """
    if kind == Transport.RAGGED:
        out = jnp.zeros((out_rows, rows.shape[-1]), rows.dtype)
        return jax.lax.ragged_all_to_all(rows, out, send_off, send_sizes, out_off, recv_sizes, axis_name=axis)
    chunks = _dense_send(rows, send_off, send_sizes, cap, axis)
    return _dense_place(chunks, recv_off, recv_sizes, out_rows)


def _experts(buf, local_expert, valid, w_gate, w_up, w_down, e_loc):
    """SwiGLU experts on the receive buffer, rows grouped by local expert for ``ragged_dot``."""
    key = jnp.where(valid, local_expert, e_loc)
    g_order = jnp.argsort(key, stable=True)
    sizes = jnp.bincount(key, length=e_loc + 1)[:e_loc].astype(jnp.int32)
    xs = buf[g_order]
    h = jax.nn.silu(jax.lax.ragged_dot(xs, w_gate, sizes)) * jax.lax.ragged_dot(xs, w_up, sizes)
    out = jax.lax.ragged_dot(h, w_down, sizes)
    out = jnp.where(valid[g_order][:, None], out, 0)  # padding rows are outside every group
    return jnp.zeros_like(out).at[g_order].set(out)


def _experts_dense(buf, local_expert, valid, w_gate, w_up, w_down, e_loc):
    """The same as ``_experts`` without a grouped matmul: every local expert runs over every buffer
    row and each row keeps its own expert's output (the others add exact zeros), e_loc × the FLOPs.
    The baseline ``bench.accelerator`` measures the grouped matmul against. One expert at a time,
    rematerialised, so that the backward pass keeps no per-expert activations."""
    key = jnp.where(valid, local_expert, e_loc)

    def expert(e: jax.Array, wg: jax.Array, wu: jax.Array, wd: jax.Array) -> jax.Array:
        h = jax.nn.silu(buf @ wg) * (buf @ wu)
        return jnp.where((key == e)[:, None], h @ wd, 0)

    @jax.checkpoint
    def one(acc: jax.Array, xs: tuple) -> tuple[jax.Array, None]:
        return acc + expert(*xs), None

    # The carry starts as expert 0's output, not zeros: inside shard_map a constant's type does not
    # vary over the mesh axes the received rows vary over, and scan wants one carry type.
    first = expert(jnp.int32(0), w_gate[0], w_up[0], w_down[0])
    rest = (jnp.arange(1, e_loc), w_gate[1:], w_up[1:], w_down[1:])
    out, _ = jax.lax.scan(one, first, rest)
    return out


def dispatch_combine(
    x: jax.Array,
    expert_ids: jax.Array,
    gates: jax.Array,
    w_gate: jax.Array,
    w_up: jax.Array,
    w_down: jax.Array,
    *,
    num_experts: int,
    factor: float,
    transport: str,
    axis: str = EXPERT_AXIS,
    expert_matmul: str = ExpertMatmul.RAGGED,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-device body (inside ``shard_map``): x [N, d], expert_ids/gates [N, k], local expert weights.

    Returns (y [N, d], row_kept [N, k], stats [1, 3] = dropped rows, received rows, load/balanced),
    the stats seen from this device as a destination.
    """
    n, d = x.shape
    k = expert_ids.shape[1]
    r = n * k
    ep = jax.lax.axis_size(axis)
    e_loc = num_experts // ep
    me = jax.lax.axis_index(axis)
    buffer = buffer_rows(n, k, factor, ep, num_experts)
    cap = min(buffer, n * min(k, e_loc))  # the most rows one source can send one shard

    plan = make_plan(expert_ids.reshape(r), num_experts, buffer, axis)
    rows = x[plan.order // k]
    buf = _transport(
        rows, buffer, plan.send_off[me], plan.kept[me], plan.recv_off[me],
        plan.recv_off[:, me], plan.kept[:, me], cap, axis, transport,
    )  # fmt: skip

    # Which local expert each buffer row is for: rows of a source arrive sorted by expert.
    q = jnp.arange(buffer)
    recv_sizes = plan.kept[:, me]
    src = jnp.searchsorted(jnp.cumsum(recv_sizes), q, side="right")
    valid = q < recv_sizes.sum()
    src_c = jnp.minimum(src, ep - 1)
    j = q - plan.recv_off[src_c, me]
    mine = jax.lax.dynamic_slice_in_dim(plan.counts, me * e_loc, e_loc, axis=1)  # [EP, e_loc]
    local_expert = (j[:, None] >= jnp.cumsum(mine, axis=1)[src_c]).sum(-1)

    dt = x.dtype
    experts = _experts_dense if expert_matmul == ExpertMatmul.DENSE else _experts
    out = experts(buf, local_expert, valid, w_gate.astype(dt), w_up.astype(dt), w_down.astype(dt), e_loc)

    back = _transport(
        out, r, plan.recv_off[:, me], plan.kept[:, me], plan.send_off[:, me],
        plan.send_off[me], plan.kept[me], cap, axis, transport,
    )  # fmt: skip
    y_rows = jnp.zeros_like(back).at[plan.order].set(back).reshape(n, k, d)
    y = jnp.einsum("nkd,nk->nd", y_rows, gates.astype(dt))

    # Which of my rows were kept: position within its chunk < rows kept of that chunk.
    sorted_dst = expert_ids.reshape(r)[plan.order] // e_loc
    pos = jnp.arange(r) - plan.send_off[me][sorted_dst]
    row_kept = jnp.zeros(r, bool).at[plan.order].set(pos < plan.kept[me][sorted_dst]).reshape(n, k)

    received = plan.sent[:, me].sum()
    stats = jnp.stack(
        [jnp.maximum(received - buffer, 0), received, received / r]  # load over balanced: / (n * k)
    ).astype(jnp.float32)
    return y, row_kept, stats[None]


def balance_loss(probs: jax.Array, top_idx: jax.Array, group: int) -> jax.Array:
    """Switch-style load-balancing loss ``E/k · Σ_e f_e P_e`` of each group of ``group`` sequences:
    [B / group]; the loss is their mean (1 when balanced).

    ``f_e`` is the fraction of the group's tokens routed to e, ``P_e`` the mean router probability.
    It is computed on the global arrays (GSPMD), not per device, so it is independent of how the
    batch is sharded; per-group values are a fixed partition of the global batch, so averaging over
    micro-batches gives the same value and gradient for any gradient accumulation. They come back
    per group, not averaged: the caller averages once over every layer and group, one reduction
    across devices per step rather than one per layer.
    """
    b, t, e = probs.shape
    k = top_idx.shape[-1]
    frac = jax.nn.one_hot(top_idx, e, dtype=jnp.float32).sum(-2)  # [B, T, E]
    frac = frac.reshape(b // group, group * t, e).mean(1)
    prob = probs.reshape(b // group, group * t, e).mean(1)
    return (e / k) * jnp.sum(frac * prob, -1)


class MLP(nnx.Module):
    """SwiGLU feed-forward: the dense layers and the shared expert."""

    def __init__(self, d_model: int, d_ff: int, init_std: float, *, rngs: nnx.Rngs):
        normal = nnx.initializers.normal(init_std)
        init_in = nnx.with_partitioning(normal, ("embed", "mlp"))
        self.w_gate = nnx.Param(init_in(rngs.params(), (d_model, d_ff)))
        self.w_up = nnx.Param(init_in(rngs.params(), (d_model, d_ff)))
        self.w_down = nnx.Param(
            nnx.with_partitioning(normal, ("mlp", "embed"))(rngs.params(), (d_ff, d_model))
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        dt = x.dtype
        gate = remat.name(x @ self.w_gate[...].astype(dt), remat.MLP_IN)
        up = remat.name(x @ self.w_up[...].astype(dt), remat.MLP_IN)
        return remat.name((jax.nn.silu(gate) * up) @ self.w_down[...].astype(dt), remat.MLP_OUT)


class MoE(nnx.Module):
    """Top-k routed SwiGLU experts (+ an optional shared expert), expert-parallel over ``expert``."""

    def __init__(self, d_model: int, cfg: MoEConfig, init_std: float, *, rngs: nnx.Rngs):
        e, f = cfg.num_experts, cfg.d_expert
        # Plain scalars, not the config object: module attributes become part of the (hashed) graphdef.
        self.num_experts, self.top_k, self.balance_group = e, cfg.top_k, cfg.balance_group
        self.factor, self.transport = cfg.ragged_buffer_factor, resolve_transport(cfg.transport)
        self.expert_matmul = ExpertMatmul(cfg.expert_matmul)
        init = nnx.initializers.normal(init_std)
        expert_in = nnx.with_partitioning(init, ("experts", "embed", "mlp"))
        self.router = nnx.Param(nnx.with_partitioning(init, ("embed", "router"))(rngs.params(), (d_model, e)))
        self.w_gate = nnx.Param(expert_in(rngs.params(), (e, d_model, f)))
        self.w_up = nnx.Param(expert_in(rngs.params(), (e, d_model, f)))
        self.w_down = nnx.Param(
            nnx.with_partitioning(init, ("experts", "mlp", "embed"))(rngs.params(), (e, f, d_model))
        )
        self.shared = (
            MLP(d_model, cfg.shared_expert_dim, init_std, rngs=rngs) if cfg.shared_expert_dim else None
        )

    def __call__(self, x: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        b, t, d = x.shape
        logits = jnp.einsum("btd,de->bte", x.astype(jnp.float32), self.router[...])
        probs = jax.nn.softmax(logits, axis=-1)
        tok, ex = P(BATCH_AXES), P(EXPERT_AXIS)
        # Each token's choice is its own: ranked on the device that holds it. On the global array
        # XLA's SPMD partitioner did not split top_k (jaxlib 0.10.2): it gathered every token's
        # probabilities to every device of the mesh, once per MoE layer (docs/platform.md §6).
        gates, idx = jax.shard_map(
            lambda p: tuple(jax.lax.top_k(p, self.top_k)), in_specs=tok, out_specs=(tok, tok)
        )(probs.reshape(b * t, -1))
        gates, idx = gates.reshape(b, t, -1), idx.reshape(b, t, -1)
        aux = {
            "lb_loss": balance_loss(probs, idx, self.balance_group),
            "z_loss": jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2, axis=-1),  # [B]
        }
        body = partial(
            dispatch_combine, num_experts=self.num_experts, factor=self.factor, transport=self.transport,
            expert_matmul=self.expert_matmul,
        )  # fmt: skip
        y, _, stats = jax.shard_map(body, in_specs=(tok, tok, tok, ex, ex, ex), out_specs=(tok, tok, tok))(
            x.reshape(b * t, d),
            idx.reshape(b * t, -1),
            gates.reshape(b * t, -1),
            self.w_gate[...],
            self.w_up[...],
            self.w_down[...],
        )
        aux["stats"] = stats  # [devices, 3], summed (max for the load) once per step, not per layer
        y = y.reshape(b, t, d)
        if self.shared is not None:
            y = y + self.shared(x)
        return y, aux
