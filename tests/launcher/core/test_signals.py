"""Table-driven: realistic objects in, the observation out (docs/platform.md §4, one case per signal)."""

import dataclasses

import pytest

from launcher.adapters import projections
from launcher.adapters.preset_files import load_presets
from launcher.core import rfc3339
from launcher.core.signals import observation as signals
from launcher.core.signals.basics import ByVersion
from launcher.core.words import Cause, Phase
from tests.launcher.core.objects import T0, failed_scheduling, jobset, pod, pool

PRESETS = list(load_presets().values())


def observe(*, pods=(), nodes=(), jobsets=(jobset(),), events=(), segment=0, expected=4, seg_pools=(), **kw):
    """The observation of the objects as served, checked against the one of what the controller's
    caches keep of them (launcher/adapters/projections.py): every case here is also a case of those."""
    args = dict(
        now=kw.get("now", T0 + 100),
        run="demo",
        of=signals.OneJobSet(segment, f"demo-{segment}"),
        segment_nodepools=seg_pools,
        expected_pods=expected,
        jobsets=list(jobsets),
        presets=PRESETS,
        committed_step=kw.get("committed_step"),
        trainer=kw.get("trainer"),
        slice_hosts=kw.get("slice_hosts", 0),
        foreign_nodes=kw.get("foreign_nodes", frozenset()),
        departed_pods=kw.get("departed_pods", ()),
    )
    obs = signals.observe(**args, pods=list(pods), nodes=list(nodes), events=list(events))
    cached = signals.observe(
        **args,
        pods=[projections.run_pod(p) for p in pods],
        nodes=[projections.tpu_node(n) for n in nodes],
        events=[projections.scheduling_event(e) for e in events],
    )
    assert cached == obs, "the caches' projections lost a field the signals read"
    return obs


FOUR_POOLS = [n for i in range(4) for n in pool(f"np-{i}")]
RUNNING4 = [pod(f"demo-0-slice-{i}-0-abcde", node_name=f"gke-np-{i}-0") for i in range(4)]


def test_running_segment_on_four_whole_slices():
    obs = observe(pods=RUNNING4, nodes=FOUR_POOLS)
    assert obs.phase == Phase.RUNNING
    assert obs.pods_running == 4 and obs.unschedulable == 0
    assert obs.nodepools_in_use == ("np-0", "np-1", "np-2", "np-3")
    assert obs.fits("tpu7x-2x2x1", 4) and not obs.fits("tpu7x-2x2x1", 5)
    assert obs.fits_since("tpu7x-2x2x1", 4) == T0
    assert obs.lost_nodepools == () and obs.disruptions == ()


@pytest.mark.parametrize(
    "reason", ["PreemptionByScheduler", "DeletionByTaintManager", "EvictionByEvictionAPI", "DeletionByPodGC",
               "TerminationByKubelet"],
)  # fmt: skip
def test_disruption_target_reasons_are_reported(reason):
    pods = [pod("demo-0-slice-0-0-aaaaa", phase="Failed", disruption=reason, exit_code=143), *RUNNING4[1:]]
    obs = observe(pods=pods, nodes=FOUR_POOLS)
    assert f"pod demo-0-slice-0-0-aaaaa: DisruptionTarget {reason}" in obs.disruptions
    assert obs.phase == Phase.RESTARTING  # a failed pod of the current attempt: JobSet is about to act


def test_a_pod_deleted_since_the_last_pass_still_reports_its_disruption():
    # PodGC marks the pod and deletes it at once: the pass that follows sees only its last state.
    gone = pod("demo-0-slice-0-0-aaaaa", phase="Failed", disruption="DeletionByPodGC", exit_code=137)
    other_segment = pod(
        "demo-1-slice-0-0-bbbbb", segment=1, phase="Failed", disruption="PreemptionByScheduler"
    )
    other_run = pod("else-0-slice-0-0-ccccc", run="else", phase="Failed", disruption="PreemptionByScheduler")
    departed = [projections.run_pod(p) for p in (gone, other_segment, other_run)]
    obs = observe(pods=RUNNING4[1:], nodes=FOUR_POOLS, departed_pods=departed)
    assert obs.disruptions == ("pod demo-0-slice-0-0-aaaaa: DisruptionTarget DeletionByPodGC",)
    assert obs.pods_running == 3  # what is gone counts for nothing else
    assert observe(pods=RUNNING4[1:], nodes=FOUR_POOLS).disruptions == ()


