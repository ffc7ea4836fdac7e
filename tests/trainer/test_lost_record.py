"""A world restored from memory writes the records of the steps up to the one it restores that
the run's metrics lack (trainer.loop._rewrite_lost_records): the previous world's process 0, which
alone writes metrics, can be killed, or wait on a dead peer of its slice, after the other slices
finished and snapshotted a step or two (bench.chaos: "kept steps are not 1..50 (missing [31])",
and later "(missing [14])", the step before the one restored)."""

from __future__ import annotations

import json
from pathlib import Path

from trainer import loop
from trainer.telemetry import metrics


def lines(run_dir: Path) -> list[dict]:
    out = []
    for f in sorted((run_dir / "metrics").glob("*.jsonl")):
        for x in f.read_text().splitlines():
            if x.endswith("}"):  # the line cut short below is no record
                out.append(json.loads(x))
    return out


def test_lost_records_are_written_once_from_memory(tmp_path: Path) -> None:
    run_dir, memory = tmp_path / "run", tmp_path / "shm"
    memory.mkdir()
    old = metrics.RunWriter(str(run_dir), 3, 0, 10.0, True)
    for step in (28, 29):
        old.write({"step": step, "segment": 3, "time": float(step)})
    (run_dir / "metrics" / "0003-000-1.jsonl.part").write_text("")  # not a metrics file
    with open(old.path, "a") as f:
        f.write('{"step": 30, "seg')  # a writer killed mid-line is no record of step 30
    kept = {
        s: {"step": s, "segment": 3, "time": float(s), "learning/loss": 2.5} for s in (28, 29, 30, 31, 32)
    }
    (memory / "29.record.json").write_text(json.dumps([kept[28], kept[29]]))
    (memory / "31.record.json").write_text(json.dumps([kept[30], kept[31]]))
    (memory / "32.record.json").write_text(json.dumps([kept[32]]))  # above the step restored
    assert metrics.recorded_steps(str(run_dir), [28, 29, 30, 31]) == {28, 29}

    # Without snapshot 31 of its own, a process's records may be another lineage's: none written.
    new = metrics.RunWriter(str(run_dir), 5, 0, 10.0, True)
    loop._rewrite_lost_records(new, str(run_dir), memory, 31)
    assert sorted(r["step"] for r in lines(run_dir)) == [28, 29]

    (memory / "31.snap").write_bytes(b"")  # its name is what says it is complete (snapshot.write)
    loop._rewrite_lost_records(new, str(run_dir), memory, 31)
    assert [r for r in lines(run_dir) if r["segment"] == 3 and r["step"] >= 30] == [kept[30], kept[31]]
    loop._rewrite_lost_records(metrics.RunWriter(str(run_dir), 5, 1, 10.0, True), str(run_dir), memory, 31)
    assert sorted(r["step"] for r in lines(run_dir)) == [28, 29, 30, 31]  # never twice, nothing above 31
    # Not process 0 (its writer does nothing), or no record beside the snapshots: nothing written.
    loop._rewrite_lost_records(metrics.RunWriter(str(run_dir), 6, 0, 10.0, False), str(run_dir), memory, 32)
    loop._rewrite_lost_records(metrics.RunWriter(str(run_dir), 6, 0, 10.0, True), str(run_dir), None, 32)
    assert max(r["step"] for r in lines(run_dir)) == 31
