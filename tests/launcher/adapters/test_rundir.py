"""The run directory, locally and on gs:// (the real fake-gcs-server binary): the same behaviour."""

import json
import threading

import pytest

from launcher.adapters.rundir import RunDir
from tests.support.fake_gcs import fake_gcs


@pytest.fixture(scope="module")
def gcs():
    with fake_gcs(buckets=["runs"]) as server:
        saved = {k: __import__("os").environ.get(k) for k in server.env}
        server.apply()
        yield server
        for k, v in saved.items():
            if v is None:
                __import__("os").environ.pop(k, None)
            else:
                __import__("os").environ[k] = v


@pytest.fixture(params=["local", "gcs"])
def rundir(request, tmp_path):
    if request.param == "local":
        return RunDir(str(tmp_path / "run"))
    request.getfixturevalue("gcs")
    return RunDir(f"gs://runs/{tmp_path.name}/run")


def test_read_write_and_listing(rundir):
    assert rundir.read_text("run.json") is None and rundir.list_dir("metrics") == []
    rundir.write_text("run.json", '{"run": "x"}')
    rundir.write_text("metrics/0000-000-1.jsonl", json.dumps({"step": 2, "time": 2.0}) + "\n")
    rundir.write_text("metrics/0001-000-2.jsonl", json.dumps({"step": 1, "time": 1.0}) + "\n{half")
    assert json.loads(rundir.read_text("run.json")) == {"run": "x"}
    assert rundir.list_dir("metrics") == ["0000-000-1.jsonl", "0001-000-2.jsonl"]
    # Sorted by time, and a line caught mid-write is skipped rather than fatal.
    assert [m["step"] for m in rundir.metrics()] == [1, 2]


def test_only_committed_checkpoints_count(rundir):
    for step in (10, 20):
        rundir.write_text(f"checkpoints/{step}/_CHECKPOINT_METADATA", "{}")
        rundir.write_text(f"checkpoints/{step}/commit_success.txt", "Checkpoint commit was successful")
    # Half written on gs://: Orbax wrote the metadata at the start of the save, not the commit file.
    rundir.write_text("checkpoints/30/_CHECKPOINT_METADATA", "{}")
    rundir.write_text("checkpoints/30/state/data", "x")
    rundir.write_text("checkpoints/40.orbax-checkpoint-tmp-123/commit_success.txt", "x")  # local, not renamed
    assert rundir.committed_steps() == [10, 20]
    assert rundir.latest_committed_step() == 20


def test_maxtext_checkpoints_are_read_where_and_as_maxtext_writes_them(rundir):
    """MaxText commits `maxtext/checkpoints/<k>` with k 0-based (the state after k + 1 steps): the
    controller must see reslice's step k + 1 there, and nothing of the other profile's layout."""
    maxtext = RunDir(rundir.url, "maxtext")
    for k in (0, 9):
        rundir.write_text(f"maxtext/checkpoints/{k}/commit_success.txt", "Checkpoint commit was successful")
    rundir.write_text("maxtext/checkpoints/14/_CHECKPOINT_METADATA", "{}")  # a save in flight
    rundir.write_text("checkpoints/30/commit_success.txt", "x")  # reslice's layout: not MaxText's
    assert maxtext.committed_steps() == [1, 10]
    assert maxtext.latest_committed_step() == 10
    assert rundir.committed_steps() == [30]


def test_status_survives_a_torn_read(rundir):
    assert rundir.status() is None
    rundir.write_text("status.json", '{"state": "runn')
    assert rundir.status() is None
    rundir.write_text("status.json", '{"state": "running", "step": 3}')
    assert rundir.status() == {"state": "running", "step": 3}


def test_ledger_appends_from_concurrent_writers_lose_nothing(rundir):
    def writer(k: int) -> None:
        for i in range(5):
            rundir.log([{"writer": k, "i": i}])

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    entries = rundir.ledger()
    assert sorted((e["writer"], e["i"]) for e in entries) == [(k, i) for k in range(3) for i in range(5)]
    # Each writer's lines stay in its own order.
    for k in range(3):
        assert [e["i"] for e in entries if e["writer"] == k] == list(range(5))


def test_latest_metrics_reads_only_the_tail(rundir):
    assert rundir.latest_metrics() is None
    long = "".join(json.dumps({"step": s, "time": float(s), "pad": "x" * 200}) + "\n" for s in range(1, 1001))
    rundir.write_text("metrics/0000-000-1.jsonl", long)  # ~230 KB: more than the tail that is read
    assert rundir.latest_metrics()["step"] == 1000
    # A newer incarnation whose file exists but has no complete line yet does not hide the last one.
    rundir.write_text("metrics/0001-000-2.jsonl", '{"step": 10')
    assert rundir.latest_metrics()["step"] == 1000
    rundir.write_text("metrics/0001-000-2.jsonl", json.dumps({"step": 1001, "time": 1001.0}) + "\n")
    assert rundir.latest_metrics()["step"] == 1001
