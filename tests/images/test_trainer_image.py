"""The trainer image (docker/Dockerfile) as a pod runs it: `python -m trainer` in the container,
the tiny config on 4 simulated CPU devices, the run directory a volume. It trains and commits
checkpoints there; `podman stop` (SIGTERM) ends it with exit 42 and the step in flight committed;
the same container again resumes from that checkpoint and finishes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from launcher.adapters.rundir import read_jsonl
from tests.images.container import JAX_CACHE, Container, jax_cpu_env
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e
STEPS, DEVICES, GLOBAL_BATCH = 40, 4, 16
RUN_DIR = "/run-dir"


def committed(run_dir: Path) -> list[int]:
    root = run_dir / "checkpoints"
    if not root.exists():
        return []
    return sorted(
        int(p.name) for p in root.iterdir() if p.name.isdigit() and (p / "commit_success.txt").exists()
    )


def trainer(image: str, run_dir: Path, log: Path) -> Container:
    JAX_CACHE.mkdir(parents=True, exist_ok=True)
    env = {
        **jax_cpu_env(DEVICES),
        "RESLICE_RUN_DIR": RUN_DIR,
        "RESLICE_CONFIG": "tiny",
        "RESLICE_GLOBAL_BATCH": str(GLOBAL_BATCH),
        "RESLICE_HEARTBEAT_TIMEOUT_S": "10",
    }
    args = ["--set", f"train.steps={STEPS}", "--set", "checkpoint.interval=10"]
    return Container(image, args, log, env=env, volumes={run_dir: RUN_DIR, JAX_CACHE: "/jax-cache"})


def test_trains_checkpoints_exits_42_on_sigterm_and_resumes(images, tmp_path):
    image = images["docker/Dockerfile"]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    first = trainer(image, run_dir, tmp_path / "first.log")
    try:
        # Past the first periodic checkpoint (step 10), so that the stop lands mid-run.
        wait_for(lambda: committed(run_dir) or not first.running(), 300, "a committed checkpoint")
        assert first.running(), first.output()[-4000:]
        signalled = time.monotonic()
        rc = first.stop(grace_s=60)
        took = time.monotonic() - signalled
    finally:
        first.close()
    out = first.output()
    assert rc == 42, out[-4000:]
    assert took < 60, f"SIGKILL, not the trainer, ended it ({took:.1f} s)"
    saved = committed(run_dir)[-1]
    assert 10 <= saved < STEPS, (committed(run_dir), out[-2000:])
    assert f"trainer: preempted: step {saved} committed, exit 42" in out
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "running" and status["step"] == saved, status
    print(f"stopped: exit {rc} {took:.1f} s after SIGTERM, checkpoints {committed(run_dir)}, status {status}")

    second = trainer(image, run_dir, tmp_path / "second.log")
    try:
        rc = second.wait(300)
    finally:
        second.close()
    out = second.output()
    assert rc == 0, out[-4000:]
    assert f"trainer: resumed step {saved} from {RUN_DIR}/checkpoints" in out, out[-3000:]
    assert f"trainer: finished {STEPS} steps" in out
    assert committed(run_dir)[-1] == STEPS
    records = [r for f in sorted((run_dir / "metrics").glob("*.jsonl")) for r in read_jsonl(f.read_text())]
    # Every step once: the stop lost no step and the resume recomputed none.
    assert sorted(r["step"] for r in records) == list(range(1, STEPS + 1))
