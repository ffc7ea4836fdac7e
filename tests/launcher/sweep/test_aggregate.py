"""The sweep's pure parts on synthetic metrics records: factors and names, aggregation (from the
trainer's own `moe/*` fields), the recommendation, and what a rerun does with each run."""

import json
import math

import pytest

from launcher.core.errors import UserError
from launcher.core.record import RunRecord
from launcher.core.render import DNS1035
from launcher.core.spec import RunSpec
from launcher.core.words import RunState
from launcher.sweep.files import load_sweep, write_outputs
from launcher.sweep.results import FactorResult, aggregate, recommend
from launcher.sweep.spec import (
    ATTACH,
    DONE,
    LAUNCH,
    MISSING,
    RELAUNCH,
    factor_label,
    factor_slug,
    make_sweep,
    next_action,
    parse_factors,
    run_name,
)


def rec(step, *, dropped=(0, 0), total=(64, 64), load=(1.0, 1.0), buffer=128, loss=3.0, t=None, st=0.02,
        segment=0):  # fmt: skip
    """A contract metrics record (docs/contract.md) of a 2-layer model."""
    layers = [
        {"dropped_rows": d, "total_rows": n, "max_load_over_balanced": x}
        for d, n, x in zip(dropped, total, load, strict=True)
    ]
    return {
        "step": step, "segment": segment, "jobset_attempt": 0, "time": t if t is not None else 1000.0 + step,
        "learning/loss": loss, "perf/step_time_seconds": st, "perf/tokens_per_sec": 512 / st,
        "moe/dropped_rows": sum(dropped), "moe/total_rows": sum(total),
        "moe/max_load_over_balanced": max(load), "moe/layers": layers, "moe/buffer_rows": buffer,
    }  # fmt: skip


# --- factors, names, input ---------------------------------------------------------------------


def test_parse_factors_and_labels():
    assert parse_factors("1.0, 1.0625,1.125,2,-1") == (1.0, 1.0625, 1.125, 2.0, -1.0)
    assert [factor_label(f) for f in (1.0, 1.0625, 2.0, -1.0, 0.0)] == [
        "1",
        "1.0625",
        "2",
        "dropless",
        "dropless",
    ]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "empty"),
        ("1.0,,2", "empty item"),
        ("1.0,abc", "'abc' is not a number"),
        ("1.0,nan", "not a finite number"),
        ("inf", "not a finite number"),
        ("1.0,1", "1 is given twice"),
        ("-1,0", "any value ≤ 0 means dropless"),
    ],
)
def test_parse_factors_rejects(text, needle):
    with pytest.raises(UserError, match=needle):
        parse_factors(text)


def test_run_names_are_dns_safe_and_one_to_one():
    factors = [1.0, 1.0625, 1.125, 1.25, 1.5, 2.0, 0.5, 1e-05, 1.00001, 10.0, -1.0]
    names = [run_name("moe", f) for f in factors]
    assert all(DNS1035.match(n) for n in names), names
    assert len(set(names)) == len(names)
    assert names[:2] == ["moe-f1", "moe-f1p0625"] and names[-1] == "moe-fdropless"
    assert factor_slug(1e-05) == "1em05"


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"steps": 10, "warmup": 10}, "no step would be measured"),
        ({"steps": 0, "warmup": 0}, "must be positive"),
        ({"warmup": -1}, "must be ≥ 0"),
        ({"max_drop": 1.5}, "--max-drop"),
        ({"max_parallel": 0}, "--max-parallel"),
        ({"name": "Bad_Name"}, "DNS-1035"),
        ({"overrides": ("moe.ragged_buffer_factor=2",)}, "use --factors"),
        ({"overrides": ("train.steps=5",)}, "use --steps"),
        ({"preset": "no-such-preset"}, "no-such-preset"),
    ],
)
def test_make_sweep_rejects(kwargs, needle):
    args = {
        "name": "s",
        "preset": "tpu7x-2x2x1",
        "slices": None,
        "config": "tiny",
        "factors": "1,-1",
        "steps": 20,
    }
    with pytest.raises(UserError, match=needle):
        make_sweep(**{**args, **kwargs})


