"""The controller on GKE's node-level disruption paths, one run through all of them:
a `kubectl drain` (eviction API), an auto-repair without graceful shutdown (the node deleted and
recreated: PodGC), a network partition (the node NotReady, its pod evicted by the unreachable taint
and finished once the kubelet is back) and a queue suspending the JobSet (Kueue's preemption). The
partition's clocks are shortened (node-monitor grace and the default unreachable toleration: 1 s
instead of 40 s and 300 s). Each restart is
uncounted, no failure budget is spent, the suspension waits for re-admission, and the run
finishes with every step kept, on one segment."""

import contextlib
import os
import signal

import pytest

from launcher.core.labels import LABEL_RUN
from launcher.core.words import RunState
from tests.e2e.harness import Harness, kept_steps, wait_for

pytestmark = pytest.mark.e2e
INTERVAL = 5
STEPS = 40


def _node(h: Harness, run: str) -> str:
    pods = [p for p in h.kube.pods(f"{LABEL_RUN}={run}") if p["spec"].get("nodeName")]
    return pods[0]["spec"]["nodeName"]


def _attempt(h: Harness, run: str) -> int:
    return max((m["jobset_attempt"] for m in h.rundir(run).metrics()), default=-1)


def _signal(run, sig: int) -> None:
    for proc in run.procs.values():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)


def test_drain_repair_and_suspension(tmp_path):
    h = Harness(tmp_path, pools=2, node_monitor_grace_s=1, default_toleration_s=1)
    try:
        h.launch("nf", slices=1, steps=STEPS, interval=INTERVAL, max_restarts=0)
        h.start_controller("nf")
        h.wait_step("nf", 5, timeout=120)
        # 1. drain: the eviction API gives the pod DisruptionTarget (EvictionByEvictionAPI) and a
        # graceful deletion; the trainer checkpoints and exits 42; JobSet restarts it, uncounted.
        drained = _node(h, "nf")
        h.cluster.drain(drained, wait=False)
        wait_for(lambda: _attempt(h, "nf") == 1, 120, "the trainer after the drain")
        h.cluster.uncordon(drained)
        # 2. repair: the node is deleted and recreated, no graceful shutdown; PodGC fails the pod.
        h.cluster.repair(_node(h, "nf"))
        wait_for(lambda: _attempt(h, "nf") == 2, 120, "the trainer after the repair")
        # 3. partition: the node goes NotReady with the unreachable taints; the other pool still fits
        # the run, so the controller leaves it to JobSet. The taint manager deletes the pod after its
        # toleration; it stays Terminating (no kubelet) until the partition heals, when the kubelet
        # stops the trainer (checkpoint, exit 42) and JobSet restarts it, uncounted.
        (pod,) = [p for p in h.run_pods("nf") if not p["metadata"].get("deletionTimestamp")]
        h.cluster.partition(pod["spec"]["nodeName"])
        # Cut off from its peers and storage, the host's trainer makes no progress; frozen here so
        # that the tiny run cannot finish during the partition (it did once, on a fast machine).
        (run,) = [r for r in h.cluster.kubelet.runs() if r.uid == pod["metadata"]["uid"]]
        _signal(run, signal.SIGSTOP)
        wait_for(
            lambda: any(
                c.get("reason") == "DeletionByTaintManager"
                for p in h.run_pods("nf")
                if p["metadata"]["name"] == pod["metadata"]["name"]
                for c in p["status"].get("conditions") or []
            ),
            60,
            "the partitioned node's pod evicted",
        )
        assert _attempt(h, "nf") == 2 and len(h.record("nf").segments) == 1
        h.cluster.heal(pod["spec"]["nodeName"])
        wait_for(lambda: run.cause is not None, 60, "the kubelet ending the evicted pod after the heal")
        _signal(run, signal.SIGCONT)  # the SIGTERM waiting for it: checkpoint, exit 42
        wait_for(lambda: _attempt(h, "nf") == 3, 120, "the trainer after the partition")
        # 4. a queue suspends the JobSet: its pods go, nothing fails; the controller waits.
        (js,) = h.kube.jobsets("nf")
        name = js["metadata"]["name"]
        h.kube.custom.patch_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", name, {"spec": {"suspend": True}}
        )
        wait_for(lambda: not h.run_pods("nf"), 60, "the suspended run's pods gone")
        h.cluster.settle()
        (js,) = h.kube.jobsets("nf")
        assert js["status"].get("restartsCountTowardsMax", 0) == 0 and "terminalState" not in js["status"]
        h.kube.custom.patch_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", name, {"spec": {"suspend": False}}
        )
        rec = h.wait_state("nf", {RunState.FINISHED}, timeout=240)
        metrics, ledger = h.rundir("nf").metrics(), h.rundir("nf").ledger()
        (js,) = h.kube.jobsets("nf")
    finally:
        h.close()

    assert len(rec.segments) == 1, "node faults and a suspension must not change the segment"
    seg = rec.segments[0]
    assert seg.restarts == 3 and seg.restarts_counted == 0
    assert js["status"]["restarts"] == 3 and js["status"].get("restartsCountTowardsMax", 0) == 0
    assert rec.app_failures == 0
    assert sorted(kept_steps(metrics)) == list(range(1, STEPS + 1))
    seen = [d for e in ledger if e.get("kind") == "observe" for d in e.get("disruptions", [])]
    assert any("EvictionByEvictionAPI" in d for d in seen), seen
    assert any("DeletionByPodGC" in d for d in seen), seen
    assert any("DeletionByTaintManager" in d for d in seen), seen
