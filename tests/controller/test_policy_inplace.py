"""The policy's in-place rules (launcher/core/policy/in_place.py RULES): (record, observation of the
run's slices) -> one decision, case by case, on the objects the signals read."""

from dataclasses import replace

import pytest

from launcher.adapters.preset_files import load_catalog
from launcher.core import policy, world
from launcher.core.labels import LABEL_JOBSET_UID, LABEL_SEGMENT, LABEL_SLICE
from launcher.core.plan import shrink_ladder
from launcher.core.record import Knobs, RunRecord
from launcher.core.signals import observation as signals
from launcher.core.signals.slices import slice_views
from launcher.core.spec import RunSpec
from launcher.core.words import Action, EndKind, RunState
from tests.controller.objects import T0, jobset, pod, pool

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
    obs = signals.observe(
        now=now,
        run="demo",
        segment=None,
        segment_jobset=None,
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
    pool_of = {n["metadata"]["name"]: n["metadata"]["labels"]["cloud.google.com/gke-nodepool"] for n in nodes}
    return replace(obs, slices=slice_views("demo", jobsets, pods, pool_of, HOSTS))


def decide(rec, obs):
    return policy.decide(rec, obs, LADDER, CATALOG)


def test_the_first_world_starts_every_slice_with_its_coordinator_on_slice_0() -> None:
    d = decide(launched(), observe(launched(), {}))
    assert d.action == Action.START_SEGMENT and d.slices_create == ("0", "1")
    seg = d.record.current
    assert seg.slice_ids == ("0", "1") and seg.index == 0
    assert seg.coordinator == f"demo-s0-slice-0-0.demo-s0:{world.epoch_port(SPEC.coordinator_port, 0)}"


def test_a_lost_pool_shrinks_in_place_keeping_the_survivor() -> None:
    rec = on_world(("0", "1"), nodepools=("np-0", "np-1"))
    # np-1 is gone: its nodes deleted, slice 1's pods failed and removed, its JobSet restarting.
    d = decide(rec, observe(rec, {"0": "np-0", "1": None}, pools=1))
    assert d.action == Action.NEW_WORLD, d.reason
    assert (d.slices_delete, d.slices_create, d.force) == (("1",), (), True)
    ended, nxt = d.record.segments
    assert ended.end_kind == EndKind.CAPACITY_LOST and not ended.live
    assert nxt.index == 1 and nxt.slice_ids == ("0",) and nxt.live
    assert nxt.devices * nxt.micro_batch * nxt.grad_accum == GB
    assert nxt.coordinator.endswith(f":{world.epoch_port(SPEC.coordinator_port, 1)}")
    # Slice 1's processes are gone: the next world says so, and the survivors' trainers are killed.
    assert nxt.lost == ("1",)


@pytest.mark.parametrize(
    "slice_1_pods",
    [
        pytest.param(lambda: slice_pods("1", "np-1"), id="left-on-deleted-nodes"),
        pytest.param(lambda: [], id="deleted-not-yet-replaced"),
    ],
)
def test_a_deleted_pool_loses_its_slice_at_once(slice_1_pods) -> None:
    # np-1's nodes (and so their pool label) are gone: slice 1's pods are still bound to them, or
    # already deleted and not yet replaced. Its pool is the world's one that no slice is on now.
    rec = on_world(("0", "1"), nodepools=("np-0", "np-1"))
    obs = observe(rec, {}, pools=1, pods=slice_pods("0", "np-0") + slice_1_pods(),
                  jobsets=[slice_jobset("0"), slice_jobset("1")])  # fmt: skip
    assert obs.slices["1"].pools == () and obs.slices["1"].unschedulable == 0
    d = decide(rec, obs)
    assert d.action == Action.NEW_WORLD and d.force, d.reason
    assert d.record.current.slice_ids == ("0",) and d.record.current.lost == ("1",)


def test_a_deleted_pool_with_two_slices_on_no_pool_waits_for_a_clearer_sign() -> None:
    # Slice 0 restarting (its new pods not scheduled yet, inside the grace) when np-1 goes: which
    # slice was on np-1 cannot be told yet.
    rec = on_world(("0", "1"), nodepools=("np-0", "np-1"))
    obs = observe(rec, {}, pools=2, pods=[p for p in slice_pods("0", None, unschedulable_since=T0 + 90)],
                  jobsets=[slice_jobset("0"), slice_jobset("1")])  # fmt: skip
    obs = replace(obs, lost_nodepools=("np-1",), gone_nodepools=("np-1",))
    d = decide(rec, obs)
    assert d.action != Action.NEW_WORLD, d.reason


def test_an_unhealthy_pool_shrinks_without_saying_its_slice_is_gone() -> None:
    # np-1's nodes NotReady but not deleted: slice 1's processes may still run, and the survivors'
    # trainers get SIGTERM (they save the step in flight if it can finish).
    rec = on_world(("0", "1"), nodepools=("np-0", "np-1"))
    obs = replace(
        observe(rec, {"0": "np-0", "1": "np-1"}), lost_nodepools=("np-1",), capacity={PRESET: (T0,)}
    )
    d = decide(rec, obs)
    assert d.action == Action.NEW_WORLD and not d.force, d.reason
    assert d.record.current.slice_ids == ("0",) and d.record.current.lost == ()
    doc = world.document(SPEC, CATALOG.preset(PRESET), d.record.current, T0)
    assert "lost" not in doc


def test_the_coordinators_slice_lost_moves_process_0_to_the_survivor() -> None:
    rec = on_world(("0", "1"), nodepools=("np-0", "np-1"))
    nodes_left = observe(rec, {"0": None, "1": "np-1"}, pools=2)
    # np-0 gone: only np-1 remains.
    obs = replace(nodes_left, lost_nodepools=("np-0",), gone_nodepools=("np-0",), capacity={PRESET: (T0,)})
    d = decide(rec, obs)
    assert d.action == Action.NEW_WORLD and d.slices_delete == ("0",)
    assert d.record.current.slice_ids == ("1",)
    assert d.record.current.coordinator.startswith("demo-s1-slice-0-0.demo-s1:")
    doc = world.document(SPEC, CATALOG.preset(PRESET), d.record.current, T0)
    assert doc["lost"] == ["0"] and doc["slices"] == ["1"]


def test_a_world_grows_with_a_new_slice_once_it_committed_and_capacity_held() -> None:
    rec = on_world(("0",), nodepools=("np-0",), start_step=5)
    d = decide(rec, observe(rec, {"0": "np-0"}, committed=10))
    # The new slice's JobSet first; world 0 trains on meanwhile.
    assert d.action == Action.CREATE_JOBSET and d.slices_create == ("1",) and d.slices_delete == ()
    joining = d.record
    assert joining.current.index == 0 and joining.current.joining == ("1",) and joining.current.live
    # Its pods pending: wait (no second JobSet, no new world).
    pending = observe(joining, {"0": "np-0"}, jobsets=[slice_jobset("0"), slice_jobset("1")])
    assert decide(joining, pending).action == Action.WAIT
    # Running: the next world takes it in after the survivor.
    d = decide(joining, observe(joining, {"0": "np-0", "1": "np-1"}))
    assert d.action == Action.NEW_WORLD and (d.slices_create, d.slices_delete) == ((), ())
    assert d.record.current.slice_ids == ("0", "1") and d.record.segments[0].end_kind == EndKind.GROW
    assert d.record.current.joining == ()
    # Its pool lost before it ran: dropped, its JobSet deleted, world 0 stays.
    gone = observe(joining, {"0": "np-0", "1": None}, pools=1)
    d = decide(joining, gone)
    assert d.action == Action.DELETE and d.slices_delete == ("1",) and d.record.current.joining == ()
    # The old JobSet of id 1 still going: wait for it rather than create over it.
    stale = observe(rec, {"0": "np-0"}, jobsets=[slice_jobset("0"), slice_jobset("1", deleting=True)])
    assert decide(rec, stale).action == Action.WAIT
    # Nothing committed in this world yet: no grow.
    assert decide(rec, observe(rec, {"0": "np-0"}, committed=5)).action == Action.WAIT


def test_a_slice_restarted_under_the_world_gets_a_new_world_of_the_same_slices() -> None:
    rec = on_world(("0", "1"))
    restarted = [slice_jobset("0"), slice_jobset("1", restarts=1)]
    pods = slice_pods("0", "np-0") + slice_pods("1", "np-1", attempt=1)
    d = decide(rec, observe(rec, {"0": "np-0", "1": "np-1"}, jobsets=restarted, pods=pods))
    assert d.action == Action.NEW_WORLD and d.record.current.slice_ids == ("0", "1")
    assert d.record.segments[0].end_kind == EndKind.RESTART and d.record.current.restarts == 1
    assert (d.slices_delete, d.slices_create) == ((), ())
    # The world is for slice 1's pods of attempt 1: those of attempt 1 that came up while world 0
    # was still published did not join it (trainer/elastic/world.py `other_attempt`).
    assert rec.current.attempts == (0, 0) and d.record.current.attempts == (0, 1)
    assert world.document(SPEC, CATALOG.preset(PRESET), d.record.current, T0)["attempts"] == {"0": 0, "1": 1}
    # Still coming back up: wait.
    back = observe(rec, {"0": "np-0", "1": None}, jobsets=restarted)
    assert decide(rec, back).action == Action.WAIT


def test_a_missing_slice_jobset_is_created_and_a_stray_one_deleted() -> None:
    rec = on_world(("0", "1"))
    d = decide(rec, observe(rec, {"0": "np-0"}, jobsets=[slice_jobset("0")]))
    assert d.action == Action.CREATE_JOBSET and d.slices_create == ("1",)
    stray = observe(rec, {"0": "np-0", "1": "np-1", "2": "np-1"})
    d = decide(rec, stray)
    assert d.action == Action.DELETE and d.slices_delete == ("2",)


def test_a_failed_slice_ends_the_world_as_an_application_failure() -> None:
    rec = on_world(("0", "1"))
    failed = slice_jobset("1", condition=("Failed", "FailedJobs", "jobs failed"))
    d = decide(rec, observe(rec, {"0": "np-0", "1": "np-1"}, jobsets=[slice_jobset("0"), failed]))
    assert d.action == Action.END and set(d.slices_delete) == {"0", "1"}
    assert d.record.app_failures == 1 and d.record.current.end_kind == EndKind.APP_FAILURE


def test_crashes_counted_by_several_slice_jobsets_spend_the_runs_max_restarts() -> None:
    rec = on_world(("0", "1"))

    def crashed(rec: RunRecord, a: int, b: int):
        """Slice 0's JobSet restarted `a` times for crashes, slice 1's `b` times; both running again."""
        jobsets = [slice_jobset("0", restarts=a, counted=a), slice_jobset("1", restarts=b, counted=b)]
        pods = slice_pods("0", "np-0", attempt=a) + slice_pods("1", "np-1", attempt=b)
        return observe(rec, {"0": "np-0", "1": "np-1"}, jobsets=jobsets, pods=pods)

    # Each below its own maxRestarts (10) and together at it: a new world of the same slices.
    assert decide(rec, crashed(rec, 5, 5)).action == Action.NEW_WORLD
    # Together over it, though each is below: the crash loop ends the run, as a recreate run's one
    # JobSet would have failed at its 11th counted crash (and rule 4 counted it 10 + 1).
    d = decide(rec, crashed(rec, 6, 5))
    assert d.action == Action.FAIL and d.record.state == RunState.FAILED, d.reason
    assert d.record.app_failures == 11 and "crash loop" in d.reason
    assert set(d.slices_delete) == {"0", "1"}
    # max_restarts 0: the first counted crash ends the world, with the run's budget's backoff.
    strict = replace(rec, spec=replace(SPEC, max_restarts=0))
    d = decide(strict, crashed(strict, 0, 1))
    assert d.action == Action.END and d.record.app_failures == 1, d.reason
    assert d.record.next_submit_at == T0 + 100 + KNOBS.app_backoff_s and set(d.slices_delete) == {"0", "1"}


def rebooted(sid: str, attempt: int = 0) -> dict:
    """A pod of slice `sid` whose host rebooted, as upstream's kubelet first reports it: Failed, its
    container waiting, `lastState.terminated` ContainerStatusUnknown 137 (kubelet_pods.go)."""
    p = slice_pods(sid, f"np-{sid}", attempt=attempt)[0]
    p["metadata"]["name"] += "-rebooted"
    p["status"] = pod("x", phase="Failed", last_exit_reason="ContainerStatusUnknown")["status"]
    return p


def test_a_rebooted_host_restarts_its_slice_in_a_new_world_counted_by_nobody() -> None:
    # max_restarts 1 (each slice JobSet may restart once): slice 1's host rebooted at attempt 0;
    # its Job failed (no podFailurePolicy rule matches a host's reboot upstream), JobSet restarted
    # the slice and counted it. The run books a host disruption, not an application failure.
    rec = replace(on_world(("0", "1")), spec=replace(SPEC, max_restarts=1))
    failed = observe(rec, {"0": "np-0", "1": "np-1"}, pods=slice_pods("0", "np-0") + [rebooted("1")])
    rec = decide(rec, failed).record
    assert rec.host_disruptions == ("uid-demo-s1/0",) and rec.app_failures == 0
    # The pod is deleted (JobSet's restart) before the next pass saw it: it is in the departed.
    jobsets = [slice_jobset("0"), slice_jobset("1", restarts=1, counted=1)]
    pods = slice_pods("0", "np-0") + slice_pods("1", "np-1", attempt=1)
    back = observe(rec, {"0": "np-0", "1": "np-1"}, jobsets=jobsets, pods=pods)
    d = decide(rec, back)
    assert d.action == Action.NEW_WORLD and (d.slices_delete, d.slices_create) == ((), ()), d.reason
    assert "host disruption" in d.reason and "slice(s) 1" in d.reason
    assert d.record.segments[0].end_kind == EndKind.RESTART and d.record.app_failures == 0
    # A second reboot of the same slice: JobSet's count (2) is over max_restarts 1, the run's is 0.
    rec = d.record
    again = observe(rec, {"0": "np-0", "1": "np-1"}, pods=slice_pods("0", "np-0") + [rebooted("1", 1)])
    rec = replace(decide(rec, again).record, spec=rec.spec)
    assert rec.host_disruptions == ("uid-demo-s1/0", "uid-demo-s1/1")
    jobsets = [slice_jobset("0"), slice_jobset("1", restarts=2, counted=2)]
    pods = slice_pods("0", "np-0") + slice_pods("1", "np-1", attempt=2)
    d = decide(rec, observe(rec, {"0": "np-0", "1": "np-1"}, jobsets=jobsets, pods=pods))
    assert d.action == Action.NEW_WORLD and d.record.app_failures == 0, d.reason
    # The same counts without the reboots booked: crashes, over max_restarts: the world ends.
    crashes = replace(rec, host_disruptions=())
    d = decide(crashes, observe(crashes, {"0": "np-0", "1": "np-1"}, jobsets=jobsets, pods=pods))
    assert d.action == Action.END and d.record.app_failures == 2, d.reason


def test_a_slice_jobset_that_gave_up_on_a_reboot_starts_the_world_again_uncharged() -> None:
    # max_restarts 0: JobSet fails the slice at its first counted restart, a reboot's. Its JobSet
    # cannot restart again, so every slice starts afresh: no backoff, nothing spent.
    rec = replace(on_world(("0", "1")), spec=replace(SPEC, max_restarts=0))
    gave_up = slice_jobset("1", condition=("Failed", "ReachedMaxRestarts", "jobset reached max restarts"))
    obs = observe(
        rec,
        {"0": "np-0", "1": "np-1"},
        jobsets=[slice_jobset("0"), gave_up],
        pods=slice_pods("0", "np-0") + [rebooted("1")],
    )
    d = decide(rec, obs)
    assert d.action == Action.END and set(d.slices_delete) == {"0", "1"}, d.reason
    assert d.record.current.end_kind == EndKind.HOST_DISRUPTION and "host disruption" in d.reason
    assert d.record.app_failures == 0 and d.record.next_submit_at == 0.0
    assert d.record.state == RunState.RESHAPING


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
