"""Reslice in place, end to end: a run of 2 slices loses a node pool and goes on on 1 slice in the
same pods at the same global batch, then grows back to 2 when the pool returns, the first slice's
pods still the same; the losses match an uninterrupted run step for step, on the same samples.
The shrink's state comes from the surviving pods' memory (0 bytes of the run directory's
checkpoints read, at most one step recomputed, whatever the storage checkpoints hold);
the grow's from a peer: the new slice's pods get the surviving slice's replica over the data axis."""

import os
import re
import time

import pytest

from contract.words import STATE_SOURCE, StateSource
from launcher.core.accounting import build_report
from launcher.core.labels import LABEL_SLICE
from launcher.core.record import Knobs
from launcher.core.words import Action, EndKind, LedgerKind, RunState
from tests.e2e.harness import (
    MULTI_HOST,
    MULTI_HOST_BATCH,
    Harness,
    assert_same_samples_and_losses,
    kept_steps,
    paced,
    shared_reference,
    wait_for,
)

pytestmark = pytest.mark.e2e
STEPS = 30  # lose a slice after step 6, grow back once the one-slice world trains, finish


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return shared_reference(tmp_path_factory, MULTI_HOST_BATCH)


def uids(h: Harness, run: str, slice_id: str) -> set[str]:
    return {
        p["metadata"]["uid"]
        for p in h.run_pods(run)
        if p["metadata"]["labels"].get(LABEL_SLICE) == slice_id and not p["metadata"].get("deletionTimestamp")
    }


def trained(h: Harness, run: str, segment: int | None = None) -> int:
    """The newest step in the metrics (of `segment`, when given)."""
    steps = [m["step"] for m in h.rundir(run).metrics() if segment is None or m.get("segment") == segment]
    return max(steps, default=0)


def launch_two_slices(
    h: Harness, run: str, interval: int = 20, steps: int = STEPS, grow: bool = True, **kw
) -> None:
    """A 2-slice in-place run of `steps` steps at MULTI_HOST_BATCH, a storage checkpoint every
    `interval`, growing back when capacity returns unless not `grow`. A shorter run matches the
    reference's first steps: one schedule for every length (harness.TRAINER_SETTINGS)."""
    knobs = Knobs(unschedulable_grace_s=20, grow=grow, grow_window_s=1, app_backoff_s=1)
    h.launch(
        run, slices=2, steps=steps, knobs=knobs, global_batch=MULTI_HOST_BATCH, restart_mode="in-place",
        interval=interval, **kw,
    )  # fmt: skip


