"""What the pages of `reslice ui` show, as JSON-ready dicts: the runs list and one run's page. Pure:
the record, the report (launcher/core/accounting.build_report, the accounting `status` prints), the
metrics, the ledger and the pods come in; nothing is read here. And a sweep's page, from its stored
results (launcher/sweep). Called by launcher/ui/sources.py."""

from __future__ import annotations

from dataclasses import asdict

from contract.words import STATE_SOURCE
from launcher.core.accounting import CATEGORIES, LOSS, RunReport, first_state_source
from launcher.core.record import RunRecord
from launcher.core.words import LedgerKind, RunState
from launcher.sweep.results import FactorResult, Recommendation, ordered
from launcher.sweep.spec import SweepSpec

# The ledger lines the timeline shows: the controller's decisions (with their reasons) and the
# disruptions it saw (observations that carry `disruptions`); the routine observations are left out.
DECISIONS = frozenset({LedgerKind.ACT, LedgerKind.TAKEOVER, LedgerKind.LAUNCH, LedgerKind.CONFLICT,
                       LedgerKind.WAIT, LedgerKind.RELAUNCH, LedgerKind.UNUSABLE_CHECKPOINT})  # fmt: skip
EVAL_PREFIX = "eval/"
EVAL_SUFFIX = "/loss"
# The newest ledger lines a run page carries: the timeline is for reading, not an archive.
TIMELINE_LIMIT = 200


def shape_of(preset: str, slices: int) -> str:
    return f"{preset} x{slices}"


def run_row(rec: RunRecord, report: RunReport | None, now: float, error: str | None = None) -> dict:
    """One line of the runs page. `report` is None when the run directory could not be read
    (`error` says why): the record's own columns are still shown."""
    seg = rec.current
    return {
        "run": rec.name,
        "state": rec.state,
        "reason": rec.reason,
        "shape": shape_of(seg.preset, seg.slices) if seg else "-",
        "requested": shape_of(rec.preset, rec.slices),
        "segments": len(rec.segments),
        "step": report.latest_step if report else None,
        "total_steps": rec.total_steps,
        "goodput": round(report.badput.goodput, 4) if report else None,
        "restarts": {k: v for k, v in report.restarts.items() if v} if report else {},
        "age_s": round(now - rec.created_at, 1) if rec.created_at else None,
        "error": error,
    }


def _loss_points(metrics: list[dict]) -> list[dict]:
    """Per segment: the training losses [step, loss] in the order they were computed (a resume
    from an older checkpoint computes some steps again: both computations are drawn), and the
    evaluation losses by split."""
    by_seg: dict[int, dict] = {}
    for m in sorted(metrics, key=lambda m: m.get("time", 0.0)):
        seg = by_seg.setdefault(int(m.get("segment", 0)), {"loss": [], "eval": {}})
        if LOSS in m and "step" in m:
            seg["loss"].append([m["step"], m[LOSS]])
        for key, value in m.items():
            if key.startswith(EVAL_PREFIX) and key.endswith(EVAL_SUFFIX) and "step" in m:
                split = key[len(EVAL_PREFIX) : -len(EVAL_SUFFIX)]
                seg["eval"].setdefault(split, []).append([m["step"], value])
    return [{"segment": k, **v} for k, v in sorted(by_seg.items())]


def _badput(b) -> list[dict]:
    rows = [{"name": "productive", "label": "productive training", "seconds": round(b.productive, 3)}]
    rows += [
        {"name": name, "label": label, "seconds": round(getattr(b, name), 3)} for name, _, label in CATEGORIES
    ]
    return rows  # fmt: skip


def _timeline(ledger: list[dict]) -> list[dict]:
    """Decisions with their reasons and the disruptions seen, oldest first."""
    out = []
    for e in ledger:
        kind = e.get("kind")
        if kind in DECISIONS:
            what = e.get("reason") or e.get("action") or kind
            out.append({"time": e.get("time"), "kind": kind, "action": e.get("action"), "text": what})
        if e.get("disruptions"):
            text = "; ".join(map(str, e["disruptions"]))
            out.append({"time": e.get("time"), "kind": "disruption", "action": None, "text": text})
    out.sort(key=lambda x: x["time"] or 0.0)
    return out[-TIMELINE_LIMIT:]


def _world(rec: RunRecord, report: RunReport, pods: list[dict]) -> dict:
    """The current segment's slices and node pools, the run's pods now (in place, the survivors'
    pods stay from one segment to the next: their age says so), and where each segment's state
    came from."""
    seg = rec.current
    sources = {s.index: s.state_source for s in report.segments}
    return {
        "segment": seg.index if seg else None,
        "shape": shape_of(seg.preset, seg.slices) if seg else None,
        "restart_mode": rec.spec.restart_mode,
        "slices": list(seg.slice_ids) if seg else [],
        "nodepools": list(seg.nodepools) if seg else [],
        "pool": seg.pool if seg else None,
        "joining": list(seg.joining) if seg else [],
        "lost": list(seg.lost) if seg else [],
        "pods": pods,
        STATE_SOURCE: [
            {
                "segment": s.index,
                STATE_SOURCE: sources.get(s.index) or first_state_source(s.index),
                "start_step": s.start_step,
            }
            for s in rec.segments
        ],
    }


def pod_row(pod: dict) -> dict:
    """A pod as the world panel lists it: name, node, phase, when it was created, restarts."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    restarts = sum(c.get("restartCount", 0) for c in status.get("containerStatuses") or [])
    return {
        "name": meta.get("name"),
        "node": spec.get("nodeName"),
        "phase": status.get("phase"),
        "created": meta.get("creationTimestamp"),
        "restarts": restarts,
    }


def run_page(
    rec: RunRecord,
    report: RunReport,
    metrics: list[dict],
    ledger: list[dict],
    committed: int | None,
    pods: list[dict],
    now: float,
) -> dict:
    """Everything a run's page shows. `segments` is `status --json`'s list as it is (one source for
    both), with the record's own columns (why it started, the JobSet) beside it."""
    status = {**report.as_dict(), "latest_committed_step": committed, "total_steps": rec.total_steps}
    started = {s.index: s for s in rec.segments}
    for s in status["segments"]:
        seg = started.get(s["index"])
        s["started_because"] = seg.reason if seg else None
        s["live"] = bool(seg and seg.live)
        s[STATE_SOURCE] = s[STATE_SOURCE] or first_state_source(s["index"])
    return {
        **status,
        "row": run_row(rec, report, now),
        "global_batch": rec.spec.global_batch,
        "loss": _loss_points(metrics),
        "badput": _badput(report.badput),
        "timeline": _timeline(ledger),
        "world": _world(rec, report, pods),
        "now": now,
    }


def sweep_page(spec: SweepSpec, results: list[FactorResult], rec: Recommendation) -> dict:
    """A sweep's page: its results in `sweep-report`'s order (launcher/sweep/results.ordered), the
    recommended factor marked, and the recommendation's words."""
    return {
        "sweep": spec.name,
        "title": f"{spec.config} on {shape_of(spec.preset, spec.slices)}, global batch {spec.global_batch}, "
        f"steps {spec.warmup + 1}–{spec.steps} measured ({spec.trainer})",
        "recommendation": asdict(rec),
        "rows": [
            {
                **asdict(r),
                "label": r.label,
                "finished": r.state == RunState.FINISHED,
                "recommended": rec.factor is not None and r.factor == rec.factor,
            }
            for r in ordered(results)
        ],
    }
