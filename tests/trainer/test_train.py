"""End-to-end trainer runs (real JAX on simulated CPU devices, real Orbax, real fake-gcs-server).

One uninterrupted 8-device run (the ``reference`` fixture) is the yardstick for every interrupted
run: same shape resumes must match it bit for bit, other shapes within 1e-5, with the same samples.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.support.fake_gcs import FakeGCS
from tests.trainer import runs
from trainer.elastic import peers

CONTRACT_KEYS = {
    "step", "segment", "jobset_attempt", "time", "learning/loss", "learning/total_loss", "learning/lr",
    "learning/grad_norm", "perf/step_time_seconds", "perf/tokens_per_sec", "perf/per_device_tflops_per_sec",
    "perf/mfu", "perf/data_loading_seconds", "perf/checkpoint_save_seconds", "moe/dropped_rows",
    "moe/total_rows", "moe/max_load_over_balanced", "moe/layers", "moe/buffer_rows", "data/sample_digest",
    "data/first_sample", "devices", "micro_batch", "grad_accum", "num_processes",
}  # fmt: skip


def tensorboard_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Read the event files back (TFRecord framing: length, crc, payload, crc)."""
    from tensorboardX.proto.event_pb2 import Event

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted((run_dir / "tensorboard").glob("events.out.tfevents.*")):
        blob, at = path.read_bytes(), 0
        while at < len(blob):
            length = int.from_bytes(blob[at : at + 8], "little")
            event = Event.FromString(blob[at + 12 : at + 12 + length])
            at += 12 + length + 4
            for v in event.summary.value:
                scalars.setdefault(v.tag, []).append((event.step, v.simple_value))
    return scalars


def test_tiny_trains_on_8_devices(reference: dict) -> None:
    records, run_dir = reference["records"], reference["dir"]
    assert sorted(records) == list(range(1, 41))
    first = sum(records[s]["learning/loss"] for s in range(1, 6)) / 5
    last = sum(records[s]["learning/loss"] for s in range(36, 41)) / 5
    assert last < first - 1.5, (first, last)
    rec = records[40]
    assert set(rec) >= CONTRACT_KEYS
    assert (rec["devices"], rec["micro_batch"], rec["grad_accum"], rec["num_processes"]) == (8, 2, 1, 1)
    assert len(rec["moe/layers"]) == 1 and rec["moe/dropped_rows"] == 0  # runs.MODEL: one MoE layer, dropless
    assert rec["moe/total_rows"] == 16 * 32 * 2 * 1  # tokens × top_k × MoE layers (tests/launcher/sweep: two)
    assert rec["moe/max_load_over_balanced"] > 1.0  # the Zipf corpus routes unevenly
    assert all(r["perf/checkpoint_save_seconds"] > 0 for s, r in records.items() if s % 10 == 0)
    assert runs.committed(run_dir) == [20, 30, 40]  # keep 3
    status = json.loads((run_dir / "status.json").read_text())
    assert (status["state"], status["step"], status["total_steps"]) == ("finished", 40, 40)
    assert tensorboard_scalars(run_dir)["learning/loss"] == [
        (s, records[s]["learning/loss"]) for s in range(1, 41)
    ]
    assert len(list((run_dir / "metrics").glob("*.jsonl"))) == 1
    # Where the start-up went (trainer.telemetry.startup), on the first record only.
    startup = records[1]["perf/startup"]
    assert list(startup) == [
        "interpreter", "imports", "distributed", "runtime", "abstract state", "train step", "init", "barrier",
        "first step", "total",
    ]  # fmt: skip
    walls = [p["wall"] for k, p in startup.items() if k != "total"]
    assert min(walls) >= 0 and sum(walls) == pytest.approx(startup["total"]["wall"], abs=0.01)
    assert startup["imports"]["cpu"] > 0.1  # JAX alone costs more
    assert "perf/startup" not in records[2]


