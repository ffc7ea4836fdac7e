"""The policy's in-place rules (launcher/core/policy/in_place.py RULES): (record, observation of the
run's slices) -> one decision, on the objects the signals read. Table-driven, as test_policy.py: each
case a name, the run record (a builder), the observation of it (a builder), and the decision expected
(`Want`); a case that needs the pass before it starts from that pass's record (`decided`)."""

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from launcher.adapters.preset_files import load_catalog
from launcher.core import policy, world
from launcher.core.labels import LABEL_JOBSET_UID, LABEL_SEGMENT, LABEL_SLICE
from launcher.core.plan import shrink_ladder
from launcher.core.record import Knobs, RunRecord
from launcher.core.signals import observation as signals
from launcher.core.spec import RunSpec
from launcher.core.words import Action, EndKind, RunState
from tests.launcher.core.objects import T0, jobset, pod, pool

CATALOG = load_catalog()
PRESETS = list(CATALOG.values())
PRESET = "tpu7x-2x2x2"
HOSTS = 2
GB = 64
SPEC = RunSpec(run="demo", run_dir="/tmp/demo", global_batch=GB, restart_mode="in-place")
KNOBS = Knobs(unschedulable_grace_s=60, grow_window_s=30, app_failure_budget=2, app_backoff_s=10)
LADDER = shrink_ladder(CATALOG.shape(PRESET, 2), GB, 16, catalog=CATALOG)


def launched() -> RunRecord:
    return RunRecord(spec=SPEC, preset=PRESET, slices=2, knobs=KNOBS, created_at=T0)


def on_world(slices: tuple[str, ...], **seg_changes) -> RunRecord:
    """A run whose live segment 0 is the world of `slices`, started at T0."""
    rung = next(r for r in LADDER if r.shape.slices == len(slices) and r.shape.preset.name == PRESET)
    obs = observe(launched(), {}, pools=len(slices), committed=None)
    seg = replace(
        policy.in_place.new_world(launched(), obs, rung, slices, "test"), running_at=T0, **seg_changes
    )
    return replace(launched().with_segment(seg), state=RunState.RUNNING)


def slice_pods(
    sid: str, pool_name: str | None, *, unschedulable_since: float | None = None, attempt: int = 0
) -> list[dict]:
    out = []
    for h in range(HOSTS):
        p = pod(
            f"demo-s{sid}-slice-0-{h}-x",
            node_name=f"gke-{pool_name}-{h}" if pool_name else None,
            unschedulable_since=unschedulable_since,
            attempt=attempt,
        )
        labels = p["metadata"]["labels"]
        del labels[LABEL_SEGMENT]
        labels[LABEL_SLICE] = sid
        labels[LABEL_JOBSET_UID] = f"uid-demo-s{sid}"  # slice_jobset's uid
        out.append(p)
    return out


def slice_jobset(sid: str, **kw) -> dict:
    js = jobset(f"demo-s{sid}", **kw)
    js["metadata"]["labels"][LABEL_SLICE] = sid
    return js


def observe(
    rec,
    placed: dict[str, str | None],
    *,
    pools=2,
    now=T0 + 100,
    committed=10,
    jobsets=None,
    pods=None,
    since=T0,
    local_port=None,
):
    """`placed`: slice id -> the pool its pods run on (None: unschedulable since T0 + 50)."""
    nodes = [n for i in range(pools) for n in pool(f"np-{i}", PRESET, since=since)]
    pods = (
        pods
        if pods is not None
        else [
            p
            for sid, where in placed.items()
            for p in slice_pods(sid, where, unschedulable_since=None if where else T0 + 50)
        ]
    )
    jobsets = jobsets if jobsets is not None else [slice_jobset(sid) for sid in placed]
    seg = rec.current
    return signals.observe(
        now=now,
        run="demo",
        of=signals.SliceJobSets(seg.index if seg else None, HOSTS, local_port),
        segment_nodepools=seg.nodepools if seg and seg.live else (),
        expected_pods=seg.shape(CATALOG).hosts if seg else 0,
        jobsets=jobsets,
        pods=pods,
        nodes=nodes,
        events=[],
        presets=PRESETS,
        committed_step=committed,
        trainer=None,
    )


