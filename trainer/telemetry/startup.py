"""Where one trainer process's start-up goes: wall and CPU seconds from the container's spawn to
the first step, phase by phase. ``__main__`` creates the ``Timeline`` before its slow imports and
``loop.run`` marks each phase; the first step's metrics record carries process 0's as
``perf/startup`` and every process prints its own (bench.recovery reads both). No heavy imports.

The spawn time is the start of the process the container runtime (the embedded kubelet) started,
from ``/proc``: this one, or for a multi-process or in-place run its parent
(``trainer.elastic.supervisor``, ``trainer.elastic.follower``), whose own start-up until it forks this process is the ``supervisor``
phase (in place it holds the trainer's imports, done there once for the pod's every child). Where
``/proc`` cannot say, the timeline starts when it is created.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path


def _boot_time() -> float:
    """Epoch seconds of the boot, to the clock's precision: ``btime`` in /proc/stat is whole
    seconds, which would shift every process start by up to 1 s against ``time.time()``."""
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the parenthesized command name (field 3 first)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_start(pid: int) -> float | None:
    """Epoch seconds at which process ``pid`` started (to the clock tick), or None off Linux."""
    try:
        fields = _stat(pid)
        if fields is None:
            return None
        return _boot_time() + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22
    except (TypeError, ValueError, IndexError):
        return None


def process_cpu(pid: int) -> float | None:
    """CPU seconds process ``pid`` has used so far (user and system, to the clock tick), or None."""
    try:
        fields = _stat(pid)
        if fields is None:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # fields 14 and 15
    except (TypeError, ValueError, IndexError):
        return None


class Timeline:
    """Phase marks of one process: (name, epoch seconds, CPU seconds of the process so far)."""

    def __init__(self, supervised: bool = False) -> None:
        own = process_start(os.getpid())
        spawned = process_start(os.getppid()) if supervised else own
        self.marks: list[tuple[str, float, float]] = []
        self.origin = spawned or own or time.time()
        # Supervised: the parent's CPU until now (about what it used until the fork) comes first.
        self.cpu0 = 0.0
        if supervised and own is not None and spawned is not None:
            self.cpu0 = process_cpu(os.getppid()) or 0.0
            self.marks.append(("supervisor", own, self.cpu0))
        self.mark("interpreter")  # Python's own start and the imports of __main__

    def mark(self, phase: str) -> None:
        """``phase`` ended now."""
        self.marks.append((phase, time.time(), self.cpu0 + time.process_time()))

    def phases(self) -> dict[str, dict[str, float]]:
        """{phase: {"wall": seconds since the previous mark, "cpu": this process's CPU seconds in
        it}}, in order; ``total`` is from the spawn to the last mark."""
        out: dict[str, dict[str, float]] = {}
        prev_t, prev_cpu = self.origin, 0.0
        for phase, t, cpu in self.marks:
            out[phase] = {"wall": round(t - prev_t, 3), "cpu": round(max(cpu - prev_cpu, 0.0), 3)}
            prev_t, prev_cpu = t, max(cpu, prev_cpu)
        out["total"] = {"wall": round(prev_t - self.origin, 3), "cpu": round(prev_cpu, 3)}
        return out

    def report(self, process_id: int) -> str:
        """The one line every process prints at its first step."""
        body = {"process": process_id, "spawned": round(self.origin, 3), "phases": self.phases()}
        return f"{REPORT}{json.dumps(body, separators=(',', ':'))}"


REPORT = "trainer: start-up: "


@contextlib.contextmanager
def no_rocm_plugin_scan(env: Mapping[str, str]) -> Iterator[None]:
    """While jax is imported: hide the installed distributions from its ROCm plugin lookup where
    ``JAX_PLATFORMS`` rules ROCm out.

    jax 0.10.2 parses the METADATA of every installed distribution when ``jax.numpy`` is imported,
    to find a ``jax-rocm*-plugin`` (jax/_src/numpy/array_constructors.py; jax-ml/jax#37879): every
    distribution in this project's environment, on every trainer start-up (docs/measurements.md,
    "Figures behind the code's constants"). The fix proposed upstream (jax-ml/jax#38030) skips the
    lookup when ``JAX_PLATFORMS`` is set without ``rocm``, as the simulated hosts and CPU runs set it;
    this does the same from outside, touching ``importlib.metadata.distributions()`` called without
    arguments (jax's lookup, the only such call among the trainer's imports) for the duration of the
    block only."""
    platforms = env.get("JAX_PLATFORMS", "")
    if not platforms or "rocm" in platforms:
        yield
        return
    from importlib import metadata

    scan = metadata.distributions

    def without_scan(**kwargs):
        return scan(**kwargs) if kwargs else iter(())

    metadata.distributions = without_scan
    try:
        yield
    finally:
        metadata.distributions = scan


def parse_report(line: str) -> dict | None:
    """{"process", "spawned" (epoch seconds), "phases"} from a line `report` printed, or None for
    any other line."""
    if not line.startswith(REPORT):
        return None
    try:
        return json.loads(line[len(REPORT) :])
    except ValueError:
        return None
