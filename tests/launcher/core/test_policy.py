"""Table-driven: (record, observation) -> decision, one case per rule of the controller's policy
(docs/design.md "What the controller does" and "Policy"). The shape of jobset's
pkg/controllers/failure_policy_test.go: a list of cases, each a name, the run record, the
observation, and the decision expected; one test runs them all."""

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from launcher.adapters.preset_files import load_catalog
from launcher.core import policy, record
from launcher.core.plan import shrink_ladder
from launcher.core.record import Knobs, RunRecord, new_segment
from launcher.core.signals import observation as signals
from launcher.core.spec import RunSpec
from launcher.core.words import Action, Cause, EndKind, RunState, WaitReason
from tests.launcher.core.objects import T0, jobset, pod, pool

CATALOG = load_catalog()
PRESETS = list(CATALOG.values())
PRESET = "tpu7x-2x2x2"  # two hosts per slice: the smallest shape GKE runs as a multislice
HOSTS = 2
GB = 64
SPEC = RunSpec(run="demo", run_dir="/tmp/demo", global_batch=GB)
KNOBS = Knobs(unschedulable_grace_s=60, grow_window_s=30, app_failure_budget=2, app_backoff_s=10)
LADDER = shrink_ladder(CATALOG.shape(PRESET, 4), GB, 16, catalog=CATALOG)


def record_on(slices: int | None, **changes) -> RunRecord:
    rec = RunRecord(spec=SPEC, preset=PRESET, slices=4, knobs=KNOBS, created_at=T0)
    if slices is not None:
        rung = next(r for r in LADDER if r.shape.slices == slices)
        seg = replace(new_segment(rec, rung.shape, rung.plan, T0, "test", None), jobset_uid="uid-demo-0")
        rec = replace(rec.with_segment(seg), state=RunState.RUNNING)
    return replace(rec, **changes)


