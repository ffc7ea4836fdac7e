"""Multi-process trainer runs that lose a peer (real JAX on simulated CPU devices): the survivors
exit 43 (a disruption) or 143 at once instead of waiting out the heartbeat timeout, and a crash is
still exit 1. Split from test_train.py so that the suite's two workers share that file's time."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from contract import envvars
from contract.exits import Exit
from tests.trainer import runs


def lose(victim: runs.Trainer, survivor: runs.Trainer, timeout: float = 90) -> tuple[int, float, str]:
    """SIGKILL ``victim`` (a lost host): the survivor's exit code, the seconds it took to exit, and
    its output."""
    victim.signal(signal.SIGKILL)
    t0 = time.monotonic()
    rc = survivor.wait(timeout)
    return rc, time.monotonic() - t0, survivor.output()


def test_survivor_of_a_dead_peer_exits_peer_lost_at_once_instead_of_waiting_for_the_heartbeat(
    tmp_path: Path,
) -> None:
    # A lost host: its peer's collectives fail at once (Gloo: connection reset), but JAX's exit
    # handler would then wait at the shutdown barrier until the heartbeat timeout (here 60 s; 100 s
    # on GKE by default) while the slice stays held. The trainer skips the barrier and exits 43, a
    # disruption rather than its own failure.
    run_dir = tmp_path / "run"
    procs = runs.processes(str(run_dir), tmp_path, grad_accum=2, extra={"RESLICE_HEARTBEAT_TIMEOUT_S": "60"})
    runs.wait_for(lambda: runs.last_step(run_dir) >= 12, 200, "step 12", procs[0])
    rc, elapsed, out = lose(procs[1], procs[0])
    assert rc == Exit.PEER_LOST, out[-3000:]
    # Which failure it sees first (Gloo's connection reset or the coordination service) is a race.
    assert "a peer is lost" in out
    # Either the trainer saw it (and skipped the barrier) or JAX's client aborted it first.
    assert "without the shutdown barrier" in out or "JAX's coordination service ended this process" in out
    assert elapsed < 15, f"the survivor took {elapsed:.1f} s to exit"
    assert 10 in runs.committed(run_dir)  # what a resume uses is intact


def test_when_the_coordinator_dies_during_start_up_the_survivor_exits_peer_lost(tmp_path: Path) -> None:
    # Process 0 hosts JAX's coordination service. Process 1 has joined and is held before the start
    # barrier (the test hook), so no step can run: a sleep instead would race a warm compile cache,
    # which trains steps within two seconds. Its client polls the service and aborts the process
    # (SIGABRT, fate sharing) when the service dies; the supervisor turns that abort into 43, well
    # before the heartbeat timeout (900 s) and with nothing recorded.
    run_dir = tmp_path / "run"
    held = {"RESLICE_SET": json.dumps(["train.debug_start_delay_s=600"])}
    procs = runs.processes(str(run_dir), tmp_path, extra={"RESLICE_INIT_TIMEOUT_S": "5"}, only={1: held})
    runs.wait_for(
        lambda: "sleeping before the start barrier" in procs[1].output(), 120, "process 1 joined", procs[1]
    )
    rc, elapsed, out = lose(procs[0], procs[1], 60)
    assert rc == Exit.PEER_LOST, out[-3000:]
    assert "Terminating process because the JAX distributed service detected fatal errors" in out, out[-3000:]
    assert "ended this process because a peer is lost: exit 43" in out, out[-3000:]
    assert elapsed < 20, f"took {elapsed:.1f} s"
    assert runs.last_step(run_dir) == 0


def test_a_crash_in_a_multi_process_run_is_still_exit_1(tmp_path: Path) -> None:
    # Both processes raise at step 1. Process 0 always exits 1 (its heartbeat timeout, 60 s, is far
    # off). Process 1 exits 1 too, unless process 0 (the coordination service) went first: then
    # JAX aborts it and it exits 43 — which is why the controller counts a crash next to exit 43s
    # as an application failure. (grad_accum=2: the shape of the other two-process runs here and in
    # test_train.py, whose train step the suite's compile cache then holds.)
    run_dir = tmp_path / "run"
    crash = {"RESLICE_SET": json.dumps(["train.crash_at_step=1"]), "RESLICE_HEARTBEAT_TIMEOUT_S": "60"}
    procs = runs.processes(str(run_dir), tmp_path, grad_accum=2, extra=crash)
    codes = [p.wait() for p in procs]
    out = procs[0].output()
    assert codes[0] == 1, out[-3000:]
    assert "train.crash_at_step=1: failing on purpose" in out and "a peer is lost" not in out
    assert codes[1] in (1, Exit.PEER_LOST), procs[1].output()[-3000:]
    assert runs.last_step(run_dir) == 0


def test_sigterm_while_a_peer_hangs_exits_143_instead_of_waiting_for_the_heartbeat(tmp_path: Path) -> None:
    # A peer that stopped answering (SIGSTOP: no connection reset, no error) leaves the step in
    # flight waiting until the heartbeat timeout. After a SIGTERM the watchdog ends it sooner.
    run_dir = tmp_path / "run"
    procs = runs.processes(str(run_dir), tmp_path, grad_accum=2, extra={"RESLICE_HEARTBEAT_TIMEOUT_S": "60"})
    runs.wait_for(lambda: runs.last_step(run_dir) >= 12, 200, "step 12", procs[0])
    procs[1].signal(signal.SIGSTOP)
    try:
        procs[0].signal(signal.SIGTERM)
        t0 = time.monotonic()
        rc = procs[0].wait(90)
        elapsed = time.monotonic() - t0
    finally:
        procs[1].signal(signal.SIGKILL)
    out = procs[0].output()
    assert rc == 143, out[-3000:]
    assert "after SIGTERM (a peer is gone?)" in out
    assert elapsed < 20, f"took {elapsed:.1f} s"  # the heartbeat would have taken 60 s
    assert 10 in runs.committed(run_dir)


def test_a_peer_lost_while_the_other_waits_in_a_save_barrier_is_a_disruption(tmp_path: Path) -> None:
    # Orbax's save barriers meet at the coordination service (trainer/state/checkpoint.py), not in a
    # collective that Gloo would fail at once. Process 1 reaches the save of step 10 late (a test
    # hook) and dies there while process 0 waits for it in Orbax's first barrier: process 0 exits 43
    # (a disruption, not its own failure) once the service gives up on process 1 (the 10 s
    # heartbeat timeout, not the barrier's 300 s), and step 10 is not committed half-written.
    run_dir = tmp_path / "run"
    late = {"RESLICE_SET": json.dumps(["checkpoint.debug_save_delay_s=120"])}
    procs = runs.processes(str(run_dir), tmp_path, grad_accum=2, only={1: late})
    runs.wait_for(
        lambda: "before saving step 10" in procs[1].output(), 200, "process 1 at its save", procs[1]
    )
    time.sleep(1.0)  # process 0 has finished step 10 with process 1; it is at the save's barrier
    rc, elapsed, out = lose(procs[1], procs[0])
    assert rc == Exit.PEER_LOST, out[-3000:]
    assert elapsed < 25, f"the survivor took {elapsed:.1f} s to exit"
    assert (
        "Barrier Id: CheckpointManager:save_start" in out or "JAX distributed service detected fatal" in out
    )
    assert runs.committed(run_dir) == []
    assert runs.last_step(run_dir) == 9  # step 10's record is written after its save


def test_sigterm_while_joining_a_group_whose_peer_never_comes_exits_42_at_once(tmp_path: Path) -> None:
    # An in-place world superseded before it formed: its other pods already follow the next world,
    # so process 0 would wait in jax.distributed.initialize (C++, no Python handler runs) until the
    # init timeout, holding its pod's next trainer. The watchdog exits 42 as soon as it joins.
    run_dir = tmp_path / "run"
    procs = runs.processes(str(run_dir), tmp_path, extra={"RESLICE_INIT_TIMEOUT_S": "300"})
    procs[1].signal(signal.SIGKILL)  # the peer that never comes
    procs[1].wait(30)
    time.sleep(1.0)
    procs[0].signal(signal.SIGTERM)  # while it imports JAX, or joins
    t0 = time.monotonic()
    rc = procs[0].wait(120)
    out = procs[0].output()
    assert rc == 42, out[-3000:]
    assert "while joining the process group" in out
    assert time.monotonic() - t0 < 100, "the init timeout (300 s) was waited out"
    assert runs.committed(run_dir) == []


@pytest.mark.parametrize("process", [0, 1])
def test_a_later_in_place_trainer_whose_world_never_forms_exits_peer_lost_at_the_rejoin_timeout(
    tmp_path: Path, process: int
) -> None:
    # A world that holds a pod whose host rebooted under it (the API still reads it Running): the
    # other processes would wait the initialization timeout (900 s here) in
    # jax.distributed.initialize. An in-place pod's later trainer joins a world of running pods,
    # so it gives up at the rejoin timeout, as a lost peer: exit 43, and its supervisor's wait.
    # Process 0 waits for a peer that never registers, process 1 for a coordinator never there.
    run_dir = tmp_path / "run"
    later = {
        "RESLICE_INIT_TIMEOUT_S": "900",
        envvars.INCARNATION: "1",
        "RESLICE_REJOIN_TIMEOUT_S": "3",
    }
    procs = runs.processes(str(run_dir), tmp_path, extra=later)
    dead = procs[1 - process]
    dead.signal(signal.SIGKILL)
    dead.wait(30)
    t0 = time.monotonic()
    rc = procs[process].wait(120)
    out = procs[process].output()
    assert rc == Exit.PEER_LOST, out[-3000:]
    assert time.monotonic() - t0 < 60, "the initialization timeout was waited out"
    assert runs.last_step(run_dir) == 0
