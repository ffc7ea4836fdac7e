"""The in-place supervisor (``RESLICE_RESTART_MODE=in-place``): a real supervisor process that follows
a world file and forks real children; the children run a fake ``train()`` that records the
environment it got (tests/trainer/worldfake.py). The table of exit codes is docs/contract.md's
"World (in-place restarts)"."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.wait import wait_for
from tests.trainer.runs import ROOT
from trainer.elastic import follower


def world_doc(epoch: int, slices: list[str], hosts: int = 2, **over: object) -> dict:
    return {
        "run": "llm",
        "epoch": epoch,
        "slices": slices,
        "hosts_per_slice": hosts,
        "coordinator": f"127.0.0.1:{9000 + epoch}",
        "global_batch": 16,
        "micro_batch": 8 // len(slices),
        "grad_accum": 1,
        "megascale": {"coordinator_address": "127.0.0.1"},
        "published": time.time(),
        **over,
    }


class Pod:
    """One pod's supervisor: slice `slice_id`, host `host`, following `<tmp>/world.json`."""

    def __init__(self, tmp: Path, slice_id: str = "b", host: int = 1, extra: dict[str, str] | None = None):
        self.world_file, self.record, self.log = tmp / "world.json", tmp / "record.jsonl", tmp / "pod.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RESLICE_", "JOB_COMPLETION_INDEX"))}
        env.update(
            PYTHONPATH=str(ROOT),
            RESLICE_RUN="llm",
            RESLICE_RESTART_MODE="in-place",
            RESLICE_WORLD_FILE=str(self.world_file),
            RESLICE_SLICE_ID=slice_id,
            JOB_COMPLETION_INDEX=str(host),
            FAKE_RECORD=str(self.record),
            RESLICE_WORLD_ENV_ALLOW="FAKE_",  # the fake trainer takes its orders from the world's env
        )
        if extra and "RESLICE_WORLD_CONFIGMAP" in extra:  # the ConfigMap instead of the file
            del env["RESLICE_WORLD_FILE"]
        env.update(extra or {})
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.trainer.worldfake"], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                start_new_session=True,
            )  # fmt: skip

    def publish(self, doc: dict) -> None:
        tmp = self.world_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.world_file)  # whole, as the contract asks of a file publisher

    def records(self) -> list[dict]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]

    def starts(self) -> list[dict]:
        return [r for r in self.records() if r["event"] == "start"]

    def wait_starts(self, n: int) -> list[dict]:
        """The first `n` children's start records, once the supervisor has also said each start: it
        prints the line (with how the previous child ended) after the child is under way, which
        may write its record first."""

        def enough() -> list[dict] | None:
            assert self.proc.poll() is None, f"the supervisor exited {self.proc.returncode}:\n{self.output()}"
            got = self.starts()
            said = re.findall(r"^trainer: world epoch \d+: process ", self.output(), re.MULTILINE)
            return got if len(got) >= n and len(said) >= n else None

        return wait_for(enough, 20, f"{n} children started")

    def wait(self, timeout: float = 20) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"the supervisor did not exit:\n{self.output()}") from None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def alive_for(self, seconds: float) -> None:
        time.sleep(seconds)
        assert self.proc.poll() is None, f"the supervisor exited {self.proc.returncode}:\n{self.output()}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def pod(tmp_path: Path):
    pods: list[Pod] = []

    def make(**kw: object) -> Pod:
        pods.append(Pod(tmp_path, **kw))  # type: ignore[arg-type]
        return pods[-1]

    yield make
    for p in pods:
        p.kill()


