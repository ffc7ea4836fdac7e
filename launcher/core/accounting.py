"""Goodput and badput of a run, per segment, from the run record, the trainer's metrics and the
controller's ledger. Pure accounting: no disk, no plotting (launcher/report/plots.py draws it).
Called by launcher/report/io.py (`reslice status`, `report`) and launcher/report/view.py (the tables).

Goodput = productive training time / wall time. Productive time is the step time of every step
whose result the run kept (the last computation of that step). The rest of the wall time is badput,
split by cause as ml-goodput-measurement splits it (docs/design.md, "Goodput"); every second of a
segment lands in exactly one of:
- scheduling: from a submit or a fault until the pods run, the wait for capacity included, and the
  end of a segment after its last step (the remainder: what the other categories do not claim);
- startup: pods running -> the trainer ready to compile (process start, jax.distributed, building
  the state), and the start barrier's wait for the slowest peer;
- compilation: `perf/compile_seconds`; restore: `perf/restore_seconds` (first record of each
  trainer incarnation);
- data_loading: the blocking data loading of the first step of each incarnation; later steps load
  their batch while the device runs the step before (not badput: ml-goodput's DATA_LOADING_ASYNC);
- recomputed: steps computed again after a resume from an older checkpoint;
- checkpointing: blocking time of checkpoint saves;
- evaluation: held-out evaluation (`perf/eval_seconds`), which no step's time includes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from contract.words import STATE_SOURCE, STATE_SOURCE_KEYS, StateSource, read_state_source
from launcher.core.record import RunRecord
from launcher.core.words import EndKind, LedgerKind, RunState

LOSS = "learning/loss"
STEP_TIME = "perf/step_time_seconds"
SAVE_TIME = "perf/checkpoint_save_seconds"
DATA_TIME = "perf/data_loading_seconds"
COMPILE_TIME = "perf/compile_seconds"
RESTORE_TIME = "perf/restore_seconds"
EVAL_TIME = "perf/eval_seconds"
TOKENS = "perf/tokens_per_sec"

# The badput categories: (Badput attribute, JSON key, label). Their sum and `productive` are the wall.
CATEGORIES = (
    ("scheduling", "scheduling", "scheduling and waiting"),
    ("startup", "startup", "process start-up"),
    ("compilation", "compilation", "compilation"),
    ("restore", "checkpoint_restore", "checkpoint restore"),
    ("data_loading", "data_loading", "data loading"),
    ("recomputed", "recomputed_steps", "recomputed steps"),
    ("checkpointing", "checkpoint_save", "checkpoint saves"),
    ("evaluation", "evaluation", "evaluation"),
)


@dataclass
class Badput:
    productive: float = 0.0
    scheduling: float = 0.0
    startup: float = 0.0
    compilation: float = 0.0
    restore: float = 0.0
    data_loading: float = 0.0
    recomputed: float = 0.0
    checkpointing: float = 0.0
    evaluation: float = 0.0
    # Of `scheduling`: pods unschedulable or no shape of the ladder fitting (the ledger says which).
    waiting_for_capacity: float = 0.0
    wall: float = 0.0

    @property
    def goodput(self) -> float:
        return self.productive / self.wall if self.wall > 0 else 0.0

    @property
    def restart_and_recovery(self) -> float:
        """The lump the report showed before the split: what is neither training, recomputation,
        a save nor the wait for capacity."""
        return max(
            0.0,
            self.wall
            - self.productive
            - self.recomputed
            - self.checkpointing
            - self.evaluation
            - self.waiting_for_capacity,
        )

    def add(self, other: Badput) -> None:
        for name in ("productive", "waiting_for_capacity", "wall", *(c[0] for c in CATEGORIES)):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def as_dict(self) -> dict:
        return {
            "wall_s": round(self.wall, 3),
            "productive_s": round(self.productive, 3),
            "goodput": round(self.goodput, 4),
            "badput_s": {key: round(getattr(self, name), 3) for name, key, _ in CATEGORIES},
            "waiting_for_capacity_s": round(self.waiting_for_capacity, 3),
        }


@dataclass
class SegmentReport:
    index: int
    shape: str
    devices: int
    micro_batch: int
    grad_accum: int
    start: float
    end: float
    first_step: int | None
    last_step: int | None
    steps_computed: int
    recomputed_steps: int
    end_kind: EndKind | None
    end_reason: str | None
    badput: Badput = field(default_factory=Badput)
    # Where the segment's first trainer incarnation got its state (its first record's
    # `state_source`, or an older trainer's spelling of it); None: a trainer that does not say.
    state_source: StateSource | None = None


@dataclass
class RunReport:
    run: str
    state: str
    reason: str
    badput: Badput
    segments: list[SegmentReport]
    restarts: dict[str, int]
    latest_step: int | None
    # What the run waits for now, from the ledger's newest decision (`waiting_now`): {"wait": a
    # words.WaitReason, "reason": its words}, or None while nothing holds it.
    waiting: dict | None = None

    def as_dict(self) -> dict:
        return {
            "run": self.run,
            "state": self.state,
            "reason": self.reason,
            "waiting": self.waiting,
            "latest_step": self.latest_step,
            "restarts": self.restarts,
            **self.badput.as_dict(),
            "segments": [
                {
                    "index": s.index,
                    "shape": s.shape,
                    "devices": s.devices,
                    "micro_batch": s.micro_batch,
                    "grad_accum": s.grad_accum,
                    "start": s.start,
                    "end": s.end,
                    "steps": [s.first_step, s.last_step],
                    "steps_computed": s.steps_computed,
                    "recomputed_steps": s.recomputed_steps,
                    STATE_SOURCE: s.state_source,
                    "end_kind": s.end_kind,
                    "end_reason": s.end_reason,
                    **s.badput.as_dict(),
                }
                for s in self.segments
            ],
        }


def kept_computations(metrics: list[dict]) -> tuple[set[int], list[dict]]:
    """Indices (into `metrics`, sorted by time) of the computation of each step that was kept —
    the last one — and the list itself."""
    ordered = sorted(metrics, key=lambda m: m.get("time", 0.0))
    last: dict[int, int] = {}
    for i, m in enumerate(ordered):
        last[m["step"]] = i
    return set(last.values()), ordered


def waiting_intervals(ledger: list[dict], end: float) -> list[tuple[float, float]]:
    """Intervals in which the run waited for capacity: its pods were unschedulable (observations)
    or no shape fitted the cluster (decisions in state WaitingForCapacity)."""
    intervals = []
    unschedulable = no_fit = False
    since = None
    for e in sorted(ledger, key=lambda e: e.get("time", 0.0)):
        if e.get("kind") == LedgerKind.OBSERVE:
            unschedulable = bool(e.get("unschedulable"))
        elif e.get("kind") in {LedgerKind.ACT, LedgerKind.WAIT}:
            no_fit = e.get("state") == RunState.WAITING
        else:
            continue
        waiting, t = unschedulable or no_fit, e.get("time", 0.0)
        if waiting and since is None:
            since = t
        elif not waiting and since is not None:
            intervals.append((since, t))
            since = None
    if since is not None:
        intervals.append((since, end))
    return intervals


def waiting_now(ledger: list[dict]) -> dict | None:
    """What the newest decision in the ledger waits for, when it is a wait for capacity (its `wait`
    key, policy/shared.Decision.wait): the record keeps the reason of the last action, while a
    run held back by capacity or by Kueue says so only in its wait lines."""
    decisions = [e for e in ledger if e.get("kind") in {LedgerKind.ACT, LedgerKind.WAIT}]
    last = max(decisions, key=lambda e: e.get("time", 0.0), default=None)
    if last is None or last.get("kind") != LedgerKind.WAIT or not last.get("wait"):
        return None
    return {"wait": last["wait"], "reason": last.get("reason", "")}


def _overlap(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in intervals)


def _all_running(entry: dict) -> bool | None:
    """An observation's "pods": "R/E running" (signals.Observation.summary): all E running, or None
    when the entry says nothing about pods."""
    pods = entry.get("pods")
    if not isinstance(pods, str):
        return None
    running, _, expected = pods.partition(" ")[0].partition("/")
    return running.isdigit() and expected.isdigit() and 0 < int(expected) == int(running)


def pods_running_at(ledger: list[dict], segment: int, after: float) -> float:
    """When the segment's pods were all running again after `after` (a submit, or the last step of
    the incarnation before): the first observation of them all running that follows one of them
    not running. `after` itself when the ledger saw no pod go down (a process restarted in its pod,
    or a ledger without pod observations): the gap is then start-up, not scheduling."""
    down = False
    for e in sorted(ledger, key=lambda e: e.get("time", 0.0)):
        if e.get("kind") != LedgerKind.OBSERVE or e.get("segment", segment) != segment:
            continue
        up = _all_running(e)
        if up is None:
            continue
        if e.get("time", 0.0) <= after:
            down = not up
        elif not up:
            down = True
        elif down:
            return e.get("time", 0.0)
    return after


def jobset_attempt(row: dict) -> Any:
    """The JobSet attempt of a trainer's record (a metrics row, status.json's `restored`): which
    attempt of its (slice) JobSet the pod is. Records written before the key was renamed call it
    `restart_attempt`: read too, never written."""
    return row["jobset_attempt"] if "jobset_attempt" in row else row.get("restart_attempt")


def incarnations(rows: list[tuple[int, dict]]) -> list[list[tuple[int, dict]]]:
    """A segment's records (index, record), in time order, cut where the JobSet attempt changes:
    one list per trainer incarnation."""
    groups: list[list[tuple[int, dict]]] = []
    for j, m in rows:
        if not groups or jobset_attempt(groups[-1][0][1]) != jobset_attempt(m):
            groups.append([])
        groups[-1].append((j, m))
    return groups


def segment_badput(
    rows: list[tuple[int, dict]], kept: set[int], ledger: list[dict], segment: int, start: float, stop: float
) -> Badput:
    """The badput of one segment [start, stop) from its records (index into the time-ordered
    metrics, record): each incarnation's start-up gap, then its steps; the rest is scheduling."""
    b = Badput(wall=max(0.0, stop - start))
    cursor = start
    for inc in incarnations(rows):
        first = inc[0][1]
        # Before the first step's clock: restore, compile, and before them the pods and the process.
        first_start = max(cursor, first.get("time", cursor) - (first.get(STEP_TIME) or 0.0))
        gap = first_start - cursor
        restore = min(first.get(RESTORE_TIME) or 0.0, gap)
        compilation = min(first.get(COMPILE_TIME) or 0.0, gap - restore)
        rest = gap - restore - compilation
        scheduling = min(rest, max(0.0, pods_running_at(ledger, segment, cursor) - cursor))
        b.restore += restore
        b.compilation += compilation
        b.startup += rest - scheduling
        for k, (j, m) in enumerate(inc):
            step = m.get(STEP_TIME) or 0.0
            # Only the first step waits for its batch: nothing is on the device to overlap with.
            data = min(m.get(DATA_TIME) or 0.0, step) if k == 0 else 0.0
            b.data_loading += data
            if j in kept:
                b.productive += step - data
            else:
                b.recomputed += step - data
            b.checkpointing += m.get(SAVE_TIME) or 0.0
            b.evaluation += m.get(EVAL_TIME) or 0.0
        last = inc[-1][1]
        after = (last.get(SAVE_TIME) or 0.0) + (last.get(EVAL_TIME) or 0.0)  # both follow its "time"
        cursor = max(cursor, last.get("time", cursor) + after)
    claimed = b.productive + sum(getattr(b, name) for name, _, _ in CATEGORIES if name != "scheduling")
    b.scheduling = max(0.0, b.wall - claimed)
    return b


