"""An analytic estimate of the train step's HBM (accelerator memory) per device, for every rung of the
ladder. (The trainer's compiled figure is trainer/hbm.py's; "memory" elsewhere means the RAM snapshots
an in-place restart restores from.)

Pure arithmetic on the trainer config (as ``python -m trainer --check`` resolves it) and a batch
plan: cheap enough for every rung, unlike compiling the step (``python -m trainer --hbm`` does
that for one shape, and tests/trainer/test_hbm.py checks this estimate against it on small
shapes). Terms, per device (b sequences per data-parallel rank per micro-step, T tokens, tensor
parallelism t, activation bytes a):

- state: fp32 parameters (key/value projections over ``model.kv_heads``) and both Adam moments,
  12 bytes a parameter, sharded over fsdp × tensor (× data with ``mesh.shard_over_data``; experts
  also over expert);
- gradients: 4 bytes a parameter, sharded alike, 8 with gradient accumulation (the accumulator
  beside one micro-step's gradients);
- one layer's weights gathered by FSDP (fp32 and their compute-dtype copy), split over tensor, when
  the parameters are sharded at all;
- what the backward pass keeps per layer: the block input only (``remat: full``), the matmul
  outputs (``save_dots``) or everything, T × T scores included (``none``);
- the working set of one layer's forward and backward, with one query block of attention scores
  (``model.attention_block``) in fp32 — none with the splash kernel (``model.attention`` auto or
  splash: a TPU's; its tiles live in the core's vector memory), only its log-sum-exp per query;
- one chunk of logits (``model.loss_chunk``) in fp32, with its softmax and gradient.

Checked on a TPU v5e against the chip's peak (docs/measurements.md "On a TPU": bytes in use plus
the bytes the runtime reserves for the step's temporaries), where an earlier form of this estimate
(8 bytes of gradients, two working sets, the blocked path's scores) was far over.

Called by launcher/core/plan.py (every rung of ``shrink_ladder`` given a trainer config).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Protocol

GIB = 2**30


class TrainerAttention(StrEnum):
    """The trainer's ``model.attention`` values (trainer/config.py Attention; the launcher cannot
    import the trainer). ``auto`` is the splash kernel on a TPU, which is what the launcher plans."""

    AUTO = "auto"
    SPLASH = "splash"
    BLOCKED = "blocked"
    DENSE = "dense"


KERNEL_ATTENTION = (TrainerAttention.AUTO, TrainerAttention.SPLASH)


class TrainerRemat(StrEnum):
    """The trainer's ``model.remat`` values (trainer/config.py Remat, its policies in
    trainer/model/remat.py): what a block keeps for its backward pass."""

    FULL = "full"
    SAVE_ATTENTION = "save_attention"
    SAVE_ALL_BUT_MLP_IN = "save_all_but_mlp_in"
    SAVE_DOTS = "save_dots"
    OFFLOAD = "offload"
    NONE = "none"


class PlanLike(Protocol):
    """What the estimate reads of a batch plan: launcher/core/plan.py's Plan has it. Not that class itself,
    so that this module imports nothing of plan.py, which calls it (no import circle)."""

    @property
    def devices(self) -> int: ...
    @property
    def micro_batch(self) -> int: ...
    @property
    def model_parallel(self) -> int: ...
    @property
    def grad_accum(self) -> int: ...


def param_counts(model: dict, moe: dict) -> tuple[int, int]:
    """(parameters outside the experts, expert parameters)."""
    d, h, hd, f, v, n = (
        model[k] for k in ("d_model", "n_heads", "head_dim", "d_ff", "vocab_size", "n_layers")
    )
    dense_layers = model["dense_layers"]
    n_moe = n - dense_layers
    kv = _kv_heads(model)
    # q and o; k and v over the key/value heads (grouped-query attention); two norms, QK-norm's scales.
    attn = 2 * d * (h + kv) * hd + 2 * d + (h + kv) * hd * bool(model.get("qk_norm"))
    shared = 3 * d * moe["shared_expert_dim"] + d * moe["num_experts"]
    other = 2 * v * d + d + n * attn + dense_layers * 3 * d * f + n_moe * shared
    return other, n_moe * 3 * d * moe["d_expert"] * moe["num_experts"]


def estimate(cfg: dict[str, Any], plan: PlanLike) -> dict[str, float]:
    """Bytes per device by term, and ``total``, for ``cfg`` (the trainer's resolved config) on ``plan``."""
    m, e, mesh = cfg["model"], cfg["moe"], cfg.get("mesh", {})
    t = plan.model_parallel
    data = mesh.get("data") or 1
    shard = plan.devices if mesh.get("shard_over_data") else plan.devices // data
    expert = _expert_size(cfg, plan.devices // (data * t))
    other, experts = param_counts(m, e)
    per_param = other / max(shard // expert, 1) + experts / shard  # dense weights are replicated over expert
    d, h, hd, f, v, n, seq = (
        m[k] for k in ("d_model", "n_heads", "head_dim", "d_ff", "vocab_size", "n_layers", "seq_len")
    )
    a = 2 if m["dtype"] == "bfloat16" else 4
    b = plan.micro_batch
    moe_layer = m["dense_layers"] < n
    ff = e["top_k"] * e["d_expert"] + e["shared_expert_dim"] if moe_layer else f
    kv = _kv_heads(m)
    layer_params = 2 * d * (h + kv) * hd + 3 * d * (
        e["d_expert"] * e["num_experts"] // expert if moe_layer else f
    )
    heads, kv_width = h * hd / t, kv * hd / t
    inner = b * seq * (6 * d + 2 * heads + 2 * kv_width + 3 * ff / t) * a
    if moe_layer:  # dispatch and return buffers of the routed rows
        inner += 4 * b * seq * e["top_k"] * d * a
    if m.get("attention", TrainerAttention.AUTO) in KERNEL_ATTENTION:
        scores = b * (h / t) * seq * 4 * 2  # the kernel's log-sum-exp and its gradient's
    else:
        block = m.get("attention_block") or seq if m.get("attention") != TrainerAttention.DENSE else seq
        scores = b * (h / t) * min(block, seq) * seq * 4 * 3
    remat = m.get("remat", TrainerRemat.NONE)
    # Per layer: its input under every policy; the attention's q, k, v and output and the kernel's
    # log-sum-exp where the attention is kept; its two output projections beside them.
    attention_kept = b * seq * (2 * heads + 2 * kv_width) * a + b * (h / t) * seq * 4
    if remat in (TrainerRemat.FULL, TrainerRemat.OFFLOAD):  # offload: the rest is in the host's memory
        saved = n * b * seq * d * a
    elif remat == TrainerRemat.SAVE_ATTENTION:
        saved = n * (b * seq * d * a + attention_kept)
    elif remat == TrainerRemat.SAVE_ALL_BUT_MLP_IN:
        saved = n * (3 * b * seq * d * a + attention_kept)
    elif remat == TrainerRemat.SAVE_DOTS:
        saved = n * b * seq * (2 * d + heads + 2 * kv_width + 2 * ff / t) * a
    else:
        saved = n * (inner + b * (h / t) * seq * seq * (4 + a))
    chunk = m.get("loss_chunk") or seq
    sharded = shard > 1
    terms = {
        "state": 12 * per_param,
        "gradients": (8 if plan.grad_accum > 1 else 4) * per_param,
        "gathered_layer": (4 + a) * layer_params / t if sharded else 0.0,
        "saved_activations": saved,
        "layer_working_set": inner + scores,
        "logits": b * min(chunk, seq) * v / t * 4 * 3,
    }
    terms["total"] = sum(terms.values())
    return terms


def _kv_heads(model: dict) -> int:
    """Key/value heads: ``model.kv_heads``, 0 (or absent, a config from before it) meaning n_heads."""
    return model.get("kv_heads") or model["n_heads"]


def _expert_size(cfg: dict, rest: int) -> int:
    """The trainer's expert-parallel size (trainer/model/mesh.py mesh_shape), from what it knows here."""
    m, e, mesh = cfg["model"], cfg["moe"], cfg.get("mesh", {})
    if m["dense_layers"] >= m["n_layers"]:
        return 1
    if mesh.get("expert"):
        return mesh["expert"]
    if mesh.get("fsdp"):
        return max(rest // mesh["fsdp"], 1)
    return max(x for x in range(1, rest + 1) if rest % x == 0 and e["num_experts"] % x == 0)
