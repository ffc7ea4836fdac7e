"""Goodput accounting on a hand-made history where every second is known."""

from dataclasses import replace

import pytest

from launcher import record
from launcher.plan import Plan
from launcher.presets import make_shape
from launcher.record import RunRecord, new_segment
from launcher.render import RunSpec
from launcher.report import build_report, waiting_intervals
from launcher.report_plots import plot_loss, plot_timeline

T0 = 1000.0


def history():
    """Launch at T0. Segment 0 (2 slices): steps 1-4 at 1 s each from T0+10, a 0.5 s save after
    step 4; capacity lost at T0+20, pods unschedulable T0+20..T0+30. Segment 1 (1 slice) submitted
    at T0+30, resumes from step 2 (steps 3 and 4 are recomputed), steps 3-6 at 2 s each from T0+40;
    finished at T0+50."""
    rec = RunRecord(spec=RunSpec(run="r", run_dir="/tmp/r", global_batch=32), preset="tpu7x-2x2x2", slices=2,
                    created_at=T0)  # fmt: skip
    s0 = new_segment(rec, make_shape("tpu7x-2x2x2", 2), Plan(32, 1, 1), T0, "launch", None)
    rec = rec.with_segment(replace(s0, ended_at=T0 + 30, end_kind="capacity-lost", end_reason="lost"))
    s1 = new_segment(rec, make_shape("tpu7x-2x2x2", 1), Plan(16, 2, 1), T0 + 30, "shrink", 2)
    rec = replace(rec.with_segment(replace(s1, ended_at=T0 + 50, end_kind="finished")), state=record.FINISHED,
                  finished_at=T0 + 50)  # fmt: skip
    metrics = [
        {
            "step": s,
            "segment": 0,
            "time": T0 + 10 + s,
            "perf/step_time_seconds": 1.0,
            "learning/loss": 5.0 - s / 10,
        }
        for s in range(1, 5)
    ]
    metrics[-1]["perf/checkpoint_save_seconds"] = 0.5
    metrics += [
        {"step": s, "segment": 1, "time": T0 + 40 + 2 * (s - 2), "perf/step_time_seconds": 2.0,
         "learning/loss": 5.0 - s / 10}
        for s in range(3, 7)
    ]  # fmt: skip
    ledger = [
        {"time": T0 + 20, "kind": "observe", "unschedulable": 1},
        {"time": T0 + 30, "kind": "act", "action": "submit", "state": record.RUNNING},
        {"time": T0 + 30.5, "kind": "observe", "unschedulable": 0},
    ]
    return rec, metrics, ledger


def test_goodput_breakdown():
    rec, metrics, ledger = history()
    report = build_report(rec, metrics, ledger, now=T0 + 999)
    b = report.badput
    assert b.wall == 50
    assert b.productive == pytest.approx(2 * 1.0 + 4 * 2.0)  # steps 1-2 on seg 0, 3-6 on seg 1
    assert b.recomputed == pytest.approx(2 * 1.0)  # steps 3-4 of seg 0 were thrown away
    assert b.checkpointing == pytest.approx(0.5)
    assert b.waiting_for_capacity == pytest.approx(10.5)
    assert b.restart_and_recovery == pytest.approx(50 - 10 - 2 - 0.5 - 10.5)
    assert b.goodput == pytest.approx(10 / 50)
    seg0, seg1 = report.segments
    assert (seg0.first_step, seg0.last_step, seg0.recomputed_steps) == (1, 4, 2)
    assert (seg1.first_step, seg1.last_step, seg1.recomputed_steps) == (3, 6, 0)
    assert seg0.badput.wall + seg1.badput.wall == b.wall
    assert report.restarts["capacity_lost"] == 1 and report.latest_step == 6


def test_waiting_for_capacity_when_nothing_fits():
    ledger = [
        {"time": 10, "kind": "wait", "action": "wait", "state": record.WAITING},
        {"time": 25, "kind": "act", "action": "submit", "state": record.RUNNING},
        {"time": 30, "kind": "observe", "unschedulable": 2},
    ]
    assert waiting_intervals(ledger, end=40) == [(10, 25), (30, 40)]


def test_plots_are_pngs(tmp_path):
    rec, metrics, ledger = history()
    report = build_report(rec, metrics, ledger, now=T0 + 999)
    plot_loss(report, metrics, str(tmp_path / "loss.png"))
    plot_timeline(report, str(tmp_path / "timeline.png"))
    for name in ("loss.png", "timeline.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_live_view_interleaves_disruptions_with_actions_in_time_order():
    from rich.console import Console

    from launcher.view import live_view

    rec, metrics, _ = history()
    ledger = [
        {"time": T0 + 1, "kind": "launch", "reason": "launched"},
        {"time": T0 + 20, "kind": "observe", "disruptions": ["node pool np-1: gone"]},
        {"time": T0 + 21, "kind": "act", "reason": "shrinking"},
        {"time": T0 + 50, "kind": "act", "reason": "trainer finished step 6"},
    ]
    console = Console(width=200, record=True)
    console.print(live_view(rec, metrics[-1], ledger, committed=6))
    text = console.export_text()
    order = [text.index(s) for s in ("launched", "np-1: gone", "shrinking", "finished step 6")]
    assert order == sorted(order)
    assert "step 6/" in text and "loss 4.4000" in text and "committed 6" in text


def test_restarts_by_cause():
    rec, metrics, ledger = history()
    seg = replace(rec.segments[0], restarts=5, restarts_counted=1, peer_lost=2, uncounted_failures=1)
    rec = replace(rec, segments=(seg, rec.segments[1]), app_failures=3)
    restarts = build_report(rec, metrics, ledger, now=T0 + 999).restarts
    assert (restarts["preemption"], restarts["peer_lost"], restarts["application_failure"]) == (1, 2, 3)
