"""The real trainer under the in-place supervisor: two pods (one host per slice, 4 devices each)
train in a 2-process world; the controller's next world keeps only the first slice; the second
pod's supervisor exits 0, the first's restarts its trainer as the only process of the new world,
which resumes from the step its SIGTERM committed at the same global batch (micro-batch 4 instead
of 2), with the uninterrupted run's samples and losses, and finishes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tests.trainer import runs


def world(epoch: int, slices: list[str], micro_batch: int) -> dict:
    return {
        "run": "inplace",
        "epoch": epoch,
        "slices": slices,
        "hosts_per_slice": 1,
        "coordinator": f"127.0.0.1:{runs.free_port()}",
        "global_batch": 16,
        "micro_batch": micro_batch,
        "grad_accum": 1,
        "megascale": {"coordinator_address": "127.0.0.1"},
        "published": time.time(),
    }


def publish(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def test_a_lost_slice_continues_in_the_same_pod_from_its_checkpoint(reference: dict, tmp_path: Path) -> None:
    run_dir, world_file = tmp_path / "run", tmp_path / "world.json"
    pods = {
        s: runs.Trainer(
            runs.env_for(
                str(run_dir),
                4,
                extra={
                    "RESLICE_RUN": "inplace",
                    "RESLICE_RESTART_MODE": "in-place",
                    "RESLICE_WORLD_FILE": str(world_file),
                    "RESLICE_SLICE_ID": s,
                    "JOB_COMPLETION_INDEX": "0",
                },
            ),
            tmp_path / f"{s}.log",
        )
        for s in ("s0", "s1")
    }
    try:
        publish(world_file, world(0, ["s0", "s1"], micro_batch=2))
        runs.wait_for(lambda: runs.last_step(run_dir) >= 5, 180, "step 5 in the 2-process world", pods["s0"])
        publish(world_file, world(1, ["s0"], micro_batch=4))  # slice s1 is lost
        assert pods["s1"].wait() == 0, pods["s1"].output()[-4000:]
        assert pods["s0"].wait() == 0, pods["s0"].output()[-4000:]
    finally:
        for p in pods.values():
            p.signal(9)
    out0, out1 = pods["s0"].output(), pods["s1"].output()
    assert "world epoch 1 leaves slice s1 out" in out1
    assert "trainer: world epoch 0: process 0 of 2" in out0
    assert "trainer: world epoch 1: process 0 of 1" in out0
    assert "the trainer of epoch 0 exited 42" in out0

    files = runs.metrics_files(run_dir)
    first, second = (runs.parse_metrics({n: t}) for n, t in sorted(files.items()))
    stopped = max(first)
    assert min(second) == stopped + 1  # the SIGTERM's checkpoint: nothing recomputed
    assert sorted(second)[-1] == 40
    assert {(r["devices"], r["micro_batch"], r["num_processes"]) for r in first.values()} == {(8, 2, 2)}
    assert {(r["devices"], r["micro_batch"], r["num_processes"]) for r in second.values()} == {(4, 4, 1)}
    runs.assert_matches_reference({**first, **second}, reference, exact=False)
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"
