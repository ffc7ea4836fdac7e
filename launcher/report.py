"""Goodput and badput of a run, per segment, from the run record, the trainer's metrics and the
controller's ledger. Pure accounting: no disk, no plotting (launcher/report_plots.py draws it).
Called by launcher/status.py (`reslice status`, `report`) and launcher/view.py (the tables).

Goodput = productive training time / wall time. Productive time is the step time of every step
whose result the run kept (the last computation of that step). The rest of the wall time is badput,
by cause:
- recomputed: steps computed again after a resume from an older checkpoint;
- checkpointing: blocking time of checkpoint saves;
- waiting for capacity: pods unschedulable, or no shape of the ladder fitting the cluster;
- restart and recovery: everything else between a disruption and the next productive step —
  rescheduling, process start, compilation, restore.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.record import WAITING, RunRecord

LOSS = "learning/loss"
STEP_TIME = "perf/step_time_seconds"
SAVE_TIME = "perf/checkpoint_save_seconds"
TOKENS = "perf/tokens_per_sec"


@dataclass
class Badput:
    productive: float = 0.0
    recomputed: float = 0.0
    checkpointing: float = 0.0
    waiting_for_capacity: float = 0.0
    restart_and_recovery: float = 0.0
    wall: float = 0.0

    @property
    def goodput(self) -> float:
        return self.productive / self.wall if self.wall > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "wall_s": round(self.wall, 3),
            "productive_s": round(self.productive, 3),
            "goodput": round(self.goodput, 4),
            "badput_s": {
                "waiting_for_capacity": round(self.waiting_for_capacity, 3),
                "restart_and_recovery": round(self.restart_and_recovery, 3),
                "recomputed_steps": round(self.recomputed, 3),
                "checkpointing": round(self.checkpointing, 3),
            },
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
    end_kind: str | None
    end_reason: str | None
    badput: Badput = field(default_factory=Badput)


@dataclass
class RunReport:
    run: str
    state: str
    reason: str
    badput: Badput
    segments: list[SegmentReport]
    restarts: dict[str, int]
    latest_step: int | None

    def as_dict(self) -> dict:
        return {
            "run": self.run,
            "state": self.state,
            "reason": self.reason,
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
        if e.get("kind") == "observe":
            unschedulable = bool(e.get("unschedulable"))
        elif e.get("kind") in {"act", "wait"}:
            no_fit = e.get("state") == WAITING
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


def _overlap(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in intervals)


def build_report(rec: RunRecord, metrics: list[dict], ledger: list[dict], now: float) -> RunReport:
    end = rec.finished_at or now
    kept, ordered = kept_computations(metrics)
    waits = waiting_intervals(ledger, end)
    segments = []
    total = Badput(wall=max(0.0, end - rec.created_at))
    for i, seg in enumerate(rec.segments):
        start = rec.created_at if i == 0 else seg.submitted_at
        stop = rec.segments[i + 1].submitted_at if i + 1 < len(rec.segments) else end
        rows = [(j, m) for j, m in enumerate(ordered) if m.get("segment") == seg.index]
        b = Badput(wall=max(0.0, stop - start))
        b.productive = sum(m.get(STEP_TIME, 0.0) for j, m in rows if j in kept)
        b.recomputed = sum(m.get(STEP_TIME, 0.0) for j, m in rows if j not in kept)
        b.checkpointing = sum(m.get(SAVE_TIME, 0.0) or 0.0 for _, m in rows)
        b.waiting_for_capacity = _overlap(waits, start, stop)
        b.restart_and_recovery = max(
            0.0, b.wall - b.productive - b.recomputed - b.checkpointing - b.waiting_for_capacity
        )
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
            )
        )
        for name in (
            "productive",
            "recomputed",
            "checkpointing",
            "waiting_for_capacity",
            "restart_and_recovery",
        ):
            setattr(total, name, getattr(total, name) + getattr(b, name))
    restarts = {
        "preemption": rec.preemptions(),
        "peer_lost": rec.peer_losses(),
        "application_failure": rec.app_failures,
        "capacity_lost": sum(s.end_kind == "capacity-lost" for s in rec.segments),
        "grow": sum(s.end_kind == "grow" for s in rec.segments),
    }
    return RunReport(
        run=rec.name,
        state=rec.state,
        reason=rec.reason,
        badput=total,
        segments=segments,
        restarts=restarts,
        latest_step=max((m["step"] for m in ordered), default=None),
    )
