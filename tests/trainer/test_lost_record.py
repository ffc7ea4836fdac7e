"""A world restored from memory writes the record of the step it restores when the run's metrics
lack it (trainer.loop._rewrite_lost_record): the previous world's process 0, which alone writes
metrics, can wait on a dead peer of its slice after the other slices finished and snapshotted the
step (bench.chaos seed 13: "kept steps are not 1..50 (missing [31])")."""

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


def test_a_lost_record_is_written_once_from_memory(tmp_path: Path) -> None:
    run_dir, memory = tmp_path / "run", tmp_path / "shm"
    memory.mkdir()
    old = metrics.RunWriter(str(run_dir), 3, 0, 10.0, True)
    for step in (29, 30):
        old.write({"step": step, "segment": 3, "time": float(step)})
    (run_dir / "metrics" / "0003-000-1.jsonl.part").write_text("")  # not a metrics file
    with open(old.path, "a") as f:
        f.write('{"step": 31, "seg')  # a writer killed mid-line is no record of step 31
    kept = {"step": 31, "segment": 4, "time": 31.0, "learning/loss": 2.5}
    (memory / "31.record.json").write_text(json.dumps(kept))
    assert not metrics.has_step(str(run_dir), 31) and metrics.has_step(str(run_dir), 30)

    new = metrics.RunWriter(str(run_dir), 5, 0, 10.0, True)
    loop._rewrite_lost_record(new, str(run_dir), memory, 31)
    assert kept in lines(run_dir)
    loop._rewrite_lost_record(metrics.RunWriter(str(run_dir), 5, 1, 10.0, True), str(run_dir), memory, 31)
    assert [r["step"] for r in lines(run_dir) if r.get("step") == 31] == [31]  # never twice
    # Not process 0 (its writer does nothing), or no record beside the snapshot: nothing written.
    loop._rewrite_lost_record(metrics.RunWriter(str(run_dir), 6, 0, 10.0, False), str(run_dir), memory, 32)
    loop._rewrite_lost_record(metrics.RunWriter(str(run_dir), 6, 0, 10.0, True), str(run_dir), memory, 32)
    assert max(r["step"] for r in lines(run_dir)) == 31
