"""In-memory snapshots (trainer/state/snapshot.py) with real JAX arrays on 8 simulated CPU devices: what a
snapshot holds, when it covers a new mesh, what it restores, and what the directory keeps."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from contract import envvars
from trainer.state import memdir, snapshot


def state_on(mesh: Mesh, rows: tuple) -> dict:
    """A small train-state-like tree: a sharded matrix, a replicated vector and a scalar step."""
    w = np.arange(16 * 6, dtype=np.float32).reshape(16, 6) / 7
    return {
        "params": {"w": jax.device_put(w, NamedSharding(mesh, P(rows, None)))},
        "opt": {"v": jax.device_put(np.linspace(0, 1, 6, dtype=np.float32), NamedSharding(mesh, P()))},
        "step": jax.device_put(np.int32(12), NamedSharding(mesh, P())),
    }


def abstract_of(tree: dict) -> dict:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def test_a_slices_snapshot_restores_bitwise_onto_the_mesh_of_that_slice_alone(cpu8, tmp_path: Path) -> None:
    two_slices = Mesh(np.array(cpu8).reshape(2, 4), ("data", "fsdp"))  # data parallel across 2 "slices"
    state = state_on(two_slices, "fsdp")
    snaps = snapshot.Snapshotter(tmp_path, 1, {"run_dir": "r"})
    snaps.take(12, state, {"step": 12, "config_hash": "h"}, recorded=True)
    snaps.wait()
    assert snaps.written == [12] and snapshot.complete_steps(tmp_path) == [12]
    header = snapshot.read_header(tmp_path / "12.snap")
    assert header["meta"] == {"step": 12, "config_hash": "h", "run_dir": "r"}
    # One copy of each distinct shard: 4 row blocks of w, one of v and of the step (not 8 each).
    assert {e["path"]: len(e["shards"]) for e in header["leaves"]} == {
        "['opt']['v']": 1,
        "['params']['w']": 4,
        "['step']": 1,
    }

    one_slice = Mesh(np.array(cpu8[:4]).reshape(1, 4), ("data", "fsdp"))  # the survivor's devices
    target = abstract_of(state_on(one_slice, "fsdp"))
    assert snapshot.covers(header, target)
    restored = snapshot.load(header, target)
    for got, want, where in zip(
        jax.tree.leaves(restored), jax.tree.leaves(state), jax.tree.leaves(target), strict=True
    ):
        assert got.sharding == where.sharding
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_a_snapshot_of_other_blocks_does_not_cover_the_new_mesh(cpu8, tmp_path: Path) -> None:
    """Rows in 8 blocks (FSDP over every device) hold no block of 4 rows that a 4-device mesh needs:
    no restore from it (the world falls back to storage), rather than a state pieced together."""
    everywhere = Mesh(np.array(cpu8).reshape(1, 8), ("data", "fsdp"))
    snaps = snapshot.Snapshotter(tmp_path, 1)
    snaps.take(3, state_on(everywhere, "fsdp"), {"step": 3}, recorded=True)
    snaps.wait()
    header = snapshot.read_header(tmp_path / "3.snap")
    assert snapshot.covers(header, abstract_of(state_on(everywhere, "fsdp")))
    half = Mesh(np.array(cpu8[:4]).reshape(1, 4), ("data", "fsdp"))
    assert not snapshot.covers(header, abstract_of(state_on(half, "fsdp")))
    other_tree = abstract_of({**state_on(everywhere, "fsdp"), "extra": state_on(everywhere, "fsdp")["step"]})
    assert not snapshot.covers(header, other_tree)


def test_the_directory_keeps_the_newest_four_and_no_other_lineage(cpu8, tmp_path: Path) -> None:
    mesh = Mesh(np.array(cpu8).reshape(2, 4), ("data", "fsdp"))
    state = state_on(mesh, "fsdp")
    snaps = snapshot.Snapshotter(tmp_path, 2)
    assert [s for s in range(1, 11) if snaps.due(s)] == [2, 4, 6, 8, 10]
    for step in (2, 4, 6, 8, 10):
        snaps.take(step, state, {"step": step}, recorded=True)
    snaps.wait()
    assert snapshot.complete_steps(tmp_path) == [10, 8, 6, 4]
    (tmp_path / ".10.snap.tmp-999999999").write_bytes(b"half")  # a writer killed mid-write
    snapshot.prune(tmp_path, above=6)  # a restore of step 6: step 8 is another lineage's now
    assert sorted(os.listdir(tmp_path)) == ["4.snap", "6.snap"]
    accepted = snapshot.candidates(tmp_path, lambda meta: meta["step"] == 6)
    assert list(accepted) == [6]


def test_a_failed_write_turns_snapshots_off_and_says_so(cpu8, tmp_path: Path, capsys) -> None:
    mesh = Mesh(np.array(cpu8).reshape(2, 4), ("data", "fsdp"))
    snaps = snapshot.Snapshotter(tmp_path / "gone", 1)
    (tmp_path / "gone").rmdir()  # the medium went away under it
    snaps.take(1, state_on(mesh, "fsdp"), {"step": 1}, recorded=True)
    snaps.wait()
    assert not snaps.on and not snaps.due(2) and snaps.written == []
    assert "memory snapshot of step 1 failed" in capsys.readouterr().out


def test_each_pod_gets_its_own_memory_directory_and_a_dead_ones_is_removed(tmp_path: Path) -> None:
    env = {envvars.MEMORY_ROOT: str(tmp_path), "RESLICE_RUN": "llm"}
    dead = tmp_path / "reslice-llm-s1-0-999999999"  # a supervisor that was killed: no such pid
    dead.mkdir()
    other = tmp_path / f"reslice-llm-s2-0-{os.getppid()}"  # another pod's, its supervisor alive
    other.mkdir()
    mine = memdir.make(env, "s1", 0)
    assert mine == tmp_path / f"reslice-llm-s1-0-{os.getpid()}" and mine.is_dir()
    assert not dead.exists() and other.exists()
    memdir.remove(mine)
    assert not mine.exists()
    assert memdir.make({envvars.MEMORY_ROOT: str(tmp_path / "missing" / "x")}, "s1", 0) is None


@pytest.mark.parametrize(("configured", "resolved"), [(0, 1), (5, 5), (-1, 0)])
def test_the_interval_resolves_to_every_step_on_cpu(cpu8, configured: int, resolved: int) -> None:
    assert snapshot.interval(configured) == resolved


def test_a_snapshot_is_done_only_once_its_step_is_recorded(cpu8, tmp_path: Path) -> None:
    """The state after a step whose metrics record was never written (its trainer failed first) is
    no snapshot: a restore from it would leave that step out of the run's metrics."""
    mesh = Mesh(np.array(cpu8).reshape(2, 4), ("data", "fsdp"))
    snaps = snapshot.Snapshotter(tmp_path, 1)
    snaps.take(5, state_on(mesh, "fsdp"), {"step": 5})
    snaps.recorded(5)
    snaps.take(6, state_on(mesh, "fsdp"), {"step": 6})
    snaps.abandon(timeout_s=10)  # the trainer fails before step 6 is recorded
    assert snaps.written == [5] and os.listdir(tmp_path) == ["5.snap"]


