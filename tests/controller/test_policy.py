"""Table-driven: (record, observation) -> decision, one case per rule of the controller's policy
(README "What the controller does", docs/design.md "Policy")."""

from dataclasses import replace

import pytest

from launcher import policy as P
from launcher import record as R
from launcher import signals as S
from launcher.plan import shrink_ladder
from launcher.presets import load_presets, make_shape
from launcher.record import Policy, RunRecord, new_segment
from launcher.render import RunSpec
from tests.controller.objects import T0, jobset, pod, pool

PRESETS = list(load_presets().values())
PRESET = "tpu7x-2x2x2"  # two hosts per slice: the smallest shape GKE runs as a multislice
HOSTS = 2
GB = 64
SPEC = RunSpec(run="demo", run_dir="/tmp/demo", global_batch=GB)
POLICY = Policy(unschedulable_grace_s=60, grow_window_s=30, app_failure_budget=2, app_backoff_s=10)
LADDER = shrink_ladder(make_shape(PRESET, 4), GB, 16)


def record_on(slices: int | None, **changes) -> RunRecord:
    rec = RunRecord(spec=SPEC, preset=PRESET, slices=4, policy=POLICY, created_at=T0)
    if slices is not None:
        rung = next(r for r in LADDER if r.shape.slices == slices)
        seg = replace(new_segment(rec, rung.shape, rung.plan, T0, "test", None), jobset_uid="uid-demo-0")
        rec = replace(rec.with_segment(seg), state=R.RUNNING)
    return replace(rec, **changes)


def observe(
    rec: RunRecord, *, pods=(), pools=4, jobsets=None, now=T0 + 100, committed=10, trainer=None, pool_since=T0
):
    seg = rec.current
    nodes = [n for i in range(pools) for n in pool(f"np-{i}", PRESET, since=pool_since)]
    return S.observe(
        now=now,
        run="demo",
        segment=seg.index if seg else None,
        segment_jobset=seg.jobset if seg else None,
        segment_nodepools=seg.nodepools if seg else (),
        expected_pods=seg.shape().hosts if seg else 0,
        jobsets=[jobset(seg.jobset)] if jobsets is None and seg else list(jobsets or []),
        pods=list(pods),
        nodes=nodes,
        events=[],
        presets=PRESETS,
        committed_step=committed,
        trainer=trainer,
    )


def running(n, segment=0):
    """The pods of n slices, running on their pools' nodes."""
    return [
        pod(f"demo-{segment}-slice-{i}-{h}-x", segment=segment, node_name=f"gke-np-{i}-{h}")
        for i in range(n)
        for h in range(HOSTS)
    ]


def pending(indices, since, segment=0):
    return [
        pod(f"demo-{segment}-slice-{i}-{h}-x", segment=segment, unschedulable_since=since)
        for i in indices
        for h in range(HOSTS)
    ]


def test_launch_submits_the_requested_shape():
    rec = record_on(None)
    d = P.decide(rec, observe(rec, pools=0), LADDER)
    assert d.action == P.SUBMIT and d.jobset == "demo-0"
    seg = d.record.current
    assert (seg.slices, seg.devices * seg.micro_batch * seg.grad_accum) == (4, GB)
    assert d.record.state == R.RUNNING


def test_healthy_running_segment_waits():
    rec = record_on(4)
    d = P.decide(rec, observe(rec, pods=running(4)), LADDER)
    assert d.action == P.WAIT and "running" in d.reason
    assert d.record.current.running_at == T0 + 100  # bookkeeping: first seen running
    assert d.record.current.nodepools == ("np-0", "np-1", "np-2", "np-3")


def test_same_size_disruption_is_left_to_jobset():
    rec = record_on(4)
    pods = [pod("demo-0-slice-0-0-x", phase="Failed", disruption="TerminationByKubelet"), *running(4)[1:]]
    d = P.decide(rec, observe(rec, pods=pods), LADDER)
    assert d.action == P.WAIT and "restarting" in d.reason


