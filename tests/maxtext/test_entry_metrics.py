"""MaxText's metrics_file lines as the contract's records (maxtext_entry/metrics.py), on a line a
real MaxText 0.2.5 run wrote (docs/maxtext.md: the tiny CPU run, 4 devices, step 0)."""

from __future__ import annotations

import json

import pytest

from maxtext_entry.metrics import Incarnation, record, required_rbf

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
WHO = Incarnation(segment=2, jobset_attempt=1, devices=4, micro_batch=1, grad_accum=1, num_processes=1)


def test_a_real_line() -> None:
    r = record(json.loads(REAL_LINE), WHO, now=1000.0)
    assert r["step"] == 1  # MaxText's step 0 is the first: the contract counts steps done
    assert (r["segment"], r["jobset_attempt"], r["time"]) == (2, 1, 1000.0)
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


def test_maxtext_overflow_probes_join_the_record() -> None:
    """MaxText 0.2.5's REQUIRED_RBF log line (a real one, log_required_ragged_buffer_factor=true on
    a 2-layer mixtral block) and its `learning/moe_max_load_ratio` metrics (moe_log_max_load_ratio)."""
    line = (
        "I1204 17:53:18.460587 140254044019584 train.py:795] REQUIRED_RBF step=1 max=1.2422 "
        "per_layer=[1.2422,1.0938] program=normal"
    )
    assert required_rbf(line) == (1, [1.2422, 1.0938])
    assert required_rbf("I1204 train.py:1454] Training stopped") is None
    raw = {"learning/lm_loss": 6.13, "learning/loss": 6.13, "learning/moe_max_load_ratio": 1.2421875,
           "learning/moe_max_load_ratio_mean": 1.16796875, "step": 1.0}  # fmt: skip
    who = Incarnation(segment=0, jobset_attempt=0, devices=4, micro_batch=2, grad_accum=1, num_processes=1)
    rec = record(raw, who, 5.0, [1.2422, 1.0938])
    assert rec["step"] == 2 and rec["moe/max_load_over_balanced"] == 1.2421875
    assert rec["learning/moe_max_load_ratio_mean"] == 1.16796875
    assert rec["moe/required_buffer_factor"] == 1.2422
    assert rec["moe/required_buffer_factor_layers"] == [1.2422, 1.0938]
    assert "moe/required_buffer_factor" not in record(raw, who, 5.0)
