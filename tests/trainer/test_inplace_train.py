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

from contract.words import STATE_SOURCE
from tests.trainer import runs
from trainer.telemetry.startup import parse_report


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
        shrunk = world(1, ["s0"], micro_batch=4)  # slice s1 is lost
        publish(world_file, shrunk)
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
    # The restarted trainer's start-up is timed from its fork, not from the pod's start.
    reports = [r for line in out0.splitlines() if (r := parse_report(line))]
    assert len(reports) == 2 and reports[1]["spawned"] >= shrunk["published"] > reports[0]["spawned"]
    assert "supervisor" in reports[0]["phases"] and "supervisor" not in reports[1]["phases"]

    files = runs.metrics_files(run_dir)
    first, second = (runs.parse_metrics({n: t}) for n, t in sorted(files.items()))
    stopped = max(first)
    assert min(second) == stopped + 1  # the SIGTERM's checkpoint: nothing recomputed
    assert sorted(second)[-1] == 40
    assert {(r["devices"], r["micro_batch"], r["num_processes"]) for r in first.values()} == {(8, 2, 2)}
    assert {(r["devices"], r["micro_batch"], r["num_processes"]) for r in second.values()} == {(4, 4, 1)}
    runs.assert_matches_reference({**first, **second}, reference, exact=False)
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"


def pod(run_dir: Path, world_file: Path, slice_id: str, log: Path, **more: str) -> runs.Trainer:
    return runs.Trainer(
        runs.env_for(
            str(run_dir),
            4,
            extra={
                "RESLICE_RUN": "inplace",
                "RESLICE_RESTART_MODE": "in-place",
                "RESLICE_WORLD_FILE": str(world_file),
                "RESLICE_SLICE_ID": slice_id,
                "JOB_COMPLETION_INDEX": "0",
                **more,
            },
        ),
        log,
    )


def test_the_coordinators_slice_lost_then_a_new_slice_grows_the_world_back(
    reference: dict, tmp_path: Path
) -> None:
    """s0 hosts process 0 and dies (SIGKILL, a host error): s1's trainer exits 43 and its pod
    waits; the next world is s1 alone (now process 0), from s1's snapshot in memory; a new pod of
    slice s2, started before any world has it, waits until the world after that takes it in as
    process 1, with s1's state from its memory (a broadcast over the data axis, no storage); s1's
    trainer is restarted in place each time."""
    run_dir, world_file = tmp_path / "run", tmp_path / "world.json"
    # s2's pod is there from the start (capacity for a grow), in no world until the third: its
    # supervisor's imports are done long before, as a pod's that waited for its slice's turn.
    s0, s1, s2 = (pod(run_dir, world_file, s, tmp_path / f"{s}.log") for s in ("s0", "s1", "s2"))
    try:
        runs.wait_for(lambda: "follows the worlds of" in s2.output(), 120, "s2's supervisor following", s2)
        publish(world_file, world(0, ["s0", "s1"], micro_batch=2))
        runs.wait_for(lambda: runs.last_step(run_dir) >= 12, 180, "step 12 (step 10 committed)", s1)
        s0.signal(9)  # the coordinator's host is gone, with its pod
        runs.wait_for(
            lambda: "exited 43; waiting for a world newer than epoch 0" in s1.output(), 120, "43", s1
        )
        publish(world_file, world(1, ["s1"], micro_batch=4))
        runs.wait_for(lambda: "world epoch 1: process 0 of 1" in s1.output(), 60, "s1 alone", s1)
        runs.wait_for(lambda: runs.last_step(run_dir) >= 24, 180, "step 24 on s1 alone", s1)
        assert "world epoch" not in s2.output()  # it only waited
        publish(world_file, world(2, ["s1", "s2"], micro_batch=2))
        assert s1.wait() == 0, s1.output()[-4000:]
        assert s2.wait() == 0, s2.output()[-4000:]
    finally:
        for p in (s0, s1, s2):
            p.signal(9)
    assert "world epoch 2: process 0 of 2" in s1.output()
    assert "world epoch 2: process 1 of 2" in s2.output()

    files = sorted(runs.metrics_files(run_dir).items())
    assert len(files) == 3, [n for n, _ in files]  # one per world's process 0: s0, then s1 twice
    first, second, third = (runs.parse_metrics({n: t}) for n, t in files)
    # s1's own snapshot in memory (it holds a whole replica: one slice of the data axis) of the
    # newest step both processes had written: at most one step is computed again, where the storage
    # checkpoint (step 10) would have cost every step since.
    restored = second[min(second)]
    assert restored[STATE_SOURCE] == "memory" and restored["restore/storage_bytes"] == 0
    assert min(second) == restored["restore/step"] + 1 >= max(first)
    # The grown world: s2's new pod holds no snapshot; s1's replica reaches it over the data axis.
    assert third[min(third)][STATE_SOURCE] == "peers" and third[min(third)]["restore/storage_bytes"] == 0
    assert min(third) == max(second) + 1 and max(third) == 40  # the SIGTERM's checkpoint
    shapes = [
        {(r["devices"], r["micro_batch"], r["num_processes"]) for r in f.values()}
        for f in (first, second, third)
    ]
    assert shapes == [{(8, 2, 2)}, {(4, 4, 1)}, {(8, 2, 2)}]
    runs.assert_matches_reference(runs.parse_metrics(dict(files)), reference, exact=False)


def test_the_coordinators_slice_leaving_alive_commits_before_the_survivors_world_restores(
    reference: dict, tmp_path: Path
) -> None:
    """s0 hosts process 0 and leaves alive (a planned shrink: the world drops it, its pod is not
    killed), and its saves are slow. The survivor's trainer exits only after process 0 committed
    the SIGTERM's step (Orbax's async_commit_complete barrier, inside the save the trainer waits
    for before exit 42), so the survivor's next world, whose process 0 is a new coordinator on
    another pod, restores that step: nothing recomputed, and the leaving process 0 writes no
    checkpoint after the new world started."""
    run_dir, world_file = tmp_path / "run", tmp_path / "world.json"
    slow = {"RESLICE_SET": json.dumps(["checkpoint.debug_save_delay_s=3"])}
    s0 = pod(run_dir, world_file, "s0", tmp_path / "s0.log", **slow)
    s1 = pod(run_dir, world_file, "s1", tmp_path / "s1.log")
    try:
        publish(world_file, world(0, ["s0", "s1"], micro_batch=2))
        runs.wait_for(lambda: runs.last_step(run_dir) >= 12, 240, "step 12 in the 2-process world", s1)
        publish(world_file, world(1, ["s1"], micro_batch=4))
        assert s0.wait() == 0, s0.output()[-4000:]
        assert s1.wait() == 0, s1.output()[-4000:]
    finally:
        for p in (s0, s1):
            p.signal(9)
    assert "world epoch 1 leaves slice s0 out" in s0.output()
    assert "trainer: world epoch 1: process 0 of 1" in s1.output()
    first, second = (runs.parse_metrics({n: t}) for n, t in sorted(runs.metrics_files(run_dir).items()))
    assert min(second) == max(first) + 1  # the leaving process 0's commit was there to restore
    assert max(second) == 40
    runs.assert_matches_reference({**first, **second}, reference, exact=False)