def test_same_shape_resume_after_kill_is_bitwise_equal(reference: dict, tmp_path: Path) -> None:
    """SIGKILL during an async save (a save every step), restart on the same shape."""
    run_dir = tmp_path / "run"
    env = runs.own_compile_cache(runs.env_for(str(run_dir), 8))
    args = ["--set", "checkpoint.interval=1"]
    first = runs.Trainer(env, tmp_path / "first.log", args)

    def saving_after_a_commit() -> bool:
        tmp = list((run_dir / "checkpoints").glob("*.orbax-checkpoint-tmp*")) if run_dir.exists() else []
        return bool(tmp) and len(runs.committed(run_dir)) >= 3

    runs.wait_for(saving_after_a_commit, 120, "a save in progress", first)
    first.signal(signal.SIGKILL)
    first.wait()
    resume_at = runs.committed(run_dir)[-1]
    assert resume_at <= 20
    if not list((run_dir / "checkpoints").glob("*.orbax-checkpoint-tmp*")):
        # The kill nearly always lands inside a save (one per step); if this one fell between two,
        # leave what such a kill leaves: a later step's temporary directory, without commit file.
        half = run_dir / "checkpoints" / f"{resume_at + 1}.orbax-checkpoint-tmp-1"
        shutil.copytree(run_dir / "checkpoints" / str(resume_at), half)
        (half / "commit_success.txt").unlink()

    rc, out = runs.run(env, tmp_path / "second.log", args)  # the same config: the same program key
    assert rc == 0, out[-4000:]
    assert f"resumed step {resume_at} " in out
    assert not list((run_dir / "checkpoints").glob("*.orbax-checkpoint-tmp*"))
    newest = sorted((run_dir / "metrics").glob("*.jsonl"))[-1]
    resumed = runs.parse_metrics({newest.name: newest.read_text()})
    assert sorted(resumed) == list(range(resume_at + 1, 41)) and len(resumed) >= 20
    runs.assert_matches_reference(resumed, reference, exact=True)
    # The same shape again: its train step came from the run's compile cache, not the compiler,
    # loaded without tracing (the entry keyed before tracing, written by the first incarnation).
    first_records = runs.parse_metrics(
        {p.name: p.read_text() for p in sorted((run_dir / "metrics").glob("*.jsonl"))[:1]}
    )
    assert first_records[min(first_records)]["perf/compile_cache_hits"] == 0
    assert resumed[resume_at + 1]["perf/compile_cache_hits"] == 1
    # The restore is timed once, on the first record of the incarnation that restored (report.py's
    # checkpoint restore badput).
    assert resumed[resume_at + 1]["perf/restore_seconds"] > 0
    assert "perf/restore_seconds" not in resumed[resume_at + 2]
    assert first_records[min(first_records)]["perf/restore_seconds"] == 0.0  # nothing to restore
    assert len(list((run_dir / "compile_cache" / "train-step").iterdir())) == 1
    assert "trainer: train step loaded without tracing" in out
    # The abstract state came from the cache too: the resumed process never imported flax.
    assert "flax and optax were never imported" in out and "never imported" not in first.output()


def test_stacks_asked_for_over_and_over_never_stop_the_training(reference: dict, tmp_path: Path) -> None:
    """SIGUSR1 every few milliseconds from the first step to the process's end (mid-step, mid-read,
    during the exit): each writes the stacks, and the run ends 0 with the reference's losses bit for
    bit. With faulthandler's own handler the process died under this (SIGSEGV mid-run, SIGABRT at
    its exit)."""
    run_dir = tmp_path / "run"
    t = runs.Trainer(runs.env_for(str(run_dir), 8), tmp_path / "log")
    runs.wait_for(lambda: runs.last_step(run_dir) >= 1, 120, "step 1", t)
    sent = 0
    while t.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
            t.signal(signal.SIGUSR1)
            sent += 1
        time.sleep(0.005)
    assert t.proc.returncode == 0, t.output()[-4000:]
    answered = t.output().count("(most recent call first):")
    assert sent >= 20 and answered >= sent, (sent, answered)  # one line per thread per signal
    runs.assert_matches_reference(runs.parse_metrics(runs.metrics_files(run_dir)), reference, exact=True)