def test_each_epoch_restarts_the_child_with_its_world(pod) -> None:
    p = pod()
    p.publish(world_doc(0, ["c"]))  # a world without this pod's slice: it waits, starts nothing
    p.alive_for(0.5)
    assert p.starts() == []
    p.publish(world_doc(1, ["a", "b"]))
    (first,) = p.wait_starts(1)
    assert first["env"] == {
        "RESLICE_WORLD_EPOCH": "1", "RESLICE_SEGMENT": "1", "RESLICE_COORDINATOR": "127.0.0.1:9001",
        "RESLICE_NUM_PROCESSES": "4", "RESLICE_NUM_SLICES": "2", "RESLICE_SLICE_INDEX": "1",
        "JOB_COMPLETION_INDEX": "1", "RESLICE_MICRO_BATCH": "4", "RESLICE_GRAD_ACCUM": "1",
        "MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "1", "RESLICE_TRAINER_CHILD": "1",
        "RESLICE_INCARNATION": "0",
    }  # fmt: skip
    p.publish(world_doc(2, ["b"]))  # slice a lost: b is process 2·0+1 of 2, alone, no multislice
    second = p.wait_starts(2)[1]
    assert second["env"]["RESLICE_SLICE_INDEX"] == "0" and second["env"]["RESLICE_NUM_PROCESSES"] == "2"
    assert second["env"]["RESLICE_INCARNATION"] == "1"  # its start-up begins at its fork
    assert "MEGASCALE_NUM_SLICES" not in second["env"] and second["env"]["RESLICE_MICRO_BATCH"] == "8"
    p.publish(world_doc(1, ["a", "b"]))  # a replayed older epoch: ignored
    p.alive_for(0.5)
    assert len(p.starts()) == 2
    p.publish(world_doc(3, ["c", "b"]))  # grown: a new slice before this one
    third = p.wait_starts(3)[2]
    assert third["env"]["RESLICE_SLICE_INDEX"] == "1" and third["env"]["RESLICE_NUM_PROCESSES"] == "4"
    p.publish(world_doc(4, ["a", "c"]))  # this slice is out: the child ends, the pod exits 0
    assert p.wait() == 0, p.output()

    out = p.output()
    assert "world epoch 1 ignored: epoch 2 is newer" in out
    assert "world epoch 4 leaves slice b out" in out
    for epoch in (1, 2, 3):
        assert sum(f"world epoch {epoch}: process" in line for line in out.splitlines()) == 1, out
    # One child at a time: each started after the one before had ended, every one by SIGTERM.
    recs = p.records()
    ends = [r for r in recs if r["event"] == "end"]
    assert [e["how"] for e in ends] == ["sigterm"] * 3
    starts = p.starts()
    assert all(starts[i + 1]["t"] > ends[i]["t"] for i in range(2))
    assert len({r["pid"] for r in starts}) == 3


@pytest.mark.parametrize(
    ("child", "then"),
    [
        ({"FAKE_EXIT": "43", "FAKE_AFTER_S": "0.2"}, "waits"),  # a lost peer: the pod survives
        ({"FAKE_ON_TERM": "143"}, "waits"),  # a stall after the supervisor's SIGTERM
        ({"FAKE_ON_TERM": "42"}, "waits"),  # the emergency checkpoint after its SIGTERM
        ({"FAKE_EXIT": "0", "FAKE_AFTER_S": "0.2"}, 0),  # finished
        ({"FAKE_EXIT": "2", "FAKE_AFTER_S": "0.2"}, 2),  # a configuration error
        ({"FAKE_EXIT": "42", "FAKE_AFTER_S": "0.2"}, "waits"),  # a peer's preemption stopped the world
        ({"FAKE_ON_TERM": "1"}, 1),  # a save that failed after the supervisor's SIGTERM
        # Gloo's transport threw (a peer died mid-collective, or a bug): a newer world says which.
        ({"FAKE_ABORT": "gloo", "FAKE_AFTER_S": "0.2"}, "waits"),
        ({"FAKE_ABORT": "plain", "FAKE_AFTER_S": "0.2"}, 134),  # any other abort is the child's own
    ],
)
def test_child_exit_codes(pod, child: dict, then: object) -> None:
    p = pod()
    p.publish(world_doc(0, ["b"], env=child))
    p.wait_starts(1)
    own = "FAKE_EXIT" in child or "FAKE_ABORT" in child  # it ends by itself
    if not own:  # the supervisor's own SIGTERM, for a newer world
        p.publish(world_doc(1, ["b", "a"]))
    if then != "waits":
        assert p.wait() == then, p.output()
        assert len(p.starts()) == 1
        return
    if own:  # the pod survives its child until the controller's next world
        wait_for(lambda: any(r["event"] == "end" for r in p.records()), 10, "the child's exit")
        p.alive_for(0.5)
        assert len(p.starts()) == 1
        p.publish(world_doc(1, ["b", "a"]))
    second = p.wait_starts(2)[1]
    assert second["env"]["RESLICE_WORLD_EPOCH"] == "1" and second["env"]["RESLICE_SLICE_INDEX"] == "0"
    assert "waiting for a world newer than epoch 0" in p.output() or not own


