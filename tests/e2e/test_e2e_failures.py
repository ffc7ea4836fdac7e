"""Failures that are the trainer's own: a crash loop fails the run after its
application-failure budget, with backoff and without touching the preemption budget; a
configuration error (exit 2) fails it at once."""

import pytest

from launcher.core.record import Knobs
from launcher.core.words import RunState
from tests.e2e.harness import Harness

pytestmark = pytest.mark.e2e


def test_crash_loop_then_config_error(tmp_path):
    h = Harness(tmp_path, pools=1)
    try:
        knobs = Knobs(app_failure_budget=3, app_backoff_s=1)
        # Every incarnation raises before step 3: exit code 1, an application failure.
        h.launch("crashy", slices=1, steps=50, knobs=knobs, max_restarts=1, extra=("train.crash_at_step=3",))
        h.start_controller("crashy")
        crashy = h.wait_state("crashy", {RunState.FAILED}, timeout=180)
        crashy_ledger = h.rundir("crashy").ledger()
        # A token file that does not exist: the trainer exits 2 before training.
        h.launch(
            "broken", slices=1, steps=50, extra=("data.source=files", f"data.path={tmp_path}/missing.bin")
        )
        h.start_controller("broken")
        broken = h.wait_state("broken", {RunState.FAILED}, timeout=120)
    finally:
        h.close()

    # JobSet restarts each segment once (maxRestarts 1) before giving up; the controller counts
    # 2 failures per segment: budget 3 is spent in the second segment.
    assert [s.end_kind for s in crashy.segments] == ["app-failure", "app-failure"]
    assert crashy.app_failures == 4 and crashy.preemptions() == 0
    assert all(s.restarts == s.restarts_counted == 1 for s in crashy.segments)
    assert "crash loop: 4 application failures exceed the budget of 3" in crashy.reason
    assert "last exit code 1" in crashy.reason
    retry = next(e for e in crashy_ledger if e.get("action") == "end-segment")
    assert "retrying in 2s" in retry["reason"]  # 1 s doubled per failure counted so far
    second = crashy.segments[1]
    assert second.submitted_at >= crashy.segments[0].ended_at + 2.0  # the backoff was honoured

    assert len(broken.segments) == 1 and broken.segments[0].restarts == 0
    assert broken.reason.startswith("configuration error (trainer exit code 2)")
    assert broken.app_failures == 0