def test_sigterm_exits_42_and_resumes_on_another_shape(reference: dict, tmp_path: Path) -> None:
    """8 devices × A=1, SIGTERM -> exit 42 with the step in flight committed; then 2 devices × A=4."""
    run_dir = tmp_path / "run"
    first = runs.Trainer(runs.env_for(str(run_dir), 8), tmp_path / "first.log")
    runs.wait_for(lambda: runs.last_step(run_dir) >= 5, 120, "step 5", first)
    # SIGUSR1: every thread's stack in the log (the training loop's among them), and it trains on.
    first.signal(signal.SIGUSR1)
    runs.wait_for(lambda: 'trainer/loop.py", line' in first.output(), 30, "the stacks", first)
    assert "(most recent call first)" in first.output() and first.proc.poll() is None
    sent = time.monotonic()
    first.signal(signal.SIGTERM)
    rc = first.wait()
    assert rc == 42, first.output()[-4000:]
    assert time.monotonic() - sent < 10  # well inside a pod's grace period
    stopped = runs.last_step(run_dir)
    assert runs.committed(run_dir)[-1] == stopped < 40
    assert json.loads((run_dir / "status.json").read_text())["state"] == "running"

    rc, out = runs.run(runs.env_for(str(run_dir), 2, grad_accum=4), tmp_path / "second.log")
    assert rc == 0, out[-4000:]
    newest = sorted((run_dir / "metrics").glob("*.jsonl"))[-1]
    resumed = runs.parse_metrics({newest.name: newest.read_text()})
    assert min(resumed) == stopped + 1  # nothing recomputed
    assert sorted(resumed) == list(range(stopped + 1, 41)) and len(resumed) >= 20
    assert {(r["devices"], r["micro_batch"], r["grad_accum"]) for r in resumed.values()} == {(2, 2, 4)}
    runs.assert_matches_reference(resumed, reference, exact=False)


