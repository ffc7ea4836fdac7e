"""The run-directory writer: local append, whole-object rewrites and rotation for object stores."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.trainer import runs
from trainer.telemetry import metrics


def records(n: int) -> list[dict]:
    return [{"step": s, "learning/loss": 1.0 / s, "moe/layers": []} for s in range(1, n + 1)]


def test_object_store_mode_rewrites_whole_objects_and_rotates(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(metrics, "ROTATE_LINES", 3)
    writer = metrics.RunWriter(str(tmp_path), segment=2, jobset_attempt=1, flush_seconds=0, enabled=True)
    writer.remote = True  # what a gs:// run directory does, on a local path
    for rec in records(7):
        writer.write(rec)
    writer.close()
    files = runs.metrics_files(tmp_path)
    assert [len(text.splitlines()) for text in files.values()] == [3, 3, 1]
    assert all(name.startswith("0002-001-") for name in files)
    assert sorted(runs.parse_metrics(files)) == list(range(1, 8))


def test_local_mode_appends_and_only_process_0_writes(tmp_path: Path) -> None:
    writer = metrics.RunWriter(str(tmp_path / "a"), 0, 0, flush_seconds=60, enabled=True)
    assert not list((tmp_path / "a" / "metrics").glob("*.jsonl"))  # nothing trained, no file
    for rec in records(3):
        writer.write(rec)
        assert runs.last_step(tmp_path / "a") == rec["step"]  # on disk at once
    writer.status(state="running", step=3, total_steps=9, segment=0, config_hash="x")
    writer.close()
    assert json.loads((tmp_path / "a" / "status.json").read_text())["step"] == 3

    other = metrics.RunWriter(str(tmp_path / "b"), 0, 0, flush_seconds=0, enabled=False)
    other.write(records(1)[0])
    other.status(state="running", step=1)
    other.close()
    assert not (tmp_path / "b").exists()


_EVENTS = """
import glob, sys
from trainer.telemetry import metrics
run_dir = sys.argv[1]
if run_dir == "-":
    metrics.preload_tensorboard(None)  # the run directory not known: everything tensorboardX imports
else:
    writer = metrics.RunWriter(run_dir, 0, 0, flush_seconds=0, enabled=True)
    for step in (1, 2):
        writer.write({"step": step, "learning/loss": 0.5})
    writer.close()
from tensorboardX import record_writer
print(record_writer.GCS_ENABLED, "google.cloud.storage" in sys.modules)
import google.cloud.storage  # still importable afterwards
"""


def test_a_local_run_directorys_event_writer_does_not_import_the_gcs_client(tmp_path: Path) -> None:
    """tensorboardX imports google.cloud.storage for gs:// event files; a local run's process 0 (and
    each in-place pod's preload) leaves it out, and still writes its events; a run directory not
    known (or on gs://) gets the whole of tensorboardX. Fresh interpreters: the suite's own has
    imported everything already."""

    def run(arg: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", _EVENTS, arg], capture_output=True, text=True, cwd=runs.ROOT, timeout=120
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip()

    assert run(str(tmp_path / "run")) == "False False"
    events = list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0
    assert run("-") == "True True"
