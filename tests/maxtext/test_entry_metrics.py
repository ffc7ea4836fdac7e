"""MaxText's metrics_file lines as the contract's records (maxtext_entry/metrics.py), on a line a
real MaxText 0.2.5 run wrote (docs/maxtext.md: the tiny CPU run, 4 devices, step 0)."""

from __future__ import annotations

import json

import pytest

from maxtext_entry.metrics import Incarnation, record

REAL_LINE = (
    '{"learning/grad_norm": 1.0000009536743164, "learning/indexer_loss": 0.0, "learning/lm_loss": '
    '6.106241226196289, "learning/loss": 6.106241226196289, "learning/moe_lb_loss": 0.0, "learning/mtp_loss": '
    '0.0, "learning/param_norm": 134.85597229003906, "learning/perplexity": 448.649169921875, '
    '"learning/raw_grad_norm": 2.2541043758392334, "learning/total_weights": 128.0, "learning/z_loss": 0.0, '
    '"perf/step_time_seconds": 0.238018, "learning/current_learning_rate": 2.9999999242136255e-05, '
    '"perf/per_device_tflops": 1.96608e-05, "perf/per_device_tflops_per_sec": 8.260215613945163e-05, '
    '"perf/per_device_tokens": 32.0, "perf/per_device_tokens_per_sec": 134.44361350822206, "step": 0.0, '
    '"run_name": "t1"}'
)
WHO = Incarnation(segment=2, restart_attempt=1, devices=4, micro_batch=1, grad_accum=1, num_processes=1)


def test_a_real_line() -> None:
    r = record(json.loads(REAL_LINE), WHO, now=1000.0)
    assert r["step"] == 1  # MaxText's step 0 is the first: the contract counts steps done
    assert (r["segment"], r["restart_attempt"], r["time"]) == (2, 1, 1000.0)
    assert r["learning/loss"] == 6.106241226196289  # cross-entropy: MaxText's lm_loss
    assert r["learning/total_loss"] == 6.106241226196289  # with the auxiliary terms (0 here)
    assert r["learning/lr"] == 2.9999999242136255e-05
    assert r["learning/grad_norm"] == 1.0000009536743164
    assert r["perf/step_time_seconds"] == 0.238018
    assert r["perf/tokens_per_sec"] == pytest.approx(4 * 134.44361350822206)  # all devices
    assert r["perf/per_device_tflops_per_sec"] == 8.260215613945163e-05
    assert r["perf/mfu"] is None  # no peak given
    assert (r["devices"], r["dp_ranks"], r["micro_batch"], r["grad_accum"], r["num_processes"]) == (
        4,
        4,
        1,
        1,
        1,
    )
    assert "run_name" not in r and "learning/perplexity" not in r
    json.dumps(r)  # a JSONL record


def test_auxiliary_losses_are_not_the_loss_and_mfu_needs_the_peak() -> None:
    line = dict(json.loads(REAL_LINE), **{"learning/loss": 6.5, "learning/moe_lb_loss": 0.4, "step": 41.0})
    r = record(line, Incarnation(0, 0, 4, 1, 1, 1, peak_tflops_per_device=8.260215613945163e-04), now=0.0)
    assert (r["step"], r["learning/loss"], r["learning/total_loss"]) == (42, 6.106241226196289, 6.5)
    assert r["learning/moe_lb_loss"] == 0.4
    assert r["perf/mfu"] == pytest.approx(0.1)