def test_two_processes_train_to_the_end_on_one_compile_and_both_load_the_train_step_when_resumed(
    reference: dict, tmp_path: Path
) -> None:
    run_dir, cache = tmp_path / "run", {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "cache")}
    procs = runs.processes(str(run_dir), tmp_path, grad_accum=2, extra=cache)
    for p in procs:
        assert p.wait() == 0, p.output()[-4000:]
        # Said once the last step is committed: an abort after it (process 0 and the coordination
        # service gone first) keeps exit 0 (trainer.elastic.peers.SETTLED).
        assert peers.SETTLED.format(code=0) in p.output()
    # Simulated hosts share the machine's cores: process 0 compiles, process 1 waits and loads.
    assert "trainer: train step compiled in" in procs[0].output()
    assert "train step loaded without tracing" in procs[1].output()
    assert "trainer: initial state's program loaded from the compile cache" in procs[1].output()
    files = runs.metrics_files(run_dir)
    assert len(files) == 1  # process 0 only
    records = runs.parse_metrics(files)
    assert sorted(records) == list(range(1, 41))
    assert {(r["devices"], r["micro_batch"], r["num_processes"]) for r in records.values()} == {(4, 2, 2)}
    runs.assert_matches_reference(records, reference, exact=False)
    assert runs.committed(run_dir) == [20, 30, 40]
    assert {p.name for p in (run_dir / "checkpoints" / "40" / "state").glob("ocdbt.process_*")} == {
        "ocdbt.process_0",
        "ocdbt.process_1",
    }
    # On CPU the trainer keeps the lowered programs' entries (JAX's cache key differs per process
    # there, and JAX writes process 0's only), one for both processes: the train step's and the
    # initial state's program in lowered/, each also keyed before tracing (train-step/,
    # initial-state/).
    assert len(list((tmp_path / "cache" / "lowered").iterdir())) == 2
    assert len(list((tmp_path / "cache" / "train-step").iterdir())) == 1
    assert len(list((tmp_path / "cache" / "initial-state").iterdir())) == 1
    # A second segment on the same shape, the run extended by 2 steps with its schedule unchanged:
    # what only the host reads is not in the key, so both processes load the train step without
    # tracing, and no new entry is written.
    (tmp_path / "more").mkdir()
    more = ["--set", "train.steps=42", "--set", "optim.decay_steps=40"]  # the same schedule
    procs = runs.processes(str(run_dir), tmp_path / "more", grad_accum=2, extra=cache, args=more)
    for p in procs:
        assert p.wait() == 0, p.output()[-4000:]
        assert "resumed step 40 " in p.output() and "train step loaded without tracing" in p.output()
    assert len(list((tmp_path / "cache" / "train-step").iterdir())) == 1
    # A fresh run of that shape: neither process compiles the initial state's program (process 1
    # did at every fresh start while JAX's cache alone served it). Process 1 has an environment
    # variable of its own, so its train-step key is not process 0's: it does not wait for an entry
    # that never comes, it lowers and loads the lowered program's entry.
    (tmp_path / "fresh").mkdir()
    short = ["--set", "train.steps=2", "--set", "optim.decay_steps=40"]
    procs = runs.processes(
        str(tmp_path / "run2"), tmp_path / "fresh", grad_accum=2, extra=cache, args=short,
        only={1: {"JAX_RESLICE_TEST_ONLY_HERE": "1"}},
    )  # fmt: skip
    for p in procs:
        assert p.wait(120) == 0, p.output()[-4000:]
        assert "trainer: initial state's program loaded from the compile cache" in p.output()
        assert "train step loaded from the compile cache" in p.output()
    assert "process 0's train-step program differs from this process's" in procs[1].output()
    # Process 0's keys are the first run's: a fresh start that neither traces the model nor imports
    # flax. Process 1 traced both programs and loaded their lowered entries.
    assert "initial state loaded without tracing" in procs[0].output()
    assert "flax and optax were never imported" in procs[0].output()
    assert "flax and optax were never imported" not in procs[1].output()


def _gcs_committed(gcs: FakeGCS, prefix: str) -> list[int]:
    names = gcs.list_objects("reslice", f"{prefix}/checkpoints/")
    return sorted(
        int(n.split("/")[-2]) for n in names if n.endswith("/commit_success.txt") and n.count("/") == 3
    )


def test_gcs_run_dir_preempt_two_processes_then_resume_on_8_devices(
    reference: dict, gcs: FakeGCS, tmp_path: Path
) -> None:
    """gs:// end to end: 2 processes × 2 devices (A=2) get preempted (SIGTERM to one process only,
    and to its supervisor only, as a container runtime signals PID 1: both must stop at the same
    step); the newest checkpoint is then made half-written (commit file removed, as a save killed
    on GCS leaves it); 8 devices resume from the one before it."""
    prefix = f"run-{uuid.uuid4().hex[:8]}"
    run_dir = f"gs://reslice/{prefix}"
    procs = runs.processes(run_dir, tmp_path, grad_accum=2, extra=gcs.env)
    runs.wait_for(lambda: 10 in _gcs_committed(gcs, prefix), 180, "checkpoint 10 on gs://", procs[0])
    procs[1].proc.send_signal(signal.SIGTERM)  # the supervisor forwards it to the trainer
    assert [p.wait() for p in procs] == [42, 42], procs[0].output()[-3000:] + procs[1].output()[-3000:]
    committed = _gcs_committed(gcs, prefix)
    stopped, previous = committed[-1], committed[-2]
    assert 10 < stopped < 40
    for p in procs:
        assert f"preempted: step {stopped} committed" in p.output()
    metric_names = [n for n in gcs.list_objects("reslice", f"{prefix}/metrics/") if n.endswith(".jsonl")]
    first = runs.parse_metrics({n: gcs.read_object("reslice", n).decode() for n in metric_names})
    assert max(first) == stopped and {r["num_processes"] for r in first.values()} == {2}
    assert gcs.list_objects("reslice", f"{prefix}/tensorboard/")

    gcs.delete_object("reslice", f"{prefix}/checkpoints/{stopped}/commit_success.txt")
    rc, out = runs.run(runs.env_for(run_dir, 8, extra=gcs.env), tmp_path / "resume.log")
    assert rc == 0, out[-4000:]
    assert f"resumed step {previous} " in out  # not from the half-written one
    names = [n for n in gcs.list_objects("reslice", f"{prefix}/metrics/") if n.endswith(".jsonl")]
    newest = sorted(names)[-1]
    resumed = runs.parse_metrics({newest: gcs.read_object("reslice", newest).decode()})
    assert sorted(resumed) == list(range(previous + 1, 41))
    runs.assert_matches_reference(resumed, reference, exact=False)
    runs.assert_matches_reference(first, reference, exact=False)
    status = json.loads(gcs.read_object("reslice", f"{prefix}/status.json"))
    assert (status["state"], status["step"]) == ("finished", 40)
    assert _gcs_committed(gcs, prefix) == [20, 30, 40]