@pytest.mark.parametrize("reason", ["Terminated", "NodeShutdown"])
def test_pod_failed_by_node_shutdown(reason):
    pods = [pod("demo-0-slice-0-0-aaaaa", phase="Failed", reason=reason), *RUNNING4[1:]]
    obs = observe(pods=pods, nodes=FOUR_POOLS)
    assert f"pod demo-0-slice-0-0-aaaaa: {reason}" in obs.disruptions


def test_deletion_timestamp_on_running_pod_means_restarting():
    pods = [pod("demo-0-slice-0-0-aaaaa", deleting=True), *RUNNING4[1:]]
    assert observe(pods=pods, nodes=FOUR_POOLS).phase == Phase.RESTARTING


def test_old_attempt_pods_still_terminating_means_restarting():
    pods = [pod(f"p{i}", attempt=0, deleting=True) for i in range(2)] + [
        pod(f"q{i}", attempt=1) for i in range(4)
    ]
    obs = observe(pods=pods, nodes=FOUR_POOLS, jobsets=[jobset(restarts=1)])
    assert obs.phase == Phase.RESTARTING and obs.jobset.restarts == 1


def test_unschedulable_pods_since_and_message():
    pods = RUNNING4[:1] + [pod(f"demo-0-slice-{i}-0-x", unschedulable_since=T0 + 10 * i) for i in (1, 2, 3)]
    obs = observe(pods=pods, nodes=pool("np-0"))
    assert obs.phase == Phase.PENDING
    assert obs.unschedulable == 3 and obs.unschedulable_since == T0 + 10
    assert "Insufficient google.com/tpu" in obs.unschedulable_message
    assert obs.fits("tpu7x-2x2x1", 1) and not obs.fits("tpu7x-2x2x1", 2)


@pytest.mark.parametrize("reason", ["FailedScheduling", "NotTriggerScaleUp"])
def test_scheduling_events_supply_the_message(reason):
    p = pod("demo-0-slice-1-0-x", unschedulable_since=T0, unschedulable_message="")
    ev = failed_scheduling(
        "demo-0-slice-1-0-x", "pod didn't trigger scale-up: 1 node(s) didn't match", T0 + 5
    )
    ev["reason"] = reason
    obs = observe(pods=[p], nodes=[], events=[ev], expected=1)
    assert obs.unschedulable_message == "pod didn't trigger scale-up: 1 node(s) didn't match"


@pytest.mark.parametrize(
    "taint",
    [
        "cloud.google.com/impending-node-termination",
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/not-ready",
    ],
)
def test_bad_node_taints_remove_the_slice_and_are_reported(taint):
    nodes = pool("np-0", taints=(taint,)) + [n for i in (1, 2, 3) for n in pool(f"np-{i}")]
    obs = observe(pods=RUNNING4, nodes=nodes, seg_pools=("np-0", "np-1", "np-2", "np-3"))
    assert not obs.fits("tpu7x-2x2x1", 4) and obs.fits("tpu7x-2x2x1", 3)
    assert "np-0" in obs.lost_nodepools
    assert f"node gke-np-0-0: taint {taint}" in obs.disruptions


def test_a_cordoned_node_is_not_capacity():
    nodes = pool("np-0") + pool("np-1")
    nodes[0]["spec"]["unschedulable"] = True  # kubectl cordon / drain
    assert len(observe(nodes=nodes, pods=[], expected=1).capacity["tpu7x-2x2x1"]) == 1


def test_node_not_ready_is_not_capacity():
    nodes = pool("np-0", ready=False) + pool("np-1")
    obs = observe(nodes=nodes, pods=[], expected=1)
    assert len(obs.capacity["tpu7x-2x2x1"]) == 1