def test_a_snapshot_keeps_its_steps_record_and_the_prune_takes_it_with_it(cpu8, tmp_path: Path) -> None:
    """Process 0 alone writes the metrics: a record kept beside each snapshot lets the next world
    write one that was lost (trainer.loop._rewrite_lost_records)."""
    mesh = Mesh(np.array(cpu8).reshape(2, 4), ("data", "fsdp"))
    snaps = snapshot.Snapshotter(tmp_path, 1)
    for step in (5, 6):
        snaps.take(step, state_on(mesh, "fsdp"), {"step": step})
        snaps.recorded(step, {"step": step, "learning/loss": 1.0 / step})
    snaps.take(7, state_on(mesh, "fsdp"), {"step": 7})
    snaps.abandon(timeout_s=10)  # step 7 never recorded: neither its snapshot nor a record
    assert sorted(os.listdir(tmp_path)) == ["5.record.json", "5.snap", "6.record.json", "6.snap"]
    assert snapshot.step_records(tmp_path, 6) == [{"step": s, "learning/loss": 1.0 / s} for s in (5, 6)]
    assert [r["step"] for r in snapshot.step_records(tmp_path, 5)] == [5]
    assert snapshot.step_records(None, 6) == [] and snapshot.step_records(tmp_path, 7) == []  # no snapshot 7
    snapshot.prune(tmp_path, above=5)  # a restore of step 5: step 6 is another lineage's now
    assert sorted(os.listdir(tmp_path)) == ["5.record.json", "5.snap"]


