"""Same-size disruptions end to end: JobSet's failure policy
restarts the run on spare capacity; the controller leaves it alone and accounts for it."""

import pytest

from launcher.core.accounting import build_report
from launcher.core.labels import LABEL_RUN
from launcher.core.words import RunState
from tests.e2e.harness import MULTI_HOST, Harness, kept_steps, paced, recomputed, wait_for

pytestmark = pytest.mark.e2e
INTERVAL = 5
# The same-size runs stay alive across their disruptions by the clock (0.1 s after every step),
# with steps to spare after the last one on a fast machine.
PACE_S, PREEMPTED_STEPS, STEADY_STEPS = 0.1, 80, 60


def node_pool_of(h: Harness, run: str) -> str:
    pods = [p for p in h.kube.pods(f"{LABEL_RUN}={run}") if p["spec"].get("nodeName")]
    node = pods[0]["spec"]["nodeName"]
    return next(n for n in h.kube.nodes() if n["metadata"]["name"] == node)["metadata"]["labels"][
        "cloud.google.com/gke-nodepool"
    ]


def attempts(metrics: list[dict]) -> list[int]:
    return sorted({m["jobset_attempt"] for m in metrics})


def test_preemption_then_hard_kill(tmp_path):
    h = Harness(tmp_path, pools=2)
    try:
        h.launch("same", slices=1, steps=PREEMPTED_STEPS, interval=INTERVAL, extra=paced(PACE_S))
        h.start_controller("same")
        h.wait_step("same", 10, timeout=90)
        # 1. Graceful preemption (the GKE spot sequence) of the slice the run is on: the trainer
        # checkpoints the step in flight and exits 42; JobSet restarts it, uncounted, on the spare.
        victim = node_pool_of(h, "same")
        h.cluster.preempt(victim, grace_s=20)
        wait_for(lambda: 1 in attempts(h.rundir("same").metrics()), 90, "the restarted trainer's first step")
        after_preempt = h.rundir("same").metrics()
        h.cluster.restore(victim)
        # 2. Hard kill of the pod: exit 137, resume from the latest committed checkpoint.
        h.wait_step("same", max(m["step"] for m in after_preempt) + 2 * INTERVAL, timeout=90)
        # Kill just after a checkpoint commits (saves are asynchronous: a kill while one is in
        # flight loses the steps it covers too, which is the trainer's trade, not the recovery's).
        committed = h.rundir("same").latest_committed_step()
        wait_for(lambda: h.rundir("same").latest_committed_step() != committed, 30, "the next commit", 0.02)
        committed = h.rundir("same").latest_committed_step()
        wait_for(
            lambda: max(m["step"] for m in h.rundir("same").metrics()) >= committed + 2,
            30, "steps past the commit, which the kill loses", 0.02,
        )  # fmt: skip
        pod = h.kube.pods(f"{LABEL_RUN}=same")[0]["metadata"]["name"]
        h.cluster.kill_pod("default", pod)
        rec = h.wait_state("same", {RunState.FINISHED}, timeout=150)
        metrics, ledger = h.rundir("same").metrics(), h.rundir("same").ledger()
    finally:
        h.close()

    assert len(rec.segments) == 1, "same-size disruptions must not change the segment"
    seg = rec.segments[0]
    assert seg.restarts == 2 and seg.restarts_counted == 1
    assert rec.preemptions() == 1 and rec.app_failures == 0
    # Acceptance 1: the preemption recomputed nothing.
    first_attempt = [m for m in after_preempt if m["jobset_attempt"] == 0]
    second_attempt = [m for m in after_preempt if m["jobset_attempt"] == 1]
    assert min(m["step"] for m in second_attempt) == max(m["step"] for m in first_attempt) + 1
    assert recomputed(after_preempt) == 0
    # Acceptance 2: the hard kill resumed from the latest committed checkpoint and recomputed only
    # the steps recorded past it. Saves are asynchronous and one may be in flight at the kill
    # (the trainer runs on while it commits; the next save waits for it), so that is up to two
    # intervals, not one: a one-layer step is fast enough on a loaded machine to get 9 steps past.
    third = [m for m in metrics if m["jobset_attempt"] == 2]
    resumed = min(m["step"] for m in third) - 1
    assert resumed >= committed
    redone = {m["step"] for m in metrics if m["jobset_attempt"] == 1 and m["step"] > resumed}
    assert 0 < recomputed(metrics) == len(redone) <= 2 * INTERVAL
    assert attempts(metrics) == [0, 1, 2]
    assert sorted(kept_steps(metrics)) == list(range(1, PREEMPTED_STEPS + 1))
    seen = [d for e in ledger if e.get("kind") == "observe" for d in e.get("disruptions", [])]
    assert any("DisruptionTarget TerminationByKubelet" in d for d in seen)
    assert any("impending-node-termination" in d for d in seen)


