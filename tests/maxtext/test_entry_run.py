"""The entrypoint end to end around a stand-in MaxText (tests/maxtext/fake_maxtext.py): the SIGTERM
forwarded and turned into 42, a finished run into 0 (also when restarted), MaxText's exit 0 after a
data crash into 1, a configuration error into 2; status.json and the metrics records written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from launcher.adapters.rundir import read_jsonl
from tests.maxtext.fake_package import fake_package
from tests.support.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
KEYS = [
    "learning_rate_schedule_steps=40", "per_device_batch_size=2", "gradient_accumulation_steps=1",
    "dcn_data_parallelism=2", "ici_fsdp_parallelism=4", "run_name=maxtext", "checkpoint_period=10",
]  # fmt: skip


def _start(tmp_path: Path, steps: int, **env: str) -> subprocess.Popen:
    run_dir = tmp_path / "run"
    environ = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{fake_package(tmp_path)}", JAX_PLATFORMS="cpu")
    environ.update(RESLICE_RUN_DIR=str(run_dir), RESLICE_SEGMENT="1", RESLICE_RESTART_ATTEMPT="2")
    environ.update(RESLICE_GLOBAL_BATCH="16", RESLICE_NUM_PROCESSES="1", **env)
    argv = [
        sys.executable,
        "-m",
        "maxtext_entry",
        "--",
        f"steps={steps}",
        f"base_output_directory={run_dir}",
        *KEYS,
    ]
    return subprocess.Popen(argv, env=environ, stderr=subprocess.PIPE, text=True, cwd=tmp_path)


def _finish(p: subprocess.Popen) -> tuple[int, str]:
    _, err = p.communicate(timeout=60)
    return p.returncode, err


def _status(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "run" / "status.json").read_text())


def _records(tmp_path: Path) -> list[dict]:
    files = sorted((tmp_path / "run" / "metrics").glob("*.jsonl"))
    return [r for f in files for r in read_jsonl(f.read_text())]


def _rmtree_fake(tmp_path: Path) -> None:
    import shutil

    shutil.rmtree(tmp_path / "fake")


def test_finishes_then_a_restart_is_finished_too(tmp_path: Path) -> None:
    code, err = _finish(_start(tmp_path, steps=25))
    assert code == 0, err
    assert "fake: hardware=cpu ici_data=2" in err  # on CPU the slices fold into ICI data parallelism
    assert _status(tmp_path)["state"] == "finished" and _status(tmp_path)["step"] == 25
    records = _records(tmp_path)
    assert [r["step"] for r in records] == list(range(1, 26))  # 1-based
    assert records[0]["segment"] == 1 and records[0]["jobset_attempt"] == 2 and records[0]["devices"] == 8
    assert len(list((tmp_path / "run" / "metrics").glob("0001-002-*.jsonl"))) == 1
    _rmtree_fake(tmp_path)
    code, err = _finish(_start(tmp_path, steps=25))  # MaxText itself would exit 1 here
    assert code == 0 and "all 25 steps are committed" in err


def test_sigterm_is_forwarded_and_the_save_exits_42(tmp_path: Path) -> None:
    p = _start(tmp_path, steps=100_000, FAKE_STEP_S="0.05")
    wait_for(lambda: len(_records(tmp_path)) >= 5 or p.poll() is not None, 30, "5 metrics records")
    p.send_signal(signal.SIGTERM)
    code, err = _finish(p)
    assert code == 42, err
    status = _status(tmp_path)
    assert status["state"] == "running" and status["step"] > 5  # the emergency checkpoint's steps
    assert status["step"] == len(_records(tmp_path))
    assert status["total_steps"] == 100_000


def test_a_data_crash_exits_1_though_maxtext_exits_0(tmp_path: Path) -> None:
    code, err = _finish(_start(tmp_path, steps=30, FAKE_MODE="data_crash"))
    assert code == 1 and "MaxText exited 0" in err
    assert _status(tmp_path)["state"] == "running"


def test_a_config_maxtext_refuses_exits_2(tmp_path: Path) -> None:
    code, err = _finish(_start(tmp_path, steps=30, FAKE_MODE="config"))
    assert code == 2, err


def test_a_command_line_without_the_rendered_keys_exits_2(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "maxtext_entry", "--", "steps=3", "not-a-key"]
    done = subprocess.run(argv, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr == "maxtext_entry: config error: argument 'not-a-key': expected key=value\n"
    assert list(tmp_path.iterdir()) == []