def test_unschedulable_inside_grace_with_room_waits():
    rec = record_on(4)
    # Room for 4 slices exists (e.g. pods just created): wait for the scheduler.
    d = P.decide(rec, observe(rec, pods=pending(range(4), since=T0 + 90)), LADDER)
    assert d.action == P.WAIT and "grace 60s" in d.reason


def test_unschedulable_past_grace_shrinks():
    rec = record_on(4)
    pods = running(1) + pending((1, 2, 3), since=T0)
    # Capacity says 4 pools exist but the pods still do not bind after the grace (e.g. a
    # reservation held elsewhere): shrink to what fits without them.
    d = P.decide(rec, observe(rec, pods=pods, pools=4, now=T0 + 61), LADDER)
    assert d.action == P.END and d.jobset == "demo-0"
    assert "capacity lost" in d.reason and "-> tpu7x-2x2x2 x2" in d.reason
    assert d.record.current.end_kind == "capacity-lost" and d.record.state == R.RESHAPING


def test_node_pools_gone_shrinks_at_once_to_largest_fit():
    rec = record_on(4)
    pods = running(1) + pending((1, 2, 3), since=T0 + 99)
    d = P.decide(rec, observe(rec, pods=pods, pools=1), LADDER)
    assert d.action == P.END and "-> tpu7x-2x2x2 x1" in d.reason


def test_node_pools_lost_while_restarting_shrinks_without_waiting_for_the_restart():
    rec = record_on(4)
    rec = rec.with_segment(replace(rec.current, nodepools=("np-0", "np-1", "np-2", "np-3")))
    # Two pools gone; the surviving pods are still Running (JobSet has not restarted yet).
    pods = running(2) + [
        pod(f"demo-0-slice-{i}-0-x", phase="Failed", disruption="DeletionByPodGC") for i in (2, 3)
    ]
    d = P.decide(rec, observe(rec, pods=pods, pools=2), LADDER)
    assert d.action == P.END and "node pools lost: np-2, np-3" in d.reason and "-> tpu7x-2x2x2 x2" in d.reason


def test_pools_gone_end_with_zero_grace_a_preemption_notice_keeps_the_save():
    rec = record_on(4)
    rec = rec.with_segment(replace(rec.current, nodepools=("np-0", "np-1", "np-2", "np-3")))
    gone = P.decide(rec, observe(rec, pods=running(2), pools=2), LADDER)
    assert gone.action == P.END and gone.force
    tainted = observe(rec, pods=running(4), pools=4)
    noticed = replace(tainted, lost_nodepools=("np-3",), capacity={"tpu7x-2x2x2": (T0,) * 3})
    d = P.decide(rec, noticed, LADDER)
    assert d.action == P.END and "node pools lost: np-3" in d.reason and not d.force


def test_node_pool_lost_but_spare_capacity_is_left_to_jobset():
    rec = record_on(1)
    rec = rec.with_segment(replace(rec.current, nodepools=("np-9",)))  # np-9 is gone; np-0.. are spare
    pods = [
        pod("demo-0-slice-0-0-x", phase="Failed", disruption="TerminationByKubelet", node_name="gke-np-9-0")
    ]
    d = P.decide(rec, observe(rec, pods=pods, pools=2), LADDER)
    assert d.action == P.WAIT and "restarting" in d.reason


def test_unschedulable_and_nothing_smaller_fits_waits():
    rec = record_on(1)
    d = P.decide(rec, observe(rec, pods=pending([0], since=T0), pools=0, now=T0 + 1000), LADDER)
    assert d.action == P.WAIT and "no smaller feasible shape" in d.reason


