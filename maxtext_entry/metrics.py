"""MaxText's `metrics_file` records as the contract's metrics records (docs/contract.md, Metrics
record): one pure function per line. MaxText's keys already follow the contract's names where the
meaning is the same; where it differs, the contract's meaning wins:

- `learning/loss` is MaxText's loss *with* the auxiliary terms; the contract's is cross-entropy
  alone, which MaxText calls `learning/lm_loss`. So `learning/loss` <- `learning/lm_loss`, and
  `learning/total_loss` <- MaxText's `learning/loss`.
- `step` is 0-based in MaxText (a float); the contract's is 1-based (after s global batches).
- `perf/tokens_per_sec` is over all devices; MaxText reports it per device.
"""

from __future__ import annotations

from dataclasses import dataclass

PASSED = (
    "learning/grad_norm",
    "learning/moe_lb_loss",
    "perf/step_time_seconds",
    "perf/per_device_tflops_per_sec",
)


@dataclass(frozen=True)
class Incarnation:
    """Who trained: the contract's identity and plan fields of every record."""

    segment: int
    restart_attempt: int
    devices: int
    micro_batch: int  # per device: MaxText's per_device_batch_size
    grad_accum: int
    num_processes: int
    peak_tflops_per_device: float | None = None


def record(line: dict, who: Incarnation, now: float) -> dict:
    """The contract's record for one MaxText metrics line (`now`: when the entrypoint read it)."""
    out: dict = {
        "step": int(line["step"]) + 1,
        "segment": who.segment,
        "restart_attempt": who.restart_attempt,
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