def test_in_place_shrink_then_grow_keeps_the_surviving_slice_pods(tmp_path, reference):
    h = Harness(tmp_path, pools=2, preset=MULTI_HOST)
    try:
        # A grow waits for a checkpoint the shrunk world committed (in-place rule 7): a storage
        # checkpoint every 5 steps lets it come at the first one after the shrink, with most of the
        # run left, so that the grown world trains before the run ends however fast the steps are
        # (every 20 steps, an idle machine's one-slice world finished the run before the grow).
        launch_two_slices(h, "inplace", interval=5)
        h.start_controller("inplace")
        wait_for(lambda: trained(h, "inplace") >= 6, 300, "step 6")
        first = uids(h, "inplace", "0")
        assert len(first) == 2
        # Which pool slice 1 is on: remove that one, so that slice 0 survives.
        node_pool = h.cluster.node_pool_of
        pods1 = [p for p in h.run_pods("inplace") if p["metadata"]["labels"].get(LABEL_SLICE) == "1"]
        lost = node_pool[pods1[0]["spec"]["nodeName"]]
        h.cluster.remove(lost)  # capacity gone: nodes deleted, running pods fail
        wait_for(lambda: len(h.record("inplace").segments) >= 2, 60, "the shrink to a new world")
        # The pool returns as soon as the one-slice world trains: a restore from memory leaves it
        # little to do before the run ends, and the grow must come first.
        wait_for(lambda: trained(h, "inplace", segment=1) > 0, 240, "training on 1 slice")
        assert uids(h, "inplace", "0") == first  # the same pods
        h.cluster.restore(lost)
        wait_for(lambda: len(h.record("inplace").segments) >= 3, 120, "the grow back")
        rec = h.wait_state("inplace", {RunState.FINISHED}, timeout=300)
        assert uids(h, "inplace", "0") in (first, set())  # finished pods may be gone (ttl); never others
        rundir = h.rundir("inplace")
        metrics, ledger = rundir.metrics(), rundir.ledger()
        survivors = [
            log.read_text(errors="replace")
            for log in h.cluster.kubelet.runtime.log_dir.glob("*_inplace-s0-*/*.log")
        ]
    finally:
        h.close()
    # Slice 1's hosts were gone: the next world said so, and each survivor's trainer, whose step
    # waited for them, was killed rather than asked to save (the stall watchdog's seconds). It dies
    # of the SIGKILL (137) or, when its collective failed on the lost peers' closed sockets a moment
    # before, exits 43 by itself: either way nothing was saved and the state comes from memory.
    assert rec.segments[1].lost == ("1",) and rec.segments[2].lost == ()
    assert len(survivors) == 2
    killed = re.compile(
        r"the trainer of epoch 0 exited (137|43) [0-9.]+ s after SIGKILL \(slice\(s\) 1 of its world lost\)"
    )
    for log in survivors:
        assert killed.search(log), log[-3000:]
    status = build_report(rec, metrics, ledger, rec.finished_at or 0.0).as_dict()  # `reslice status --json`
    froms = [s[STATE_SOURCE] for s in status["segments"][:3]]
    assert froms == [StateSource.FRESH, StateSource.MEMORY, StateSource.PEERS], froms
    assert status["segments"][0]["recomputed_steps"] <= 1  # the steps after the newest snapshot
    heads: dict[int, dict] = {}  # each segment's first incarnation's first record
    for m in sorted(metrics, key=lambda m: m["time"]):
        if STATE_SOURCE in m:
            heads.setdefault(m["segment"], m)
    assert heads[1]["restore/storage_bytes"] == 0 and heads[2]["restore/storage_bytes"] == 0
    said = [e["message"] for e in ledger if e.get("kind") == LedgerKind.RESTORE]
    assert f"restored step {heads[1]['restore/step']} from memory" in said, said

    first_seg, shrunk, grown = rec.segments[:3]
    assert (first_seg.slice_ids, shrunk.slice_ids, grown.slice_ids) == (("0", "1"), ("0",), ("0", "1"))
    assert first_seg.end_kind == "capacity-lost" and shrunk.end_kind == "grow"
    for seg in rec.segments:
        assert seg.devices * seg.micro_batch * seg.grad_accum == MULTI_HOST_BATCH
    assert (shrunk.devices, shrunk.micro_batch, shrunk.grad_accum) == (8, 4, 1)
    kept = kept_steps(metrics)
    assert sorted(kept) == list(range(1, STEPS + 1))
    assert {m["segment"] for m in kept.values()} >= {0, 1, 2}
    assert_same_samples_and_losses(kept, reference)
    assert all(m["devices"] * m["micro_batch"] * m["grad_accum"] == MULTI_HOST_BATCH for m in kept.values())
    acts = [e for e in ledger if e.get("kind") == LedgerKind.ACT]
    assert [a["action"] for a in acts].count(Action.NEW_WORLD) >= 2
    assert rec.state == RunState.FINISHED and rec.segments[-1].end_step == STEPS


