"""The controller reads caches kept by its watches: once they are synced a pass makes no
request but its decisions' writes, unrelated objects never reach the caches (server-side
selectors), and the run's Lease is renewed on a period with one PUT."""

from __future__ import annotations

import subprocess
import sys
import threading

from kubernetes import client

from launcher.adapters.kube import Kube
from launcher.controller.launch import create_run, prepare
from launcher.controller.lease import lease_name
from launcher.controller.loop import Controller, PassResult
from launcher.controller.snapshot import Snapshot
from launcher.core.presets import LABEL_ACCELERATOR
from launcher.core.record import Knobs
from launcher.core.spec import RunSpec
from launcher.core.words import Action
from launcher.embedded.cluster import EmbeddedCluster, NodePoolSpec
from tests.e2e.harness import wait_for
from tests.support.fakeclock import FakeClock
from tests.trainer.runs import ROOT

PRESET = "tpu7x-2x2x2"


def unrelated(api: client.ApiClient) -> None:
    """A CPU node, a pod of another workload running on it, and an event about it."""
    core = client.CoreV1Api(api)
    labels = {
        "cloud.google.com/gke-nodepool": "cpu-pool",
        "node.kubernetes.io/instance-type": "e2-standard-8",
    }
    core.create_node({"metadata": {"name": "cpu-0", "labels": labels}})
    pod = {
        "metadata": {"name": "web-0", "labels": {"app": "web"}},
        "spec": {"nodeName": "cpu-0", "containers": [{"name": "web", "image": "nginx"}]},
    }
    core.create_namespaced_pod("default", pod)
    event = {
        "metadata": {"name": "web-0.pulled"},
        "involvedObject": {"kind": "Pod", "name": "web-0", "namespace": "default"},
        "reason": "Pulled",
        "message": "pulled nginx",
        "type": "Normal",
    }
    core.create_namespaced_event("default", event)


def test_a_synced_pass_reads_the_caches_and_lists_nothing(tmp_path):
    with EmbeddedCluster(nodepools=[NodePoolSpec(PRESET, count=2)], mode="simulate") as cluster:
        kube = Kube(cluster.api_client(), "default")
        unrelated(cluster.api_client())
        spec = RunSpec(run="cache", run_dir=str(tmp_path / "cache"), global_batch=32, grace_period_s=30)
        create_run(kube, prepare(spec, PRESET, 2, Knobs(unschedulable_grace_s=5))[0])
        results: list[PassResult] = []
        # A long lease: no renewal falls inside the test.
        controller = Controller(kube, resync_s=0.1, lease_s=60, on_pass=results.append)
        stop = threading.Event()
        loop = threading.Thread(target=controller.run_forever, args=(lambda: ["cache"], stop), daemon=True)
        loop.start()
        try:
            # Waits read what the passes saw: the test's own polling would be counted too.
            wait_for(lambda: results and results[-1].observation.pods_running == 4, 30, "segment 0 running")
            caches = controller.caches
            nodes = caches["nodes"].items()
            assert len(nodes) == 4 and all(LABEL_ACCELERATOR in n["metadata"]["labels"] for n in nodes)
            assert "cpu-0" not in {n["metadata"]["name"] for n in caches["nodes"].items()}
            assert caches["foreign-pods"].items() == ("cpu-0",)  # of another workload's pod, its node
            assert caches["foreign-pods"].indexed() == {"cpu-0"}  # what a pass reads of them
            assert all(e["reason"] == "FailedScheduling" for e in caches["events"].items())
            lists = {name: c.lists for name, c in caches.items()}
            cluster.server.requests.clear()
            seen = len(results)
            cluster.remove(f"{PRESET}-np-1")
            wait_for(
                lambda: any(r.decision.action == Action.START_SEGMENT and r.decision.record.current.index == 1 for r in results),
                30,
                "segment 1",
            )  # fmt: skip
            passes = len(results) - seen
            wait_for(lambda: len(results) >= seen + passes + 5, 10, "five more passes")
        finally:
            stop.set()
            loop.join(timeout=10)
        requests = dict(cluster.server.requests)
    ended = next(r.decision for r in results if r.decision.action == Action.END)
    assert ended.force and "node pools lost" in ended.reason
    # The shrink's writes, and nothing else: no LIST, no GET, in a dozen passes.
    assert not [k for k in requests if k[0] in {"list", "get"}], requests
    assert requests.get(("deletecollection", "pods")) == 1, requests  # the zero-grace end
    assert requests.get(("create", "jobsets")) == 1 and requests.get(("delete", "jobsets")) == 1, requests
    # The watches never relisted: each cache listed once.
    assert set(lists.values()) == {1}, lists


def test_the_lease_is_renewed_on_a_period_with_one_put(tmp_path):
    with EmbeddedCluster(nodepools=[NodePoolSpec(PRESET, count=1)], mode="simulate") as cluster:
        kube = Kube(cluster.api_client(), "default")
        spec = RunSpec(run="lease", run_dir=str(tmp_path / "lease"), global_batch=16, grace_period_s=1)
        create_run(kube, prepare(spec, PRESET, 1, Knobs())[0])
        clock = FakeClock()
        controller = Controller(kube, lease_s=1, monotonic=clock.monotonic)
        requests = cluster.server.requests
        assert controller.own("lease")
        requests.clear()
        for _ in range(20):
            assert controller.own("lease")
        assert not requests, "no request between renewals"
        clock.step(controller.leases.renew_every_s - 0.01)
        assert controller.own("lease") and not requests, "renewed early"
        clock.step(0.02)
        assert controller.own("lease")
        assert dict(requests) == {("update", "leases"): 1}
        assert kube.lease_holder(lease_name("lease")) == controller.identity


