"""The start barrier (trainer.elastic.distributed.wait_for_peers): the processes of a run meet on JAX's
coordination service after compiling and before their first step, so a process that gets there
more than Gloo's fixed 30 s rendezvous later than another (a slower compile, a starved host) no
longer fails the first step's collectives. ``train.debug_start_delay_s`` (a test hook, set on one
process only) plays that process."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from contract.exits import Exit
from tests.trainer import runs
from trainer.elastic import distributed

GLOO_RENDEZVOUS_S = 30
DELAY_S = 40


def _delayed(seconds: float) -> dict[str, str]:
    return {"RESLICE_SET": json.dumps([f"train.debug_start_delay_s={seconds}"])}


def _barrier_wait(out: str) -> float:
    found = re.findall(r"all \d+ processes at the start barrier after ([0-9.]+) s", out)
    assert len(found) == 1, out[-3000:]
    return float(found[0])


def test_the_barrier_is_one_per_incarnation_of_the_process_group() -> None:
    # A set restarted by JobSet (a new restart attempt) or a later segment meets a barrier of its own.
    ids = {distributed.start_barrier_id(segment, attempt) for segment in range(3) for attempt in range(3)}
    assert len(ids) == 9


def test_a_process_40_s_late_for_the_first_step_still_trains_with_the_right_losses(
    reference: dict, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    # 10 steps of the reference's 40, on its schedule (the same program as the suite's other runs
    # of this shape): the wait is before step 1, and more two-process steps are only CPU
    # (docs/measurements.md, "The test suite").
    short = ["--set", "train.steps=10", "--set", "optim.decay_steps=40"]
    procs = runs.processes(str(run_dir), tmp_path, grad_accum=2, only={1: _delayed(DELAY_S)}, args=short)
    for p in procs:
        assert p.wait(300) == 0, p.output()[-4000:]
    outputs = [p.output() for p in procs]
    assert not any("Gloo context initialization failed" in out for out in outputs)
    records = runs.parse_metrics(runs.metrics_files(run_dir))
    assert sorted(records) == list(range(1, 11))
    runs.assert_matches_reference(records, reference, exact=False)
    # Process 0 waited for the late one past Gloo's limit; the late one found it there.
    waited = records[1]["perf/start_barrier_seconds"]
    assert abs(waited - _barrier_wait(outputs[0])) < 1e-3  # the log line and the metric agree
    assert waited > GLOO_RENDEZVOUS_S, waited
    assert _barrier_wait(outputs[1]) < 5
    assert records[1]["perf/step_time_seconds"] < 20  # the wait is start-up, not the first step's time
    assert "perf/start_barrier_seconds" not in records[2]
    print(f"start barrier: process 0 waited {waited:.3f} s, process 1 {_barrier_wait(outputs[1]):.3f} s")


def test_sigterm_at_the_start_barrier_exits_42_at_once_and_its_waiting_peers_then_exit_43(
    tmp_path: Path,
) -> None:
    # Three processes: 2 is late (its hook sleeps 600 s), 0 and 1 wait at the barrier. A SIGTERM
    # to 1 ends it with 42 at once (no step: nothing to save, and no JAX shutdown barrier, which
    # would wait for 2). To 0, still at the barrier, 1 is a peer that died: its heartbeats stop
    # and after the heartbeat timeout (10 s here) the barrier fails: 43, as for 2.
    run_dir = tmp_path / "run"
    procs = runs.processes(
        str(run_dir),
        tmp_path,
        count=3,
        devices=1,
        extra={"RESLICE_GLOBAL_BATCH": "12"},
        only={2: _delayed(600)},
    )
    try:
        for p in procs[:2]:
            runs.wait_for(lambda p=p: "at the start barrier" in p.output(), 240, "the start barrier", p)
        procs[1].signal(signal.SIGTERM)
        t0 = time.monotonic()
        rc = procs[1].wait(60)
        took = time.monotonic() - t0
        assert rc == 42, procs[1].output()[-3000:]
        assert took < 5, f"took {took:.1f} s"
        assert "preempted before the first step, step 0 stands" in procs[1].output()
        # Both the group's SIGTERM and the supervisor's copy of it reached the trainer, quietly.
        assert "Exception ignored" not in procs[1].output(), procs[1].output()[-3000:]
        rc0 = procs[0].wait(90)
        waited = time.monotonic() - t0
        assert rc0 == Exit.PEER_LOST, procs[0].output()[-3000:]
        assert waited < 60, f"process 0 took {waited:.1f} s"  # its heartbeat timeout, not 900 s
        assert procs[2].wait(90) == Exit.PEER_LOST, procs[2].output()[-3000:]
    finally:
        for p in procs:
            p.signal(signal.SIGKILL)
    assert runs.last_step(run_dir) == 0 and runs.committed(run_dir) == []
    print(f"start barrier: SIGTERM -> 42 in {took:.2f} s; the peer still waiting -> 43 after {waited:.1f} s")


_ORBAX_BARRIER = """
import sys
from absl import flags
from orbax.checkpoint._src.multihost import multihost
from trainer.state.checkpoint import Checkpointer
try:
    multihost.EXPERIMENTAL_ORBAX_USE_DISTRIBUTED_BARRIER.value
except flags.UnparsedFlagAccessError:  # Orbax then falls back to its all-gather barrier
    print("unreadable")
Checkpointer(sys.argv[1], 3)
print(multihost.EXPERIMENTAL_ORBAX_USE_DISTRIBUTED_BARRIER.value)
"""


def test_orbax_meets_at_the_coordination_service_too(tmp_path: Path) -> None:
    # What Orbax reads, as it reads it (sync_global_processes), in a process of its own: before a
    # Checkpointer the flag cannot be read and Orbax uses a collective; after, its barriers are the
    # coordination service's, as the start barrier.
    out = subprocess.run(
        [sys.executable, "-c", _ORBAX_BARRIER, str(tmp_path)],
        cwd=runs.ROOT,
        env=runs.env_for(str(tmp_path), 1),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == ["unreadable", "True"]
