"""Goodput accounting on a hand-made history where every second is known."""

from dataclasses import replace

import pytest

from contract.words import STATE_SOURCE, StateSource, read_state_source
from launcher.adapters.preset_files import make_shape
from launcher.core.accounting import CATEGORIES, build_report, incarnations, jobset_attempt, waiting_intervals
from launcher.core.plan import Plan
from launcher.core.record import RunRecord, new_segment
from launcher.core.spec import RunSpec
from launcher.core.words import RunState
from launcher.report.plots import plot_loss, plot_timeline

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
    rec = replace(rec.with_segment(replace(s1, ended_at=T0 + 50, end_kind="finished")), state=RunState.FINISHED,
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
        {"time": T0 + 30, "kind": "act", "action": "start-segment", "state": RunState.RUNNING},
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


def preempted_in_place():
    """One segment from T0 to T0+30, two trainer incarnations. Pods observed 0/2 at T0+1 and 2/2 at
    T0+4; attempt 0 restores for 0.5 s (nothing) and compiles for 3 s, its step 1 (1 s, of which
    0.25 s waiting for its batch) ends at T0+10; step 2 at T0+11 then a 0.5 s save; steps 3 and 4
    at T0+12.5 and T0+13.5. Preempted: pods 0/2 (unschedulable) at T0+15, schedulable at T0+18,
    2/2 at T0+20. Attempt 1 restores step 2 in 2 s, loads its train step in 1 s, and trains steps
    3-6 (1 s each, step 3 with 0.5 s for its batch) ending at T0+25..T0+28; finished at T0+30."""
    rec = RunRecord(spec=RunSpec(run="r", run_dir="/tmp/r", global_batch=32), preset="tpu7x-2x2x2", slices=1,
                    created_at=T0)  # fmt: skip
    s0 = new_segment(rec, make_shape("tpu7x-2x2x2", 1), Plan(16, 2, 1), T0, "launch", None)
    rec = replace(rec.with_segment(replace(s0, ended_at=T0 + 30, end_kind="finished")), state=RunState.FINISHED,
                  finished_at=T0 + 30)  # fmt: skip

    def step(n, attempt, t, **extra):
        return {"step": n, "segment": 0, "jobset_attempt": attempt, "time": T0 + t,
                "perf/step_time_seconds": 1.0, "perf/data_loading_seconds": 0.01, **extra}  # fmt: skip

    metrics = [
        step(1, 0, 10, **{"perf/restore_seconds": 0.5, "perf/compile_seconds": 3.0,
                          "perf/data_loading_seconds": 0.25}),
        step(2, 0, 11, **{"perf/checkpoint_save_seconds": 0.5}),
        step(3, 0, 12.5),
        step(4, 0, 13.5),
        step(3, 1, 25, **{"perf/restore_seconds": 2.0, "perf/compile_seconds": 1.0,
                          "perf/data_loading_seconds": 0.5}),
        *(step(n, 1, 22 + n) for n in (4, 5, 6)),
    ]  # fmt: skip

    def pods(t, running, unschedulable=0):
        return {"time": T0 + t, "kind": "observe", "segment": 0, "pods": f"{running}/2 running",
                "unschedulable": unschedulable}  # fmt: skip

    ledger = [pods(1, 0), pods(4, 2), pods(15, 0, 2), pods(18, 0), pods(20, 2)]
    return rec, metrics, ledger


def test_goodput_split_as_ml_goodput_measurement_does():
    rec, metrics, ledger = preempted_in_place()
    report = build_report(rec, metrics, ledger, now=T0 + 999)
    b = report.badput
    assert b.wall == 30
    # Steps 1, 2 of attempt 0 and 3-6 of attempt 1 are kept, less the first steps' waits for a batch.
    assert b.productive == pytest.approx(6 - 0.25 - 0.5)
    assert b.data_loading == pytest.approx(0.25 + 0.5)  # later steps' 0.01 s overlapped the device
    assert b.recomputed == pytest.approx(2.0)  # steps 3 and 4 of attempt 0
    assert b.checkpointing == pytest.approx(0.5)
    assert b.restore == pytest.approx(0.5 + 2.0)
    assert b.compilation == pytest.approx(3.0 + 1.0)
    # Pods running -> the first step, less restore and compile: T0+4..T0+9 less 3.5, T0+20..T0+24 less 3.
    assert b.startup == pytest.approx(1.5 + 1.0)
    # Submit -> pods running (T0..T0+4), last step -> pods running again (T0+13.5..T0+20), and the
    # end after the last step (T0+28..T0+30).
    assert b.scheduling == pytest.approx(4 + 6.5 + 2)
    assert b.waiting_for_capacity == pytest.approx(3)  # unschedulable T0+15..T0+18, within scheduling
    categories = [name for name, _, _ in CATEGORIES]
    assert b.productive + sum(getattr(b, name) for name in categories) == pytest.approx(b.wall)
    assert report.segments[0].badput.startup == pytest.approx(b.startup)

    out = report.as_dict()
    assert out["goodput"] == pytest.approx(round(5.25 / 30, 4))
    assert out["badput_s"] == {
        "scheduling": 12.5, "startup": 2.5, "compilation": 4.0, "checkpoint_restore": 2.5,
        "data_loading": 0.75, "recomputed_steps": 2.0, "checkpoint_save": 0.5, "evaluation": 0.0,
    }  # fmt: skip
    assert out["waiting_for_capacity_s"] == 3.0 and out["segments"][0]["badput_s"] == out["badput_s"]


def test_every_second_in_one_category_on_the_shrinking_history():
    rec, metrics, ledger = history()
    b = build_report(rec, metrics, ledger, now=T0 + 999).badput
    # No pod observations: the gap before each segment's first step is start-up (T0..T0+10, T0+30..T0+40).
    assert b.startup == pytest.approx(20)
    assert b.productive + sum(getattr(b, name) for name, _, _ in CATEGORIES) == pytest.approx(b.wall)


def test_evaluation_is_its_own_category_not_training_nor_scheduling():
    """Step 2 of the preempted history evaluates for 0.75 s after its save (`perf/eval_seconds`,
    which no step time includes): those seconds leave scheduling (the remainder) for evaluation,
    and productive training is unchanged."""
    rec, metrics, ledger = preempted_in_place()
    before = build_report(rec, metrics, ledger, now=T0 + 999).badput
    metrics[1]["perf/eval_seconds"] = 0.75
    after = build_report(rec, metrics, ledger, now=T0 + 999).badput
    assert after.evaluation == pytest.approx(0.75) and before.evaluation == 0
    assert after.productive == pytest.approx(before.productive)
    assert after.scheduling == pytest.approx(before.scheduling - 0.75)
    assert after.productive + sum(getattr(after, name) for name, _, _ in CATEGORIES) == pytest.approx(
        after.wall
    )
    assert build_report(rec, metrics, ledger, now=T0 + 999).as_dict()["badput_s"]["evaluation"] == 0.75


def test_badput_table_shows_each_category():
    from rich.console import Console

    from launcher.report.view import badput_table

    rec, metrics, ledger = preempted_in_place()
    console = Console(width=120, record=True)
    console.print(badput_table(build_report(rec, metrics, ledger, now=T0 + 999)))
    text = console.export_text()
    for label, secs in [("scheduling and waiting", "12.5"), ("of which waiting for capacity", "3.0"),
                        ("process start-up", "2.5"), ("compilation", "4.0"), ("checkpoint restore", "2.5"),
                        ("data loading", "0.8"), ("recomputed steps", "2.0"), ("checkpoint saves", "0.5")]:  # fmt: skip
        line = next(x for x in text.splitlines() if label in x)
        assert secs in line, line


def test_waiting_for_capacity_when_nothing_fits():
    ledger = [
        {"time": 10, "kind": "wait", "action": "wait", "state": RunState.WAITING},
        {"time": 25, "kind": "act", "action": "start-segment", "state": RunState.RUNNING},
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

    from launcher.report.view import live_view

    rec, metrics, _ = history()
    ledger = [
        {"time": T0 + 1, "kind": "launch", "reason": "launched"},
        {"time": T0 + 20, "kind": "observe", "disruptions": ["node pool np-1: gone"]},
        {"time": T0 + 20.5, "kind": "observe", "disruptions": ["node pool np-1: gone"]},  # the same, again
        {"time": T0 + 21, "kind": "act", "reason": "shrinking"},
        {"time": T0 + 50, "kind": "act", "reason": "trainer finished step 6"},
    ]
    console = Console(width=200, record=True)
    console.print(live_view(rec, metrics[-1], ledger, committed=6))
    text = console.export_text()
    order = [text.index(s) for s in ("launched", "np-1: gone", "shrinking", "finished step 6")]
    assert order == sorted(order)
    assert text.count("np-1: gone") == 1  # consecutive observations of the same disruption: one line
    assert "step 6/" in text and "loss 4.4000" in text and "committed 6" in text


def test_restarts_by_cause():
    rec, metrics, ledger = history()
    seg = replace(rec.segments[0], restarts=5, restarts_counted=1, peer_lost=2, uncounted_failures=1)
    rec = replace(rec, segments=(seg, rec.segments[1]), app_failures=3)
    restarts = build_report(rec, metrics, ledger, now=T0 + 999).restarts
    assert (restarts["preemption"], restarts["peer_lost"], restarts["application_failure"]) == (1, 2, 3)


def test_each_segment_says_where_its_state_came_from():
    """`state_source` is the segment's first incarnation's `state_source` (the trainer's first
    record): `fresh` for a fresh start, and a segment whose trainer does not say stays null."""
    rec, metrics, ledger = history()
    first = next(m for m in metrics if m["segment"] == 0)
    later = sorted((m for m in metrics if m["segment"] == 1), key=lambda m: m["time"])
    first.update({STATE_SOURCE: "fresh", "restore/step": 0})
    later[0].update({STATE_SOURCE: "memory", "restore/step": 2})
    segments = build_report(rec, metrics, ledger, T0 + 60).as_dict()["segments"]
    assert [s[STATE_SOURCE] for s in segments] == [StateSource.FRESH, StateSource.MEMORY]
    assert [s["recomputed_steps"] for s in segments] == [2, 0]
    later[0][STATE_SOURCE] = "tape"  # not a source this launcher knows
    assert build_report(rec, metrics, ledger, T0 + 60).segments[1].state_source is None
    del later[0][STATE_SOURCE]
    assert build_report(rec, metrics, ledger, T0 + 60).segments[1].state_source is None  # says none


def test_an_older_trainers_restore_from_reads_as_the_state_source():
    """Metrics files an older trainer wrote spell it `restore/from`, null for a fresh start: the
    report reads them as the same state sources."""
    rec, metrics, ledger = history()
    first = next(m for m in metrics if m["segment"] == 0)
    later = sorted((m for m in metrics if m["segment"] == 1), key=lambda m: m["time"])
    first.update({"restore/from": None, "restore/step": 0})
    later[0].update({"restore/from": "peers", "restore/step": 2})
    segments = build_report(rec, metrics, ledger, T0 + 60).as_dict()["segments"]
    assert [s[STATE_SOURCE] for s in segments] == [StateSource.FRESH, StateSource.PEERS]


def test_the_state_source_has_one_key_and_reads_the_older_ones():
    """contract.words.read_state_source: the key, then an older writer's (the metrics record's
    `restore/from`, status.json's and the ledger's `from`), None meaning a fresh start there."""
    assert read_state_source({STATE_SOURCE: "storage", "from": "memory"}) is StateSource.STORAGE
    assert read_state_source({"restore/from": "memory"}) is StateSource.MEMORY
    assert read_state_source({"restore/from": None}) is StateSource.FRESH
    assert read_state_source({"segment": 1, "from": "peers", "step": 3}) is StateSource.PEERS
    assert read_state_source({"from": "tape"}) is None
    assert read_state_source({"step": 3}) is None


def test_in_place_steps_after_the_next_world_is_published_stay_with_their_segment():
    # In place the old world trains on until the new world's trainers take over: segment 0's steps
    # 5-6 end after segment 1 was submitted (T0+15). They are segment 0's seconds: no segment may
    # claim more than its wall time, and the segments still partition the run's wall time.
    rec = RunRecord(spec=RunSpec(run="r", run_dir="/tmp/r", global_batch=32), preset="tpu7x-2x2x2", slices=1,
                    created_at=T0)  # fmt: skip
    s0 = new_segment(rec, make_shape("tpu7x-2x2x2", 1), Plan(16, 2, 1), T0, "launch", None)
    rec = rec.with_segment(replace(s0, ended_at=T0 + 15, end_kind="grow", end_reason="grow"))
    s1 = new_segment(rec, make_shape("tpu7x-2x2x2", 2), Plan(32, 1, 1), T0 + 15, "grow", 6)
    rec = replace(rec.with_segment(replace(s1, ended_at=T0 + 30, end_kind="finished")), state=RunState.FINISHED,
                  finished_at=T0 + 30)  # fmt: skip
    metrics = [
        {"step": s, "segment": 0, "time": T0 + 10 + s, "perf/step_time_seconds": 1.0} for s in range(1, 7)
    ]
    metrics += [
        {"step": s, "segment": 1, "time": T0 + 20 + s - 7, "perf/step_time_seconds": 1.0}
        for s in range(7, 11)
    ]
    report = build_report(rec, metrics, [], now=T0 + 99)
    first, second = report.segments
    assert first.end == second.start == T0 + 16  # segment 0's last step ended at T0+16
    assert first.badput.productive == pytest.approx(6.0) and first.badput.goodput <= 1.0
    assert second.badput.goodput <= 1.0
    assert first.badput.wall + second.badput.wall == pytest.approx(report.badput.wall)


def test_records_written_before_the_rename_say_restart_attempt_and_read_alike():
    """A metrics row or status.json's `restored` written before `jobset_attempt` was renamed calls it
    `restart_attempt`: read as the same, so an old run directory's report is unchanged."""
    rows = [
        (0, {"step": 1, "jobset_attempt": 0}),
        (1, {"step": 2, "jobset_attempt": 0}),
        (2, {"step": 2, "jobset_attempt": 1}),
    ]
    old = [(j, {"step": m["step"], "restart_attempt": m["jobset_attempt"]}) for j, m in rows]
    assert (
        [[j for j, _ in g] for g in incarnations(old)]
        == [[j for j, _ in g] for g in incarnations(rows)]
        == [[0, 1], [2]]
    )
    assert jobset_attempt({"restart_attempt": 2}) == 2 and jobset_attempt({"jobset_attempt": 3}) == 3
    assert jobset_attempt({}) is None