def test_a_preempted_slice_leaves_the_other_slices_pods_in_place_and_comes_back(tmp_path, reference):
    # A spot preemption of slice 1 while the controller is down (say its own node was preempted):
    # DisruptionTarget and SIGTERM for slice 1's pods, its node pool gone after the grace period.
    # Every process's SIGTERM flag is combined each step, so the whole world saves the step and
    # exits 42 together. Slice 0's supervisors, which nobody signalled, keep their pods (a 42
    # passed on would have had slice 0's JobSet recreate them) until the next controller's world
    # on slice 0, then the one with slice 1 back.
    h = Harness(tmp_path, pools=2, preset=MULTI_HOST)
    try:
        launch_two_slices(h, "spot", interval=5)  # the grow comes early: see the first test
        controller = h.controller_process("spot", tmp_path / "controller-1.log")
        wait_for(lambda: trained(h, "spot") >= 6, 300, "step 6")
        controller.kill()
        controller.wait(10)
        first = uids(h, "spot", "0")
        pods1 = [p for p in h.run_pods("spot") if p["metadata"]["labels"].get(LABEL_SLICE) == "1"]
        pool = h.cluster.node_pool_of[pods1[0]["spec"]["nodeName"]]
        # GKE gives a spot VM 30 s and the test's pods 15 of them; 60 here, because this test is
        # about the exit-42 path: on a loaded 2-core machine the whole world's save of the stop
        # step can outlast 15 s, and the SIGKILL then makes it the lost-peer path (exit 43).
        h.cluster.preempt(pool, grace_s=60, wait=True)  # returns once slice 1's pods have exited
        # The logs of the pods slice 0 trains in (`first`), by their folders (`<namespace>_<pod>_<uid>`):
        # another slice 0 folder may be there (docs/measurements.md); whether slice 0 kept its pods is
        # the UIDs' check below, not the number of folders.
        logs = lambda: {  # noqa: E731
            log.parent.name: log.read_text(errors="replace")
            for log in h.cluster.kubelet.runtime.log_dir.glob("*_spot-s0-*/*.log")
            if log.parent.name.rsplit("_", 1)[-1] in first
        }
        waiting = "(a peer's preemption stopped its world; this pod was not signalled); waiting for a world"
        try:
            wait_for(
                lambda: len(logs()) == 2 and all(waiting in log for log in logs().values()),
                60,
                "slice 0 waiting",
            )
        except AssertionError as e:  # what slice 0's supervisors said instead
            said = "\n----\n".join(f"{pod}:\n{log[-3000:]}" for pod, log in logs().items())
            raise AssertionError(f"{e}\n{said}\n{h.run_pods('spot')}") from None
        assert uids(h, "spot", "0") == first
        controller = h.controller_process("spot", tmp_path / "controller-2.log")
        wait_for(lambda: len(h.record("spot").segments) >= 2, 60, "the shrink to a new world")
        wait_for(lambda: trained(h, "spot", segment=1) > 0, 240, "training on 1 slice")
        assert uids(h, "spot", "0") == first  # the same pods
        h.cluster.restore(pool)
        wait_for(lambda: len(h.record("spot").segments) >= 3, 120, "the grow back")
        rec = h.wait_state("spot", {RunState.FINISHED}, timeout=300)
        assert uids(h, "spot", "0") in (first, set())  # finished pods may be gone; never others
        metrics, ledger = h.rundir("spot").metrics(), h.rundir("spot").ledger()
    finally:
        if controller.poll() is None:
            controller.kill()
        h.close()
    first_seg, shrunk, grown = rec.segments[:3]
    assert (first_seg.slice_ids, shrunk.slice_ids, grown.slice_ids) == (("0", "1"), ("0",), ("0", "1"))
    status = build_report(rec, metrics, ledger, rec.finished_at or 0.0).as_dict()
    assert status["segments"][0]["recomputed_steps"] == 0  # the whole world saved the step
    kept = kept_steps(metrics)
    assert sorted(kept) == list(range(1, STEPS + 1))
    assert_same_samples_and_losses(kept, reference)
    assert all(m["devices"] * m["micro_batch"] * m["grad_accum"] == MULTI_HOST_BATCH for m in kept.values())
    assert rec.segments[-1].end_step == STEPS


# No storage checkpoint before the end (every 20 steps): a state from anywhere but memory or a peer
# would be step 0's. Two-slice steps are the suite's dearest (docs/measurements.md): the run is
# short, paced by the clock so that both faults come before its end however fast the steps are.
REBOOT_AT, HOSTS_STEPS, HOSTS_PACE_S = 6, 16, 0.25