def _one_line_exit_2(env: dict, args: list[str]) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=runs.ROOT,
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [
        line
        for line in proc.stderr.splitlines()
        if line.strip() and not line.startswith(("I", "W", "[Gloo]"))
    ]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("override", "env_extra", "expected"),
    [
        (["--set", "optim.lr=0.001"], {}, "optim.lr 0.003 -> 0.001"),
        ([], {"RESLICE_GLOBAL_BATCH": "32"}, "global batch 16, this run 32"),
    ],
    ids=["config-hash", "global-batch"],
)
def test_refuses_a_checkpoint_of_another_run(
    reference: dict, tmp_path: Path, override: list[str], env_extra: dict, expected: str
) -> None:
    run_dir = reference["dir"]
    before = {p.name: p.stat().st_mtime_ns for p in run_dir.rglob("*")}
    env = runs.env_for(str(run_dir), 8, extra=env_extra)
    line = _one_line_exit_2(env, [a for s in runs.COMMON for a in ("--set", s)] + override)
    assert "refusing to resume" in line and expected in line, line
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.rglob("*")} == before  # nothing written


def test_a_checkpoint_of_another_run_is_refused_before_the_compile_cache_is_written(reference: dict) -> None:
    """Without a compile cache of its own (the suite shares one), the trainer keeps compiled
    programs in <run_dir>/compile_cache: none may be written into a run directory it refuses."""
    run_dir = reference["dir"]
    before = {str(p): p.stat().st_mtime_ns for p in run_dir.rglob("*")}
    env = runs.env_for(str(run_dir), 8)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    sets = [a for s in runs.COMMON for a in ("--set", s)]
    line = _one_line_exit_2(env, [*sets, "--set", "optim.lr=0.001"])
    assert "refusing to resume" in line, line
    assert {str(p): p.stat().st_mtime_ns for p in run_dir.rglob("*")} == before


def test_batch_plan_mismatch_is_a_config_error(tmp_path: Path) -> None:
    env = runs.env_for(str(tmp_path / "run"), 8, global_batch=12)
    line = _one_line_exit_2(env, [])
    assert "≠ global batch 12" in line
    assert not (tmp_path / "run").exists()


def test_sigterm_during_start_up_exits_42_without_training(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    trainer = runs.Trainer(runs.env_for(str(run_dir), 8), tmp_path / "t.log")
    # Once the handler is installed (its first act, ~0.2 s in), long before the first step (> 2 s).
    runs.wait_for(trainer.catches, 60, "the trainer's SIGTERM handler", trainer)
    trainer.signal(signal.SIGTERM)
    assert trainer.wait() == 42, trainer.output()[-3000:]
    assert "preempted before the first step" in trainer.output()
    assert runs.committed(run_dir) == [] and runs.last_step(run_dir) == 0