def test_node_pool_vanishing_is_lost():
    nodes = [n for i in (1, 2, 3) for n in pool(f"np-{i}")]
    obs = observe(pods=RUNNING4[1:], nodes=nodes, seg_pools=("np-0", "np-1", "np-2", "np-3"))
    assert obs.lost_nodepools == ("np-0",)
    assert "node pool np-0: gone" in obs.disruptions


def test_a_pool_whose_nodes_were_deleted_is_gone_a_terminating_one_is_not():
    big = [f"big-{i}" for i in range(3)]
    nodes = (
        pool("big-0", "tpu7x-4x4x4")[:-1]  # a host deleted: its node is gone for good
        + pool("big-1", "tpu7x-4x4x4", taints=("cloud.google.com/impending-node-termination",))
        + pool("big-2", "tpu7x-4x4x4")
    )
    obs = observe(nodes=nodes, pods=[], expected=48, seg_pools=big, slice_hosts=16)
    assert obs.lost_nodepools == ("big-0", "big-1")
    assert obs.gone_nodepools == ("big-0",)  # the preemption notice still lets the trainer save


def test_nodes_of_other_workloads_given_apart_are_busy():
    obs = observe(nodes=pool("np-0") + pool("np-1"), pods=[], expected=1, foreign_nodes={"gke-np-1-0"})
    assert len(obs.capacity["tpu7x-2x2x1"]) == 1


def test_multi_host_slice_counts_only_when_whole():
    nodes = pool("big-0", "tpu7x-4x4x4") + pool("big-1", "tpu7x-4x4x4")[:-1]  # big-1 lost a host
    obs = observe(nodes=nodes, pods=[], expected=16)
    assert len(obs.capacity["tpu7x-4x4x4"]) == 1
    assert obs.capacity["tpu7x-2x2x1"] == ()  # 4x4x4 nodes do not match the 2x2x1 topology


def test_pools_busy_with_other_workloads_are_not_capacity():
    other = pod("someone-else-0", run="other", node_name="gke-np-1-0")
    obs = observe(pods=[*RUNNING4[:1], other], nodes=pool("np-0") + pool("np-1"), expected=1)
    assert len(obs.capacity["tpu7x-2x2x1"]) == 1  # np-0 is ours, np-1 is busy


def test_spot_preset_needs_spot_nodes():
    nodes = pool("v6-0", "v6e-4x4")  # v6e-4x4 is a spot preset
    assert len(observe(nodes=nodes, pods=[], expected=4).capacity["v6e-4x4"]) == 1
    for n in nodes:  # the nodes lack gke-spot=true
        del n["metadata"]["labels"]["cloud.google.com/gke-spot"]
    obs = observe(nodes=nodes, pods=[], expected=4)
    assert obs.capacity["v6e-4x4"] == ()


def test_a_slice_fits_since_its_last_node_was_created_or_turned_ready():
    nodes = pool("np-0")
    nodes[0]["metadata"]["creationTimestamp"] = rfc3339.stamp(T0 + 30)  # recreated, Ready since T0
    assert observe(nodes=nodes, pods=[], expected=1).fits_since("tpu7x-2x2x1", 1) == T0 + 30
    nodes[0]["status"]["conditions"][0]["lastTransitionTime"] = rfc3339.stamp(T0 + 60)
    assert observe(nodes=nodes, pods=[], expected=1).fits_since("tpu7x-2x2x1", 1) == T0 + 60


@pytest.mark.parametrize(
    "condition,phase,kind",
    [
        (("Completed", "AllJobsCompleted", "jobset completed successfully"), Phase.COMPLETED, None),
        (("Failed", "FailJobSetFailurePolicyAction", 'Failure policy rule "config-error" matched'), Phase.FAILED,
         "config-error"),
        (("Failed", "ReachedMaxRestarts", "jobset failed due to reaching max number of restarts"), Phase.FAILED,
         "max-restarts"),
        (("Failed", "FailedJobs", "jobset failed due to one or more job failures"), Phase.FAILED, "other"),
    ],
)  # fmt: skip
def test_jobset_terminal_conditions(condition, phase, kind):
    obs = observe(
        pods=RUNNING4, nodes=FOUR_POOLS, jobsets=[jobset(condition=condition, restarts=3, counted=2)]
    )
    assert obs.phase == phase
    assert (obs.failure.kind if obs.failure else None) == kind
    assert (obs.jobset.restarts, obs.jobset.restarts_counted) == (3, 2)