def test_a_snapshot_every_few_steps_keeps_the_records_of_the_steps_since_the_last(
    cpu8, tmp_path: Path
) -> None:
    """With a snapshot every 3 steps, the one of step 6 keeps the records of steps 4, 5 and 6: a
    world that restores step 6 can write any of them that the previous world's process 0 never
    did. A stop's snapshot (step 8, not due) keeps those since step 6."""
    mesh = Mesh(np.array(cpu8).reshape(2, 4), ("data", "fsdp"))
    snaps = snapshot.Snapshotter(tmp_path, 3)
    state = state_on(mesh, "fsdp")
    for step in range(1, 9):
        if snaps.due(step):
            snaps.take(step, state, {"step": step})
        snaps.recorded(step, {"step": step})
    snaps.take(8, state, {"step": 8})
    snaps.wait()
    assert sorted(os.listdir(tmp_path)) == [f"{s}.{x}" for s in (3, 6, 8) for x in ("record.json", "snap")]
    assert json.loads((tmp_path / "6.record.json").read_text()) == [{"step": s} for s in (4, 5, 6)]
    assert [r["step"] for r in snapshot.step_records(tmp_path, 6)] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in snapshot.step_records(tmp_path, 8)] == list(range(1, 9))


def test_the_slices_that_hold_a_step_whole() -> None:
    """Process ids are slice-major: with 2 hosts per slice, processes 0-1 are slice 0, 2-3 slice 1."""
    per_process = [[4, 5, 6], [5, 6], [6, 7], [7]]
    assert snapshot.whole(per_process, 2) == {5: (0,), 6: (0,), 7: (1,)}
    assert snapshot.whole([[1], [1], [], []], 2) == {1: (0,)}
    assert snapshot.whole([[], []], 1) == {}


def test_a_broadcast_gives_the_state_on_the_target_shardings(cpu8, tmp_path: Path) -> None:
    """The peers' path: each device's part stacked along a data axis, one program picks a slice's."""
    mesh = Mesh(np.array(cpu8).reshape(2, 4), ("data", "fsdp"))
    state = state_on(mesh, "fsdp")
    snaps = snapshot.Snapshotter(tmp_path, 1)
    snaps.take(7, state, {"step": 7}, recorded=True)
    snaps.wait()
    target = abstract_of(state)
    assert snapshot.broadcastable(target, mesh, 2)
    assert not snapshot.broadcastable(abstract_of(state_on(mesh, ("data", "fsdp"))), mesh, 2)
    got = snapshot.broadcast(snapshot.read_header(tmp_path / "7.snap"), target, mesh, 1)
    for g, want, where in zip(
        jax.tree.leaves(got), jax.tree.leaves(state), jax.tree.leaves(target), strict=True
    ):
        assert g.sharding == where.sharding
        np.testing.assert_array_equal(np.asarray(g), np.asarray(want))
    zeros = snapshot.broadcast(None, target, mesh, 0)  # a process that holds nothing sends zeros
    assert not np.asarray(zeros["params"]["w"]).any()


