"""Helpers to run ``python -m trainer`` as the launcher would: a subprocess with the contract env."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from launcher.adapters.rundir import read_jsonl
from tests.support import wait as support

ROOT = Path(__file__).resolve().parents[2]

# Every end-to-end run shares these settings, so that runs are comparable step by step.
# One layer of `tiny`'s two: the suite's trainer processes test the elastic machinery (restores,
# reshards, worlds, the same losses on every shape), which a layer more only makes slower: on
# simulated CPU devices a multi-process step is its collectives over TCP, and a second layer
# doubles them (0.67 against 0.38 CPU seconds a step for 2 processes of 8 devices). The model's
# own tests build deeper ones in process.
MODEL = ["model.n_layers=1"]
COMMON = [*MODEL, "train.steps=40", "checkpoint.interval=10", "metrics.log_every=1000"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def own_compile_cache(env: dict[str, str]) -> dict[str, str]:
    """The run's own compile cache (<run_dir>/compile_cache) instead of the suite's shared one."""
    return {k: v for k, v in env.items() if k != "JAX_COMPILATION_CACHE_DIR"}


def env_for(
    run_dir: str,
    devices: int,
    *,
    grad_accum: int | None = None,
    global_batch: int = 16,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESLICE_", "JOB_COMPLETION_INDEX"))}
    env.update(
        JAX_PLATFORMS="cpu",
        JAX_NUM_CPU_DEVICES=str(devices),
        RESLICE_RUN_DIR=run_dir,
        RESLICE_CONFIG="tiny",
        RESLICE_GLOBAL_BATCH=str(global_batch),
        RESLICE_HEARTBEAT_TIMEOUT_S="10",
        PYTHONPATH=str(ROOT),
    )
    if grad_accum is not None:
        env["RESLICE_GRAD_ACCUM"] = str(grad_accum)
    env.update(extra or {})
    return env


class Trainer:
    """One trainer process (with its supervisor child, when multi-process) in its own process group,
    as the kubelet starts a container; stdout+stderr go to a log file."""

    def __init__(self, env: Mapping[str, str], log: Path, args: list[str] | None = None):
        self.log = log
        sets = [a for s in COMMON for a in ("--set", s)]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "trainer", *sets, *(args or [])],
                env=dict(env), stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
            )  # fmt: skip

    def wait(self, timeout: float = 240) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            raise AssertionError(f"trainer timed out; log:\n{self.output()[-4000:]}") from None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def catches(self, sig: int = signal.SIGTERM) -> bool:
        """Whether the process has a handler for `sig` installed now (`SigCgt` in /proc/PID/status,
        Linux): what a test waits on instead of sleeping until the trainer has installed it."""
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except FileNotFoundError:  # exited
            return False
        caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
        return bool(int(caught, 16) >> (sig - 1) & 1)

    def signal(self, sig: int = signal.SIGTERM) -> None:
        """To the whole process group, as the kubelet signals a container."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)


def run(
    env: Mapping[str, str], log: Path, args: list[str] | None = None, timeout: float = 240
) -> tuple[int, str]:
    t = Trainer(env, log, args)
    rc = t.wait(timeout)
    return rc, t.output()


def wait_for(pred: Callable[[], bool], timeout: float, what: str, proc: Trainer | None = None) -> None:
    """tests.support.wait.wait_for, failing at once (with its output) when the trainer `proc` exits first."""

    def holds() -> bool:
        if pred():
            return True
        if proc is not None and proc.proc.poll() is not None:
            raise AssertionError(
                f"trainer exited ({proc.proc.returncode}) before {what}:\n{proc.output()[-4000:]}"
            )
        return False

    support.wait_for(holds, timeout, what, interval=0.01)


def parse_metrics(files: Mapping[str, str]) -> dict[int, dict]:
    """name -> text of metrics files => step -> record; later incarnations (file names sort by
    segment, restart attempt, start time) override recomputed steps, as the contract says."""
    records: dict[int, dict] = {}
    for name in sorted(files):
        for rec in read_jsonl(files[name]):
            records[rec["step"]] = rec
    return records


def metrics_files(run_dir: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((run_dir / "metrics").glob("*.jsonl"))}


def last_step(run_dir: Path) -> int:
    steps = [rec["step"] for text in metrics_files(run_dir).values() for rec in read_jsonl(text)]
    return max(steps, default=0)


def committed(run_dir: Path) -> list[int]:
    root = run_dir / "checkpoints"
    if not root.exists():
        return []
    return sorted(
        int(p.name) for p in root.iterdir() if p.name.isdigit() and (p / "commit_success.txt").exists()
    )


def losses(records: Mapping[int, dict]) -> dict[int, float]:
    return {s: r["learning/loss"] for s, r in records.items()}


def processes(
    run_dir: str,
    log_dir: Path,
    *,
    count: int = 2,
    devices: int = 2,
    grad_accum: int = 1,
    extra: Mapping | None = None,
    only: Mapping[int, Mapping[str, str]] | None = None,
    args: list[str] | None = None,
) -> list[Trainer]:
    """``count`` trainer processes of one segment on this machine (one slice, ``count`` hosts);
    ``only[i]`` is more environment for process i alone."""
    shared = {
        **(extra or {}),
        "RESLICE_COORDINATOR": f"127.0.0.1:{free_port()}",
        "RESLICE_NUM_PROCESSES": str(count),
        "RESLICE_HOSTS_PER_SLICE": str(count),
        "RESLICE_SLICE_INDEX": "0",
    }
    return [
        Trainer(
            env_for(
                run_dir,
                devices,
                grad_accum=grad_accum,
                extra={**shared, **(only or {}).get(i, {}), "JOB_COMPLETION_INDEX": str(i)},
            ),
            log_dir / f"p{i}.log",
            args,
        )
        for i in range(count)
    ]


def assert_matches_reference(records: dict[int, dict], reference: dict, *, exact: bool) -> None:
    """The reference run's samples at every step, and its losses: bit for bit (same shape) or within
    1e-5 (another shape)."""
    ref = reference["records"]
    for step, rec in records.items():
        assert rec["data/sample_digest"] == ref[step]["data/sample_digest"], f"step {step}: different samples"
        if exact:
            assert rec["learning/loss"] == ref[step]["learning/loss"], f"step {step}"
        else:
            assert abs(rec["learning/loss"] - ref[step]["learning/loss"]) <= 1e-5, f"step {step}"