def test_make_sweep_defaults(tmp_path):
    s = make_sweep(name="s", preset="tpu7x-2x2x1", slices=None, config="tiny", factors="1,-1", steps=20,
                   sweep_dir=str(tmp_path / "d"))  # fmt: skip
    assert (s.slices, s.global_batch, s.warmup, s.max_drop) == (1, 16, 10, 0.001)  # 2 sequences × 8 devices
    assert s.run_dir(-1.0) == f"{tmp_path}/d/s-fdropless"
    # The sweep's own keys come last, so a config file cannot override them.
    assert s.run_overrides(1.25)[-2:] == ("train.steps=20", "moe.ragged_buffer_factor=1.25")


# --- aggregation -------------------------------------------------------------------------------


def test_drops_come_from_the_trainers_counts_not_from_loads():
    # Loads of 1.0 with a buffer of 128 rows per shard could not drop a row — but the trainer says
    # it dropped some, and the trainer is who counts. Warm-up steps (≤ 2) drop a lot and are skipped.
    warm = [rec(s, dropped=(50, 50)) for s in (1, 2)]
    measured = [rec(3, dropped=(3, 1)), rec(4, dropped=(0, 5)), rec(5, dropped=(2, 0))]
    r = aggregate(1.25, "s-f1p25", [warm + measured], warmup=2, steps=5)
    assert (r.dropped_rows, r.total_rows, r.measured_steps) == (11, 3 * 128, 3)
    assert r.dropped_fraction == 11 / 384
    # Per layer: layer 0 dropped 5 of 192, layer 1 dropped 6 of 192.
    assert (r.worst_layer, r.worst_layer_dropped_fraction) == (1, 6 / 192)
    assert r.buffer_rows == 128 and r.state == RunState.FINISHED


def test_aggregate_load_loss_and_timing_over_measured_steps():
    recs = [
        rec(1, load=(3.0, 3.0), loss=9.0, st=5.0),  # compile step: skipped (warm-up and first of its file)
        rec(2, load=(1.2, 1.6), loss=4.0, st=0.030),
        rec(3, load=(1.4, 1.1), loss=3.0, st=0.010),
        rec(4, load=(1.9, 1.0), loss=2.0, st=0.020),
    ]
    r = aggregate(2.0, "s-f2", [recs], warmup=1, steps=4)
    assert r.max_load_mean == pytest.approx((1.6 + 1.4 + 1.9) / 3) and r.max_load_max == 1.9
    assert (r.loss_final, r.loss_mean) == (2.0, 3.0)
    assert r.step_time_median_s == 0.020 and r.step_time_mean_s == pytest.approx(0.020)
    assert r.tokens_per_sec == pytest.approx(512 / 0.020)


def test_aggregate_keeps_the_last_computation_and_skips_each_incarnations_first_step():
    # Incarnation 0 ran steps 1–6 and was preempted; 5–6 were not checkpointed, so incarnation 1
    # resumed at step 5 (its first step includes start-up: 4 s) and recomputed them.
    first = [rec(s, dropped=(1, 0), st=0.01, t=100 + s) for s in range(1, 7)]
    second = [rec(s, dropped=(0, 2), st=4.0 if s == 5 else 0.03, t=200 + s, segment=1) for s in range(5, 9)]
    r = aggregate(1.0, "s-f1", [second, first], warmup=2, steps=8)  # file order does not matter
    assert r.measured_steps == 6  # steps 3..8, each once
    assert r.dropped_rows == 2 * 1 + 4 * 2  # steps 3–4 from incarnation 0, 5–8 from incarnation 1
    # Timed steps: 3, 4 (0.01) and 6, 7, 8 (0.03); step 5 of incarnation 1 is its start-up step.
    assert r.step_time_median_s == 0.03 and r.step_time_mean_s == pytest.approx((2 * 0.01 + 3 * 0.03) / 5)


def test_aggregate_without_measured_steps_or_unfinished():
    r = aggregate(1.0, "s-f1", [[rec(1), rec(2)]], warmup=2, steps=10, state=RunState.FAILED, reason="boom")
    assert not r.measured and r.dropped_fraction is None and r.state == RunState.FAILED
    r = aggregate(1.0, "s-f1", [[rec(s) for s in range(1, 6)]], warmup=2, steps=10, state=RunState.STOPPED)
    assert r.measured and r.loss_final is None  # never reached the last step


# --- recommendation ----------------------------------------------------------------------------


