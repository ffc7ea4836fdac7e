"""State from memory, with the real trainer under the in-place supervisor: two pods (one host per
slice, 4 devices each) train in a 2-process world with in-memory snapshots; the next world keeps
the first slice only. Its new trainer restores the step its SIGTERM stopped at from the pod's
memory — 0 bytes read from the run directory's checkpoints (tensorstore's own counters) — and
trains on with losses bitwise equal to a resume of that same step from storage on the same shape,
and within 1e-5 of the uninterrupted run. When every slice is lost with its memory, the next world
reads the run directory's newest committed checkpoint, as before."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from contract.words import STATE_SOURCE
from tests.trainer import runs
from tests.trainer.test_inplace_train import pod as inplace_pod
from tests.trainer.test_inplace_train import publish, world


def pod(run_dir: Path, world_file: Path, slice_id: str, log: Path, memory_root: str) -> runs.Trainer:
    """An in-place pod (test_inplace_train's) that snapshots to `memory_root`, keeping every
    checkpoint: the SIGTERM's step stays for the comparison."""
    return inplace_pod(
        run_dir,
        world_file,
        slice_id,
        log,
        RESLICE_MEMORY_ROOT=memory_root,
        RESLICE_SET='["checkpoint.keep=10"]',
    )


def test_a_shrink_restores_from_memory_bitwise_as_from_storage(reference: dict, tmp_path: Path) -> None:
    run_dir, world_file = tmp_path / "run", tmp_path / "world.json"
    memory_root = tempfile.mkdtemp(prefix="reslice-test-", dir="/dev/shm")
    pods = {s: pod(run_dir, world_file, s, tmp_path / f"{s}.log", memory_root) for s in ("s0", "s1")}
    try:
        publish(world_file, world(0, ["s0", "s1"], micro_batch=2))
        runs.wait_for(lambda: runs.last_step(run_dir) >= 5, 180, "step 5 in the 2-process world", pods["s0"])
        publish(world_file, world(1, ["s0"], micro_batch=4))
        assert pods["s1"].wait() == 0, pods["s1"].output()[-4000:]
        assert pods["s0"].wait() == 0, pods["s0"].output()[-4000:]
        left = list(Path(memory_root).iterdir())
    finally:
        for p in pods.values():
            p.signal(9)
        shutil.rmtree(memory_root, ignore_errors=True)
    assert left == []  # each supervisor removed its memory directory when it exited
    out0 = pods["s0"].output()
    files = sorted(runs.metrics_files(run_dir).items())
    first, second = (runs.parse_metrics({n: t}) for n, t in files)
    stopped = max(first)
    head = second[min(second)]
    assert min(second) == stopped + 1  # nothing recomputed
    assert (head[STATE_SOURCE], head["restore/step"], head["restore/storage_bytes"]) == (
        "memory",
        stopped,
        0,
    )
    assert f"trainer: resumed step {stopped} from memory" in out0
    assert first[min(first)][STATE_SOURCE] == "fresh"  # the run's first incarnation
    assert all(r["perf/memory_snapshot_seconds"] >= 0 for r in first.values())
    runs.assert_matches_reference({**first, **second}, reference, exact=False)

    # The same step from storage, on the same shape (1 process, 4 devices, micro-batch 4): the SIGTERM
    # committed it. A broken snapshot (a shard from the wrong place, a stale step) changes the losses.
    copy = tmp_path / "from-storage"
    (copy / "checkpoints").mkdir(parents=True)
    shutil.copytree(run_dir / "checkpoints" / str(stopped), copy / "checkpoints" / str(stopped))
    rc, out = runs.run(
        runs.env_for(str(copy), 4, extra={"RESLICE_MICRO_BATCH": "4"}), tmp_path / "storage.log"
    )
    assert rc == 0, out[-4000:]
    resumed = runs.parse_metrics(runs.metrics_files(copy))
    head = resumed[min(resumed)]
    assert (head[STATE_SOURCE], head["restore/step"]) == ("storage", stopped)
    assert head["restore/storage_bytes"] > 0
    assert {s: r["learning/loss"] for s, r in resumed.items()} == {
        s: r["learning/loss"] for s, r in second.items()
    }


def test_every_slice_lost_restores_from_storage(reference: dict, tmp_path: Path) -> None:
    # Both pods die with their hosts (SIGKILL, their memory gone with them); the next world's pods
    # start on other hosts with empty memory: no complete replica survives anywhere, so the new
    # world reads the newest committed checkpoint of the run directory, as a recreate run does.
    run_dir, world_file = tmp_path / "run", tmp_path / "world.json"
    roots = [tempfile.mkdtemp(prefix="reslice-test-", dir="/dev/shm") for _ in range(2)]
    first = {s: pod(run_dir, world_file, s, tmp_path / f"{s}-a.log", roots[0]) for s in ("s0", "s1")}
    second: dict[str, runs.Trainer] = {}
    try:
        publish(world_file, world(0, ["s0", "s1"], micro_batch=2))
        runs.wait_for(lambda: 10 in runs.committed(run_dir), 180, "checkpoint 10 committed", first["s0"])
        runs.wait_for(lambda: runs.last_step(run_dir) >= 12, 60, "step 12: newer ones in memory", first["s0"])
        for p in first.values():
            p.signal(9)
            p.wait(30)
        committed = max(runs.committed(run_dir))
        shutil.rmtree(roots[0], ignore_errors=True)  # the hosts are gone, and their memory
        publish(world_file, world(1, ["s0", "s1"], micro_batch=2))
        second = {s: pod(run_dir, world_file, s, tmp_path / f"{s}-b.log", roots[1]) for s in ("s0", "s1")}
        for s, p in second.items():
            assert p.wait() == 0, f"{s}: " + p.output()[-4000:]
    finally:
        for p in [*first.values(), *second.values()]:
            p.signal(9)
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)
    records = runs.parse_metrics(runs.metrics_files(run_dir))
    heads = [r for r in records.values() if r.get(STATE_SOURCE) not in (None, "fresh")]
    assert heads, "the second world recorded no restore"
    head = heads[0]
    assert (head[STATE_SOURCE], head["restore/step"]) == ("storage", committed)
    assert head["restore/storage_bytes"] > 0
    runs.assert_matches_reference(records, reference, exact=False)
