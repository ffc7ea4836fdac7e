"""``train.profile_steps``: a ``jax.profiler`` trace of chosen steps, written into the run directory.

Each run of consecutive steps of ``train.profile_steps`` (steps as the metrics records number them,
from 1) is one trace, of every process, under
``<run_dir>/profile/process-<p>/steps-<first>-<last>/plugins/profile/<time>/``: the profiler's
``<host>.xplane.pb`` (TensorBoard's and XProf's profile plugin read it) and ``<host>.trace.json.gz``
and ``perfetto_trace.json.gz`` (Perfetto's UI opens them). Each step's dispatch is annotated
(``jax.profiler.StepTraceAnnotation("train", step_num=n)``), so the profile plugin splits the trace
by step. An incarnation that resumed inside a run of steps traces the rest of it
(``steps-<its first>-<last>``). A gs:// run directory gets the files copied in after the trace ends (the profiler writes
local files).

The loop (``trainer.loop._train``) runs the traced steps without its usual one-step lead: it
finishes the step in flight before the first traced step is dispatched, and the last traced step
before the trace stops, so the trace holds the chosen steps' device work and nothing of their
neighbours'. The steps around a trace cost that overlap, nothing else does; a run without
``train.profile_steps`` takes no branch of this module.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import jax
from etils import epath


def windows(steps: list[int]) -> list[tuple[int, int]]:
    """[5, 6, 9] -> [(5, 6), (9, 9)]: the runs of consecutive steps, each one trace."""
    out: list[tuple[int, int]] = []
    for s in sorted(set(steps)):
        if out and s == out[-1][1] + 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


class StepProfiler:
    """Starts and stops the traces of ``train.profile_steps`` around the loop's steps."""

    def __init__(self, steps: list[int], run_dir: str, process: int) -> None:
        self.windows = windows(steps)
        self.root = epath.Path(run_dir) / "profile" / f"process-{process}"
        self.remote = "://" in run_dir
        self.active: tuple[int, int] | None = None
        self._local: Path | None = None

    def starts(self, n: int) -> bool:
        """Whether step `n` begins a trace: the first of a window, or one inside it that an
        incarnation resumed at (the window's rest is traced then)."""
        return self.active is None and any(first <= n <= last for first, last in self.windows)

    def ends(self, n: int) -> bool:
        """Whether step `n` is the last of the trace that runs."""
        return self.active is not None and self.active[1] == n

    def start(self, n: int) -> None:
        last = next(last for first, last in self.windows if first <= n <= last)
        first = n
        self.active = (first, last)
        target = self.root / f"steps-{first}-{last}"
        if self.remote:
            self._local = Path(tempfile.mkdtemp(prefix="reslice-profile-"))
        else:
            target.mkdir(parents=True, exist_ok=True)
            self._local = Path(str(target))
        jax.profiler.start_trace(str(self._local), create_perfetto_trace=True)

    def stop(self) -> str | None:
        """End the trace that runs; where it was written (None when none ran)."""
        if self.active is None or self._local is None:
            return None
        first, last = self.active
        self.active = None
        jax.profiler.stop_trace()
        target = self.root / f"steps-{first}-{last}"
        if self.remote:
            for path in self._local.rglob("*"):
                if path.is_file():
                    dest = target / path.relative_to(self._local).as_posix()
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(path.read_bytes())
            shutil.rmtree(self._local, ignore_errors=True)
        self._local = None
        return str(target)

    @contextlib.contextmanager
    def step(self, n: int) -> Iterator[None]:
        """Around step `n`'s dispatch: its annotation in the trace that runs, if any."""
        if self.active is None:
            yield
            return
        with jax.profiler.StepTraceAnnotation("train", step_num=n):
            yield
