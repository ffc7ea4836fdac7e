"""``train.profile_steps``: a jax.profiler trace of the chosen steps in the run directory
(trainer/telemetry/profile.py), on CPU: the files appear, and the steps annotated in the trace are
the chosen ones and no others."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.fake_gcs import FakeGCS
from tests.trainer import runs
from trainer import config
from trainer.config import ConfigError
from trainer.telemetry import profile


def test_two_traces_of_the_chosen_steps_only_and_every_step_recorded(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    sets = ["train.steps=7", "train.profile_steps=[2, 3, 6]", "checkpoint.interval=7"]
    rc, out = runs.run(
        runs.env_for(str(run_dir), 1), tmp_path / "t.log", [a for s in sets for a in ("--set", s)]
    )
    assert rc == 0, out[-3000:]
    root = run_dir / "profile" / "process-0"
    assert sorted(p.name for p in root.iterdir()) == ["steps-2-3", "steps-6-6"]
    for window, expected in (("steps-2-3", {2, 3}), ("steps-6-6", {6})):
        (run,) = (root / window / "plugins" / "profile").iterdir()  # one trace each
        names = {p.name for p in run.iterdir()}
        assert "perfetto_trace.json.gz" in names and any(n.endswith(".xplane.pb") for n in names), names
        (trace,) = run.glob("*.trace.json.gz")
        events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
        steps = {int(e["args"]["step_num"]) for e in events if e.get("name") == "train"}
        assert steps == expected, (window, steps)
        assert f"profile of steps up to {max(expected)} written to {root / window}" in out
    records = runs.parse_metrics(runs.metrics_files(run_dir))
    assert sorted(records) == [1, 2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize(
    ("value", "steps"),
    [("[5, 6]", [5, 6]), ("7", [7]), ("3-5", [3, 4, 5]), ("[6, 5, 6]", [5, 6]), ("[]", [])],
)
def test_profile_steps_forms_and_no_part_of_the_runs_identity(value: str, steps: list[int]) -> None:
    cfg = config.resolve("tiny", [f"train.profile_steps={value}"], {})
    assert cfg.train.profile_steps == steps
    assert config.config_hash(cfg) == config.config_hash(config.load("tiny"))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("[0, 1]", "numbered from 1"),
        ("5-3", "expected steps as"),
        ("[1.5]", "expected steps as"),
        ("[100]", "train.profile_steps must be steps from 1 to train.steps=60"),
    ],
)
def test_bad_profile_steps_are_config_errors(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config.resolve("tiny", [f"train.profile_steps={value}"], {})


def test_windows_are_the_runs_of_consecutive_steps() -> None:
    assert profile.windows([9, 5, 6, 7, 12]) == [(5, 7), (9, 9), (12, 12)]
    assert profile.windows([]) == []
    # An incarnation that resumed inside a window traces the window's rest.
    p = profile.StepProfiler([5, 6, 7], "/unused", 0)
    assert [n for n in range(1, 10) if p.starts(n)] == [5, 6, 7]
    p.active = (6, 7)  # as start(6) sets it, without a trace
    assert not p.starts(7) and p.ends(7) and not p.ends(6)


def test_a_gs_run_directory_gets_the_trace_copied_in(gcs: FakeGCS) -> None:
    script = """
import jax, jax.numpy as jnp
from trainer.telemetry.profile import StepProfiler
p, f = StepProfiler([1], "gs://reslice/prof", 0), jax.jit(lambda x: x * 2)
p.start(1)
with p.step(1):
    f(jnp.ones(4)).block_until_ready()
print(p.stop())
"""
    env = {**gcs.env, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(runs.ROOT), "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "gs://reslice/prof/profile/process-0/steps-1-1"
    names = gcs.list_objects("reslice", "prof/profile/process-0/steps-1-1/plugins/profile/")
    assert any(n.endswith(".xplane.pb") for n in names) and any(
        n.endswith(".trace.json.gz") for n in names
    ), names