def decide(rec, obs):
    return policy.decide(rec, obs, LADDER, CATALOG)


def decided(rec: RunRecord, obs: Callable[[RunRecord], signals.Observation]) -> RunRecord:
    """The record one pass writes: the start of a case that needs the pass before it."""
    return decide(rec, obs(rec)).record


def rebooted(sid: str, attempt: int = 0) -> dict:
    """A pod of slice `sid` whose host rebooted, as upstream's kubelet first reports it: Failed, its
    container waiting, `lastState.terminated` ContainerStatusUnknown 137 (kubelet_pods.go)."""
    p = slice_pods(sid, f"np-{sid}", attempt=attempt)[0]
    p["metadata"]["name"] += "-rebooted"
    p["status"] = pod("x", phase="Failed", last_exit_reason="ContainerStatusUnknown")["status"]
    return p


# --- the records the cases start from -----------------------------------------------------------


def on_two_pools() -> RunRecord:
    return on_world(("0", "1"), nodepools=("np-0", "np-1"))


def grown_from_step_5() -> RunRecord:
    return on_world(("0",), nodepools=("np-0",), start_step=5)


def joining_slice_1() -> RunRecord:
    """World 0 of slice 0, slice 1's JobSet created to join it (the grow's first pass)."""
    return decided(grown_from_step_5(), lambda rec: observe(rec, {"0": "np-0"}, committed=10))


def restarts_at_most(n: int) -> Callable[[], RunRecord]:
    return lambda: replace(on_world(("0", "1")), spec=replace(SPEC, max_restarts=n))


def slice_1_rebooted(rec: RunRecord, attempt: int = 0) -> signals.Observation:
    return observe(rec, {"0": "np-0", "1": "np-1"}, pods=slice_pods("0", "np-0") + [rebooted("1", attempt)])


def slice_1_back(restarts: int) -> Callable[[RunRecord], signals.Observation]:
    """Slice 1's JobSet restarted (and counted) `restarts` times, its pods running again: the
    rebooted pod deleted by the restart before the next pass saw it."""
    jobsets = [slice_jobset("0"), slice_jobset("1", restarts=restarts, counted=restarts)]
    pods = slice_pods("0", "np-0") + slice_pods("1", "np-1", attempt=restarts)
    return lambda rec: observe(rec, {"0": "np-0", "1": "np-1"}, jobsets=jobsets, pods=pods)


def rebooted_once() -> RunRecord:
    # max_restarts 1 (each slice JobSet may restart once): slice 1's host rebooted at attempt 0;
    # its Job failed (no podFailurePolicy rule matches a host's reboot upstream), JobSet restarted
    # the slice and counted it. The run books a host disruption, not an application failure.
    return decided(restarts_at_most(1)(), slice_1_rebooted)


def rebooted_once_and_back() -> RunRecord:
    return decided(rebooted_once(), slice_1_back(1))


def rebooted_twice() -> RunRecord:
    """A second reboot of the same slice, booked."""
    rec = rebooted_once_and_back()
    return replace(decided(rec, lambda r: slice_1_rebooted(r, 1)), spec=rec.spec)


# --- the observations -----------------------------------------------------------------------------


def slice_1_pool_lost(rec: RunRecord) -> signals.Observation:
    """np-1 is gone: its nodes deleted, slice 1's pods failed and removed, its JobSet restarting."""
    return observe(rec, {"0": "np-0", "1": None}, pools=1)


def pool_1_deleted(slice_1_pods: Callable[[], list[dict]]) -> Callable[[RunRecord], signals.Observation]:
    """np-1's nodes (and so their pool label) are gone: slice 1's pods are still bound to them, or
    already deleted and not yet replaced. Its pool is the world's one that no slice is on now."""
    return lambda rec: observe(
        rec,
        {},
        pools=1,
        pods=slice_pods("0", "np-0") + slice_1_pods(),
        jobsets=[slice_jobset("0"), slice_jobset("1")],
    )