def test_a_rebooted_host_then_a_crashed_one_in_place_each_cost_at_most_one_step(tmp_path, reference):
    # Two host faults in one run, both on slice 1; slice 0 keeps its pods throughout and each time
    # restores the newest step in its memory, while the storage checkpoint is 20 steps apart.
    # 1. A reboot: the host is back at once (`--down 0`), as upstream's kubelet has it: slice 1's pod
    #    Failed, its container gone (lastState.terminated ContainerStatusUnknown, 137). Its Job fails
    #    (no podFailurePolicy rule can match a reboot), JobSet restarts slice 1 and counts it; the
    #    controller books a host disruption, not an application failure, and once slice 1's new pods
    #    run the same slices form a new world (docs/design.md "A rebooted host").
    # 2. A crash that stays down (no SIGTERM, no DisruptionTarget, its pod still Running): the other
    #    slice's trainers exit 43 at once; the node turns NotReady after the node monitor grace
    #    period (1 s here, 40 s upstream), the only sign the controller gets, and the world shrinks
    #    to slice 0 (docs/design.md, "State from memory"). No grow when the host is back: the first
    #    test grows back, and a grown world's two-slice steps are CPU spent on nothing asserted here.
    h = Harness(tmp_path, pools=2, preset=MULTI_HOST, node_monitor_grace_s=1)
    run = "hosts"

    def a_pod_of_slice_1(not_in: set[str]) -> dict:
        return wait_for(
            lambda: next(
                (
                    p
                    for p in h.run_pods(run)
                    if p["metadata"]["labels"].get(LABEL_SLICE) == "1"
                    and p["metadata"]["uid"] not in not_in
                    and (p.get("status") or {}).get("phase") == "Running"
                ),
                None,
            ),
            60,
            "a running pod of slice 1",
        )

    try:
        launch_two_slices(h, run, steps=HOSTS_STEPS, grow=False, extra=paced(HOSTS_PACE_S))
        h.start_controller(run)
        wait_for(lambda: trained(h, run) >= REBOOT_AT, 300, f"step {REBOOT_AT}")
        first = uids(h, run, "0")
        slice_1 = uids(h, run, "1")
        before_reboot = trained(h, run)
        rebooted_at = time.time()
        h.cluster.crash_host("default", a_pod_of_slice_1(set())["metadata"]["name"])
        wait_for(lambda: len(h.record(run).segments) >= 2, 120, "the new world")
        wait_for(lambda: trained(h, run, segment=1) > 0, 240, "training in the new world")
        assert uids(h, run, "0") == first  # the same pods

        victim = a_pod_of_slice_1(slice_1)  # one of the pods JobSet made after the reboot
        before_crash = trained(h, run)
        h.cluster.crash_host("default", victim["metadata"]["name"], down_s=600)
        wait_for(lambda: len(h.record(run).segments) >= 3, 60, "the shrink to a new world")
        wait_for(lambda: trained(h, run, segment=2) > 0, 240, "training on 1 slice")
        assert uids(h, run, "0") == first
        h.cluster.heal(victim["spec"]["nodeName"])  # the host is back
        rec = h.wait_state(run, {RunState.FINISHED, RunState.FAILED}, timeout=300)
        metrics, ledger = h.rundir(run).metrics(), h.rundir(run).ledger()
    finally:
        h.close()
    assert rec.state == RunState.FINISHED, rec.segments
    rebooted, crashed, shrunk = rec.segments
    assert (rebooted.slice_ids, crashed.slice_ids, shrunk.slice_ids) == (("0", "1"), ("0", "1"), ("0",))
    assert rebooted.end_kind == EndKind.NEW_ATTEMPT and "host disruption" in (rebooted.end_reason or "")
    assert crashed.end_kind == EndKind.CAPACITY_LOST
    assert rec.app_failures == 0 and len(rec.host_disruptions) == 1, rec
    status = build_report(rec, metrics, ledger, rec.finished_at or 0.0).as_dict()
    assert status["restarts"]["host_disruption"] == 1 and status["restarts"]["application_failure"] == 0
    assert status["segments"][1][STATE_SOURCE] in {StateSource.MEMORY, StateSource.PEERS}
    assert status["segments"][2][STATE_SOURCE] == StateSource.MEMORY
    assert status["segments"][0]["recomputed_steps"] <= 1 and status["segments"][1]["recomputed_steps"] <= 1
    heads = {  # each later segment's first record, with what it restored
        seg: min(
            (m for m in metrics if m.get("segment") == seg and STATE_SOURCE in m), key=lambda m: m["time"]
        )
        for seg in (1, 2)
    }
    assert heads[1]["restore/storage_bytes"] == 0 and heads[1]["restore/step"] >= before_reboot - 1
    assert heads[2]["restore/storage_bytes"] == 0 and heads[2]["restore/step"] >= before_crash - 1
    said = [e["message"] for e in ledger if e.get("kind") == LedgerKind.RESTORE]
    assert f"restored step {heads[2]['restore/step']} from memory" in said, said
    trains = min(m["time"] for m in metrics if m.get("segment") == 1)
    assert trains - rebooted_at <= 30, f"the next world trained {trains - rebooted_at:.1f} s after the reboot"
    kept = kept_steps(metrics)
    assert sorted(kept) == list(range(1, HOSTS_STEPS + 1))
    assert_same_samples_and_losses(kept, reference)
    assert rec.segments[-1].end_step == HOSTS_STEPS


SLOW = "RESLICE_SLOW_TESTS"  # the tests below run minutes, outside the default suite (docs/gke.md)