def test_each_controller_keeps_its_own_events_memo():
    """Two controllers of one process (the bench, these tests) each hand signals.observe the same
    events tuple while their own caches are unchanged: one's join must not evict the other's."""
    first, second = Controller(kube=None), Controller(kube=None)
    mine = ({"reason": "FailedScheduling"},), ({"reason": "NotTriggerScaleUp"},)
    theirs = ({"reason": "FailedScheduling", "n": 2},), ({"reason": "NotTriggerScaleUp", "n": 2},)

    def events(c: Controller, failed: tuple, no_scale_up: tuple) -> object:
        items = {"jobsets": (), "pods": (), "nodes": (), "events": failed, "events-scale-up": no_scale_up}
        return Snapshot.of(items, frozenset(), c._events_join).events

    joined = events(first, *mine)
    assert joined == (*mine[0], *mine[1])
    assert events(second, *theirs) == (*theirs[0], *theirs[1])
    assert events(first, *mine) is joined  # the second controller's pass left the first's memo alone
    assert events(first, mine[0], ()) == mine[0]  # one side empty: no join to keep


FREEZE_PROBE = """
import gc
from launcher.controller.loop import FREEZE_EVERY_S, Controller

off = Controller(None)  # a controller sharing its process (tests, the demo) leaves the GC alone
off._tune_process()
assert gc.get_freeze_count() == 0
c = Controller(None, own_process=True)
c._tune_process()  # once the caches have listed
frozen = gc.get_freeze_count()
assert frozen > 10_000, frozen
kept = [[i] for i in range(50_000)]  # what a relist would bring
c._tune_process()  # not again before FREEZE_EVERY_S
assert gc.get_freeze_count() == frozen
c._frozen_at -= FREEZE_EVERY_S
c._tune_process()
assert gc.get_freeze_count() >= frozen + 50_000
print("ok")
"""


def test_a_controller_process_freezes_its_heap_once_synced_then_on_a_period() -> None:
    # In a process of its own: freezing would reach into this test process's heap.
    out = subprocess.run([sys.executable, "-c", FREEZE_PROBE], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


def test_the_watches_hold_events_off_while_a_pass_decides():
    # A pass decides on one state, and in a burst of events it gets the interpreter to itself:
    # what arrives meanwhile is applied once it has decided.
    with EmbeddedCluster(nodepools=[NodePoolSpec(PRESET, count=1)], mode="simulate") as cluster:
        controller = Controller(Kube(cluster.api_client(), "default"))
        halt = threading.Event()
        controller.start_caches(halt)
        try:
            wait_for(controller.synced, 30, "the caches")
            names = lambda: {n["metadata"]["name"] for n in controller.caches["nodes"].items()}  # noqa: E731
            gone = sorted(names())[0]
            with controller._deciding():
                client.CoreV1Api(cluster.api_client()).delete_node(gone)
                threading.Event().wait(0.5)  # the watch has had time to deliver the deletion
                assert gone in names(), "an event was applied while the pass decided"
            wait_for(lambda: gone not in names(), 10, "the deletion applied")
        finally:
            halt.set()


def test_a_pass_before_the_watch_delivers_a_create_sees_the_jobset_created(tmp_path):
    # On a loaded machine the next pass can come before the watch delivers the JobSet just created
    # (a CI run's ledger had a second create-jobset): that pass must see the JobSet, not its absence.
    with EmbeddedCluster(nodepools=[NodePoolSpec(PRESET, count=1)], mode="simulate") as cluster:
        kube = Kube(cluster.api_client(), "default")
        spec = RunSpec(run="lag", run_dir=str(tmp_path / "lag"), global_batch=16, grace_period_s=1)
        create_run(kube, prepare(spec, PRESET, 1, Knobs())[0])
        controller = Controller(kube, lease_s=60)
        halt = threading.Event()
        controller.start_caches(halt)
        try:
            wait_for(lambda: controller.synced() and controller.record("lag"), 30, "the caches")
            # The watches wait on this gate; the passes below open and close a new one of their own.
            gate, controller._ingest = controller._ingest, threading.Event()
            controller._ingest.set()
            gate.clear()
            cluster.server.requests.clear()
            first = controller.reconcile("lag")
            second = controller.reconcile("lag")
            requests = dict(cluster.server.requests)
            uid = kube.custom.get_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", first.decision.jobset
            )["metadata"]["uid"]
            assert controller.caches["jobsets"].items() == (), "the watch delivered it after all"
            gate.set()
            wait_for(lambda: controller.caches["jobsets"].items(), 10, "the watch delivers the JobSet")
            third = controller.reconcile("lag")
        finally:
            halt.set()
    assert first.decision.action == Action.START_SEGMENT
    assert second.observation.jobset.uid == uid and second.decision.action not in {
        Action.START_SEGMENT,
        Action.CREATE_JOBSET,
    }
    assert requests.get(("create", "jobsets")) == 1, requests
    assert third.observation.jobset.uid == uid and not controller._created, "the cache took over"