def test_a_world_that_lost_a_slice_of_the_childs_world_kills_the_child(pod) -> None:
    # The child's step waits for slice a's processes, whose hosts are gone: a SIGTERM would wait
    # for its stall watchdog; the world's `lost` says so, and the supervisor kills it instead.
    p = pod()
    p.publish(world_doc(0, ["a", "b"], env={"FAKE_ON_TERM": "hang"}))
    p.wait_starts(1)
    p.publish(world_doc(1, ["b"]))  # no slice said lost: SIGTERM, and the child goes on
    wait_for(lambda: any(r["event"] == "sigterm" for r in p.records()), 10, "the SIGTERM")
    p.alive_for(1.0)
    assert len(p.starts()) == 1
    t0 = time.time()
    p.publish(world_doc(2, ["b"], lost=["a"]))  # escalated: killed, the next child starts at once
    second = p.wait_starts(2)[1]
    assert second["env"]["RESLICE_WORLD_EPOCH"] == "2" and second["t"] - t0 < 2.0
    assert not [r for r in p.records() if r["event"] == "end"]  # it never ran its own exit
    assert "the trainer of epoch 0 exited 137" in p.output()
    assert "after SIGKILL (slice(s) a of its world lost)" in p.output()
    # A lost slice that was not in the child's world: SIGTERM as before (it saves and exits 42).
    p.publish(world_doc(3, ["b", "c"], lost=["a"]))
    p.wait_starts(3)
    assert [r["how"] for r in p.records() if r["event"] == "end"] == ["sigterm"]
    # The benchmarks read these lines: their parser and the supervisor's words stay one.
    lines = [w for line in p.output().splitlines() if (w := follower.world_line(line))]
    assert [(w["epoch"], w["signal"]) for w in lines] == [(0, None), (2, "SIGKILL"), (3, "SIGTERM")]
    assert all(w["ended"] is not None and w["ended"] < 2.0 for w in lines[1:])


def reaped(pid: int) -> bool:
    """Ended and reaped: a zombie keeps its /proc entry."""
    return not Path(f"/proc/{pid}").exists()


def test_what_a_killed_child_left_is_ended_its_shared_memory_unlinked_and_reaped(pod) -> None:
    # A trainer killed for a lost slice runs no exit path of its own: its loader's workers would
    # live on in the pod (one more set with every such world), with the shared memory they hold.
    p = pod()
    p.publish(world_doc(0, ["a", "b"], env={"FAKE_WORKERS": "1"}))
    p.wait_starts(1)
    (w,) = wait_for(lambda: [r for r in p.records() if r["event"] == "workers"] or None, 30, "the workers")
    shm = Path("/dev/shm", w["shm"])
    assert not reaped(w["worker"]) and not reaped(w["tracker"]) and shm.exists()
    p.publish(world_doc(1, ["b"], lost=["a"]))
    second = p.wait_starts(2)[1]
    assert "the trainer of epoch 0 exited 137" in p.output()
    # Ended (SIGTERM: the tracker outlives the worker and unlinks the block) and reaped here.
    wait_for(lambda: reaped(w["worker"]) and reaped(w["tracker"]), 10, "the worker and the tracker reaped")
    assert not shm.exists()
    p.alive_for(0.3)
    assert not reaped(second["pid"])  # the next world's child is spared


@pytest.mark.parametrize(
    ("child", "code", "said"),
    [
        # A peer died where nothing reports it: no newer world comes. The pod's own 43 is the report
        # (JobSet restarts the slice without counting it); a world in time keeps the pod, as above.
        (
            {"FAKE_EXIT": "43"},
            43,
            [
                "no world newer than epoch 0 2 s after a peer was lost or preempted (the controller's heartbeat",
                "absent, wait 2 s, at most 3600 s): exit 43",
            ],
        ),
        # Gloo's abort says nothing of a peer: only the controller's next world would have shown one
        # lost. Without it, the abort was the trainer's own failure (a collective mismatch), counted.
        (
            {"FAKE_ABORT": "gloo"},
            134,
            [
                "the trainer of epoch 0 exited 134 (Gloo's transport aborted it); waiting for a world",
                "2 s after its collectives' transport aborted (the controller's heartbeat absent",
                "exit 134 (its own failure)",
            ],
        ),
    ],
)
def test_no_newer_world_after_the_child_ended_the_pod_exits(pod, child: dict, code: int, said: list) -> None:
    p = pod(extra={"RESLICE_PEER_LOST_WAIT_S": "1.5"})
    p.publish(world_doc(0, ["b"], env={**child, "FAKE_AFTER_S": "0.2"}))
    p.wait_starts(1)
    t0 = time.monotonic()
    assert p.wait(10) == code, p.output()
    assert time.monotonic() - t0 >= 1.5
    for line in said:
        assert line in p.output()
    assert len(p.starts()) == 1