def test_kueue_suspension():
    assert observe(pods=[], nodes=FOUR_POOLS, jobsets=[jobset(suspend=True)]).phase == Phase.SUSPENDED


def test_absent_and_deleting_jobset():
    assert observe(pods=[], nodes=FOUR_POOLS, jobsets=[]).phase == Phase.ABSENT
    obs = observe(pods=RUNNING4, nodes=FOUR_POOLS, jobsets=[jobset(deleting=True)])
    assert obs.phase == Phase.DELETING and obs.live_jobsets == () and obs.run_pods_alive == 4


def test_exit_codes_and_other_runs_pods_are_separated():
    pods = [pod("demo-0-slice-0-0-a", phase="Failed", exit_code=1), pod("x-0", run="other", exit_code=2)]
    obs = observe(pods=pods, nodes=FOUR_POOLS)
    assert obs.last_exit_code == 1 and obs.run_pods_alive == 1


# --- why an attempt failed: what its failed pods say (the cause of the JobSet restart) ---------
def failed(name="demo-0-slice-0-0-a", **kw):
    return pod(name, phase="Failed", **kw)


@pytest.mark.parametrize(
    "pods,causes",
    [
        # A host died: the survivor exits 43; the dead host's pod is still Running (nobody reports).
        ([failed(exit_code=43), pod("b")], {0: Cause.PEER_LOST}),
        # The host rebooted: its kubelet reports the container it cannot find, first in lastState
        # (kubelet_pods.go), then in state too (TerminatePod): a host disruption, not a crash.
        ([failed(exit_code=43), failed("b", last_exit_reason="ContainerStatusUnknown")],
         {0: Cause.HOST_DISRUPTION}),
        ([failed(exit_code=43), failed("b", exit_code=137, exit_reason="ContainerStatusUnknown")],
         {0: Cause.HOST_DISRUPTION}),
        ([failed("b", last_exit_reason="ContainerStatusUnknown", deleting=True)], {0: Cause.HOST_DISRUPTION}),
        # containerd kept the container's record across the reboot: exit 255, reason Unknown.
        ([failed("b", exit_code=255, exit_reason="Unknown")], {0: Cause.HOST_DISRUPTION}),
        ([failed("b", exit_code=255)], {0: Cause.APP_FAILURE}),  # the trainer's own 255
        # The kubelet, back, could not admit the pod again (a device plugin not registered yet).
        ([failed("b", reason="UnexpectedAdmissionError")], {0: Cause.HOST_DISRUPTION}),
        # A pod deleted before its container started: not a host's doing, no cause.
        ([failed("b", exit_code=137, exit_reason="ContainerStatusUnknown", deleting=True)], {}),
        # A crash next to a rebooted host: the crash is the cause.
        ([failed(exit_code=1), failed("b", last_exit_reason="ContainerStatusUnknown")], {0: Cause.APP_FAILURE}),
        # A crash made its peer exit 43 first: the crash is the cause.
        ([failed(exit_code=43), failed("b", exit_code=1)], {0: Cause.APP_FAILURE}),
        ([failed(exit_code=43), failed("b", exit_code=137, exit_reason="OOMKilled")], {0: Cause.APP_FAILURE}),
        # A preempted host saved (42) or carries DisruptionTarget: a preemption, whatever its peers did.
        ([failed(exit_code=43), failed("b", exit_code=42)], {0: Cause.PREEMPTION}),
        ([failed(exit_code=43), failed("b", disruption="TerminationByKubelet", exit_code=143)], {0: Cause.PREEMPTION}),
        ([failed(reason="Terminated", exit_code=42)], {0: Cause.PREEMPTION}),
        # Failed while being deleted: the restart's doing, not its cause.
        ([failed(exit_code=143, deleting=True), failed("b", exit_code=43, deleting=True)], {}),
        # Attempts are told apart.
        ([failed(exit_code=43, attempt=0), failed("b", exit_code=1, attempt=1)], {0: Cause.PEER_LOST, 1: Cause.APP_FAILURE}),
        ([pod("a"), failed("b", exit_code=0)], {0: Cause.APP_FAILURE}),  # Failed with 0: not a success
        (RUNNING4, {}),
    ],
)  # fmt: skip
def test_attempt_causes(pods, causes):
    obs = observe(pods=pods, nodes=FOUR_POOLS, jobsets=[jobset(restarts=1)])
    assert obs.causes == causes


