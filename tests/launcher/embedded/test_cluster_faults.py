"""Every fault, and the objects it leaves: taints, conditions, events, phases, exit codes, nodes."""

import os

from tests.launcher.embedded.cluster_helpers import HOSTS, PodRecorder, condition, rendered, running, wait_for

# A trainer stand-in: on SIGTERM it "saves" and exits 42, as the real one does.
TRAINER = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.2), sys.exit(42)))\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def _slice_pods(kube, idx, attempt="0"):
    """The slice's pods (one per host, by completion index) once each process has its SIGTERM
    handler (it says so in its log)."""
    sel = f"jobset.sigs.k8s.io/job-index={idx},jobset.sigs.k8s.io/restart-attempt={attempt}"
    pods = wait_for(
        lambda: len(r := [p for p in kube.pods(sel) if p.status.phase == "Running"]) == HOSTS and r,
        what=f"slice {idx} running",
    )
    for pod in pods:
        wait_for(
            lambda pod=pod: "ready" in kube.core.read_namespaced_pod_log(pod.metadata.name, "default"),
            what="trainer ready",
        )
    return sorted(pods, key=lambda p: p.metadata.name)


def _wait_both_slices_restarted(kube) -> None:
    wait_for(
        lambda: (
            sum(p.status.phase == "Running" for p in kube.pods("jobset.sigs.k8s.io/restart-attempt=1"))
            == 2 * HOSTS
        ),
        what="both slices running again",
    )


def _pool_of(kube, pod):
    return kube.core.read_node(pod.spec.node_name).metadata.labels["cloud.google.com/gke-nodepool"]