def result(factor, drop, step_ms, state=RunState.FINISHED):
    return FactorResult(factor=factor, run=run_name("s", factor), state=state, measured_steps=10,
                        dropped_fraction=drop, step_time_median_s=step_ms / 1e3)  # fmt: skip


def test_recommend_smallest_factor_under_threshold_and_saving():
    rs = [result(1.0, 0.13, 20), result(1.25, 0.05, 21), result(1.5, 0.0008, 22), result(2.0, 0.0, 24),
          result(-1.0, 0.0, 32)]  # fmt: skip
    rec = recommend(rs, 0.001)
    assert rec.factor == 1.5 and rec.dropped_fraction == 0.0008
    assert rec.saving == pytest.approx(1 - 22 / 32)
    assert "moe.ragged_buffer_factor=1.5" in rec.message and "31.2 % saved" in rec.message
    assert recommend(rs, 0.05).factor == 1.25  # "at most": equal to the threshold qualifies


def test_recommend_is_not_fooled_by_a_noisy_dip_and_ignores_unfinished_runs():
    rs = [result(1.0, 0.0005, 20), result(1.25, 0.02, 21), result(1.5, 0.0, 22, state=RunState.FAILED),
          result(2.0, 0.0, 24), result(-1.0, 0.0, 30)]  # fmt: skip
    assert recommend(rs, 0.001).factor == 2.0


def test_recommend_falls_back_to_dropless_or_says_what_is_missing():
    rec = recommend([result(1.0, 0.1, 20), result(-1.0, 0.0, 30)], 0.001)
    assert rec.factor == -1.0 and rec.saving == 0.0 and "use dropless" in rec.message
    rec = recommend([result(1.0, 0.1, 20), result(2.0, 0.0, 22)], 0.001)
    assert rec.factor == 2.0 and rec.saving is None and "no dropless run" in rec.message
    assert recommend([result(1.0, 0.0, 20, state=RunState.RUNNING)], 0.001).factor is None


# --- resumability ------------------------------------------------------------------------------


def record(state):
    return RunRecord(spec=RunSpec(run="s-f1", run_dir="/x", global_batch=16), preset="tpu7x-2x2x1", slices=1,
                     state=state)  # fmt: skip


FINISHED_STATUS = {"state": "finished", "step": 20, "total_steps": 20}


@pytest.mark.parametrize(
    ("state", "status", "has_last", "action"),
    [
        (None, None, False, LAUNCH),  # never launched
        (RunState.FINISHED, FINISHED_STATUS, True, DONE),
        (None, FINISHED_STATUS, True, DONE),  # the cluster lost its records: the run directory decides
        (RunState.FINISHED, FINISHED_STATUS, False, MISSING),  # finished, results gone: rerunning cannot help
        (RunState.FINISHED, None, False, MISSING),
        (
            RunState.RUNNING,
            {"state": "running", "step": 8},
            False,
            ATTACH,
        ),  # left live by an interrupted sweep
        (RunState.PENDING, None, False, ATTACH),
        (
            RunState.RUNNING,
            FINISHED_STATUS,
            True,
            ATTACH,
        ),  # trainer done, record not yet: let the controller see
        (RunState.STOPPED, {"state": "running", "step": 8}, False, RELAUNCH),
        (RunState.FAILED, None, False, RELAUNCH),
        (RunState.STOPPED, FINISHED_STATUS, True, DONE),
        (None, {"state": "finished", "step": 10}, True, LAUNCH),  # finished fewer steps than asked
    ],
)
def test_next_action(state, status, has_last, action):
    assert next_action(record(state) if state else None, status, has_last, 20) == action


# --- outputs -----------------------------------------------------------------------------------


def test_write_and_load_outputs(tmp_path):
    s = make_sweep(name="s", preset="tpu7x-2x2x1", slices=None, config="tiny", factors="1,2,-1", steps=20,
                   sweep_dir=str(tmp_path))  # fmt: skip
    rs = [result(-1.0, 0.0, 30), result(1.0, 0.1, 20), result(2.0, 0.0, 22)]
    rec, paths = write_outputs(s, rs)
    assert rec.factor == 2.0
    assert paths == [str(tmp_path / "sweep.json"), str(tmp_path / "sweep.csv"), str(tmp_path / "sweep.png")]
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads((tmp_path / "sweep.json").read_text())
    assert [r["factor"] for r in doc["results"]] == [1.0, 2.0, -1.0]  # ascending, dropless last
    assert doc["recommendation"]["factor"] == 2.0
    lines = (tmp_path / "sweep.csv").read_text().splitlines()
    assert lines[0].startswith("label,factor,run,state") and lines[1].startswith("1,1.0,s-f1,Finished")
    spec, loaded, rec2 = load_sweep(str(tmp_path))
    assert spec == s and loaded == sorted(rs, key=lambda r: (r.factor <= 0, r.factor)) and rec2 == rec
    assert math.isclose(rec2.saving, 1 - 22 / 30)