def test_while_the_controller_beats_the_pod_waits_past_its_patience_up_to_the_bound(pod) -> None:
    # A slice being recreated takes minutes: the controller refreshes the world's heartbeat while it
    # waits for it (launcher/core/world.py `beat`), and the survivors wait past
    # RESLICE_PEER_LOST_WAIT_S as long as it changes; RESLICE_PEER_LOST_MAX_WAIT_S still ends it.
    p = pod(extra={"RESLICE_PEER_LOST_WAIT_S": "1", "RESLICE_PEER_LOST_MAX_WAIT_S": "4"})
    doc = world_doc(0, ["b"], env={"FAKE_EXIT": "43", "FAKE_AFTER_S": "0.2"})
    p.publish(doc)
    p.wait_starts(1)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 3.0:  # beats every 0.25 s, well past the 1 s patience
        p.publish({**doc, "heartbeat": time.time()})
        time.sleep(0.25)
        assert p.proc.poll() is None, p.output()
    assert p.wait(10) == 43, p.output()
    assert time.monotonic() - t0 >= 3.5
    assert "the controller's heartbeat stale, wait 1 s, at most 4 s): exit 43" in p.output()
    assert len(p.starts()) == 1


def test_a_pod_of_a_restarted_slice_joins_no_world_decided_before_its_restart(pod) -> None:
    # Slice b's JobSet restarted (a host rebooted): its new pods (attempt 1) start while world 0,
    # decided for attempt 0, is still published. A trainer there would wait for world 0's
    # coordination service, which never takes it in; the pod waits for the world made for it.
    p = pod(extra={"RESLICE_RESTART_ATTEMPT": "1"})
    doc = world_doc(0, ["a", "b"], attempts={"a": 0, "b": 0})
    p.publish(doc)
    p.alive_for(0.5)
    p.publish({**doc, "heartbeat": time.time()})  # read again: said once
    p.alive_for(0.5)
    assert p.starts() == []
    said = "world epoch 0 was decided for attempt 0 of slice b, and this pod is attempt 1: waiting"
    assert p.output().count(said) == 1, p.output()
    p.publish(world_doc(1, ["a", "b"], attempts={"a": 0, "b": 1}))
    (first,) = p.wait_starts(1)
    assert first["env"]["RESLICE_WORLD_EPOCH"] == "1" and first["env"]["RESLICE_SLICE_INDEX"] == "1"


@pytest.mark.parametrize("key", ["RESLICE_PEER_LOST_WAIT_S", "RESLICE_CHIP_WAIT_S"])
@pytest.mark.parametrize("value", ["0", "-5", "soon"])
def test_a_bad_peer_lost_wait_is_one_line_and_exit_2(pod, key: str, value: str) -> None:
    p = pod(extra={key: value})
    p.publish(world_doc(0, ["b"]))
    assert p.wait() == 2, p.output()
    assert f"{key}={value!r}: expected seconds > 0" in p.output()
    assert p.starts() == [] and "Traceback" not in p.output()


def test_sigterm_to_the_pod_is_forwarded_and_its_code_returned(pod) -> None:
    p = pod()
    p.publish(world_doc(0, ["b"], env={"FAKE_ON_TERM": "42"}))
    p.wait_starts(1)
    os.kill(p.proc.pid, signal.SIGTERM)  # to the supervisor only, as a runtime signals PID 1
    assert p.wait() == 42, p.output()
    assert [r["how"] for r in p.records() if r["event"] == "end"] == ["sigterm"]


def test_sigterm_between_children_exits_42(pod) -> None:
    p = pod()
    p.publish(world_doc(0, ["b"], env={"FAKE_EXIT": "43"}))
    wait_for(lambda: any(r["event"] == "end" for r in p.records()), 10, "the child's exit 43")
    p.alive_for(0.3)
    os.kill(p.proc.pid, signal.SIGTERM)
    assert p.wait() == 42, p.output()
    assert "with no trainer running: nothing to save, exit 42" in p.output()


def test_a_malformed_world_is_one_line_and_exit_2(pod) -> None:
    p = pod()
    p.publish(world_doc(0, ["b"], hosts=0))
    assert p.wait() == 2, p.output()
    assert (
        p.output().strip().splitlines()[-1]
        == "trainer: world: 'hosts_per_slice' must be an integer >= 1, not 0"
    )
    assert p.starts() == []