@pytest.mark.skipif(not os.environ.get(SLOW), reason=f"minutes long: {SLOW}=1 runs it (docs/gke.md)")
def test_a_slice_whose_replacement_pods_take_300_s_keeps_the_survivors_and_the_run_finishes(
    tmp_path, reference
):
    # Slice 1's host reboots and its replacement pods take 300 s to run (an image pulled onto a
    # fresh node; on GKE a 768-pod slice takes minutes to recreate): far past the survivors'
    # RESLICE_PEER_LOST_WAIT_S (120 s). The controller beats the world's heartbeat meanwhile, so
    # slice 0's supervisors wait on: the same pods take part in the world that takes slice 1 back.
    h = Harness(tmp_path, pools=2, preset=MULTI_HOST)
    try:
        # A long unschedulable grace: a follower pod briefly unschedulable while its leader is placed
        # (exclusive placement) must not make the slice lost (rule 5) before the wait is tested.
        knobs = Knobs(unschedulable_grace_s=600, grow_window_s=1, app_backoff_s=1)
        h.launch(
            "slow", slices=2, steps=STEPS, knobs=knobs, global_batch=MULTI_HOST_BATCH,
            restart_mode="in-place", interval=20, max_restarts=1,
        )  # fmt: skip
        h.start_controller("slow")
        wait_for(lambda: trained(h, "slow") >= 6, 300, "step 6")
        first = uids(h, "slow", "0")
        victim = next(p for p in h.run_pods("slow") if p["metadata"]["labels"].get(LABEL_SLICE) == "1")
        pool = h.cluster.node_pool_of[victim["spec"]["nodeName"]]
        for node in h.cluster.pools[pool].node_names:
            h.cluster.kubelet.pull_delay_s[node] = 300.0
        crashed_at = time.monotonic()
        h.cluster.crash_host("default", victim["metadata"]["name"])
        wait_for(lambda: time.monotonic() - crashed_at > 150, 200, "past the survivors' 120 s", 5.0)
        assert uids(h, "slow", "0") == first  # still waiting, in the same pods
        wait_for(lambda: len(h.record("slow").segments) >= 2, 400, "slice 1 back in a new world", 2.0)
        said = [e.get("reason") for e in h.rundir("slow").ledger() if e.get("kind") == LedgerKind.ACT]
        assert time.monotonic() - crashed_at >= 300, said  # what ended the world early, if anything
        rec = h.wait_state("slow", {RunState.FINISHED, RunState.FAILED}, timeout=400)
        assert uids(h, "slow", "0") in (first, set())  # finished pods may be gone; never others
        metrics = h.rundir("slow").metrics()
    finally:
        h.close()
    assert rec.state == RunState.FINISHED, rec.segments
    assert rec.segments[1].slice_ids == ("0", "1") and rec.app_failures == 0
    assert sorted(kept_steps(metrics)) == list(range(1, STEPS + 1))


THREE_BATCH = 48  # 3 x 8 devices and 2 x 8 both divide it
SHORT = 10  # a 3-slice step costs most of all (docs/measurements.md): slice 0 goes after step 3


@pytest.fixture(scope="module")
def reference_three(tmp_path_factory):
    return shared_reference(tmp_path_factory, THREE_BATCH, steps=SHORT)


def test_the_coordinators_slice_lost_three_to_two_in_the_same_pods(tmp_path, reference_three):
    h = Harness(tmp_path, pools=3, preset=MULTI_HOST)
    try:
        knobs = Knobs(unschedulable_grace_s=20, grow=False, app_backoff_s=1)
        h.launch(
            "three", slices=3, steps=SHORT, knobs=knobs, global_batch=THREE_BATCH, restart_mode="in-place",
        )  # fmt: skip
        h.start_controller("three")
        wait_for(lambda: trained(h, "three") >= 3, 400, "step 3")
        before = {sid: uids(h, "three", sid) for sid in ("1", "2")}
        pods0 = [p for p in h.run_pods("three") if p["metadata"]["labels"].get(LABEL_SLICE) == "0"]
        h.cluster.remove(h.cluster.node_pool_of[pods0[0]["spec"]["nodeName"]])  # process 0's slice
        wait_for(lambda: len(h.record("three").segments) >= 2, 60, "the shrink to a new world")
        rec = h.wait_state("three", {RunState.FINISHED}, timeout=400)
        after = {sid: uids(h, "three", sid) for sid in ("1", "2")}
        rundir = h.rundir("three")
        metrics = rundir.metrics()
    finally:
        h.close()
    for sid in ("1", "2"):
        assert len(before[sid]) == 2 and after[sid] in (before[sid], set())  # never other pods
    first, shrunk = rec.segments[:2]
    assert (first.slice_ids, shrunk.slice_ids) == (("0", "1", "2"), ("1", "2"))
    assert shrunk.coordinator and shrunk.coordinator != first.coordinator
    kept = kept_steps(metrics)
    assert sorted(kept) == list(range(1, SHORT + 1))
    assert_same_samples_and_losses(kept, reference_three)
    assert all(m["devices"] * m["micro_batch"] * m["grad_accum"] == THREE_BATCH for m in kept.values())
    assert rec.segments[-1].end_step == SHORT
