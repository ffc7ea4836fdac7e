"""The entrypoint on a gs:// run directory (the real fake-gcs-server binary), around the stand-in
MaxText (fake_maxtext.py), which commits its checkpoints through etils' epath as Orbax does: the
entrypoint reads them there, writes status.json and the metrics records there, keeps MaxText's own
metrics_file local and copies its lines to `maxtext/metrics/`; what it wrote is read back with the
launcher's reader (`launcher.adapters.rundir.RunDir`, the google-cloud-storage client), as the controller
reads it. And the write probe (`--probe-write`) of `reslice preflight --trainer maxtext`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.adapters.rundir import RunDir, read_jsonl
from tests.maxtext.fake_package import fake_package
from tests.support.fake_gcs import FakeGCS, fake_gcs
from tests.support.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
KEYS = [
    "learning_rate_schedule_steps=40", "per_device_batch_size=2", "gradient_accumulation_steps=1",
    "dcn_data_parallelism=1", "ici_fsdp_parallelism=8", "run_name=maxtext", "checkpoint_period=10",
]  # fmt: skip


@pytest.fixture(scope="module")
def gcs() -> Iterator[FakeGCS]:
    with fake_gcs(buckets=["runs"]) as server:
        saved = {k: os.environ.get(k) for k in server.env}
        server.apply()  # this process reads back with launcher.adapters.rundir (STORAGE_EMULATOR_HOST)
        yield server
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _env(tmp_path: Path, gcs: FakeGCS, run_dir: str, **extra: str) -> dict[str, str]:
    fake = tmp_path / "fake"
    env = dict(os.environ, **gcs.env, JAX_PLATFORMS="cpu", RESLICE_RUN_DIR=run_dir, RESLICE_SEGMENT="0")
    env.update(RESLICE_RESTART_ATTEMPT="0", RESLICE_GLOBAL_BATCH="16", RESLICE_NUM_PROCESSES="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(fake if fake.exists() else fake_package(tmp_path))])
    return env


def _start(
    tmp_path: Path, gcs: FakeGCS, run_dir: str, steps: int, *keys: str, **env: str
) -> subprocess.Popen:
    argv = [sys.executable, "-m", "maxtext_entry", "--", f"steps={steps}", f"base_output_directory={run_dir}"]
    return subprocess.Popen(
        [*argv, *KEYS, *keys], env=_env(tmp_path, gcs, run_dir, **env), stderr=subprocess.PIPE, text=True,
        cwd=tmp_path,
    )  # fmt: skip


def _finish(p: subprocess.Popen) -> tuple[int, str]:
    _, err = p.communicate(timeout=90)
    return p.returncode, err


def _maxtext_lines(gcs: FakeGCS, prefix: str) -> list[dict]:
    names = sorted(n for n in gcs.list_objects("runs", f"{prefix}/maxtext/metrics/"))
    return [r for n in names for r in read_jsonl(gcs.read_object("runs", n).decode())]


def test_a_gcs_run_directory_trains_finishes_and_a_restart_is_finished(tmp_path: Path, gcs: FakeGCS) -> None:
    prefix = f"{tmp_path.name}/run"
    url = f"gs://runs/{prefix}"
    probes = ("log_required_ragged_buffer_factor=true", "moe_log_max_load_ratio=true")
    code, err = _finish(_start(tmp_path, gcs, url, 25, *probes))
    assert code == 0, err[-3000:]
    rd = RunDir(url, "maxtext")
    assert rd.status()["state"] == "finished" and rd.status()["step"] == 25
    assert rd.committed_steps() == [1, 11, 21, 25]  # MaxText's 0, 10, 20, 24, read by the controller's reader
    records = rd.metrics()
    assert [r["step"] for r in records] == list(range(1, 26))
    assert {r["segment"] for r in records} == {0} and records[0]["devices"] == 8
    # The REQUIRED_RBF log line of each step joined its record; the load ratio came from the metrics.
    assert all(len(r["moe/required_buffer_factor_layers"]) == 2 for r in records)
    assert all(
        r["moe/required_buffer_factor"] == max(r["moe/required_buffer_factor_layers"]) for r in records
    )
    assert all(r["moe/max_load_over_balanced"] == r["learning/moe_max_load_ratio"] for r in records)
    # MaxText's own lines, copied as they are: 0-based steps, MaxText's keys.
    assert [line["step"] for line in _maxtext_lines(gcs, prefix)] == [float(s) for s in range(25)]
    objects = gcs.list_objects("runs", f"{prefix}/")
    assert not any(".reslice-write-probe-" in n for n in objects)  # the start's probe left nothing
    assert not any(n.endswith("metrics.jsonl") for n in objects)  # metrics_file itself stays local

    code, err = _finish(_start(tmp_path, gcs, url, 25))
    assert code == 0 and "all 25 steps are committed" in err


def test_sigterm_on_gcs_saves_and_exits_42_with_the_records_flushed(tmp_path: Path, gcs: FakeGCS) -> None:
    url = f"gs://runs/{tmp_path.name}/run"
    p = _start(tmp_path, gcs, url, 100_000, FAKE_STEP_S="0.05")
    rd = RunDir(url, "maxtext")
    wait_for(lambda: (rd.latest_committed_step() or 0) >= 11 or p.poll() is not None, 60, "checkpoint 10")
    p.send_signal(signal.SIGTERM)
    code, err = _finish(p)
    assert code == 42, err[-3000:]
    status = rd.status()
    assert status["state"] == "running" and status["step"] == rd.latest_committed_step() > 11
    # At exit the records are flushed whole: one per trained step up to the emergency save.
    assert [r["step"] for r in rd.metrics()] == list(range(1, status["step"] + 1))


def test_the_write_probe_on_gcs(tmp_path: Path, gcs: FakeGCS) -> None:
    env = _env(tmp_path, gcs, "unused")
    ok = subprocess.run(
        [sys.executable, "-m", "maxtext_entry", "--probe-write", f"gs://runs/{tmp_path.name}/p"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(
        f"maxtext_entry: wrote and deleted gs://runs/{tmp_path.name}/p/.reslice-write-probe-"
    )
    assert gcs.list_objects("runs", f"{tmp_path.name}/p") == []
    bad = subprocess.run(
        [sys.executable, "-m", "maxtext_entry", "--probe-write", "gs://no-such-bucket-here/p"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "gs://no-such-bucket-here does not exist" in bad.stderr
    assert "; fix: create it" in bad.stderr


def test_a_run_directory_in_a_missing_bucket_is_a_config_error(tmp_path: Path, gcs: FakeGCS) -> None:
    code, err = _finish(_start(tmp_path, gcs, "gs://no-such-bucket-here/run", 25))
    assert code == 2, err[-3000:]
    assert err.startswith("maxtext_entry: config error: bucket gs://no-such-bucket-here does not exist")
    assert json.dumps(gcs.list_objects("runs", f"{tmp_path.name}/")) == "[]"


def test_records_of_committed_steps_reach_gcs_before_a_hard_kill(tmp_path: Path, gcs: FakeGCS) -> None:
    """A segment whose node pool is gone is killed without notice and resumes after its last commit:
    the records up to that commit must already be in the bucket, though gs:// objects are otherwise
    rewritten only every FLUSH_S (10 s)."""
    url = f"gs://runs/{tmp_path.name}/run"
    p = _start(tmp_path, gcs, url, 100_000, FAKE_STEP_S="0.1")
    rd = RunDir(url, "maxtext")
    try:
        wait_for(lambda: (rd.latest_committed_step() or 0) >= 11 or p.poll() is not None, 60, "checkpoint 10")
        committed = time.monotonic()
        wait_for(
            lambda: 11 in {r["step"] for r in rd.metrics()} or p.poll() is not None, 8, "step 11's record"
        )
        assert time.monotonic() - committed < 5, "flushed by the periodic rewrite, not for the commit"
    finally:
        p.kill()  # SIGKILL: nothing is flushed from here on (MaxText dies with the entrypoint)
        p.communicate(timeout=30)
    assert [r["step"] for r in rd.metrics()][:11] == list(range(1, 12))