def first_state_source(index: int) -> StateSource | None:
    """What a segment's state source is before its trainer says: a run's first segment starts
    fresh; any other: not known yet."""
    return StateSource.FRESH if index == 0 else None


def state_source(rows: list[dict]) -> StateSource | None:
    """The state source of the earliest record that says one (each incarnation's first record),
    under its key or an older trainer's (contract.words.read_state_source)."""
    for m in rows:
        if any(k in m for k in STATE_SOURCE_KEYS):
            return read_state_source(m)
    return None


def handoff(submitted: float, rows: list[tuple[int, dict]]) -> float:
    """Where a segment ends and the next begins: the next one's submission, or, in place, where the
    old world's last step (and its save) ended, if later: the surviving trainers train on until the
    new world's take over, and those steps are the old segment's."""
    if not rows:
        return submitted
    last = rows[-1][1]
    done = last.get("time", submitted) + (last.get(SAVE_TIME) or 0.0) + (last.get(EVAL_TIME) or 0.0)
    return max(submitted, done)


def build_report(rec: RunRecord, metrics: list[dict], ledger: list[dict], now: float) -> RunReport:
    end = rec.finished_at or now
    kept, ordered = kept_computations(metrics)
    waits = waiting_intervals(ledger, end)
    segments = []
    total = Badput()
    rows_of = {
        seg.index: [(j, m) for j, m in enumerate(ordered) if m.get("segment") == seg.index]
        for seg in rec.segments
    }
    start = rec.created_at
    for i, seg in enumerate(rec.segments):
        rows = rows_of[seg.index]
        stop = end if i + 1 == len(rec.segments) else handoff(rec.segments[i + 1].submitted_at, rows)
        start = rec.created_at if i == 0 else min(start, stop)
        b = segment_badput(rows, kept, ledger, seg.index, start, stop)
        b.waiting_for_capacity = min(_overlap(waits, start, stop), b.scheduling)
        steps = [m["step"] for _, m in rows]
        segments.append(
            SegmentReport(
                index=seg.index,
                shape=f"{seg.preset} x{seg.slices}",
                devices=seg.devices,
                micro_batch=seg.micro_batch,
                grad_accum=seg.grad_accum,
                start=start,
                end=stop,
                first_step=min(steps) if steps else None,
                last_step=max(steps) if steps else None,
                steps_computed=len(rows),
                recomputed_steps=sum(1 for j, _ in rows if j not in kept),
                end_kind=seg.end_kind,
                end_reason=seg.end_reason,
                badput=b,
                state_source=state_source([m for _, m in rows]),
            )
        )
        total.add(b)
        start = stop
    total.wall = max(0.0, end - rec.created_at)
    restarts = {
        "preemption": rec.preemptions(),
        "peer_lost": rec.peer_losses(),
        "application_failure": rec.app_failures,
        # Hosts that rebooted under a pod (docs/design.md "A rebooted host"): never counted.
        "host_disruption": len(rec.host_disruptions),
        "capacity_lost": sum(s.end_kind == EndKind.CAPACITY_LOST for s in rec.segments),
        "grow": sum(s.end_kind == EndKind.GROW for s in rec.segments),
    }
    return RunReport(
        run=rec.name,
        state=rec.state,
        reason=rec.reason,
        badput=total,
        segments=segments,
        restarts=restarts,
        latest_step=max((m["step"] for m in ordered), default=None),
        waiting=None if rec.terminal else waiting_now(ledger),
    )