def _pid(pod) -> int:
    return int(pod.status.container_statuses[0].container_id.removeprefix("process://"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_preempt_is_the_spot_sequence_and_restarts_without_counting():
    with running("tpu7x-2x2x2:2") as kube:
        rec = PodRecorder(kube)
        kube.create_jobset(rendered("spot", TRAINER, grace_s=10, max_restarts=0))
        victims = _slice_pods(kube, 0)
        names = [v.metadata.name for v in victims]
        (pool,) = {_pool_of(kube, v) for v in victims}  # a slice is one node pool
        out = kube.cluster.preempt(pool, grace_s=3, wait=False)
        assert out["pods"] == names
        # At once: the termination taint on every node of the pool and DisruptionTarget on its pods.
        nodes = kube.pool_nodes(pool)
        assert len(nodes) == HOSTS
        for node in nodes:
            assert any(
                t.key == "cloud.google.com/impending-node-termination" and t.effect == "NoSchedule"
                for t in node.spec.taints
            )
        for name in names:
            cur = kube.core.read_namespaced_pod(name, "default")
            dt = next(c for c in cur.status.conditions if c.type == "DisruptionTarget")
            assert (dt.status, dt.reason, dt.message) == (
                "True",
                "TerminationByKubelet",
                "Pod was terminated in response to imminent node shutdown.",
            )
        # Then the nodes go, and the pods with them.
        wait_for(lambda: not kube.pool_nodes(pool), what="nodes removed")
        for name in names:
            wait_for(lambda n=name: any(t == "DELETED" for t, _ in rec.states(n)), what="pod removed")
            failed = [p for t, p in rec.states(name) if p.status.phase == "Failed"]
            assert failed, "the pod must be seen Failed before it goes"
            p = failed[0]
            assert (p.status.reason, p.status.message) == (
                "Terminated",
                "Pod was terminated in response to imminent node shutdown.",
            )
            assert p.status.container_statuses[0].state.terminated.exit_code == 42  # SIGTERM reached it
            killing = [e.message for e in kube.events("Killing", "Pod") if e.involved_object.name == name]
            assert killing == ["Stopping container trainer"]
        removed = wait_for(lambda: len(r := kube.events(kind="Node")) == HOSTS and r, what="node events")
        assert sorted(e.involved_object.name for e in removed) == sorted(n.metadata.name for n in nodes)
        assert {e.reason for e in removed} == {"RemovingNode"}
        # DisruptionTarget matched rule 0 → "preempted" → restart without spending maxRestarts (0).
        js = wait_for(lambda: (j := kube.jobset("spot-0"))["status"].get("restarts") == 1 and j)
        assert js["status"].get("restartsCountTowardsMax", 0) == 0 and "terminalState" not in js["status"]
        (jev,) = kube.events("PodFailurePolicy", "Job")
        assert jev.involved_object.name == "spot-0-slice-0"
        assert jev.message in {
            f"Pod default/{name} has condition DisruptionTarget matching FailJob rule at index 0"
            for name in names
        }

        # One node pool left for two slices: the second slice's leader waits, unschedulable. The
        # first leader holds one host; exclusive placement keeps the second off the other one.
        def unschedulable():
            for p in kube.pods("jobset.sigs.k8s.io/restart-attempt=1"):
                for c in p.status.conditions or []:
                    if c.type == "PodScheduled" and c.status == "False":
                        return p, c
            return None

        pending, cond = wait_for(unschedulable, what="an unschedulable slice")
        assert pending.metadata.labels["batch.kubernetes.io/job-completion-index"] == "0"
        assert cond.message == (
            "0/2 nodes are available: 1 Insufficient google.com/tpu, "
            "1 node(s) didn't match pod anti-affinity rules. preemption: 0/2 nodes are available: "
            "2 No preemption victims found for incoming pod."
        )
        # Restore: the nodes come back clean and the slice is scheduled.
        kube.cluster.restore(pool)
        nodes = kube.pool_nodes(pool)
        assert len(nodes) == HOSTS
        for node in nodes:
            assert not any(
                t.key == "cloud.google.com/impending-node-termination" for t in node.spec.taints or []
            )
            assert next(c for c in node.status.conditions if c.type == "Ready").status == "True"
        assert [e.reason for e in kube.events(kind="Node")].count("RegisteredNode") == HOSTS
        _wait_both_slices_restarted(kube)
        rec.close()


def test_remove_fails_pods_by_podgc_and_kills_their_processes():
    with running("tpu7x-2x2x2:3") as kube:
        rec = PodRecorder(kube)
        kube.create_jobset(rendered("gone", TRAINER, grace_s=10, max_restarts=0))
        victims = _slice_pods(kube, 1)
        names = [v.metadata.name for v in victims]
        pids = [_pid(v) for v in victims]
        assert all(_alive(pid) for pid in pids)
        (pool,) = {_pool_of(kube, v) for v in victims}
        pool_nodes = sorted(n.metadata.name for n in kube.pool_nodes(pool))
        out = kube.cluster.remove(pool)
        assert out["pods"] == names and not kube.pool_nodes(pool)
        wait_for(lambda: not any(_alive(pid) for pid in pids), what="the processes to die with their nodes")
        for name in names:
            states = rec.states(name)
            wait_for(lambda n=name: any(t == "DELETED" for t, _ in rec.states(n)), what="pod removed")
            failed = next(p for _, p in rec.states(name) if p.status.phase == "Failed")
            dt = next(c for c in failed.status.conditions if c.type == "DisruptionTarget")
            assert (dt.status, dt.reason, dt.message) == (
                "True",
                "DeletionByPodGC",
                "PodGC: node no longer exists",
            )
            assert not any(
                t == "MODIFIED" and p.status.reason == "Terminated" for t, p in states
            )  # no graceful shutdown
        removed = kube.events(kind="Node")
        assert sorted(e.involved_object.name for e in removed) == pool_nodes
        assert {e.reason for e in removed} == {"RemovingNode"}
        # No graceful stop for the victims (the other slice's pods get one: the restart deletes them).
        assert not [e for e in kube.events("Killing") if e.involved_object.name in names]
        # A disruption: the JobSet restarts uncounted and, with a spare pool, runs on.
        js = wait_for(lambda: (j := kube.jobset("gone-0"))["status"].get("restarts") == 1 and j)
        assert js["status"].get("restartsCountTowardsMax", 0) == 0
        wait_for(
            lambda: (
                sum(p.status.phase == "Running" for p in kube.pods("jobset.sigs.k8s.io/restart-attempt=1"))
                == 2 * HOSTS
            )
        )
        assert pool not in {_pool_of(kube, p) for p in kube.pods("jobset.sigs.k8s.io/restart-attempt=1")}
        rec.close()


# A survivor stand-in: SIGUSR1 plays its collectives failing because a peer is gone (exit 43).
SURVIVOR = TRAINER.replace(
    "print('ready'", "signal.signal(signal.SIGUSR1, lambda *_: sys.exit(43))\nprint('ready'"
)


def test_a_rebooted_host_fails_its_pod_as_upstream_and_jobset_counts_it():
    # The host is back at once (`--down 0`): its kubelet finds the container it last saw Running
    # gone and does what upstream's does (kubernetes/kubernetes pkg/kubelet/kubelet_pods.go, then
    # pkg/kubelet/status/status_manager.go TerminatePod): the restartPolicy Never pod Failed, its
    # container first waiting with lastState.terminated ContainerStatusUnknown 137, then
    # state.terminated the same. No podFailurePolicy rule matches it (no DisruptionTarget, and
    # onExitCodes reads state.terminated, absent at first and then a 137 like any SIGKILL), so the
    # Job fails on its backoff limit and JobSet's catch-all rule restarts the slices, counted.
    with running("tpu7x-2x2x2:2") as kube:
        rec = PodRecorder(kube)
        kube.create_jobset(rendered("crash", SURVIVOR, max_restarts=1))
        victim = _slice_pods(kube, 0)[0]
        _slice_pods(kube, 1)
        pid = _pid(victim)
        out = kube.cluster.crash_host("default", victim.metadata.name)
        assert out == {"pod": f"default/{victim.metadata.name}", "node": victim.spec.node_name, "down_s": 0.0}
        assert not _alive(pid)
        js = wait_for(lambda: (j := kube.jobset("crash-0"))["status"].get("restarts") == 1 and j)
        assert js["status"].get("restartsCountTowardsMax") == 1 and "terminalState" not in js["status"]
        states = [p for t, p in rec.states(victim.metadata.name) if t != "DELETED"]
        failed = [p for p in states if p.status.phase == "Failed"]
        phases = [p.status.phase for p in states]
        assert failed and "Running" not in phases[phases.index("Failed") :]  # terminal stays terminal
        first, last = failed[0].status.container_statuses[0], failed[-1].status.container_statuses[0]
        assert first.state.waiting is not None and first.state.terminated is None  # kubelet_pods.go
        assert (first.last_state.terminated.exit_code, first.last_state.terminated.reason) == (
            137,
            "ContainerStatusUnknown",
        )
        assert first.last_state.terminated.message == (
            "The container could not be located when the pod was deleted.  The container used to be Running"
        )
        assert first.restart_count == 1
        assert (last.state.terminated.exit_code, last.state.terminated.reason) == (
            137,
            "ContainerStatusUnknown",
        )
        assert (
            last.state.terminated.message == "The container could not be located when the pod was terminated"
        )
        assert last.last_state.terminated.reason == "ContainerStatusUnknown"  # kept
        assert not any(c.type == "DisruptionTarget" for c in failed[-1].status.conditions)
        assert not kube.events("PodFailurePolicy", "Job")  # no rule matched
        _wait_both_slices_restarted(kube)
        rec.close()


def test_a_host_down_for_a_while_turns_its_node_not_ready_then_ready_again():
    # The host's kubelet died with it: no heartbeats until the reboot, so the node monitor marks the
    # node NotReady (unreachable taints) after its grace period, the only sign a controller gets of
    # it; the pod itself is still reported Running. Back after `down_s`: Ready, taints gone.
    with running("tpu7x-2x2x2:2", node_monitor_grace_s=0.3) as kube:
        kube.create_jobset(rendered("down", TRAINER, max_restarts=0))
        victim = _slice_pods(kube, 0)[0]
        node = victim.spec.node_name
        out = kube.cluster.crash_host("default", victim.metadata.name, down_s=3.0)
        assert out["down_s"] == 3.0 and out["node"] == node

        def ready() -> str:
            return next(c.status for c in kube.core.read_node(node).status.conditions if c.type == "Ready")

        wait_for(lambda: ready() == "Unknown", timeout=2.5, what="node NotReady within the down time")
        taints = {t.key for t in kube.core.read_node(node).spec.taints or []}
        assert "node.kubernetes.io/unreachable" in taints
        cur = kube.core.read_namespaced_pod(victim.metadata.name, "default")
        assert cur.status.phase == "Running"  # nothing reports the pod meanwhile
        wait_for(lambda: ready() == "True", timeout=10, what="node Ready after the reboot")
        assert "node.kubernetes.io/unreachable" not in {
            t.key for t in kube.core.read_node(node).spec.taints or []
        }
        # Back, its kubelet reports the pod as after any reboot: Failed, the container gone.
        gone = wait_for(
            lambda: (
                (x := kube.core.read_namespaced_pod(victim.metadata.name, "default")).status.phase == "Failed"
                and x
            ),
            what="the pod reported after the reboot",
        )
        assert gone.status.container_statuses[0].last_state.terminated.reason == "ContainerStatusUnknown"


def test_kill_pod_is_exit_137_and_counts_as_an_app_failure():
    with running("tpu7x-2x2x2:2") as kube:
        kube.create_jobset(rendered("kill", TRAINER, max_restarts=0))
        victim, other = _slice_pods(kube, 1)
        out = kube.cluster.kill_pod("default", victim.metadata.name)
        assert out == {"pod": f"default/{victim.metadata.name}", "exitCode": 137}
        p = wait_for(
            lambda: (
                (x := kube.core.read_namespaced_pod(victim.metadata.name, "default")).status.phase == "Failed"
                and x
            )
        )
        term = p.status.container_statuses[0].state.terminated
        assert (term.exit_code, term.reason) == (137, "Error")
        assert not any(c.type == "DisruptionTarget" for c in p.status.conditions)
        js = wait_for(lambda: (j := kube.jobset("kill-0"))["status"].get("terminalState") and j)
        assert condition(js, "Failed")["reason"] == "ReachedMaxRestarts"  # 137 is neither 42 nor 2
        job = kube.batch.read_namespaced_job("kill-0-slice-1", "default")
        assert next(c for c in job.status.conditions if c.type == "Failed").reason == "BackoffLimitExceeded"
        # The killed pod, and its other host, which the failed Job stops: once a Job has failed,
        # upstream's Job controller counts every pod of it that did not succeed as failed.
        assert job.status.failed == HOSTS
        # That one was deleted and goes; the failed pod stays in the API (nothing deleted it), as
        # on a real cluster.
        wait_for(
            lambda: other.metadata.name not in {x.metadata.name for x in kube.pods()},
            what="the other host gone",
        )
        kube.cluster.settle()  # every controller has done what it will do with the failed pod
        assert kube.core.read_namespaced_pod(victim.metadata.name, "default").status.phase == "Failed"
