"""`reslice sweep --trainer maxtext` end to end on the embedded cluster (the real command line, the
real controller, the real entrypoint in every pod) around the stand-in MaxText (tests/maxtext/
fake_maxtext.py), which logs MaxText 0.2.5's two overflow probes as MaxText does: `REQUIRED_RBF`
lines on its output and `learning/moe_max_load_ratio` in its metrics file. One run per factor;
sweep.json, sweep.csv and sweep.png hold a row each, and the numbers and the recommendation are
recomputed here, independently, from the runs' metrics records. Real MaxText: tests/maxtext_e2e."""

from __future__ import annotations

import csv
import io
import json
import os
import statistics

import pytest

from launcher.adapters.rundir import RunDir
from tests.e2e.harness import PRESET, Harness
from tests.maxtext.fake_package import fake_package
from tests.support.cli import run_cli

pytestmark = pytest.mark.e2e
FACTORS = "1.0,1.25,2.0,-1"
STEPS, WARMUP = 30, 10
MOE = ["num_experts=4", "num_experts_per_tok=2", "base_num_decoder_layers=2"]


def overflow(run_dir: str, factor: float) -> dict:
    """The aggregates recomputed from the run's records: a (step, layer) overflowed when MaxText's
    REQUIRED_RBF for it exceeds the factor."""
    recs = {r["step"]: r for r in RunDir(run_dir).metrics()}
    assert sorted(recs) == list(range(1, STEPS + 1))
    measured = [recs[s] for s in range(WARMUP + 1, STEPS + 1)]
    pairs = [(i, v) for r in measured for i, v in enumerate(r["moe/required_buffer_factor_layers"])]
    over = [(i, factor > 0 and v > factor) for i, v in pairs]
    return {
        "dropped_rows": sum(o for _, o in over),
        "total_rows": len(over),
        "max_load_max": max(r["learning/moe_max_load_ratio"] for r in measured),
        "required_factor_max": max(v for _, v in pairs),
        "loss_final": recs[STEPS]["learning/loss"],
        "measured_steps": STEPS - WARMUP,
        "drop_unit": "layer-steps",
    }


def test_sweep_of_maxtext_ragged_buffer_factor_on_the_embedded_cluster(tmp_path, capsys) -> None:
    path = os.pathsep.join(p for p in (str(fake_package(tmp_path)), os.environ.get("PYTHONPATH")) if p)
    h = Harness(tmp_path, pools=1, gcs_env={"PYTHONPATH": path, "FAKE_STEP_S": "0.03"})
    sweep_dir = tmp_path / "sweeps" / "mt"
    argv = ["sweep", "--trainer", "maxtext", "--preset", PRESET, "--steps", str(STEPS), "--name", "mt",
            "--factors", FACTORS, "--warmup", str(WARMUP), "--sweep-dir", str(sweep_dir),
            "--kubeconfig", str(h.cluster.kubeconfig)]  # fmt: skip
    for kv in MOE:
        argv += ["--set", kv]
    try:
        code, out, err = run_cli(capsys, *argv)
        runs = {r: h.record(r) for r in ("mt-f1", "mt-f1p25", "mt-f2", "mt-fdropless")}
    finally:
        h.close()
    assert code == 0, (out[-3000:], err[-3000:])
    assert {r.state for r in runs.values()} == {"Finished"}
    # Each run is a MaxText run with the sweep's keys: its factor, the probes, the steps.
    spec = runs["mt-f1p25"].spec
    assert spec.trainer == "maxtext" and spec.image == "reslice-maxtext:latest"
    assert spec.overrides[-1] == "ragged_buffer_factor=1.25" and "steps=30" in spec.overrides
    assert {"moe_log_max_load_ratio=true", "log_required_ragged_buffer_factor=true"} <= set(spec.overrides)

    doc = json.loads((sweep_dir / "sweep.json").read_text())
    rows = list(csv.DictReader(io.StringIO((sweep_dir / "sweep.csv").read_text())))
    assert (sweep_dir / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert [r["run"] for r in doc["results"]] == list(runs) and [r["run"] for r in rows] == list(runs)
    expected = {}
    for r in doc["results"]:
        exp = expected[r["run"]] = overflow(runs[r["run"]].spec.run_dir, r["factor"])
        for key, value in exp.items():
            assert r[key] == value, (r["run"], key, r[key], value)
        assert r["dropped_fraction"] == exp["dropped_rows"] / exp["total_rows"]
        assert r["step_time_median_s"] > 0 and r["tokens_per_sec"] > 0
    fracs = [r["dropped_fraction"] for r in doc["results"]]
    assert fracs[0] > fracs[1] > 0 and fracs[-1] == 0  # f = 1 overflows most, dropless never
    # The recommendation: the smallest factor at most --max-drop (0.1 %) with every larger one too.
    finite = [r for r in doc["results"] if r["factor"] > 0]
    ok = [r["dropped_fraction"] <= 0.001 for r in finite]
    chosen = next((r["factor"] for i, r in enumerate(finite) if all(ok[i:])), -1.0)
    rec = doc["recommendation"]
    assert rec["factor"] == chosen and rec["message"].startswith(
        "recommended ragged_buffer_factor=" if chosen > 0 else "no finite factor"
    ), rec
    dropless = doc["results"][-1]["step_time_median_s"]
    if chosen > 0:
        picked = next(r for r in doc["results"] if r["factor"] == chosen)
        assert rec["saving"] == pytest.approx(1 - picked["step_time_median_s"] / dropless)
        assert "of layer-steps overflowed" in rec["message"]
    text = " ".join(out.split())
    assert "MaxText base on tpu7x-2x2x1" in text and "◀ recommended" in text
    assert (
        statistics.fmean(
            len(r["moe/required_buffer_factor_layers"]) for r in RunDir(runs["mt-f2"].spec.run_dir).metrics()
        )
        == 2
    )