@pytest.mark.parametrize(
    ("env", "line"),
    [
        (
            {"RESLICE_RESTART_MODE": "sideways"},
            "trainer: RESLICE_RESTART_MODE='sideways' is not one of recreate, in-place",
        ),
        (
            {"RESLICE_RESTART_MODE": "in-place", "RESLICE_SLICE_ID": "a"},
            "trainer: in-place mode needs RESLICE_WORLD_CONFIGMAP (or RESLICE_WORLD_FILE): where the worlds are",
        ),
        (
            {"RESLICE_RESTART_MODE": "in-place", "RESLICE_WORLD_FILE": "/nonexistent"},
            "trainer: in-place mode needs RESLICE_SLICE_ID (or RESLICE_SLICE_INDEX): this pod's slice",
        ),
    ],
)
def test_bad_mode_or_source_is_one_line_and_exit_2(tmp_path: Path, env: dict, line: str) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RESLICE_", "JOB_COMPLETION_INDEX"))}
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "--config", "tiny"],
        env={**base, "PYTHONPATH": str(ROOT), "RESLICE_RUN_DIR": str(run_dir), **env},
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == line
    assert not run_dir.exists()


def test_a_malformed_world_while_training_lets_the_trainer_save_then_exits_2(pod) -> None:
    p = pod()
    p.publish(world_doc(0, ["b"]))
    p.wait_starts(1)
    p.publish(world_doc(1, ["b"], coordinator="no-port"))
    assert p.wait() == 2, p.output()
    assert [r["how"] for r in p.records() if r["event"] == "end"] == ["sigterm"]  # it saved first
    assert "trainer: world: 'coordinator' must be 'host:port', not 'no-port'" in p.output()
    assert "exit 2 for the world that could not be read" in p.output()


def test_the_pod_imports_once_and_every_child_is_forked_with_the_imports_done(pod) -> None:
    p = pod()
    for epoch, slices in enumerate((["b"], ["a", "b"], ["b", "a"])):
        p.publish(world_doc(epoch, slices))
        p.wait_starts(epoch + 1)
    p.publish(world_doc(3, ["a"]))  # this slice leaves: the pod exits 0
    assert p.wait() == 0, p.output()
    preloads = [r for r in p.records() if r["event"] == "preload"]
    # Once, in the supervisor, before it had started any thread (the world source's): a fork while
    # another thread holds a lock would leave that lock held in the child.
    assert [(r["pid"], r["threads"]) for r in preloads] == [(p.proc.pid, 1)]
    starts = p.starts()
    assert len({r["pid"] for r in starts}) == 3 and p.proc.pid not in {r["pid"] for r in starts}
    assert {r["imported_by"] for r in starts} == {p.proc.pid}  # none imported again
    assert all(r["running_fd"] for r in starts)


def test_a_world_with_an_environment_of_its_own_gets_a_fresh_interpreter(pod) -> None:
    """Its variables may be read by the imports (``JAX_*``): the child imports in them, in a fresh
    interpreter, and is otherwise a child like any: its first-step pipe, SIGTERM for a newer world."""
    p = pod(extra={"FAKE_FRESH_WORLDS": "1"})
    p.publish(world_doc(0, ["b"], env={"FAKE_ON_TERM": "42"}))
    (fresh,) = p.wait_starts(1)
    assert fresh["imported_by"] == fresh["pid"] != p.proc.pid
    assert fresh["running_fd"] and fresh["env"]["RESLICE_TRAINER_CHILD"] == "1"
    p.publish(world_doc(1, ["b"]))  # none of its own: forked with the supervisor's imports
    forked = p.wait_starts(2)[1]
    assert forked["imported_by"] == p.proc.pid
    assert [r["how"] for r in p.records() if r["event"] == "end"] == ["sigterm"]
    assert "the trainer of epoch 0 exited 42" in p.output()


