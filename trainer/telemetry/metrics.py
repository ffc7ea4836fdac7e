"""Run-directory outputs of process 0: metrics JSON lines, TensorBoard events, ``status.json``.

Local and gs:// run directories go through ``etils.epath``. A GCS object cannot be appended to, so
on gs:// the metrics object of this incarnation is rewritten whole at each flush (every
``metrics.flush_seconds``, at each checkpoint and at exit) and continued in a new object (a later
name) every ``ROTATE_LINES`` records; locally lines are appended and flushed every step.
Other processes get a writer that does nothing.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

from etils import epath

ROTATE_LINES = 2000  # records per gs:// metrics object


def _is_remote(path: str) -> bool:
    return "://" in path


def recorded_steps(run_dir: str, steps: Iterable[int]) -> set[int]:
    """Which of `steps` some metrics record of the run directory is of: its files newest first (one
    per trainer incarnation, named by segment, restart attempt and start time), every line read
    until all are found. For a restore, not a loop: a long run's history on gs:// is many objects."""
    wanted, found = set(steps), set[int]()
    directory = epath.Path(run_dir) / "metrics"
    try:
        names = sorted((p.name for p in directory.iterdir() if p.name.endswith(".jsonl")), reverse=True)
    except FileNotFoundError:
        return found
    for name in names:
        for line in (directory / name).read_text().splitlines():
            try:
                step = json.loads(line).get("step")
            except (ValueError, AttributeError):
                continue  # a line cut short by a writer that was killed
            if isinstance(step, int) and step in wanted:
                found.add(step)
        if found == wanted:
            break
    return found


def preload_tensorboard(run_dir: str | None) -> None:
    """Import the event writer now. The in-place supervisor does it once for its pod's every child
    (trainer.__main__ ``_preload``): process 0 otherwise pays the import with its first record,
    inside the first step, where every other process waits for its next step's dispatch.
    `run_dir`: the run directory the children write to (None: not known yet, as for gs://)."""
    with _event_writer_imports(run_dir):
        from tensorboardX import FileWriter  # noqa: F401
        from tensorboardX.proto.summary_pb2 import Summary  # noqa: F401


# What tensorboardX imports for the object stores it can write event files to, which only a gs://
# run directory needs: most of tensorboardX's import, paid by process 0 and, in place, by every
# pod's preload (docs/measurements.md, "The test suite").
_REMOTE_ONLY = ("google.cloud.storage",)


@contextlib.contextmanager
def _event_writer_imports(run_dir: str | None) -> Iterator[None]:
    """tensorboardX's imports, without its gs:// writer's when `run_dir` is a local directory:
    each module of _REMOTE_ONLY not imported yet is None in ``sys.modules`` meanwhile, which its
    import reads as not installed (tensorboardX then refuses gs:// paths, which a local run never
    gives it). Once tensorboardX is imported, this does nothing."""
    hidden = (
        [m for m in _REMOTE_ONLY if m not in sys.modules]
        if run_dir is not None and not _is_remote(run_dir) and "tensorboardX" not in sys.modules
        else []
    )
    for m in hidden:
        sys.modules[m] = None  # type: ignore[assignment]  # None there makes importing it fail, by design
    try:
        yield
    finally:
        for m in hidden:
            if sys.modules.get(m, 0) is None:
                del sys.modules[m]


class RunWriter:
    def __init__(self, run_dir: str, segment: int, jobset_attempt: int, flush_seconds: float, enabled: bool):
        self.enabled = enabled
        self.run_dir = epath.Path(run_dir)
        self.remote = _is_remote(run_dir)
        self.flush_seconds = flush_seconds
        self.prefix = f"{segment:04d}-{jobset_attempt:03d}"
        self.path = self.run_dir / "metrics" / self._new_name()
        self._lines: list[str] = []
        self._last_flush = 0.0
        self._file: TextIO | None = None
        self._tb = None
        if not enabled:
            return
        (self.run_dir / "metrics").mkdir(parents=True, exist_ok=True)

    def _new_name(self) -> str:
        return f"{self.prefix}-{int(time.time() * 1000)}.jsonl"

    def _tensorboard(self) -> Any:
        if self._tb is None:
            with _event_writer_imports(str(self.run_dir)):
                from tensorboardX import FileWriter  # slow import, process 0 only

            # The event-file writer itself: the loop adds whole Summary protos (below), which is
            # all SummaryWriter would do with it.
            self._tb = FileWriter(
                str(self.run_dir / "tensorboard"), flush_secs=int(max(self.flush_seconds, 1))
            )
        return self._tb

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        line = json.dumps(record, separators=(",", ":"))
        if not self.remote:
            if self._file is None:  # created with the first record: a run that trains nothing leaves none
                self._file = open(self.path, "a")  # noqa: SIM115 (kept open for the run)
            self._file.write(line + "\n")
            self._file.flush()
        else:
            self._lines.append(line)
            if time.monotonic() - self._last_flush >= self.flush_seconds:
                self.flush()
        events = self._tensorboard()  # first: it imports tensorboardX
        from tensorboardX.proto.summary_pb2 import Summary

        # One event per step holding every scalar: each event is a multiprocessing-queue put in
        # tensorboardX, too costly to pay per key on the training host.
        values = [
            Summary.Value(tag=k, simple_value=float(v))
            for k, v in record.items()
            if "/" in k and isinstance(v, (int, float)) and not isinstance(v, bool)
        ]
        events.add_summary(Summary(value=values), record["step"])

    def flush(self) -> None:
        if not self.enabled:
            return
        if self.remote and self._lines:
            self.path.write_text("\n".join(self._lines) + "\n")
            if len(self._lines) >= ROTATE_LINES:  # keep each rewrite small: continue in a new object
                self.path = self.run_dir / "metrics" / self._new_name()
                self._lines = []
        self._last_flush = time.monotonic()
        if self._tb is not None:
            self._tb.flush()

    def status(self, **fields: Any) -> None:
        """Rewrite ``status.json`` (small; written at start, at each checkpoint and at exit)."""
        if self.enabled:
            (self.run_dir / "status.json").write_text(json.dumps({**fields, "time": time.time()}))

    def close(self) -> None:
        if not self.enabled:
            return
        self.flush()
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()