def slice_0_restarting_when_pool_1_goes(rec: RunRecord) -> signals.Observation:
    # Slice 0 restarting (its new pods not scheduled yet, inside the grace) when np-1 goes: which
    # slice was on np-1 cannot be told yet.
    obs = observe(rec, {}, pools=2, pods=slice_pods("0", None, unschedulable_since=T0 + 90),
                  jobsets=[slice_jobset("0"), slice_jobset("1")])  # fmt: skip
    return replace(obs, lost_nodepools=("np-1",), gone_nodepools=("np-1",))


def pool_1_unhealthy(rec: RunRecord) -> signals.Observation:
    # np-1's nodes NotReady but not deleted: slice 1's processes may still run, and the survivors'
    # trainers get SIGTERM (they save the step in flight if it can finish).
    obs = observe(rec, {"0": "np-0", "1": "np-1"})
    return replace(obs, lost_nodepools=("np-1",), capacity={PRESET: (T0,)})


def pool_0_gone(rec: RunRecord) -> signals.Observation:
    """np-0 gone: only np-1 remains."""
    obs = observe(rec, {"0": None, "1": "np-1"}, pools=2)
    return replace(obs, lost_nodepools=("np-0",), gone_nodepools=("np-0",), capacity={PRESET: (T0,)})


SLICE_1_RESTARTED = [slice_jobset("0"), slice_jobset("1", restarts=1)]


def crashed(a: int, b: int) -> Callable[[RunRecord], signals.Observation]:
    """Slice 0's JobSet restarted `a` times for crashes, slice 1's `b` times; both running again."""
    jobsets = [slice_jobset("0", restarts=a, counted=a), slice_jobset("1", restarts=b, counted=b)]
    pods = slice_pods("0", "np-0", attempt=a) + slice_pods("1", "np-1", attempt=b)
    return lambda rec: observe(rec, {"0": "np-0", "1": "np-1"}, jobsets=jobsets, pods=pods)


# --- the table ----------------------------------------------------------------------------------

ANY = object()  # the decision's field is not what the case is about
ABSENT = object()  # the world document has no such key


@dataclass(frozen=True)
class Not:
    """Any action but this one."""

    action: str


@dataclass(frozen=True)
class Want:
    action: str | Not | object  # ANY: the case is about the record the pass writes
    create: tuple[str, ...] | object = ANY  # slices_create
    delete: tuple[str, ...] | frozenset[str] | object = ANY  # slices_delete (a frozenset: in any order)
    force: bool | None = None
    reason: tuple[str, ...] = ()  # substrings of the decision's reason
    record: dict[str, Any] = field(default_factory=dict)  # path in the record written -> value
    document: dict[str, Any] = field(default_factory=dict)  # key of its world document -> value


# Record fields the table names that are not plain attributes.
DERIVED: dict[str, Callable[[RunRecord], Any]] = {
    "current.batch": lambda r: r.current.devices * r.current.micro_batch * r.current.grad_accum,
    "current.coordinator host": lambda r: r.current.coordinator.rpartition(":")[0],
    "current.coordinator port": lambda r: int(r.current.coordinator.rpartition(":")[2]),
    "len(segments)": lambda r: len(r.segments),
}


def at(value: Any, path: str) -> Any:
    """`a.b.0.c`: attributes, keys of a mapping, indexes of a sequence."""
    if isinstance(value, RunRecord) and path in DERIVED:
        return DERIVED[path](value)
    for name in path.split("."):
        if isinstance(value, dict):
            value = value[name]
        elif name.isdigit():
            value = value[int(name)]
        else:
            value = getattr(value, name)
    return value


