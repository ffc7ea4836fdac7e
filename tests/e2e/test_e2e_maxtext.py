"""The MaxText profile's outcomes through the real controller: runs launched
with `trainer="maxtext"` on the embedded cluster, the real entrypoint in every pod, around the
stand-in MaxText (fake_maxtext.py: MaxText's 0-based checkpoints under maxtext/checkpoints, its exit
0 after a preemption save and after a data crash). A preempted segment restarts without spending
the failure budget and the run is reported finished at its final step; a crash spends it.
Real MaxText, elastic: tests/maxtext_e2e (not in the default run)."""

from __future__ import annotations

import os

import pytest

from launcher.controller.launch import create_run, prepare
from launcher.core.record import Knobs
from launcher.core.spec import RunSpec
from launcher.core.words import RunState
from tests.e2e.harness import PRESET, Harness, kept_steps, recomputed
from tests.maxtext.fake_package import fake_package

pytestmark = pytest.mark.e2e


def launch(h: Harness, run: str, steps: int, knobs: Knobs, **env: str) -> None:
    spec = RunSpec(
        run=run, run_dir=str(h.tmp / run), global_batch=16, config="base", trainer="maxtext",
        overrides=(f"steps={steps}", "checkpoint_period=25"), env=tuple(env.items()), grace_period_s=20,
        max_restarts=1, image_pull_policy="Never",
    )  # fmt: skip
    rec, _ = prepare(spec, PRESET, 1, knobs)
    create_run(h.kube, rec)


def pool_of(h: Harness, run: str) -> str:
    node = next(p["spec"]["nodeName"] for p in h.run_pods(run) if p["spec"].get("nodeName"))
    labels = next(n for n in h.kube.nodes() if n["metadata"]["name"] == node)["metadata"]["labels"]
    return labels["cloud.google.com/gke-nodepool"]


def test_a_preempted_maxtext_segment_restarts_free_and_finishes_a_crash_spends_the_budget(tmp_path):
    # The pods' `python -m maxtext_entry` finds "MaxText" on its own interpreter's path.
    path = os.pathsep.join(p for p in (str(fake_package(tmp_path)), os.environ.get("PYTHONPATH")) if p)
    h = Harness(tmp_path, pools=2, gcs_env={"PYTHONPATH": path})
    try:
        knobs = Knobs(app_failure_budget=1, app_backoff_s=1)
        launch(h, "pre", 200, knobs, FAKE_STEP_S="0.05")
        h.start_controller("pre")
        h.wait_step("pre", 26, timeout=90)  # MaxText's checkpoint 25: the controller reads step 26
        victim = pool_of(h, "pre")
        h.cluster.preempt(victim, grace_s=20)  # SIGTERM: the save, MaxText exits 0, the entrypoint 42
        h.cluster.restore(victim)
        pre = h.wait_state("pre", {RunState.FINISHED}, timeout=120)
        pre_dir = h.rundir("pre")
        metrics, status, committed = pre_dir.metrics(), pre_dir.status(), pre_dir.committed_steps()

        # A data crash: MaxText exits 0 half-way, the entrypoint 1; JobSet restarts it once (counted),
        # then the segment fails: 2 failures spend the budget of 1.
        launch(h, "crashy", 40, knobs, FAKE_MODE="data_crash")
        h.start_controller("crashy")
        crashy = h.wait_state("crashy", {RunState.FAILED}, timeout=120)
    finally:
        h.close()

    assert len(pre.segments) == 1, "a preemption restarts the segment in place"
    seg = pre.segments[0]
    assert seg.restarts == 1 and seg.restarts_counted == 0
    assert pre.preemptions() == 1 and pre.app_failures == 0
    assert pre.reason == "trainer finished step 200" and seg.end_kind == "finished"
    assert status["state"] == "finished" and status["step"] == 200 and committed[-1] == 200
    assert (tmp_path / "pre" / "maxtext" / "checkpoints" / "199" / "commit_success.txt").exists()
    # The restart resumed after the step the SIGTERM saved: nothing computed twice, nothing skipped.
    assert sorted({m["jobset_attempt"] for m in metrics}) == [0, 1]
    assert recomputed(metrics) == 0 and sorted(kept_steps(metrics)) == list(range(1, 201))

    assert crashy.app_failures == 2 and crashy.preemptions() == 0
    assert "exceed the budget of 1" in crashy.reason and "last exit code 1" in crashy.reason
