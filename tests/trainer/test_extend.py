"""Extending a run (docs/contract.md "Extending a run"): ``train.steps`` raised on a resume.

One short run (the default cosine, whose decay follows ``train.steps``) commits steps 2 and 4. Raised
to 6 steps as it is, the resume is refused in one line that says how to go on; with the pin that
line names, it resumes and trains on at the floor of its own schedule, the steps it trained
unchanged. In process (real JAX on the 8 simulated devices, real Orbax), as
tests/trainer/test_corrupt_checkpoint.py runs the trainer.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest

from tests.trainer import runs
from trainer import config
from trainer.__main__ import main
from trainer.step import schedule

# A warm-up shorter than the run, so that its decay is seen; checkpoints every 2 steps.
SETS = [*runs.MODEL, "optim.warmup_steps=1", "checkpoint.interval=2", "metrics.log_every=1000"]


def _train(run_dir: Path, monkeypatch: pytest.MonkeyPatch, *overrides: str) -> int:
    for k in [k for k in os.environ if k.startswith("RESLICE_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("RESLICE_RUN_DIR", str(run_dir))
    monkeypatch.setenv("RESLICE_GLOBAL_BATCH", "16")
    return main(["--config", "tiny", *(a for s in [*SETS, *overrides] for a in ("--set", s))])


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory: pytest.TempPathFactory, cpu8: list) -> Path:
    run_dir = tmp_path_factory.mktemp("four") / "run"
    with pytest.MonkeyPatch.context() as mp:
        assert _train(run_dir, mp, "train.steps=4") == 0
    assert runs.committed(run_dir) == [2, 4]
    return run_dir


def test_raising_train_steps_under_a_decay_that_follows_it_is_refused_with_the_way_on(
    four_steps: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    before = {str(p): p.stat().st_mtime_ns for p in four_steps.rglob("*")}
    capsys.readouterr()
    assert _train(four_steps, monkeypatch, "train.steps=6") == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert lines[0].endswith(
        "(optim.decay_steps 4 -> 6): refusing to resume; the cosine decay follows train.steps when"
        " optim.decay_steps=0: --set optim.decay_steps=4 keeps this run's schedule"
    ), lines[0]
    assert {str(p): p.stat().st_mtime_ns for p in four_steps.rglob("*")} == before  # nothing written


def test_with_the_decay_pinned_the_run_goes_on_at_the_floor_of_its_schedule(
    four_steps: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(four_steps, run_dir)
    capsys.readouterr()
    assert _train(run_dir, monkeypatch, "train.steps=6", "optim.decay_steps=4") == 0
    assert f"resumed step 4 from {run_dir}/checkpoints" in capsys.readouterr().out
    records = runs.parse_metrics(runs.metrics_files(run_dir))
    assert sorted(records) == list(range(1, 7))
    pinned = config.resolve("tiny", [*SETS, "train.steps=6", "optim.decay_steps=4"], {})
    lr = schedule(pinned)
    for step, rec in records.items():  # record `step` is the update of schedule step `step - 1`
        assert rec["learning/lr"] == pytest.approx(float(lr(step - 1)), rel=1e-6), step
    floor = pinned.optim.lr * pinned.optim.min_lr_ratio
    assert [records[s]["learning/lr"] for s in (5, 6)] == pytest.approx([floor, floor], rel=1e-6)
    assert all(math.isfinite(records[s]["learning/loss"]) for s in (5, 6))
    status = json.loads((run_dir / "status.json").read_text())
    assert (status["state"], status["step"], status["total_steps"]) == ("finished", 6, 6)
    # The same run: the hash of its checkpoints, which a later extension is checked against.
    assert status["config_hash"] == config.config_hash(config.resolve("tiny", [*SETS, "train.steps=4"], {}))