def test_next_segment_waits_for_pods_then_submits_largest_fit_same_batch():
    rec = record_on(4)
    ended = P.decide(rec, observe(rec, pods=running(1) + pending((1, 2, 3), T0), pools=1), LADDER).record
    d = P.decide(ended, observe(ended, pods=running(1), pools=1, jobsets=[]), LADDER)
    assert d.action == P.WAIT and f"{HOSTS} pod(s) of the run to terminate" in d.reason
    d = P.decide(ended, observe(ended, pods=[], pools=1, jobsets=[]), LADDER)
    assert d.action == P.SUBMIT and d.jobset == "demo-1"
    seg = d.record.current
    assert (seg.index, seg.slices, seg.micro_batch, seg.grad_accum) == (1, 1, 4, 1)
    assert seg.devices * seg.micro_batch * seg.grad_accum == GB
    assert seg.start_step == 10


def test_ended_segment_whose_jobset_lingers_is_deleted_again():
    rec = record_on(4)
    ended = P.decide(rec, observe(rec, pods=pending(range(4), T0), pools=1), LADDER).record
    d = P.decide(ended, observe(ended, pods=[], pools=1, jobsets=[jobset("demo-0")]), LADDER)
    assert d.action == P.DELETE and d.jobset == "demo-0"


def test_no_capacity_at_all_waits_for_capacity():
    rec = record_on(4)
    ended = P.decide(rec, observe(rec, pods=pending(range(4), T0), pools=0), LADDER)
    assert ended.action == P.WAIT  # nothing smaller fits: keep the Pending JobSet
    rec2 = replace(rec, segments=(replace(rec.current, ended_at=T0, end_kind="capacity-lost"),))
    d = P.decide(rec2, observe(rec2, pods=[], pools=0, jobsets=[]), LADDER)
    assert d.action == P.WAIT and d.record.state == R.WAITING


def test_grow_back_after_stability_window():
    rec = record_on(1)
    early = observe(rec, pods=running(1), pools=4, now=T0 + 100, pool_since=T0 + 80)
    assert P.decide(rec, early, LADDER).action == P.WAIT
    late = observe(rec, pods=running(1), pools=4, now=T0 + 111, pool_since=T0 + 80)
    d = P.decide(rec, late, LADDER)
    assert d.action == P.END and d.record.current.end_kind == "grow"
    assert "-> tpu7x-2x2x2 x4" in d.reason and "checkpoints on SIGTERM" in d.reason


def test_grow_waits_for_a_checkpoint_of_the_segment():
    rec = record_on(1)
    rec = rec.with_segment(replace(rec.current, start_step=10))
    obs = observe(rec, pods=running(1), pools=4, now=T0 + 1000, committed=10)
    assert P.decide(rec, obs, LADDER).action == P.WAIT
    assert (
        P.decide(rec, observe(rec, pods=running(1), pools=4, now=T0 + 1000, committed=15), LADDER).action
        == P.END
    )


def test_grow_disabled():
    rec = record_on(1, policy=replace(POLICY, grow=False))
    assert P.decide(rec, observe(rec, pods=running(1), pools=4, now=T0 + 1000), LADDER).action == P.WAIT


def test_config_error_fails_the_run_at_once():
    rec = record_on(4)
    js = jobset(condition=("Failed", "FailJobSetFailurePolicyAction", "rule config-error"))
    pods = [pod("demo-0-slice-0-0-x", phase="Failed", exit_code=2)]
    d = P.decide(rec, observe(rec, pods=pods, jobsets=[js]), LADDER)
    assert d.action == P.FAIL and d.record.state == R.FAILED and "configuration error" in d.reason
    assert d.record.app_failures == 0


