"""MaxText's `metrics_file` records as the contract's metrics records (docs/contract.md, Metrics
record): one pure function per line. MaxText's keys already follow the contract's names where the
meaning is the same; where it differs, the contract's meaning wins:

- `learning/loss` is MaxText's loss *with* the auxiliary terms; the contract's is cross-entropy
  alone, which MaxText calls `learning/lm_loss`. So `learning/loss` <- `learning/lm_loss`, and
  `learning/total_loss` <- MaxText's `learning/loss`.
- `step` is 0-based in MaxText (a float); the contract's is 1-based (after s global batches).
- `perf/tokens_per_sec` is over all devices; MaxText reports it per device.

MaxText's MoE overflow probes (0.2.5's base.yml, read by `reslice sweep --trainer maxtext`):
`moe_log_max_load_ratio` puts `learning/moe_max_load_ratio` (the largest expert shard's load over
the balanced load, max over MoE layers) and `learning/moe_max_load_ratio_mean` (mean over layers)
in the metrics file (`loss_fn`/`train_step`, `src/maxtext/trainers/pre_train/train.py`): passed, and
the first also as the contract's `moe/max_load_over_balanced`. `log_required_ragged_buffer_factor`
writes no metric: it logs `REQUIRED_RBF step=S max=M per_layer=[...] program=P` per step
(`_maybe_log_required_rbf`), the smallest factor that would not have dropped tokens in each MoE
layer; the entrypoint reads it from MaxText's output (`required_rbf`) and adds it to the step's
record as `moe/required_buffer_factor` (max) and `moe/required_buffer_factor_layers`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PASSED = (
    "learning/grad_norm",
    "learning/moe_lb_loss",
    "learning/moe_max_load_ratio",
    "learning/moe_max_load_ratio_mean",
    "perf/step_time_seconds",
    "perf/per_device_tflops_per_sec",
)
REQUIRED_RBF = re.compile(r"REQUIRED_RBF step=(\d+) max=(\S+) per_layer=\[([^\]]*)\] program=(\w+)")


def required_rbf(line: str) -> tuple[int, list[float]] | None:
    """(MaxText's 0-based step, the per-layer factors) of a `REQUIRED_RBF` log line, else None."""
    m = REQUIRED_RBF.search(line)
    if m is None:
        return None
    try:
        return int(m.group(1)), [float(v) for v in m.group(3).split(",") if v.strip()]
    except ValueError:
        return None


@dataclass(frozen=True)
class Incarnation:
    """Who trained: the contract's identity and plan fields of every record."""

    segment: int
    jobset_attempt: int
    devices: int
    micro_batch: int  # per device: MaxText's per_device_batch_size
    grad_accum: int
    num_processes: int
    peak_tflops_per_device: float | None = None


def record(line: dict, who: Incarnation, now: float, rbf_layers: list[float] | None = None) -> dict:
    """The contract's record for one MaxText metrics line (`now`: when the entrypoint read it;
    `rbf_layers`: the step's REQUIRED_RBF per layer, when MaxText logged one)."""
    out: dict = {
        "step": int(line["step"]) + 1,
        "segment": who.segment,
        "jobset_attempt": who.jobset_attempt,
        "time": now,
    }
    if "learning/lm_loss" in line:
        out["learning/loss"] = line["learning/lm_loss"]
        out["learning/total_loss"] = line.get("learning/loss")
    else:
        out["learning/loss"] = line.get("learning/loss")
    if "learning/current_learning_rate" in line:
        out["learning/lr"] = line["learning/current_learning_rate"]
    out.update({k: line[k] for k in PASSED if k in line})
    if "learning/moe_max_load_ratio" in line:
        out["moe/max_load_over_balanced"] = line["learning/moe_max_load_ratio"]
    if rbf_layers:
        out["moe/required_buffer_factor"] = max(rbf_layers)
        out["moe/required_buffer_factor_layers"] = rbf_layers
    per_device = line.get("perf/per_device_tokens_per_sec")
    if per_device is not None:
        out["perf/tokens_per_sec"] = per_device * who.devices
    tflops = line.get("perf/per_device_tflops_per_sec")
    peak = who.peak_tflops_per_device
    out["perf/mfu"] = tflops / peak if tflops is not None and peak else None
    out.update(
        devices=who.devices,
        dp_ranks=who.devices,
        micro_batch=who.micro_batch,
        grad_accum=who.grad_accum,
        num_processes=who.num_processes,
    )
    return out