def observe(
    rec: RunRecord, *, pods=(), pools=4, jobsets=None, now=T0 + 100, committed=10, trainer=None, pool_since=T0
):
    seg = rec.current
    nodes = [n for i in range(pools) for n in pool(f"np-{i}", PRESET, since=pool_since)]
    return signals.observe(
        now=now,
        run="demo",
        of=signals.OneJobSet(seg.index if seg else None, seg.jobset if seg else None),
        segment_nodepools=seg.nodepools if seg else (),
        expected_pods=seg.shape(CATALOG).hosts if seg else 0,
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


def failed_pod(attempt=0, i=0, code=43, **kw):
    return pod(f"demo-0-slice-{i}-0-{attempt}{code}", phase="Failed", exit_code=code, attempt=attempt, **kw)


def with_current(rec: RunRecord, **changes) -> RunRecord:
    return rec.with_segment(replace(rec.current, **changes))


def decided(rec: RunRecord, **observed) -> RunRecord:
    """The record one pass writes: the start of a case that needs the pass before it."""
    return policy.decide(rec, observe(rec, **observed), LADDER, CATALOG).record


def ended_on_one_pool() -> RunRecord:
    rec = record_on(4)
    return decided(rec, pods=running(1) + pending((1, 2, 3), T0), pools=1)


def after_two_app_failures() -> RunRecord:
    rec = with_current(record_on(4), restarts=5, restarts_counted=0)  # 5 preemptions so far
    js = jobset(restarts=6, counted=1, condition=("Failed", "ReachedMaxRestarts", "reached max restarts"))
    return decided(rec, pods=[pod("demo-0-slice-0-0-x", phase="Failed", exit_code=1)], jobsets=[js])


def ended_for_a_grow_at_step_55() -> RunRecord:
    rec = with_current(record_on(1, total_steps=60), start_step=40)
    return decided(rec, pods=running(1), pools=4, now=T0 + 111, pool_since=T0 + 80, committed=55)


def restarted_after_a_crash_loop() -> RunRecord:
    rec = with_current(record_on(4, app_failures=KNOBS.app_failure_budget), restarts=40, peer_lost=40)
    return with_current(rec, failing=Cause.APP_FAILURE)


ANY = object()  # the decision's JobSet is not what the case is about

# Record fields the table names that are not plain attributes.
DERIVED: dict[str, Callable[[RunRecord], Any]] = {
    "current.batch": lambda r: r.current.devices * r.current.micro_batch * r.current.grad_accum,
    "preemptions()": lambda r: r.preemptions(),
    "len(segments)": lambda r: len(r.segments),
}


def field_of(rec: RunRecord, path: str) -> Any:
    if path in DERIVED:
        return DERIVED[path](rec)
    value: Any = rec
    for name in path.split("."):
        value = getattr(value, name)
    return value


@dataclass(frozen=True)
class Want:
    action: str
    jobset: Any = ANY
    reason: tuple[str, ...] = ()  # substrings of the decision's reason
    force: bool | None = None
    record: dict[str, Any] = field(default_factory=dict)  # field path -> value in the record to write


@dataclass(frozen=True)
class Case:
    name: str
    record: Callable[[], RunRecord]
    observation: Callable[[RunRecord], signals.Observation]
    want: Want


def pools_named(rec: RunRecord) -> RunRecord:
    return with_current(rec, nodepools=("np-0", "np-1", "np-2", "np-3"))


def preemption_notice(rec: RunRecord) -> signals.Observation:
    tainted = observe(rec, pods=running(4), pools=4)
    return replace(tainted, lost_nodepools=("np-3",), capacity={"tpu7x-2x2x2": (T0,) * 3})


def lost_pools_while_restarting(rec: RunRecord) -> signals.Observation:
    # Two pools gone; the surviving pods are still Running (JobSet has not restarted yet).
    gone = [pod(f"demo-0-slice-{i}-0-x", phase="Failed", disruption="DeletionByPodGC") for i in (2, 3)]
    return observe(rec, pods=running(2) + gone, pools=2)


def the_next_segment_crashes(rec: RunRecord) -> signals.Observation:
    return observe(
        rec, pods=[pod("demo-1-slice-0-0-x", segment=1, phase="Failed", exit_code=1)],
        jobsets=[jobset("demo-1", condition=("Failed", "ReachedMaxRestarts", "m"))], now=T0 + 300,
    )  # fmt: skip


FINISHED_AT_60 = {"state": "finished", "step": 60, "total_steps": 60}

CASES = [
    Case(
        "launch submits the requested shape",
        lambda: record_on(None),
        lambda rec: observe(rec, pools=0),
        Want(
            Action.START_SEGMENT,
            "demo-0",
            record={"current.slices": 4, "current.batch": GB, "state": RunState.RUNNING},
        ),
    ),
    Case(
        "a healthy running segment waits (bookkeeping: first seen running, its pools)",
        lambda: record_on(4),
        lambda rec: observe(rec, pods=running(4)),
        Want(
            Action.WAIT,
            reason=("running",),
            record={"current.running_at": T0 + 100, "current.nodepools": ("np-0", "np-1", "np-2", "np-3")},
        ),
    ),
    Case(
        "a same-size disruption is left to JobSet",
        lambda: record_on(4),
        lambda rec: observe(
            rec,
            pods=[
                pod("demo-0-slice-0-0-x", phase="Failed", disruption="TerminationByKubelet"),
                *running(4)[1:],
            ],
        ),
        Want(Action.WAIT, reason=("restarting",)),
    ),
    Case(
        # Room for 4 slices exists (e.g. pods just created): wait for the scheduler.
        "unschedulable inside the grace with room waits",
        lambda: record_on(4),
        lambda rec: observe(rec, pods=pending(range(4), since=T0 + 90)),
        Want(Action.WAIT, reason=("grace 60s",)),
    ),
    Case(
        # Capacity says 4 pools exist but the pods still do not bind after the grace (e.g. a
        # reservation held elsewhere): shrink to what fits without them.
        "unschedulable past the grace shrinks",
        lambda: record_on(4),
        lambda rec: observe(rec, pods=running(1) + pending((1, 2, 3), since=T0), pools=4, now=T0 + 61),
        Want(
            Action.END,
            "demo-0",
            reason=("capacity lost", "-> tpu7x-2x2x2 x2"),
            record={"current.end_kind": "capacity-lost", "state": RunState.RESHAPING},
        ),
    ),
    Case(
        "node pools gone shrinks at once to the largest fit",
        lambda: record_on(4),
        lambda rec: observe(rec, pods=running(1) + pending((1, 2, 3), since=T0 + 99), pools=1),
        Want(Action.END, reason=("-> tpu7x-2x2x2 x1",)),
    ),
    Case(
        "node pools lost while restarting shrinks without waiting for the restart",
        lambda: pools_named(record_on(4)),
        lost_pools_while_restarting,
        Want(Action.END, reason=("node pools lost: np-2, np-3", "-> tpu7x-2x2x2 x2")),
    ),
    Case(
        "pools gone end the segment with zero grace",
        lambda: pools_named(record_on(4)),
        lambda rec: observe(rec, pods=running(2), pools=2),
        Want(Action.END, force=True),
    ),
    Case(
        "a preemption notice ends the segment and keeps the save",
        lambda: pools_named(record_on(4)),
        preemption_notice,
        Want(Action.END, reason=("node pools lost: np-3",), force=False),
    ),
    Case(
        "a node pool lost with spare capacity is left to JobSet",
        lambda: with_current(record_on(1), nodepools=("np-9",)),  # np-9 is gone; np-0.. are spare
        lambda rec: observe(
            rec,
            pools=2,
            pods=[
                pod(
                    "demo-0-slice-0-0-x",
                    phase="Failed",
                    disruption="TerminationByKubelet",
                    node_name="gke-np-9-0",
                )
            ],
        ),
        Want(Action.WAIT, reason=("restarting",)),
    ),
    Case(
        "unschedulable and nothing smaller fits waits",
        lambda: record_on(1),
        lambda rec: observe(rec, pods=pending([0], since=T0), pools=0, now=T0 + 1000),
        Want(Action.WAIT, reason=("waiting for capacity (no-room)", "no feasible shape of the ladder fits")),
    ),
    Case(
        "the next segment waits for the old pods to terminate",
        ended_on_one_pool,
        lambda rec: observe(rec, pods=running(1), pools=1, jobsets=[]),
        Want(Action.WAIT, reason=(f"{HOSTS} pod(s) of the run to terminate",)),
    ),
    Case(
        "then submits the largest fit with the same global batch",
        ended_on_one_pool,
        lambda rec: observe(rec, pods=[], pools=1, jobsets=[]),
        Want(
            Action.START_SEGMENT,
            "demo-1",
            record={
                "current.index": 1,
                "current.slices": 1,
                "current.micro_batch": 4,
                "current.grad_accum": 1,
                "current.batch": GB,
                "current.start_step": 10,
                # One slice: on the pool it saw free, named (render.render_jobset), and its own.
                "current.pool": "np-0",
                "current.nodepools": ("np-0",),
            },
        ),
    ),
    Case(
        "a segment on a named pool that is lost starts again on another pool, same shape",
        lambda: with_current(record_on(1), pool="np-0", nodepools=("np-0",)),
        lambda rec: replace(
            observe(rec, pods=running(1), pools=2),
            lost_nodepools=("np-0",),
            free_pools={PRESET: ("np-1",)},
            capacity={PRESET: (T0,)},
        ),
        Want(
            Action.END,
            "demo-0",
            reason=("node pools lost: np-0", "on another node pool tpu7x-2x2x2"),
            record={"current.end_kind": "capacity-lost"},
        ),
    ),
    Case(
        "an ended segment whose JobSet lingers is deleted again",
        lambda: decided(record_on(4), pods=pending(range(4), T0), pools=1),
        lambda rec: observe(rec, pods=[], pools=1, jobsets=[jobset("demo-0")]),
        Want(Action.DELETE, "demo-0"),
    ),
    Case(
        "no capacity at all keeps the Pending JobSet: nothing smaller fits",
        lambda: record_on(4),
        lambda rec: observe(rec, pods=pending(range(4), T0), pools=0),
        Want(Action.WAIT),
    ),
    Case(
        "no capacity at all after a segment ended waits for capacity",
        lambda: (
            (rec := record_on(4))
            and replace(rec, segments=(replace(rec.current, ended_at=T0, end_kind="capacity-lost"),))
        ),
        lambda rec: observe(rec, pods=[], pools=0, jobsets=[]),
        Want(Action.WAIT, record={"state": RunState.WAITING}),
    ),
    Case(
        "capacity back inside the stability window: no grow yet",
        lambda: record_on(1),
        lambda rec: observe(rec, pods=running(1), pools=4, now=T0 + 100, pool_since=T0 + 80),
        Want(Action.WAIT),
    ),
    Case(
        "capacity back past the stability window grows",
        lambda: record_on(1),
        lambda rec: observe(rec, pods=running(1), pools=4, now=T0 + 111, pool_since=T0 + 80),
        Want(
            Action.END,
            reason=("-> tpu7x-2x2x2 x4", "checkpoints on SIGTERM"),
            record={"current.end_kind": "grow"},
        ),
    ),
    Case(
        "a grow waits for a checkpoint of the segment",
        lambda: with_current(record_on(1), start_step=10),
        lambda rec: observe(rec, pods=running(1), pools=4, now=T0 + 1000, committed=10),
        Want(Action.WAIT),
    ),
    Case(
        "a grow after the segment's first checkpoint",
        lambda: with_current(record_on(1), start_step=10),
        lambda rec: observe(rec, pods=running(1), pools=4, now=T0 + 1000, committed=15),
        Want(Action.END),
    ),
    Case(
        "grow disabled",
        lambda: record_on(1, knobs=replace(KNOBS, grow=False)),
        lambda rec: observe(rec, pods=running(1), pools=4, now=T0 + 1000),
        Want(Action.WAIT),
    ),
    Case(
        "a configuration error fails the run at once",
        lambda: record_on(4),
        lambda rec: observe(
            rec,
            pods=[pod("demo-0-slice-0-0-x", phase="Failed", exit_code=2)],
            jobsets=[jobset(condition=("Failed", "FailJobSetFailurePolicyAction", "rule config-error"))],
        ),
        Want(
            Action.FAIL, reason=("configuration error",), record={"state": RunState.FAILED, "app_failures": 0}
        ),
    ),
    Case(
        # restartsCountTowardsMax (1) + the failed segment (1) = 2 application failures: at the
        # budget; the preemptions before them are not spent.
        "application failures back off",
        lambda: with_current(record_on(4), restarts=5, restarts_counted=0),  # 5 preemptions so far
        lambda rec: observe(
            rec,
            pods=[pod("demo-0-slice-0-0-x", phase="Failed", exit_code=1)],
            jobsets=[
                jobset(
                    restarts=6, counted=1, condition=("Failed", "ReachedMaxRestarts", "reached max restarts")
                )
            ],
        ),
        Want(
            Action.END,
            reason=("last exit code 1",),
            record={"app_failures": 2, "next_submit_at": T0 + 100 + 10 * 2, "preemptions()": 5},
        ),
    ),
    Case(
        # A host rebooted under attempt 0 (its pod Failed, lastState ContainerStatusUnknown): JobSet
        # restarted the segment and counted it, as a crash. The run books a host disruption.
        "a rebooted host's restart is a host disruption, not an application failure",
        lambda: record_on(4),
        lambda rec: observe(
            rec,
            pods=[
                *running(4)[1:],
                pod("demo-0-slice-0-0-r", phase="Failed", last_exit_reason="ContainerStatusUnknown"),
            ],
            jobsets=[jobset(restarts=1, counted=1)],
        ),
        Want(
            Action.WAIT,
            record={
                "host_disruptions": ("uid-demo-0/0",),
                "app_failures": 0,
                "current.restarts_counted": 1,
                "current.uncounted_failures": 0,
            },
        ),
    ),
    Case(
        # max_restarts reached on a reboot: JobSet gave up; the run starts again at once, uncharged.
        "a JobSet that gave up on a rebooted host starts again, uncharged",
        lambda: with_current(
            record_on(4, host_disruptions=("uid-demo-0/0",)), restarts=1, restarts_counted=1
        ),
        lambda rec: observe(
            rec,
            pods=[failed_pod(attempt=1, code=137, exit_reason="ContainerStatusUnknown")],
            jobsets=[
                jobset(
                    restarts=1, counted=1, condition=("Failed", "ReachedMaxRestarts", "reached max restarts")
                )
            ],
        ),
        Want(
            Action.END,
            reason=("host disruption",),
            record={
                "app_failures": 0,
                "next_submit_at": 0.0,
                "current.end_kind": EndKind.HOST_DISRUPTION,
                "host_disruptions": ("uid-demo-0/0", "uid-demo-0/1"),
            },
        ),
    ),
    Case(
        # Two counted restarts, one a reboot's, then a crash JobSet gave up on: 1 + 1, not 2 + 1.
        "a crash after a reboot: only the crashes are application failures",
        lambda: with_current(
            record_on(4, host_disruptions=("uid-demo-0/0",)), restarts=2, restarts_counted=2
        ),
        lambda rec: observe(
            rec,
            pods=[pod("demo-0-slice-0-0-x", phase="Failed", exit_code=1, attempt=2)],
            jobsets=[
                jobset(
                    restarts=2, counted=2, condition=("Failed", "ReachedMaxRestarts", "reached max restarts")
                )
            ],
        ),
        Want(Action.END, reason=("application failure 2/",), record={"app_failures": 2}),
    ),
    Case(
        # The reboot's restart was not counted (its peer's 43 failed the Job first: host_disrupted),
        # so the crash JobSet counted later is not forgiven for it: 0 + 1 + 1.
        "a crash after an uncounted reboot is not forgiven",
        lambda: with_current(
            record_on(4, host_disruptions=("uid-demo-0/0",)), restarts=2, restarts_counted=1, host_disrupted=1
        ),
        lambda rec: observe(
            rec,
            pods=[pod("demo-0-slice-0-0-x", phase="Failed", exit_code=1, attempt=2)],
            jobsets=[
                jobset(
                    restarts=2, counted=1, condition=("Failed", "ReachedMaxRestarts", "reached max restarts")
                )
            ],
        ),
        Want(Action.END, reason=("application failure 2/",), record={"app_failures": 2}),
    ),
    Case(
        "backing off: the next segment waits",
        after_two_app_failures,
        lambda rec: observe(rec, pods=[], jobsets=[], now=T0 + 105),
        Want(Action.WAIT, reason=("backing off",)),
    ),
    Case(
        "one more application failure is over the budget: the run fails",
        lambda: decided(after_two_app_failures(), pods=[], jobsets=[], now=T0 + 200),
        the_next_segment_crashes,
        Want(Action.FAIL, reason=("crash loop", "preemptions so far: 5")),
    ),
    Case(
        "the trainer finished: the run finishes",
        lambda: record_on(4),
        lambda rec: observe(
            rec,
            pods=running(4),
            committed=100,
            trainer={"state": "finished", "step": 100, "total_steps": 100},
        ),
        Want(Action.FINISH, record={"state": RunState.FINISHED, "total_steps": 100}),
    ),
    Case(
        "a segment ended for a grow at step 55",
        lambda: with_current(record_on(1, total_steps=60), start_step=40),
        lambda rec: observe(rec, pods=running(1), pools=4, now=T0 + 111, pool_since=T0 + 80, committed=55),
        Want(Action.END, record={"current.end_kind": "grow"}),
    ),
    Case(
        # The trainer got SIGTERM at step 59 of 60, finished the last step and committed it.
        "a segment ended for a grow that finished first is labelled finished",
        ended_for_a_grow_at_step_55,
        lambda rec: observe(rec, pods=running(1), committed=60, trainer=FINISHED_AT_60),
        Want(
            Action.FINISH,
            record={
                "state": RunState.FINISHED,
                "current.end_kind": "finished",
                "current.end_step": 60,
                "len(segments)": 1,
            },
        ),
    ),
    Case(
        "completed without the final step fails",
        lambda: record_on(4, total_steps=100),
        lambda rec: observe(
            rec, jobsets=[jobset(condition=("Completed", "AllJobsCompleted", "done"))], committed=50
        ),
        Want(Action.FAIL),
    ),
    Case(
        "a recorded but never created JobSet is created",
        lambda: with_current(record_on(4), jobset_uid=None),
        lambda rec: observe(rec, jobsets=[]),
        Want(Action.CREATE_JOBSET, "demo-0"),
    ),
    Case(
        "a JobSet deleted behind our back ends the segment",
        lambda: record_on(4),
        lambda rec: observe(rec, jobsets=[]),
        Want(Action.END, None, record={"current.end_kind": EndKind.DISAPPEARED}),
    ),
    *(
        Case(
            f"a terminal run ({state}) does nothing",
            lambda state=state: record_on(4, state=state),
            lambda rec: observe(rec, pods=pending(range(4), T0), pools=0),
            Want(Action.WAIT),
        )
        for state in sorted(record.TERMINAL)
    ),
    Case(
        "suspended by Kueue, not admitted yet, waits within the grace period",
        lambda: record_on(4),
        lambda rec: observe(rec, jobsets=[jobset(suspend=True)], pods=[], now=T0 + 30),
        Want(Action.WAIT, reason=("suspended by Kueue", "not admitted for 30s")),
    ),
    Case(
        "suspended by Kueue, not admitted within the grace period: the segment ends, evicted",
        lambda: record_on(4),
        lambda rec: observe(rec, jobsets=[jobset(suspend=True)], pods=[], now=T0 + 61),
        Want(
            Action.END,
            jobset="demo-0",
            reason=("not admitted within 60s",),
            record={"current.end_kind": "evicted"},
        ),
    ),
    Case(
        "suspended by Kueue after it ran (evicted, preempted): the segment ends at once",
        lambda: with_current(record_on(4), running_at=T0 + 5),
        lambda rec: observe(rec, jobsets=[jobset(suspend=True)], pods=running(4), now=T0 + 6),
        Want(
            Action.END,
            jobset="demo-0",
            reason=("evicted or preempted",),
            record={"state": RunState.RESHAPING},
        ),
    ),
    Case(
        "after an eviction the next segment is smaller, though the nodes still fit the shape",
        lambda: decided(
            with_current(record_on(4), running_at=T0 + 5), jobsets=[jobset(suspend=True)], pods=[], now=T0 + 6
        ),
        lambda rec: observe(rec, jobsets=[], pods=[], now=T0 + 7),
        Want(Action.START_SEGMENT, reason=("after segment 0 (evicted)",), record={"current.slices": 2}),
    ),
    Case(
        "in a Kueue queue, after an eviction the next segment is the largest smaller rung, nodes or not",
        lambda: decided(
            with_current(record_on(4, spec=replace(SPEC, queue="q")), running_at=T0 + 5),
            jobsets=[jobset(suspend=True)],
            pods=[],
            now=T0 + 6,
        ),
        lambda rec: observe(rec, jobsets=[], pods=[], pools=0, now=T0 + 7),
        Want(Action.START_SEGMENT, reason=("after segment 0 (evicted)",), record={"current.slices": 2}),
    ),
    Case(
        "a lost peer is named while JobSet restarts",
        lambda: record_on(4),
        lambda rec: observe(rec, pods=[failed_pod(), *running(4)[1:]]),
        Want(Action.WAIT, reason=("restarting (JobSet failure policy) after a lost peer",)),
    ),
    Case(
        "lost peers never spend the budget",
        lambda: with_current(
            record_on(4, app_failures=KNOBS.app_failure_budget),
            failing=Cause.PEER_LOST,
            restarts=40,
            peer_lost=40,
        ),
        lambda rec: observe(rec, pods=running(4), jobsets=[jobset(restarts=41)]),
        Want(Action.WAIT, record={"current.peer_lost": 41, "app_failures": 2}),
    ),
    Case(
        # The same restart after a crash that made its peers exit 43: over the budget, the run fails.
        "an uncounted crash over the budget fails the run",
        restarted_after_a_crash_loop,
        lambda rec: observe(rec, pods=running(4), jobsets=[jobset(restarts=41)]),
        Want(
            Action.END,
            "demo-0",
            reason=("crash loop: 3 application failures exceed the budget of 2",),
            record={"state": RunState.FAILED},
        ),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_policy(case: Case) -> None:
    rec = case.record()
    d = policy.decide(rec, case.observation(rec), LADDER, CATALOG)
    want = case.want
    assert d.action == want.action, d.reason
    if want.jobset is not ANY:
        assert d.jobset == want.jobset
    for part in want.reason:
        assert part in d.reason, f"{part!r} not in {d.reason!r}"
    if want.force is not None:
        assert d.force is want.force
    assert {path: field_of(d.record, path) for path in want.record} == want.record


def test_a_one_slice_segment_names_a_free_pool_its_predecessor_held_first() -> None:
    obs = observe(record_on(None), pools=4)
    assert obs.free_pools[PRESET] == ("np-0", "np-1", "np-2", "np-3")
    one, two = (next(r for r in LADDER if r.shape.slices == n) for n in (1, 2))
    assert policy.shared.pool_for(one, obs, ("np-9", "np-2")) == "np-2"
    assert policy.shared.pool_for(one, obs, ()) == "np-0"
    assert policy.shared.pool_for(two, obs, ("np-2",)) is None  # several slices: JobSet's exclusive placement
    assert policy.shared.pool_for(one, replace(obs, free_pools={}), ("np-2",)) is None


def test_a_grow_finished_first_says_so_in_the_end_reason() -> None:
    rec = ended_for_a_grow_at_step_55()
    d = policy.decide(
        rec, observe(rec, pods=running(1), committed=60, trainer=FINISHED_AT_60), LADDER, CATALOG
    )
    assert "before the grow" in d.record.current.end_reason


# --- what a JobSet restart is counted as: the record's counters after one pass ------------------
# A pod whose host rebooted, as upstream's kubelet first reports it (lastState, the container waiting).
REBOOTED = pod("demo-0-slice-1-0-r", phase="Failed", last_exit_reason="ContainerStatusUnknown")


@pytest.mark.parametrize(
    "failing,restarts,counted,pods,expect",
    [
        # The survivor of a dead host exited 43, JobSet has not restarted yet: remembered as failing.
        (None, 0, 0, [failed_pod(), *running(4)[1:]], {"failing": Cause.PEER_LOST, "peer_lost": 0}),
        # JobSet restarted (not counted); the failed pods are gone already: what was seen counts.
        (Cause.PEER_LOST, 1, 0, running(4), {"failing": None, "peer_lost": 1, "preemptions": 0}),
        # ... or still in view, seen for the first time in this pass.
        (None, 1, 0, [failed_pod(i=1)], {"peer_lost": 1, "preemptions": 0}),
        # A crash next to the 43s it caused, and the pod failure policy took the 43: an app failure.
        (None, 0, 0, [failed_pod(), failed_pod(i=1, code=1)], {"failing": Cause.APP_FAILURE}),
        (Cause.PEER_LOST, 0, 0, [failed_pod(i=1, code=1)], {"failing": Cause.APP_FAILURE}),  # the crash shows later
        (Cause.APP_FAILURE, 1, 0, [], {"uncounted_failures": 1, "app_failures": 1, "preemptions": 0}),
        # JobSet counted it (the crash's pod failed first): JobSet's count, nothing more here.
        (Cause.APP_FAILURE, 1, 1, [], {"uncounted_failures": 0, "restarts_counted": 1, "app_failures": 0}),
        # A saved preemption, or nothing seen at all: a preemption, as before.
        (None, 1, 0, [failed_pod(code=42)], {"peer_lost": 0, "preemptions": 1}),
        (None, 1, 0, [], {"peer_lost": 0, "preemptions": 1}),
        # Two restarts between passes: the first gets the cause seen, the other stays a preemption.
        (Cause.PEER_LOST, 2, 0, [], {"peer_lost": 1, "preemptions": 1}),
        # A rebooted host, its peer's 43 failed the Job first (uncounted): a host disruption, not a
        # preemption nor a lost peer; JobSet counted it (its pod failed first): not an app failure.
        (None, 1, 0, [failed_pod(), REBOOTED], {"host_disrupted": 1, "peer_lost": 0, "preemptions": 0}),
        (None, 1, 1, [REBOOTED], {"host_disrupted": 0, "restarts_counted": 1, "app_failures": 0, "preemptions": 0}),
    ],
)  # fmt: skip
def test_restart_causes_are_counted(failing, restarts, counted, pods, expect):
    rec = record_on(4)
    rec = rec.with_segment(replace(rec.current, failing=failing))
    d = policy.decide(
        rec, observe(rec, pods=pods, jobsets=[jobset(restarts=restarts, counted=counted)]), LADDER, CATALOG
    )
    assert d.action == Action.WAIT
    seg = d.record.current
    got = {
        "failing": seg.failing, "peer_lost": seg.peer_lost, "uncounted_failures": seg.uncounted_failures,
        "restarts_counted": seg.restarts_counted, "app_failures": d.record.app_failures,
        "preemptions": d.record.preemptions(), "host_disrupted": seg.host_disrupted,
    }  # fmt: skip
    assert {k: got[k] for k in expect} == expect
    assert seg.restarts == restarts


def test_an_evicted_segment_on_the_ladders_floor_waits_for_kueue_to_admit_it_again() -> None:
    """No smaller feasible rung: ending the segment would only queue the same shape again, and lose
    its Workload's place; Kueue requeues it and admits it again by itself."""
    floor = [r for r in LADDER if r.shape.devices >= 16]
    rec = with_current(record_on(1), running_at=T0 + 5)
    d = policy.decide(
        rec, observe(rec, jobsets=[jobset(suspend=True)], pods=[], now=T0 + 600), floor, CATALOG
    )
    assert (d.action, d.wait) == (Action.WAIT, WaitReason.ADMISSION), d.reason
    assert "evicted; Kueue requeues it" in d.reason