def test_api_server_restart_mid_run(tmp_path):
    h = Harness(tmp_path, pools=1, state_dir=tmp_path / "state")
    try:
        h.launch("steady", slices=1, steps=STEADY_STEPS, interval=INTERVAL, extra=paced(PACE_S))
        controller = h.start_controller("steady")
        h.wait_step("steady", 10, timeout=90)
        h.cluster.restart_apiserver(downtime_s=2.0)
        rec = h.wait_state("steady", {RunState.FINISHED}, timeout=120)
        metrics = h.rundir("steady").metrics()
    finally:
        h.close()
    # The watches were cut, re-listed, and at least one resumed from a compacted version: 410.
    errors = {k: v for k, v in controller.wakeups.items() if "watch" in k}
    assert any("410" in k for k in errors), errors
    assert any("interrupted" in k for k in errors), errors
    assert rec.state == RunState.FINISHED and len(rec.segments) == 1
    assert sorted(kept_steps(metrics)) == list(range(1, STEADY_STEPS + 1))


def test_a_rebooted_host_is_a_host_disruption_not_an_application_failure(tmp_path):
    # One slice of two hosts (2 trainer processes). Process 0's host crashes and reboots at once:
    # no graceful shutdown, no DisruptionTarget; back, its kubelet reports the pod Failed, its
    # container gone (lastState.terminated ContainerStatusUnknown, 137: upstream's reboot). The Job
    # fails (no podFailurePolicy rule can match a reboot), JobSet restarts the segment and counts it,
    # as upstream's would; the controller books a host disruption: not an application failure,
    # not a preemption, nothing spent of the run's budget.
    h = Harness(tmp_path, pools=1, preset=MULTI_HOST)
    try:
        h.launch("host", slices=1, steps=20, interval=INTERVAL, max_restarts=1)
        h.start_controller("host")
        h.wait_step("host", INTERVAL, timeout=300)
        committed = h.rundir("host").latest_committed_step()
        wait_for(lambda: h.rundir("host").latest_committed_step() != committed, 60, "the next commit", 0.02)
        committed = h.rundir("host").latest_committed_step()
        # Two steps past it (process 0 writes the metrics): they will be trained again.
        wait_for(lambda: max(m["step"] for m in h.rundir("host").metrics()) >= committed + 2, 60, "2 steps")
        victim = next(p for p in h.run_pods("host") if p["metadata"]["name"].startswith("host-0-slice-0-0-"))
        h.cluster.crash_host("default", victim["metadata"]["name"])
        rec = h.wait_state("host", {RunState.FINISHED}, timeout=300)
        metrics, ledger = h.rundir("host").metrics(), h.rundir("host").ledger()
        (js,) = h.kube.jobsets("host")
    finally:
        h.close()

    assert len(rec.segments) == 1, "a rebooted host must not change the segment"
    seg = rec.segments[0]
    # One restart, the reboot's: counted by JobSet when the rebooted host's pod failed the Job first,
    # not when its peer's 43 did (the pod failure policy's rule); booked as a host disruption either
    # way. (On a starved 2-core machine a restarted pair can lose another: Gloo's 30 s rendezvous
    # times out when one process reaches its first collective that much later than the other; that
    # exits 43: a lost peer, uncounted.)
    assert seg.restarts >= 1 and seg.restarts_counted + seg.host_disrupted == 1, seg
    assert seg.peer_lost == seg.restarts - 1
    assert js["status"]["restarts"] == seg.restarts
    assert js["status"].get("restartsCountTowardsMax", 0) == seg.restarts_counted
    assert (
        rec.app_failures == 0 and rec.preemptions() == 0 and rec.host_disruptions == (f"{seg.jobset_uid}/0",)
    )
    assert build_report(rec, metrics, ledger, rec.finished_at or 0.0).restarts["host_disruption"] == 1
    # Nothing is lost beyond the latest committed checkpoint, and the steps trained again give the
    # losses the first computation gave, bit for bit (same shape: a clean resume).
    assert attempts(metrics)[0] == 0 and len(attempts(metrics)) >= 2
    first = {m["step"] for m in metrics if m["jobset_attempt"] == 0}
    assert min(m["step"] for m in metrics if m["jobset_attempt"] > 0) == committed + 1
    assert 2 <= len({s for s in first if s > committed}) < INTERVAL  # trained again after the crash
    computed: dict[int, set] = {}
    for m in metrics:
        computed.setdefault(m["step"], set()).add((m["learning/loss"], m["data/sample_digest"]))
    assert all(len(v) == 1 for v in computed.values()), {s: v for s, v in computed.items() if len(v) > 1}
    assert recomputed(metrics) >= 2
    assert sorted(kept_steps(metrics)) == list(range(1, 21))
    assert {(m["num_processes"], m["devices"]) for m in metrics} == {(2, 8)}
    # The ledger names the cause; no disruption condition was ever set.
    seen = [d for e in ledger if e.get("kind") == "observe" for d in e.get("disruptions", [])]
    assert any("host disruption (ContainerStatusUnknown)" in d for d in seen), seen
    assert not any("DisruptionTarget" in d for d in seen)
    waits = [e["reason"] for e in ledger if e.get("kind") == "wait"]
    assert any("restarting (JobSet failure policy) after a host disruption" in r for r in waits), waits
