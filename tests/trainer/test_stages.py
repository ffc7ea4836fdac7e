"""Stages (train.init_from): stage 2 starts from stage 1's last committed checkpoint at step 0 with
its own schedule, resumes from its own checkpoints after a preemption, grows while its WSD schedule
is in the stable phase, and neither stage resumes the other's checkpoints. Real trainer processes
on simulated CPU devices, real Orbax; the step-0 state in-process."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from pathlib import Path

import jax
import numpy as np
import pytest

from tests.support.fake_gcs import FakeGCS
from tests.trainer import runs
from trainer import config
from trainer.model.mesh import make_mesh
from trainer.state import stages
from trainer.state.checkpoint import Checkpointer
from trainer.step import abstract_state, init_state, plain, schedule

# Stage 2: a WSD schedule of its own (peak 1e-3, warm-up 5 that trains its first step, decay over
# the last 10 %), so that its logged learning rate is unlike stage 1's cosine.
STAGE2 = ["optim.schedule=wsd", "optim.lr=1e-3", "optim.warmup_steps=5", "optim.warmup_nonzero_start=true"]


def _sets(*overrides: str) -> list[str]:
    return [a for s in [*runs.COMMON, *overrides] for a in ("--set", s)]


def _one_line_exit_2(env: dict, args: list[str]) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", *args], env=env, capture_output=True, text=True, timeout=180, cwd=runs.ROOT
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith(("I", "W", "[Gloo]"))]
    assert len(lines) == 1, proc.stderr[-2000:]
    return lines[0]


@pytest.fixture(scope="module")
def stage1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Stage 1: tiny, cosine, 10 steps on 8 devices; its last committed checkpoint is step 10."""
    run_dir = tmp_path_factory.mktemp("stage1")
    rc, out = runs.run(runs.env_for(str(run_dir), 8), run_dir / "trainer.log", ["--set", "train.steps=10"])
    assert rc == 0, out[-4000:]
    assert runs.committed(run_dir) == [10]
    return run_dir


def _leaves(tree: dict, prefix: str = "") -> dict[str, np.ndarray]:
    out = {}
    for k, v in tree.items():
        name = f"{prefix}/{k}" if prefix else str(k)
        out.update(_leaves(v, name) if isinstance(v, dict) else {name: np.asarray(jax.device_get(v))})
    return out


@pytest.mark.parametrize("init_optimizer", [True, False])
def test_stage_2_step_0_holds_stage_1s_parameters_and_adam_moments_bitwise(
    cpu8: list, stage1: Path, init_optimizer: bool
) -> None:
    sets = [*runs.MODEL, *STAGE2, f"train.init_from={stage1}", f"train.init_optimizer={init_optimizer}"]
    cfg = config.resolve("tiny", sets, {})
    mesh = make_mesh(cfg.moe.num_experts)
    with jax.set_mesh(mesh):
        _, abstract = abstract_state(cfg, mesh)
        fresh = init_state(cfg, mesh, abstract)
        fresh_leaves = _leaves(fresh)
        state = _leaves(stages.initial_state(cfg, fresh, plain(abstract)))
        ckpt = Checkpointer(str(stage1), keep=3)
        try:
            source = _leaves(ckpt.restore(10, plain(abstract)))
        finally:
            ckpt.close()
    params = [k for k in source if k.startswith("0/")]
    moments = [k for k in source if "/mu/" in k or "/nu/" in k]
    assert params and len(moments) == 2 * len(params)
    for k in params:
        assert np.array_equal(state[k], source[k]), k
        assert not np.array_equal(state[k], fresh_leaves[k]), k  # not the stage's own initialisation
    adam_count = next(k for k in source if k.endswith("/0/count/value"))
    schedule_count = next(k for k in source if k.endswith("/count/value") and k != adam_count)
    assert int(source["1/step/value"]) == int(source[schedule_count]) == 10 == int(source[adam_count])
    assert int(state["1/step/value"]) == int(state[schedule_count]) == 0  # the stage's own step and schedule
    if init_optimizer:
        for k in moments:
            assert np.array_equal(state[k], source[k]), k
        assert int(state[adam_count]) == 10  # the moments' bias correction goes on from the source
    else:
        for k in [*moments, adam_count]:
            assert np.array_equal(state[k], fresh_leaves[k]) and not state[k].any(), k