def mt_rec(step, rbf, *, st=0.02, loss=3.0):
    """The entrypoint's record of a MaxText step (maxtext_entry/metrics.py): MaxText's probes, no rows."""
    return {
        "step": step, "segment": 0, "jobset_attempt": 0, "time": 1000.0 + step, "learning/loss": loss,
        "perf/step_time_seconds": st, "perf/tokens_per_sec": 512 / st, "moe/max_load_over_balanced": max(rbf),
        "moe/required_buffer_factor": max(rbf), "moe/required_buffer_factor_layers": list(rbf),
    }  # fmt: skip


def test_maxtext_overflow_is_counted_per_layer_step_from_required_rbf() -> None:
    files = [[mt_rec(1, (9.0, 9.0)), *(mt_rec(s, (1.0 + (s % 4) / 8, 1.3)) for s in range(2, 12))]]
    r = aggregate(1.2, "mt-f1p2", files, warmup=1, steps=11, trainer="maxtext")
    # Steps 2..11 measured (step 1 is the warm-up): layer 1 (1.3) overflows at every step, layer 0
    # (1.0, 1.125, 1.25, 1.375 by step % 4) at the 6 steps with 1.25 or 1.375.
    assert (r.dropped_rows, r.total_rows, r.drop_unit) == (16, 20, "layer-steps")
    assert r.dropped_fraction == 16 / 20 and r.worst_layer == 1 and r.worst_layer_dropped_fraction == 1.0
    assert r.required_factor_max == 1.375 and r.buffer_rows is None and r.measured_steps == 10
    dropless = aggregate(-1.0, "mt-fdropless", files, warmup=1, steps=11, trainer="maxtext")
    assert dropless.dropped_rows == 0 and dropless.dropped_fraction == 0.0
    assert aggregate(1.4, "mt-f1p4", files, warmup=1, steps=11, trainer="maxtext").dropped_fraction == 0.0
    rec_ = recommend([r, dropless], 0.001, "ragged_buffer_factor")
    assert rec_.factor == -1.0 and "use dropless (ragged_buffer_factor ≤ 0)" in rec_.message
    # A step without MaxText's probe is not counted as a step that dropped nothing: unmeasured.
    gap = [[*files[0][:5], {k: v for k, v in mt_rec(6, (1.0,)).items() if not k.startswith("moe/")}]]
    missing = aggregate(1.2, "mt-f1p2", gap, warmup=1, steps=11, trainer="maxtext")
    assert not missing.measured and "without MaxText's REQUIRED_RBF" in missing.reason


def test_a_maxtext_sweep_owns_its_keys_and_needs_a_moe_model() -> None:
    common = dict(name="mt", preset="tpu7x-2x2x1", slices=None, config="base", factors="1,-1", steps=30)
    s = make_sweep(**common, overrides=("num_experts=4",), trainer="maxtext")
    assert (
        s.run_overrides(1.0)[0] == "num_experts=4" and s.run_overrides(1.0)[-1] == "ragged_buffer_factor=1.0"
    )
    assert "steps=30" in s.run_overrides(-1.0) and s.factor_key == "ragged_buffer_factor"
    for kv, words in (
        ("ragged_buffer_factor=2", "use --factors"),
        ("use_ragged_sort=false", "which need it"),
    ):
        with pytest.raises(UserError, match=words):
            make_sweep(**common, overrides=("num_experts=4", kv), trainer="maxtext")
    with pytest.raises(UserError, match="sweeps a MoE model"):
        make_sweep(**common, overrides=("num_experts=1",), trainer="maxtext")
    make_sweep(**{**common, "config": "/cfg/moe.yml"}, trainer="maxtext")  # MaxText reads its file
    assert (
        make_sweep(**common, overrides=("model_name=mixtral-8x7b",), trainer="maxtext").trainer == "maxtext"
    )
