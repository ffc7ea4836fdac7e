"""What a block keeps for its backward pass (``model.remat``): the names of the activations the
model marks (``jax.ad_checkpoint.checkpoint_name``) and the policies over them.

Under ``full`` a block saves only its input and recomputes everything else in the backward pass,
a fourth more FLOPs than the step needs; each other policy keeps some of the block's matmul
outputs instead, HBM traded for FLOPs (MaxText's ``remat_policy`` names the same trade-offs:
``save_qkv_proj``, ``save_dot_except_mlpwi``, ``minimal_offloaded``). The accelerator benchmark
(bench/accelerator.py) compiles each policy for the chip, keeps the ones that fit its HBM and
times them.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.ad_checkpoint import checkpoint_name

from trainer.config import Remat

# The activations a block names (trainer/model/transformer.py, moe.py). QKV: the projections
# after the QK-norm and RoPE (what attention reads); ATTENTION: the attention's output and, for the
# splash kernel, its log-sum-exp (the kernel's residuals: kept, its forward is not run again);
# ATTENTION_OUT: the output projection; MLP_IN: the gate and up projections; MLP_OUT: the down one.
QKV, ATTENTION, ATTENTION_OUT, MLP_IN, MLP_OUT = "qkv", "attention", "attention_out", "mlp_in", "mlp_out"
NAMES = (QKV, ATTENTION, ATTENTION_OUT, MLP_IN, MLP_OUT)


_SAVED = {
    Remat.SAVE_ATTENTION: (QKV, ATTENTION),
    Remat.SAVE_ALL_BUT_MLP_IN: (QKV, ATTENTION, ATTENTION_OUT, MLP_OUT),
}


def policy(kind: str) -> Any:
    """The ``jax.checkpoint`` policy of ``kind`` (None: save nothing). Not for ``none``, which is
    no ``jax.checkpoint`` at all."""
    kind = Remat(kind)
    if kind == Remat.FULL:
        return None
    if kind == Remat.SAVE_DOTS:
        return jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    if kind == Remat.OFFLOAD:
        return jax.checkpoint_policies.save_and_offload_only_these_names(
            names_which_can_be_saved=[],
            names_which_can_be_offloaded=list(NAMES),
            offload_src="device",
            offload_dst="pinned_host",
        )
    if kind in _SAVED:
        return jax.checkpoint_policies.save_only_these_names(*_SAVED[kind])
    raise ValueError(f"model.remat={kind} has no policy (it is not rematerialised)")


def name(x: jax.Array, what: str) -> jax.Array:
    """``x`` marked as the activation ``what`` (one of NAMES) for the policies above."""
    return checkpoint_name(x, what)