@dataclass(frozen=True)
class Case:
    name: str
    record: Callable[[], RunRecord]
    observation: Callable[[RunRecord], signals.Observation]
    want: Want
    given: dict[str, Any] = field(default_factory=dict)  # path in the record decided on -> value
    observed: dict[str, Any] = field(default_factory=dict)  # path in the observation -> value


PORT_0, PORT_1 = (world.epoch_port(SPEC.coordinator_port, e) for e in (0, 1))

CASES = [
    Case(
        "the first world starts every slice with its coordinator on slice 0",
        launched,
        lambda rec: observe(rec, {}),
        Want(
            Action.START_SEGMENT,
            create=("0", "1"),
            record={
                "current.slice_ids": ("0", "1"),
                "current.index": 0,
                "current.coordinator": f"demo-s0-slice-0-0.demo-s0:{PORT_0}",
            },
        ),
    ),
    Case(
        # The embedded cluster (the pods read their world at `world_api`, and share the controller's
        # host): the policy takes the port the controller observed free.
        "on the embedded cluster a world's coordinator is the free local port observed",
        lambda: replace(launched(), spec=replace(SPEC, world_api="http://127.0.0.1:6443")),
        lambda rec: observe(rec, {}, local_port=40123),
        Want(Action.START_SEGMENT, create=("0", "1"), record={"current.coordinator": "127.0.0.1:40123"}),
    ),
    Case(
        "a new world on the embedded cluster takes the free local port observed",
        lambda: replace(on_two_pools(), spec=replace(SPEC, world_api="http://127.0.0.1:6443")),
        lambda rec: replace(slice_1_pool_lost(rec), local_port=40124),
        Want(Action.NEW_WORLD, record={"current.index": 1, "current.coordinator": "127.0.0.1:40124"}),
    ),
    Case(
        "a lost pool shrinks in place keeping the survivor",
        on_two_pools,
        slice_1_pool_lost,
        Want(
            Action.NEW_WORLD,
            delete=("1",),
            create=(),
            force=True,
            record={
                "len(segments)": 2,
                "segments.0.end_kind": EndKind.CAPACITY_LOST,
                "segments.0.live": False,
                "current.index": 1,
                "current.slice_ids": ("0",),
                "current.live": True,
                "current.batch": GB,
                "current.coordinator port": PORT_1,
                # Slice 1's processes are gone: the next world says so, and the survivors' trainers are killed.
                "current.lost": ("1",),
            },
        ),
    ),
    *(
        Case(
            f"a deleted pool loses its slice at once ({how})",
            on_two_pools,
            pool_1_deleted(slice_1_pods),
            Want(Action.NEW_WORLD, force=True, record={"current.slice_ids": ("0",), "current.lost": ("1",)}),
            observed={"slices.1.pools": (), "slices.1.unschedulable": 0},
        )
        for how, slice_1_pods in (
            ("left on deleted nodes", lambda: slice_pods("1", "np-1")),
            ("deleted, not yet replaced", lambda: []),
        )
    ),
    Case(
        "a deleted pool with two slices on no pool waits for a clearer sign",
        on_two_pools,
        slice_0_restarting_when_pool_1_goes,
        Want(Not(Action.NEW_WORLD)),
    ),
    Case(
        "an unhealthy pool shrinks without saying its slice is gone",
        on_two_pools,
        pool_1_unhealthy,
        Want(
            Action.NEW_WORLD,
            force=False,
            record={"current.slice_ids": ("0",), "current.lost": ()},
            document={"lost": ABSENT},
        ),
    ),
    Case(
        "the coordinator's slice lost moves process 0 to the survivor",
        on_two_pools,
        pool_0_gone,
        Want(
            Action.NEW_WORLD,
            delete=("0",),
            record={"current.slice_ids": ("1",), "current.coordinator host": "demo-s1-slice-0-0.demo-s1"},
            document={"lost": ["0"], "slices": ["1"]},
        ),
    ),
    Case(
        # The new slice's JobSet first; world 0 trains on meanwhile.
        "a world grows with a new slice once it committed and capacity held",
        grown_from_step_5,
        lambda rec: observe(rec, {"0": "np-0"}, committed=10),
        Want(
            Action.CREATE_JOBSET,
            create=("1",),
            delete=(),
            record={"current.index": 0, "current.joining": ("1",), "current.live": True},
        ),
    ),
    Case(
        "a joining slice's pods pending: wait (no second JobSet, no new world)",
        joining_slice_1,
        lambda rec: observe(rec, {"0": "np-0"}, jobsets=[slice_jobset("0"), slice_jobset("1")]),
        Want(Action.WAIT),
    ),
    Case(
        "a joining slice running: the next world takes it in after the survivor",
        joining_slice_1,
        lambda rec: observe(rec, {"0": "np-0", "1": "np-1"}),
        Want(
            Action.NEW_WORLD,
            create=(),
            delete=(),
            record={
                "current.slice_ids": ("0", "1"),
                "segments.0.end_kind": EndKind.GROW,
                "current.joining": (),
            },
        ),
    ),
    Case(
        "a joining slice's pool lost before it ran: dropped, its JobSet deleted, world 0 stays",
        joining_slice_1,
        lambda rec: observe(rec, {"0": "np-0", "1": None}, pools=1),
        Want(Action.DELETE, delete=("1",), record={"current.joining": ()}),
    ),
    Case(
        "the old JobSet of a slice id still going: wait for it rather than create over it",
        grown_from_step_5,
        lambda rec: observe(
            rec, {"0": "np-0"}, jobsets=[slice_jobset("0"), slice_jobset("1", deleting=True)]
        ),
        Want(Action.WAIT),
    ),
    Case(
        "nothing committed in this world yet: no grow",
        grown_from_step_5,
        lambda rec: observe(rec, {"0": "np-0"}, committed=5),
        Want(Action.WAIT),
    ),
    Case(
        # The world is for slice 1's pods of attempt 1: those of attempt 1 that came up while world 0
        # was still published did not join it (trainer/elastic/world.py `other_attempt`).
        "a slice restarted under the world gets a new world of the same slices",
        lambda: on_world(("0", "1")),
        lambda rec: observe(
            rec,
            {"0": "np-0", "1": "np-1"},
            jobsets=SLICE_1_RESTARTED,
            pods=slice_pods("0", "np-0") + slice_pods("1", "np-1", attempt=1),
        ),
        Want(
            Action.NEW_WORLD,
            delete=(),
            create=(),
            record={
                "current.slice_ids": ("0", "1"),
                "segments.0.end_kind": EndKind.NEW_ATTEMPT,
                "current.restarts": 1,
                "current.attempts": (0, 1),
            },
            document={"attempts": {"0": 0, "1": 1}},
        ),
        given={"current.attempts": (0, 0)},
    ),
    Case(
        "a slice restarted under the world, still coming back up: wait",
        lambda: on_world(("0", "1")),
        lambda rec: observe(rec, {"0": "np-0", "1": None}, jobsets=SLICE_1_RESTARTED),
        Want(Action.WAIT),
    ),
    Case(
        "a missing slice JobSet is created",
        lambda: on_world(("0", "1")),
        lambda rec: observe(rec, {"0": "np-0"}, jobsets=[slice_jobset("0")]),
        Want(Action.CREATE_JOBSET, create=("1",)),
    ),
    Case(
        "a stray slice JobSet is deleted",
        lambda: on_world(("0", "1")),
        lambda rec: observe(rec, {"0": "np-0", "1": "np-1", "2": "np-1"}),
        Want(Action.DELETE, delete=("2",)),
    ),
    Case(
        "a failed slice ends the world as an application failure",
        lambda: on_world(("0", "1")),
        lambda rec: observe(
            rec,
            {"0": "np-0", "1": "np-1"},
            jobsets=[slice_jobset("0"), slice_jobset("1", condition=("Failed", "FailedJobs", "jobs failed"))],
        ),
        Want(
            Action.END,
            delete=frozenset({"0", "1"}),
            record={"app_failures": 1, "current.end_kind": EndKind.APP_FAILURE},
        ),
    ),
    Case(
        # Each below its own maxRestarts (10) and together at it: a new world of the same slices.
        "crashes counted by several slice JobSets within the run's max_restarts: a new world",
        lambda: on_world(("0", "1")),
        crashed(5, 5),
        Want(Action.NEW_WORLD),
    ),
    Case(
        # Together over it, though each is below: the crash loop ends the run, as a recreate run's one
        # JobSet would have failed at its 11th counted crash (and rule 4 counted it 10 + 1).
        "crashes counted by several slice JobSets over the run's max_restarts: the run fails",
        lambda: on_world(("0", "1")),
        crashed(6, 5),
        Want(
            Action.FAIL,
            delete=frozenset({"0", "1"}),
            reason=("crash loop",),
            record={"state": RunState.FAILED, "app_failures": 11},
        ),
    ),
    Case(
        # max_restarts 0: the first counted crash ends the world, with the run's budget's backoff.
        "max_restarts 0: the first counted crash ends the world",
        restarts_at_most(0),
        crashed(0, 1),
        Want(
            Action.END,
            delete=frozenset({"0", "1"}),
            record={"app_failures": 1, "next_submit_at": T0 + 100 + KNOBS.app_backoff_s},
        ),
    ),
    Case(
        "a rebooted host is booked as a host disruption, not an application failure",
        restarts_at_most(1),
        slice_1_rebooted,
        Want(ANY, record={"host_disruptions": ("uid-demo-s1/0",), "app_failures": 0}),
    ),
    Case(
        "a rebooted host restarts its slice in a new world counted by nobody",
        rebooted_once,
        slice_1_back(1),
        Want(
            Action.NEW_WORLD,
            delete=(),
            create=(),
            reason=("host disruption", "slice(s) 1"),
            record={"segments.0.end_kind": EndKind.NEW_ATTEMPT, "app_failures": 0},
        ),
    ),
    Case(
        # JobSet's count (2) is over max_restarts 1, the run's is 0.
        "a second reboot of the same slice: a new world, still counted by nobody",
        rebooted_twice,
        slice_1_back(2),
        Want(Action.NEW_WORLD, record={"app_failures": 0}),
        given={"host_disruptions": ("uid-demo-s1/0", "uid-demo-s1/1")},
    ),
    Case(
        "the same counts without the reboots booked: crashes over max_restarts end the world",
        lambda: replace(rebooted_twice(), host_disruptions=()),
        slice_1_back(2),
        Want(Action.END, record={"app_failures": 2}),
    ),
    Case(
        # max_restarts 0: JobSet fails the slice at its first counted restart, a reboot's. Its JobSet
        # cannot restart again, so every slice starts afresh: no backoff, nothing spent.
        "a slice JobSet that gave up on a reboot starts the world again uncharged",
        restarts_at_most(0),
        lambda rec: observe(
            rec,
            {"0": "np-0", "1": "np-1"},
            jobsets=[
                slice_jobset("0"),
                slice_jobset("1", condition=("Failed", "ReachedMaxRestarts", "jobset reached max restarts")),
            ],
            pods=slice_pods("0", "np-0") + [rebooted("1")],
        ),
        Want(
            Action.END,
            delete=frozenset({"0", "1"}),
            reason=("host disruption",),
            record={
                "current.end_kind": EndKind.HOST_DISRUPTION,
                "app_failures": 0,
                "next_submit_at": 0.0,
                "state": RunState.RESHAPING,
            },
        ),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_policy_in_place(case: Case) -> None:
    rec = case.record()
    assert {path: at(rec, path) for path in case.given} == case.given
    obs = case.observation(rec)
    assert {path: at(obs, path) for path in case.observed} == case.observed
    d = decide(rec, obs)
    want = case.want
    if isinstance(want.action, Not):
        assert d.action != want.action.action, d.reason
    elif want.action is not ANY:
        assert d.action == want.action, d.reason
    if want.create is not ANY:
        assert d.slices_create == want.create
    if isinstance(want.delete, frozenset):
        assert set(d.slices_delete) == want.delete
    elif want.delete is not ANY:
        assert d.slices_delete == want.delete
    if want.force is not None:
        assert d.force is want.force
    for part in want.reason:
        assert part in d.reason, f"{part!r} not in {d.reason!r}"
    assert {path: at(d.record, path) for path in want.record} == want.record
    if want.document:
        doc = world.document(SPEC, CATALOG.preset(PRESET), d.record.current, T0)
        assert {k: doc.get(k, ABSENT) for k in want.document} == want.document


def test_the_world_beats_while_it_waits_for_a_slice_being_recreated() -> None:
    # Slice 1 restarting (its new pods not running yet): the survivors' trainers exited and their
    # supervisors wait; the controller refreshes the heartbeat every HEARTBEAT_S so that they wait
    # as long as it is at work (trainer/elastic/world.py keep_waiting), and not otherwise.
    rec = on_world(("0", "1"))
    seg = rec.current
    doc = world.document(SPEC, CATALOG.preset(PRESET), seg, T0)
    restarting = observe(
        rec, {"0": "np-0", "1": None}, jobsets=[slice_jobset("0"), slice_jobset("1", restarts=1)]
    )
    assert world.awaits_slices(seg, restarting.slices)
    assert world.beat(doc, seg, restarting.slices, T0 + world.HEARTBEAT_S - 1) is None  # not due yet
    beaten = world.beat(doc, seg, restarting.slices, T0 + world.HEARTBEAT_S)
    assert beaten == {**doc, "heartbeat": T0 + world.HEARTBEAT_S}
    assert world.beat(beaten, seg, restarting.slices, T0 + world.HEARTBEAT_S + 5) is None
    assert world.beat(beaten, seg, restarting.slices, T0 + 2 * world.HEARTBEAT_S)["heartbeat"] == T0 + 20
    # Every slice running: nothing to wait for, no beat; nor for another epoch's document.
    running = observe(rec, {"0": "np-0", "1": "np-1"})
    assert not world.awaits_slices(seg, running.slices)
    assert world.beat(doc, seg, running.slices, T0 + 100) is None
    assert world.beat({**doc, "epoch": seg.index + 1}, seg, restarting.slices, T0 + 100) is None
    assert world.beat(None, seg, restarting.slices, T0 + 100) is None


def test_a_pass_over_unchanged_caches_reads_no_slice_again_and_a_change_is_seen() -> None:
    # At the seeds' scale every pass re-read each of the run's 3,072 pods: most of an in-place
    # decision's time. The controller's memo keeps the slices by the caches' tuples, and the pods'
    # views by resourceVersion.
    memos = signals.Memos()
    nodes = tuple(n for i in range(2) for n in pool(f"np-{i}", PRESET, since=T0))
    pods = [p for sid, where in (("0", "np-0"), ("1", "np-1")) for p in slice_pods(sid, where)]
    for i, p in enumerate(pods):
        p["metadata"]["resourceVersion"] = str(i + 1)
    jobsets, pods = (slice_jobset("0"), slice_jobset("1")), tuple(pods)
    first = memos.slices(("demo", HOSTS), jobsets, pods, nodes)
    assert first["0"].pods_running == HOSTS and first["1"].pools == ("np-1",)
    assert memos.slices(("demo", HOSTS), jobsets, pods, nodes) is first  # nothing walked again
    failed = dict(
        pods[-1], status={"phase": "Failed"}, metadata={**pods[-1]["metadata"], "resourceVersion": "99"}
    )
    changed = memos.slices(("demo", HOSTS), jobsets, (*pods[:-1], failed), nodes)
    assert changed["1"].pods_alive == HOSTS - 1 and changed["0"] == first["0"]
