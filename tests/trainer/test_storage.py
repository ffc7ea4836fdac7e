"""The write probe (trainer/state/storage.py): locally, on the real fake-gcs-server, and at trainer start-up."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from google.auth.exceptions import DefaultCredentialsError

from tests.support.fake_gcs import FakeGCS
from tests.trainer import runs
from trainer.__main__ import main
from trainer.state import storage


def buckets(gcs: FakeGCS) -> list[str]:
    with urllib.request.urlopen(f"{gcs.endpoint}/storage/v1/b") as resp:
        return [b["name"] for b in json.load(resp).get("items", [])]


def probe(run_dir: str, env: dict[str, str]) -> tuple[int, str, str]:
    """`python -m trainer --probe-write RUN_DIR` as the preflight pod runs it."""
    p = subprocess.run(
        [sys.executable, "-m", "trainer", "--probe-write", run_dir],
        env=env, capture_output=True, text=True, timeout=60, cwd=runs.ROOT,
    )  # fmt: skip
    return p.returncode, p.stdout, p.stderr


def test_local_probe_leaves_the_run_dir_as_it_found_it(tmp_path: Path, capsys) -> None:
    run_dir = tmp_path / "a" / "run"
    assert main(["--probe-write", str(run_dir)]) == 0
    assert f"wrote and deleted {run_dir}/{storage.PROBE_PREFIX}" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []  # the directories it had to create are gone again
    (run_dir / "keep").mkdir(parents=True)
    assert main(["--probe-write", str(run_dir)]) == 0
    assert [p.name for p in run_dir.iterdir()] == ["keep"]


def test_an_unwritable_local_run_dir_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    (tmp_path / "file").write_text("")  # a file in the path stops even root, which tests run as
    assert main(["--probe-write", str(tmp_path / "file" / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"trainer: cannot create run directory {tmp_path}/file/run"
    )
    assert err.rstrip().endswith("; fix: choose a --run-dir whose parents are directories")


def test_gcs_probe_writes_and_deletes_and_a_missing_bucket_is_not_created(gcs: FakeGCS) -> None:
    env = runs.env_for("unused", 8, extra=gcs.env)
    code, out, err = probe("gs://reslice/probe-test/run", env)
    assert code == 0 and "wrote and deleted gs://reslice/probe-test/run/.reslice-write-probe-" in out, err
    assert gcs.list_objects("reslice", "probe-test/") == []
    code, out, err = probe("gs://no-such-bucket/run", env)
    assert code == 2 and err.count("\n") == 1, err
    assert "bucket gs://no-such-bucket does not exist" in err
    assert "fix: create it (gcloud storage buckets create gs://no-such-bucket --location=REGION)" in err
    assert "no-such-bucket" not in buckets(gcs)


def test_the_trainer_probes_before_it_writes_anything(gcs: FakeGCS) -> None:
    env = runs.env_for("gs://no-such-bucket/run", 8, extra=gcs.env)
    p = subprocess.run(
        [sys.executable, "-m", "trainer"], env=env, capture_output=True, text=True, timeout=120, cwd=runs.ROOT
    )
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr[-2000:]
    assert p.stderr.startswith("trainer: config error: bucket gs://no-such-bucket does not exist")
    assert "no-such-bucket" not in buckets(gcs)  # a probe must not make the bucket it was asked about


FORBIDDEN = OSError(
    "Forbidden: https://storage.googleapis.com/upload/storage/v1/b/b/o\n"
    "123-compute@developer.gserviceaccount.com does not have storage.objects.create access"
)  # what gcsfs raises on a 403 (gcsfs/retry.py validate_response)
EXPLAIN_CASES = [
    ("403", "gs://b/run", FORBIDDEN, "the node pool's service account cannot write gs://b/run (403 Forbidden)",
     "--scopes=storage-full (or cloud-platform)"),
    ("403 via HttpError", "gs://b/run", type("HttpError", (Exception,), {"code": 403})("denied"),
     "cannot write gs://b/run (403 Forbidden)", "roles/storage.objectUser"),
    ("no bucket", "gs://b/run", FileNotFoundError("b/run/.x"), "bucket gs://b does not exist",
     "gcloud storage buckets create gs://b"),
    ("no credentials", "gs://b/run", DefaultCredentialsError("none found"), "no Google credentials",
     "application-default login"),
    ("other gcs", "gs://b/run", RuntimeError("boom"), "cannot write gs://b/run: boom", "storage access"),
    ("local EACCES", "/r", PermissionError(errno.EACCES, "Permission denied"), "/r is not writable",
     "choose a writable --run-dir"),
    ("local EROFS", "/r", OSError(errno.EROFS, "Read-only file system"), "/r is not writable", "gs:// bucket"),
    ("local ENOTDIR", "/f/r", NotADirectoryError(errno.ENOTDIR, "Not a directory"), "a part of the path is a file",
     "parents are directories"),
    ("local ENOSPC", "/r", OSError(errno.ENOSPC, "No space left on device"), "cannot write run directory /r",
     "choose a writable --run-dir"),
]  # fmt: skip


@pytest.mark.parametrize(("run_dir", "error", "what", "fix"), [c[1:] for c in EXPLAIN_CASES],
                         ids=[c[0] for c in EXPLAIN_CASES])  # fmt: skip
def test_explain_says_what_failed_and_the_fix_in_one_line(run_dir, error, what, fix) -> None:
    line = storage.explain(run_dir, error)
    found, sep, said_fix = line.partition("; fix: ")
    assert sep and "\n" not in line and what in found and fix in said_fix, line