def test_stage_2_follows_its_schedule_resumes_itself_grows_and_refuses_foreign_checkpoints(
    stage1: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "stage2"
    args = _sets(*STAGE2, f"train.init_from={stage1}", "train.init_optimizer=true", "train.steps=20")
    first = runs.Trainer(runs.env_for(str(run_dir), 8), tmp_path / "first.log", args)
    runs.wait_for(lambda: runs.last_step(run_dir) >= 3, 180, "stage 2 step 3", first)
    first.signal(signal.SIGTERM)
    assert first.wait() == 42, first.output()[-4000:]
    assert (
        f"stage start: parameters and Adam moments from {stage1}/checkpoints/10, at step 0" in first.output()
    )
    stopped = runs.committed(run_dir)[-1]
    assert 3 <= stopped < 18  # preempted in the stable phase (the decay of 20 steps starts at 18)

    # The preempted stage resumes itself, not stage 1, and grows to 30 steps (decay from 27): the
    # steps it trained are what the longer schedule would have trained.
    longer = _sets(*STAGE2, f"train.init_from={stage1}", "train.init_optimizer=true", "train.steps=30")
    rc, out = runs.run(runs.env_for(str(run_dir), 8), tmp_path / "second.log", longer)
    assert rc == 0, out[-4000:]
    assert f"resumed step {stopped} from {run_dir}/checkpoints" in out and "stage start" not in out
    records = runs.parse_metrics(runs.metrics_files(run_dir))
    assert sorted(records) == list(range(1, 31))
    lr = schedule(config.resolve("tiny", [*runs.MODEL, *STAGE2, "train.steps=30"], {}))
    for step, rec in records.items():  # record `step` is the update of schedule step `step - 1`
        assert rec["learning/lr"] == pytest.approx(float(lr(step - 1)), rel=1e-6), step
    assert records[1]["learning/lr"] == pytest.approx(1e-3 / 5)  # the first update is not wasted
    stage1_records = runs.parse_metrics(runs.metrics_files(stage1))
    assert stage1_records[1]["learning/lr"] == 0.0  # stage 1: optax's warm-up (and its own schedule)

    # Past its decay start the run cannot grow again: one line, exit 2, nothing written.
    before = {p.name: p.stat().st_mtime_ns for p in run_dir.rglob("*")}
    line = _one_line_exit_2(
        runs.env_for(str(run_dir), 8),
        _sets(*STAGE2, f"train.init_from={stage1}", "train.init_optimizer=true", "train.steps=40"),
    )
    assert "refusing to resume" in line and "past the decay start 27" in line and "stable phase" in line, line
    assert line.endswith("; the decay follows train.steps when optim.decay_steps=0: --set optim.decay_steps=30"
                         " keeps this run's decay at the same optim.decay_fraction"), line  # fmt: skip
    # Stage 2's config on stage 1's run directory, and stage 1's on stage 2's: each another run's.
    line = _one_line_exit_2(runs.env_for(str(stage1), 8), longer)
    assert "refusing to resume" in line and "init" in line, line
    line = _one_line_exit_2(runs.env_for(str(run_dir), 8), _sets())
    assert "refusing to resume" in line, line
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.rglob("*")} == before


def test_a_missing_or_uncommitted_source_is_one_line_and_exit_2(stage1: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    line = _one_line_exit_2(runs.env_for(str(run_dir), 8), _sets(f"train.init_from={tmp_path / 'nothing'}"))
    assert "train.init_from" in line and "no committed checkpoint" in line, line
    half = tmp_path / "half" / "checkpoints" / "7"
    half.mkdir(parents=True)  # a step directory Orbax never committed
    line = _one_line_exit_2(runs.env_for(str(run_dir), 8), _sets(f"train.init_from={half}"))
    assert "not a committed checkpoint" in line, line
    line = _one_line_exit_2(
        runs.env_for(str(run_dir), 8), _sets(f"train.init_from={stage1}/checkpoints/10", "model.d_model=32")
    )
    assert "model.d_model=64, this run 32" in line, line
    assert not run_dir.exists()


def test_a_stage_starts_from_a_gcs_run_directory_and_reads_only_committed_steps(
    stage1: Path, gcs: FakeGCS, tmp_path: Path
) -> None:
    """Stage 1's checkpoint copied object by object to gs:// (as a run on gs:// writes it), plus a
    later step without its commit file: the stage starts from the committed one and writes nothing
    under the source's prefix."""
    prefix = f"stage1-{uuid.uuid4().hex[:8]}"
    for path in (stage1 / "checkpoints" / "10").rglob("*"):
        if path.is_file():
            rel = path.relative_to(stage1)
            gcs.write_object("reslice", f"{prefix}/{rel}", path.read_bytes())
            if rel.name != "commit_success.txt":  # step 20: the same arrays, never committed
                gcs.write_object(
                    "reslice", f"{prefix}/checkpoints/20/{rel.relative_to('checkpoints/10')}", b""
                )
    before = gcs.list_objects("reslice", f"{prefix}/")
    run_dir = tmp_path / "stage2"
    env = runs.env_for(str(run_dir), 8, extra=gcs.env)
    rc, out = runs.run(
        env, tmp_path / "s2.log", _sets(f"train.init_from=gs://reslice/{prefix}", "train.steps=2")
    )
    assert rc == 0, out[-4000:]
    assert f"from gs://reslice/{prefix}/checkpoints/10, at step 0" in out
    assert gcs.list_objects("reslice", f"{prefix}/") == before
    assert runs.committed(run_dir) == [2]