def test_app_failures_back_off_then_fail_without_spending_preemptions():
    rec = record_on(4)
    rec = rec.with_segment(replace(rec.current, restarts=5, restarts_counted=0))  # 5 preemptions so far
    js = jobset(restarts=6, counted=1, condition=("Failed", "ReachedMaxRestarts", "reached max restarts"))
    pods = [pod("demo-0-slice-0-0-x", phase="Failed", exit_code=1)]
    d = P.decide(rec, observe(rec, pods=pods, jobsets=[js]), LADDER)
    # restartsCountTowardsMax (1) + the failed segment (1) = 2 application failures: at the budget.
    assert d.action == P.END and d.record.app_failures == 2
    assert d.record.next_submit_at == T0 + 100 + 10 * 2
    assert "last exit code 1" in d.reason
    assert d.record.preemptions() == 5
    # Backing off: the next segment waits.
    w = P.decide(d.record, observe(d.record, pods=[], jobsets=[], now=T0 + 105), LADDER)
    assert w.action == P.WAIT and "backing off" in w.reason
    # One more failure: over the budget.
    nxt = P.decide(d.record, observe(d.record, pods=[], jobsets=[], now=T0 + 200), LADDER).record
    failed = P.decide(
        nxt,
        observe(nxt, pods=[pod("demo-1-slice-0-0-x", segment=1, phase="Failed", exit_code=1)],
                jobsets=[jobset("demo-1", condition=("Failed", "ReachedMaxRestarts", "m"))], now=T0 + 300),
        LADDER,
    )  # fmt: skip
    assert (
        failed.action == P.FAIL and "crash loop" in failed.reason and "preemptions so far: 5" in failed.reason
    )


def test_trainer_finished_finishes():
    rec = record_on(4)
    obs = observe(
        rec, pods=running(4), committed=100, trainer={"state": "finished", "step": 100, "total_steps": 100}
    )
    d = P.decide(rec, obs, LADDER)
    assert d.action == P.FINISH and d.record.state == R.FINISHED and d.record.total_steps == 100


def test_a_segment_ended_for_a_grow_that_finished_first_is_labelled_finished():
    rec = record_on(1, total_steps=60)
    rec = rec.with_segment(replace(rec.current, start_step=40))
    grow = P.decide(
        rec, observe(rec, pods=running(1), pools=4, now=T0 + 111, pool_since=T0 + 80, committed=55), LADDER
    )
    assert grow.action == P.END and grow.record.current.end_kind == "grow"
    # The trainer got SIGTERM at step 59 of 60, finished the last step and committed it.
    done = {"state": "finished", "step": 60, "total_steps": 60}
    d = P.decide(grow.record, observe(grow.record, pods=running(1), committed=60, trainer=done), LADDER)
    assert d.action == P.FINISH and d.record.state == R.FINISHED
    seg = d.record.current
    assert (seg.end_kind, seg.end_step) == ("finished", 60) and "before the grow" in seg.end_reason
    assert len(d.record.segments) == 1


def test_completed_without_final_step_fails():
    rec = record_on(4, total_steps=100)
    js = jobset(condition=("Completed", "AllJobsCompleted", "done"))
    d = P.decide(rec, observe(rec, jobsets=[js], committed=50), LADDER)
    assert d.action == P.FAIL


def test_recorded_but_never_created_jobset_is_created():
    rec = record_on(4)
    rec = rec.with_segment(replace(rec.current, jobset_uid=None))
    d = P.decide(rec, observe(rec, jobsets=[]), LADDER)
    assert d.action == P.CREATE and d.jobset == "demo-0"


def test_jobset_deleted_behind_our_back_ends_the_segment():
    rec = record_on(4)
    d = P.decide(rec, observe(rec, jobsets=[]), LADDER)
    assert d.action == P.END and d.jobset is None and d.record.current.end_kind == "lost"


@pytest.mark.parametrize("state", sorted(R.TERMINAL))
def test_terminal_runs_do_nothing(state):
    rec = record_on(4, state=state)
    assert P.decide(rec, observe(rec, pods=pending(range(4), T0), pools=0), LADDER).action == P.WAIT


def test_kueue_suspended_waits():
    rec = record_on(4)
    d = P.decide(rec, observe(rec, jobsets=[jobset(suspend=True)], pods=[]), LADDER)
    assert d.action == P.WAIT and "suspended" in d.reason


# --- what a JobSet restart is counted as: the record's counters after one pass ------------------
def failed_pod(attempt=0, i=0, code=43, **kw):
    return pod(f"demo-0-slice-{i}-0-{attempt}{code}", phase="Failed", exit_code=code, attempt=attempt, **kw)