def test_peer_lost_pods_are_named_in_the_disruptions():
    obs = observe(pods=[failed(exit_code=43), *RUNNING4[1:]], nodes=FOUR_POOLS)
    assert "pod demo-0-slice-0-0-a: peer lost (exit 43)" in obs.disruptions
    assert obs.phase == Phase.RESTARTING and obs.last_exit_code == 43


def test_an_observation_from_the_caches_tuples_follows_every_change():
    """The caches hand out one tuple per change and signals.observe reuses what it computed from the
    same tuples (a pass over unchanged caches walks nothing): a new tuple in any input, or a
    different segment, must still give a new observation; the clock and the trainer's files always."""
    pods, nodes = tuple(RUNNING4), tuple(FOUR_POOLS)
    three = tuple(n for n in FOUR_POOLS if n["metadata"]["labels"]["cloud.google.com/gke-nodepool"] != "np-3")
    memos = signals.Memos()  # one controller's: every call below reuses what it kept

    def obs(nodes, **kw):
        base = {"jobsets": (jobset(),), "pods": pods, "nodes": nodes, "events": ()}
        return signals.observe(
            now=kw.get("now", T0 + 100), run="demo", of=signals.OneJobSet(kw.get("segment", 0), "demo-0"),
            segment_nodepools=("np-0", "np-1", "np-2", "np-3"), expected_pods=4, presets=PRESETS, committed_step=kw.get("step"),
            trainer=None, slice_hosts=1, memos=memos, **{**base, **kw.get("over", {})},
        )  # fmt: skip

    first = obs(nodes, step=5)
    assert first.lost_nodepools == () and first.committed_step == 5 and first.phase == Phase.RUNNING
    lost = obs(three, now=T0 + 200)
    assert lost.lost_nodepools == ("np-3",) and lost.now == T0 + 200 and lost.committed_step is None
    again = obs(nodes, step=6)
    assert again.lost_nodepools == () and again.committed_step == 6
    failed = (pod("demo-0-slice-0-0-abcde", node_name="gke-np-0-0", phase="Failed", exit_code=1), *pods[1:])
    assert obs(nodes, over={"pods": failed}).phase == Phase.RESTARTING
    assert obs(nodes, segment=1).pods_running == 0  # same tuples, another segment
    assert obs(nodes, over={"foreign_nodes": frozenset({"gke-np-1-0"})}).capacity != first.capacity


def test_the_caches_keep_every_label_a_node_selector_names():
    """A preset's node selector decides whether a pool is a whole slice of it: the nodes' cache
    must keep each label it may name (a placement policy, spot), or no pool would ever match."""
    for p in PRESETS:
        selector = dataclasses.replace(p, placement_policy="compact-1", spot=True).node_selector()
        assert set(selector) <= set(projections.NODE_LABELS), p.name


def test_a_memo_by_version_holds_each_objects_latest_version_and_forgets_the_gone():
    """A controller runs for weeks: its memo of pod views must hold what is in view, not every
    version of every pod it ever saw."""
    made = []
    memo = ByVersion(lambda o: made.append(o["metadata"].get("resourceVersion")) or made[-1])

    def obj(name: str, version: str) -> dict:
        return {"metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": version}}

    assert memo(obj("a", "1")) == "1" and memo(obj("a", "1")) == "1" and made == ["1"]
    assert memo(obj("a", "2")) == "2" and len(memo) == 1  # a new version replaces the old
    memo(obj("b", "3"))
    memo.retain([obj("b", "3")])  # a was deleted
    assert len(memo) == 1 and made == ["1", "2", "3"]
    assert memo(obj("a", "2")) == "2" and made == ["1", "2", "3", "2"]  # computed again
    assert memo({"metadata": {"name": "table"}}) is None and made[-1] is None  # no version: no memo