def test_a_forked_child_sees_the_environment_a_child_that_imported_itself_sees(tmp_path: Path) -> None:
    """On a TPU host ``import jax`` sets variables (``cloud_tpu_init``) that the backend reads later,
    in the world: a child forked after the supervisor's imports must have them as a child that
    imported in its world's environment (a world with ``env`` of its own: a fresh interpreter)."""
    extra = {
        "FAKE_IMPORT_ENV": "1",
        "LIBTPU_INIT_ARGS": "--pod_flag=1",
        "GRPC_VERBOSITY": "INFO",
        "FAKE_FRESH_WORLDS": "1",
    }
    pods, envs = {}, {}
    try:
        for name, own_env in (("forked", {}), ("fresh", {"FAKE_FRESH": "1"})):
            (tmp_path / name).mkdir()
            pods[name] = Pod(tmp_path / name, extra=extra)
            pods[name].publish(world_doc(0, ["b"], env=own_env))
            (start,) = pods[name].wait_starts(1)
            envs[name] = start["environ"]
            assert (start["imported_by"] == start["pid"]) is (name == "fresh")
    finally:
        for p in pods.values():
            p.kill()
    forked, fresh = envs["forked"], envs["fresh"]
    # The imports' variables: set when absent, the pod's own value kept, one appended to once.
    for env in (forked, fresh):
        assert env["TPU_ML_PLATFORM"] == "JAX" and env["TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS"] == "60"
        assert env["GRPC_VERBOSITY"] == "INFO"
        assert env["LIBTPU_INIT_ARGS"] == "--pod_flag=1 --xla_tpu_use_enhanced_launch_barrier=true"
    # Otherwise the same but for what names its own pod (paths, its pipe's descriptor, the world's own).
    own = {
        "FAKE_RECORD",
        "RESLICE_WORLD_FILE",
        "RESLICE_MEMORY_DIR",
        "RESLICE_TRAINER_RUNNING_FD",
        "FAKE_FRESH",
    }
    assert {k: v for k, v in forked.items() if k not in own} == {
        k: v for k, v in fresh.items() if k not in own
    }


def _hold_lock(path: Path) -> subprocess.Popen:
    """Another process that holds `path`'s lockf, as a TPU process holds libtpu's, until killed."""
    code = (
        "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644);"
        " fcntl.lockf(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
    return holder


def test_a_trainer_starts_once_the_chip_is_free(pod, tmp_path: Path) -> None:
    lock = tmp_path / "libtpu_lockfile"
    holder = _hold_lock(lock)
    try:
        p = pod(extra={"RESLICE_LIBTPU_LOCKFILE": str(lock), "FAKE_LOCK": "1"})
        p.publish(world_doc(0, ["b"]))
        wait_for(lambda: "another process holds the chip" in p.output(), 20, "the wait for the chip")
        p.alive_for(1.0)
        assert not p.starts() and not any(r["event"] == "lockfail" for r in p.records())
    finally:
        holder.kill()
        holder.wait()
    released = time.time()
    (start,) = p.wait_starts(1)
    assert start["t"] >= released
    assert "the chip is free after" in p.output()
    # The hand-off to the next world's trainer: the first holds the lock until it exits.
    p.publish(world_doc(1, ["b"]))
    assert p.wait_starts(2)[1]["env"]["RESLICE_WORLD_EPOCH"] == "1"
    assert not any(r["event"] == "lockfail" for r in p.records()), p.output()


def test_a_trainer_that_failed_on_the_chips_lock_is_started_again(pod, tmp_path: Path) -> None:
    lock = tmp_path / "libtpu_lockfile"
    holder = _hold_lock(lock)
    p = pod(extra={"RESLICE_LIBTPU_LOCKFILE": str(lock), "FAKE_LOCK": "1", "RESLICE_CHIP_WAIT_S": "0.2"})
    try:
        p.publish(world_doc(0, ["b"]))
        wait_for(
            lambda: any(r["event"] == "lockfail" for r in p.records()) or None, 20, "a trainer's lock error"
        )
        wait_for(lambda: "starting epoch 0's trainer again (1 of 3)" in p.output(), 20, "its retry")
    finally:
        holder.kill()
        holder.wait()
    (start,) = p.wait_starts(1)
    assert start["env"]["RESLICE_WORLD_EPOCH"] == "0"
    p.alive_for(0.3)


def test_the_chips_lock_held_for_good_fails_the_pod_after_the_retries(pod, tmp_path: Path) -> None:
    lock = tmp_path / "libtpu_lockfile"
    holder = _hold_lock(lock)
    try:
        p = pod(extra={"RESLICE_LIBTPU_LOCKFILE": str(lock), "FAKE_LOCK": "1", "RESLICE_CHIP_WAIT_S": "0.1"})
        p.publish(world_doc(0, ["b"]))
        assert p.wait(30) == 1, p.output()
    finally:
        holder.kill()
        holder.wait()
    assert sum(r["event"] == "lockfail" for r in p.records()) == 4  # the first and its 3 retries
    assert "the chip's lock failed 4 trainers in a row" in p.output()