def test_the_newest_snapshot_of_this_run_is_read_ahead_and_serves_the_restore(cpu8, tmp_path: Path) -> None:
    """``Prefetch`` maps the newest snapshot whose meta is this run's (not another run's newer
    one) into memory; the restore takes its shards from there and gets the same arrays; a file
    written again under the same name since (another lineage's step) is read afresh instead."""
    mesh = Mesh(np.array(cpu8).reshape(1, 8), ("data", "fsdp"))
    state = state_on(mesh, "fsdp")
    snaps = snapshot.Snapshotter(tmp_path, 1, {"run_dir": "r"})
    for step, run in ((3, "h"), (4, "h"), (5, "another")):
        snaps.take(step, state, {"step": step, "config_hash": run}, recorded=True)
    snaps.wait()
    expected = {"run_dir": "r", "config_hash": "h"}
    ahead = snapshot.Prefetch.newest(tmp_path, expected)
    assert ahead is not None and ahead.path == tmp_path / "4.snap"
    header = snapshot.read_header(tmp_path / "4.snap")
    held = ahead.bytes_of(header["file"])
    assert held is not None and ahead.error is None
    assert held.tobytes() == (tmp_path / "4.snap").read_bytes()
    assert ahead.bytes_of(str(tmp_path / "3.snap")) is None  # another file: not these bytes
    target = abstract_of(state)
    for got, want in zip(
        jax.tree.leaves(snapshot.load(header, target, ahead)), jax.tree.leaves(state), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # Step 4 written again (a later lineage), with other values: the read-ahead bytes are stale.
    doubled = jax.tree.map(lambda x: x * 2, state)
    os.replace(tmp_path / "3.snap", tmp_path / "4.snap")  # a new file under the name
    assert ahead.bytes_of(header["file"]) is None
    assert snapshot.Prefetch.newest(tmp_path, {"run_dir": "r", "config_hash": "nobody"}) is None
    assert snapshot.Prefetch.newest(None, expected) is None
    del doubled


def test_without_room_on_the_devices_a_snapshot_copies_the_state_to_the_host_and_says_so(
    cpu8, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """A chip whose state is half its memory has no room for the on-device copy (a TPU v5e at
    olmo-7b's shape): the copy fails with RESOURCE_EXHAUSTED, and the snapshot, this one and every
    later one, takes the shards to the host instead, before the caller's next step; the file is
    the same."""
    mesh = Mesh(np.array(cpu8).reshape(2, 4), ("data", "fsdp"))
    state = state_on(mesh, "fsdp")
    real_put, tried = jax.device_put, []

    def no_room(x, device=None, *, may_alias=None, **kw):
        if may_alias is False:  # the snapshot's on-device copy
            tried.append(1)
            raise jax.errors.JaxRuntimeError(
                "RESOURCE_EXHAUSTED: E0100: RuntimeBufferAllocationFailure: no room"
            )
        return real_put(x, device, may_alias=may_alias, **kw)

    monkeypatch.setattr(jax, "device_put", no_room)
    snaps = snapshot.Snapshotter(tmp_path, 1, {"run_dir": "r"})
    for step in (1, 2):
        snaps.take(step, state, {"step": step}, recorded=True)
    snaps.wait()
    assert tried == [1] and not snaps.on_device and snaps.written == [1, 2]
    assert capsys.readouterr().out.count("no room on the devices for a copy of the state") == 1
    restored = snapshot.load(snapshot.read_header(tmp_path / "2.snap"), abstract_of(state))
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_a_record_whose_older_snapshot_is_still_on_its_way_in_is_not_pruned(tmp_path: Path) -> None:
    """Two snapshots in flight, the newer done first: its prune keeps the record the older one
    wrote before its rename (without it a restore of that step could not write the records the
    previous world lost); a record of a step with neither snapshot nor writer goes."""
    (tmp_path / "6.snap").write_bytes(b"x")
    for name in ("6.record.json", "3.record.json", f".3.snap.tmp-{os.getpid()}", "2.record.json"):
        (tmp_path / name).write_text("[]")
    snapshot.prune(tmp_path)
    assert sorted(os.listdir(tmp_path)) == [
        f".3.snap.tmp-{os.getpid()}",
        "3.record.json",
        "6.record.json",
        "6.snap",
    ]