@pytest.mark.parametrize(
    "failing,restarts,counted,pods,expect",
    [
        # The survivor of a dead host exited 43, JobSet has not restarted yet: remembered as failing.
        (None, 0, 0, [failed_pod(), *running(4)[1:]], {"failing": S.PEER_LOST, "peer_lost": 0}),
        # JobSet restarted (not counted); the failed pods are gone already: what was seen counts.
        (S.PEER_LOST, 1, 0, running(4), {"failing": None, "peer_lost": 1, "preemptions": 0}),
        # ... or still in view, seen for the first time in this pass.
        (None, 1, 0, [failed_pod(i=1)], {"peer_lost": 1, "preemptions": 0}),
        # A crash next to the 43s it caused, and the pod failure policy took the 43: an app failure.
        (None, 0, 0, [failed_pod(), failed_pod(i=1, code=1)], {"failing": S.APP_FAILURE}),
        (S.PEER_LOST, 0, 0, [failed_pod(i=1, code=1)], {"failing": S.APP_FAILURE}),  # the crash shows later
        (S.APP_FAILURE, 1, 0, [], {"uncounted_failures": 1, "app_failures": 1, "preemptions": 0}),
        # JobSet counted it (the crash's pod failed first): JobSet's count, nothing more here.
        (S.APP_FAILURE, 1, 1, [], {"uncounted_failures": 0, "restarts_counted": 1, "app_failures": 0}),
        # A saved preemption, or nothing seen at all: a preemption, as before.
        (None, 1, 0, [failed_pod(code=42)], {"peer_lost": 0, "preemptions": 1}),
        (None, 1, 0, [], {"peer_lost": 0, "preemptions": 1}),
        # Two restarts between passes: the first gets the cause seen, the other stays a preemption.
        (S.PEER_LOST, 2, 0, [], {"peer_lost": 1, "preemptions": 1}),
    ],
)  # fmt: skip
def test_restart_causes_are_counted(failing, restarts, counted, pods, expect):
    rec = record_on(4)
    rec = rec.with_segment(replace(rec.current, failing=failing))
    d = P.decide(rec, observe(rec, pods=pods, jobsets=[jobset(restarts=restarts, counted=counted)]), LADDER)
    assert d.action == P.WAIT
    seg = d.record.current
    got = {
        "failing": seg.failing, "peer_lost": seg.peer_lost, "uncounted_failures": seg.uncounted_failures,
        "restarts_counted": seg.restarts_counted, "app_failures": d.record.app_failures,
        "preemptions": d.record.preemptions(),
    }  # fmt: skip
    assert {k: got[k] for k in expect} == expect
    assert seg.restarts == restarts


def test_a_lost_peer_is_named_while_jobset_restarts():
    rec = record_on(4)
    d = P.decide(rec, observe(rec, pods=[failed_pod(), *running(4)[1:]]), LADDER)
    assert d.action == P.WAIT and "restarting (JobSet failure policy) after a lost peer" in d.reason


def test_lost_peers_never_spend_the_budget_but_uncounted_crashes_do():
    rec = record_on(4, app_failures=POLICY.app_failure_budget)
    rec = rec.with_segment(replace(rec.current, failing=S.PEER_LOST, restarts=40, peer_lost=40))
    d = P.decide(rec, observe(rec, pods=running(4), jobsets=[jobset(restarts=41)]), LADDER)
    assert d.action == P.WAIT and d.record.current.peer_lost == 41 and d.record.app_failures == 2
    # The same restart after a crash that made its peers exit 43: over the budget, the run fails.
    rec = rec.with_segment(replace(rec.current, failing=S.APP_FAILURE))
    d = P.decide(rec, observe(rec, pods=running(4), jobsets=[jobset(restarts=41)]), LADDER)
    assert d.action == P.END and d.jobset == "demo-0" and d.record.state == R.FAILED
    assert "crash loop: 3 application failures exceed the budget of 2" in d.reason
