"""Node lifecycle as GKE drives it, through the official client (simulate mode): the eviction API
with a PodDisruptionBudget, `drain`, NoExecute taints, a partitioned node going NotReady, PodGC
on a node deleted through the API, `repair`; and a running JobSet suspended by a queue."""

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.launcher.embedded.cluster_helpers import HOSTS, PodRecorder, condition, rendered, running
from tests.support.wait import wait_for

JS = "jobset.sigs.k8s.io/jobset-name"


def _running_pods(kube, n=2 * HOSTS):
    return wait_for(
        lambda: len(r := [p for p in kube.pods() if p.status.phase == "Running"]) == n and r,
        what="pods running",
    )


def _dt(pod):
    return next((c for c in pod.status.conditions or [] if c.type == "DisruptionTarget"), None)


def _evict(kube, name):
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace="default"))
    return kube.core.create_namespaced_pod_eviction(name, "default", body)


def test_eviction_api_honours_the_disruption_budget_and_drain_evicts():
    with running("tpu7x-2x2x2:2", mode="simulate") as kube:
        kube.create_jobset(rendered("ev", "unused"))
        pods = sorted(_running_pods(kube), key=lambda p: p.metadata.name)
        policy = client.PolicyV1Api(kube.cluster.api_client())
        policy.create_namespaced_pod_disruption_budget(
            "default",
            client.V1PodDisruptionBudget(
                metadata=client.V1ObjectMeta(name="keep"),
                spec=client.V1PodDisruptionBudgetSpec(
                    min_available=2 * HOSTS - 1, selector=client.V1LabelSelector(match_labels={JS: "ev-0"})
                ),
            ),
        )
        first, second = pods[0].metadata.name, pods[1].metadata.name
        _evict(kube, first)  # the client's own method, as kubectl drain calls it: 201 with a Status
        cur = kube.core.read_namespaced_pod(first, "default")
        assert cur.metadata.deletion_timestamp is not None
        dt = _dt(cur)
        assert (dt.status, dt.reason, dt.message) == (
            "True",
            "EvictionByEvictionAPI",
            "Eviction API: evicting",
        )
        pdb = policy.read_namespaced_pod_disruption_budget("keep", "default")
        assert pdb.status.disruptions_allowed == 0 and first in pdb.status.disrupted_pods
        # The budget has no disruption left: 429 with the upstream cause, and the pod is untouched.
        with pytest.raises(ApiException) as e:
            _evict(kube, second)
        assert e.value.status == 429
        assert "violate the pod's disruption budget" in e.value.body
        assert "The disruption budget keep needs 3 healthy pods and has 3 currently" in e.value.body
        assert kube.core.read_namespaced_pod(second, "default").metadata.deletion_timestamp is None
        # drain: cordoned, its pods evicted once the budget allows (the evicted pod's replacement).
        policy.delete_namespaced_pod_disruption_budget("keep", "default")
        node = pods[1].spec.node_name
        out = kube.cluster.drain(node, timeout_s=20)
        assert second in out["evicted"]
        n = kube.core.read_node(node)
        assert n.spec.unschedulable is True
        assert any(t.key == "node.kubernetes.io/unschedulable" for t in n.spec.taints)
        assert not [p for p in kube.pods() if p.spec.node_name == node]


def test_noexecute_taint_and_a_partitioned_node():
    with running("tpu7x-2x2x2:2", mode="simulate", node_monitor_grace_s=0.3) as kube:
        js = rendered("nx", "unused", max_restarts=5)
        pod_spec = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        pod_spec["tolerations"].append(
            {
                "key": "node.kubernetes.io/unreachable",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 1,
            }
        )
        pod_spec["tolerations"].append(
            {"key": "example.com/tolerated", "operator": "Exists", "effect": "NoExecute"}
        )
        kube.create_jobset(js)
        pods = sorted(_running_pods(kube), key=lambda p: p.metadata.name)
        rec = PodRecorder(kube)
        # A tolerated NoExecute taint (no tolerationSeconds) evicts nothing; an untolerated one at once.
        a = pods[0]
        node = kube.core.read_node(a.spec.node_name)
        taints = [*node.spec.taints, client.V1Taint(key="example.com/tolerated", effect="NoExecute")]
        kube.core.patch_node(
            a.spec.node_name,
            {"spec": {"taints": [kube.core.api_client.sanitize_for_serialization(t) for t in taints]}},
        )
        kube.cluster.settle()
        assert kube.core.read_namespaced_pod(a.metadata.name, "default").metadata.deletion_timestamp is None
        taints.append(client.V1Taint(key="example.com/evict", effect="NoExecute"))
        kube.core.patch_node(
            a.spec.node_name,
            {"spec": {"taints": [kube.core.api_client.sanitize_for_serialization(t) for t in taints]}},
        )
        wait_for(lambda: any(t == "DELETED" for t, _ in rec.states(a.metadata.name)), what="tainted pod gone")
        dts = [_dt(p) for _, p in rec.states(a.metadata.name) if _dt(p) is not None]
        assert dts and dts[0].reason == "DeletionByTaintManager"
        # The eviction fails its Job (DisruptionTarget: FailJob) and the JobSet restarts, deleting
        # every pod of attempt 0: lift the taint and partition a pod of attempt 1, which nothing
        # but the taint manager deletes.
        kube.core.patch_node(
            a.spec.node_name,
            {"spec": {"taints": [kube.core.api_client.sanitize_for_serialization(t) for t in taints[:-1]]}},
        )
        pods = wait_for(
            lambda: (
                len(
                    r := [
                        p
                        for p in kube.pods("jobset.sigs.k8s.io/restart-attempt=1")
                        if p.status.phase == "Running" and not p.metadata.deletion_timestamp
                    ]
                )
                == 2 * HOSTS
                and r
            ),
            what="attempt 1 running",
        )
        # Partition another slice's node: NotReady, unreachable taints, its pod deleted after 1 s and
        # left Terminating (no kubelet completes it) until the partition heals.
        b = next(
            p
            for p in pods
            if kube.core.read_node(p.spec.node_name).metadata.labels["cloud.google.com/gke-nodepool"]
            != node.metadata.labels["cloud.google.com/gke-nodepool"]
        )
        kube.cluster.partition(b.spec.node_name)
        ready = wait_for(
            lambda: (
                (
                    c := next(
                        c
                        for c in kube.core.read_node(b.spec.node_name).status.conditions
                        if c.type == "Ready"
                    )
                ).status
                == "Unknown"
                and c
            ),
            what="NotReady",
        )
        assert (ready.reason, ready.message) == ("NodeStatusUnknown", "Kubelet stopped posting node status.")
        got = {(t.key, t.effect) for t in kube.core.read_node(b.spec.node_name).spec.taints}
        assert {
            ("node.kubernetes.io/unreachable", "NoSchedule"),
            ("node.kubernetes.io/unreachable", "NoExecute"),
        } <= got
        gone = wait_for(
            lambda: (
                (p := kube.core.read_namespaced_pod(b.metadata.name, "default")).metadata.deletion_timestamp
                and p
            ),
            what="evicted after tolerationSeconds",
        )
        assert _dt(gone).reason == "DeletionByTaintManager"
        assert gone.status.phase == "Running"  # nobody reports it
        kube.cluster.settle()
        assert kube.core.read_namespaced_pod(b.metadata.name, "default").metadata.deletion_timestamp
        kube.cluster.heal(b.spec.node_name)
        wait_for(
            lambda: not [p for p in kube.pods() if p.metadata.name == b.metadata.name],
            what="pod removed after heal",
        )
        n = kube.core.read_node(b.spec.node_name)
        assert next(c for c in n.status.conditions if c.type == "Ready").status == "True"
        assert not any(t.key == "node.kubernetes.io/unreachable" for t in n.spec.taints)
        rec.close()


def test_podgc_on_a_node_deleted_through_the_api_and_repair():
    with running("tpu7x-2x2x2:2", mode="simulate") as kube:
        kube.create_jobset(rendered("gc", "unused", max_restarts=5))
        pods = sorted(_running_pods(kube), key=lambda p: p.metadata.name)
        rec = PodRecorder(kube)
        victim = pods[0]
        kube.core.delete_node(victim.spec.node_name)  # not a fault helper: anyone's delete
        wait_for(lambda: any(t == "DELETED" for t, _ in rec.states(victim.metadata.name)), what="PodGC")
        last = rec.states(victim.metadata.name)[-1][1]
        assert last.status.phase == "Failed"
        assert (_dt(last).reason, _dt(last).message) == ("DeletionByPodGC", "PodGC: node no longer exists")
        # repair: the node is deleted and recreated (same name), its pods go the PodGC way.
        kube.cluster.restore(kube.cluster.node_pool_of[victim.spec.node_name])
        fresh = wait_for(
            lambda: (
                len(
                    r := [
                        p
                        for p in kube.pods("jobset.sigs.k8s.io/restart-attempt=1")
                        if p.status.phase == "Running"
                    ]
                )
                == 2 * HOSTS
                and r
            ),
            what="restarted",
        )
        other = fresh[0]
        uid = kube.core.read_node(other.spec.node_name).metadata.uid
        out = kube.cluster.repair(other.spec.node_name)
        assert other.metadata.name in out["pods"]
        assert kube.core.read_node(other.spec.node_name).metadata.uid != uid
        wait_for(lambda: any(t == "DELETED" for t, _ in rec.states(other.metadata.name)), what="repair PodGC")
        assert _dt(rec.states(other.metadata.name)[-1][1]).reason == "DeletionByPodGC"
        rec.close()


def test_suspending_a_running_jobset_fails_and_restarts_nothing():
    with running("tpu7x-2x2x2:2", mode="simulate") as kube:
        kube.create_jobset(rendered("q", "unused", max_restarts=1))
        _running_pods(kube)
        kube.custom.patch_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", "q-0", {"spec": {"suspend": True}}
        )
        wait_for(lambda: not kube.pods(), what="pods deleted")
        wait_for(lambda: (c := condition(kube.jobset("q-0"), "Suspended")) and c["status"] == "True")
        kube.cluster.settle()
        jobs = kube.batch.list_namespaced_job("default").items
        assert len(jobs) == 2
        for j in jobs:
            conds = {c.type: c for c in j.status.conditions or []}
            assert conds["Suspended"].status == "True" and conds["Suspended"].reason == "JobSuspended"
            assert "Failed" not in conds and "FailureTarget" not in conds
            assert not j.status.failed
        st = kube.jobset("q-0")["status"]
        assert st["restarts"] == 0 and not st.get("restartsCountTowardsMax")
        assert condition(kube.jobset("q-0"), "Failed") is None
        kube.custom.patch_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", "q-0", {"spec": {"suspend": False}}
        )
        _running_pods(kube)
        assert kube.jobset("q-0")["status"]["restarts"] == 0
        assert all(p.metadata.labels["jobset.sigs.k8s.io/restart-attempt"] == "0" for p in kube.pods())


def test_active_deadline_seconds_fails_the_job_and_stops_its_pods():
    with running("tpu7x-2x2x2:1", mode="simulate") as kube:
        tolerate = [{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}]
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "dl"},
            "spec": {
                "activeDeadlineSeconds": 1,
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "tolerations": tolerate,
                        "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "60"]}],
                    }
                },
            },
        }
        kube.batch.create_namespaced_job("default", job)
        wait_for(lambda: [p for p in kube.pods("job-name=dl") if p.status.phase == "Running"], what="running")
        failed = wait_for(
            lambda: next(
                (
                    c
                    for c in kube.batch.read_namespaced_job("dl", "default").status.conditions or []
                    if c.type == "Failed"
                ),
                None,
            ),
            timeout=10,
            what="Failed",
        )
        assert (failed.status, failed.reason, failed.message) == (
            "True",
            "DeadlineExceeded",
            "Job was active longer than specified deadline",
        )
        wait_for(
            lambda: all(p.status.phase == "Failed" for p in kube.pods("job-name=dl")), what="pods stopped"
        )
        assert [e.message for e in kube.events("DeadlineExceeded")] == [
            "Job was active longer than specified deadline"
        ]


def test_a_jobs_template_is_immutable_unless_suspended_and_never_started():
    with running("tpu7x-2x2x2:1", mode="simulate") as kube:
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "im"},
            "spec": {
                "suspend": True,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "60"]}],
                    }
                },
            },
        }
        kube.batch.create_namespaced_job("default", job)
        # Suspended, never started: the scheduling directives may change (Kueue's admission) ...
        tolerate = [{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}]
        kube.batch.patch_namespaced_job(
            "im", "default", {"spec": {"template": {"spec": {"tolerations": tolerate}}}}
        )
        # ... the containers may not, and nothing may once it ran.
        with pytest.raises(ApiException) as e:
            kube.batch.patch_namespaced_job(
                "im",
                "default",
                {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "other"}]}}}},
            )
        assert (
            e.value.status == 422
            and "spec.template: Invalid value" in e.value.body
            and "field is immutable" in e.value.body
        )
        kube.batch.patch_namespaced_job("im", "default", {"spec": {"suspend": False}})
        wait_for(lambda: kube.batch.read_namespaced_job("im", "default").status.start_time, what="started")
        with pytest.raises(ApiException) as e:
            kube.batch.patch_namespaced_job(
                "im", "default", {"spec": {"template": {"spec": {"nodeSelector": {"a": "b"}}}}}
            )
        assert e.value.status == 422 and "field is immutable" in e.value.body
        # An empty map where there was none is no change to a typed template (Semantic.DeepEqual):
        # accepted, and the Job's generation stays.
        before = kube.batch.read_namespaced_job("im", "default").metadata.generation
        kube.batch.patch_namespaced_job(
            "im",
            "default",
            {"spec": {"template": {"metadata": {"annotations": {}}, "spec": {"nodeSelector": {}}}}},
        )
        assert kube.batch.read_namespaced_job("im", "default").metadata.generation == before
        with pytest.raises(ApiException) as e:
            kube.batch.patch_namespaced_job(
                "im", "default", {"spec": {"completionMode": "Indexed", "completions": 1}}
            )
        assert e.value.status == 422 and "spec.completionMode" in e.value.body
        assert kube.batch.read_namespaced_job("im", "default").spec.completion_mode == "NonIndexed"


def test_jobs_and_pods_carry_the_jobset_uid_label():
    with running("tpu7x-2x2x2:2", mode="simulate") as kube:
        uid = kube.create_jobset(rendered("lb", "unused"))["metadata"]["uid"]
        _running_pods(kube)
        sel = f"jobset.sigs.k8s.io/jobset-uid={uid}"
        assert len(kube.batch.list_namespaced_job("default", label_selector=sel).items) == 2
        assert len(kube.pods(sel)) == 2 * HOSTS
        # JobSet's pod webhook labels the pods (not the Jobs) with their priority.
        assert {p.metadata.labels.get("jobset.sigs.k8s.io/priority") for p in kube.pods(sel)} == {"0"}
        for j in kube.batch.list_namespaced_job("default", label_selector=sel).items:
            lbl = j.metadata.labels
            assert lbl["jobset.sigs.k8s.io/group-name"] == "default"
            assert lbl["jobset.sigs.k8s.io/group-replicas"] == "2"
            assert lbl["jobset.sigs.k8s.io/job-group-index"] == lbl["jobset.sigs.k8s.io/job-index"]
            assert "jobset.sigs.k8s.io/priority" not in lbl


def test_in_order_startup_policy_creates_each_replicated_job_once_the_previous_is_ready():
    import copy
    import threading

    from kubernetes import watch

    with running("tpu7x-2x2x2:2", mode="simulate") as kube:
        seen: list[tuple[str, str, int]] = []
        w = watch.Watch()

        def record() -> None:
            try:
                for ev in w.stream(kube.batch.list_namespaced_job, "default", timeout_seconds=30):
                    j = ev["object"]
                    seen.append((ev["type"], j.metadata.name, j.status.ready or 0))
            except Exception:
                pass  # the stream ends with the cluster

        threading.Thread(target=record, daemon=True).start()
        js = rendered("io", "unused", slices=1)
        rj = js["spec"]["replicatedJobs"]
        rj.append(copy.deepcopy(rj[0]) | {"name": "second"})
        js["spec"]["startupPolicy"] = {"startupPolicyOrder": "InOrder"}
        kube.create_jobset(js)
        done = wait_for(lambda: condition(kube.jobset("io-0"), "StartupPolicyCompleted"), what="startup done")
        assert (done["status"], done["reason"], done["message"]) == (
            "True",
            "InOrderStartupPolicyCompleted",
            "in order startup policy has completed",
        )
        progress = condition(kube.jobset("io-0"), "StartupPolicyInProgress")
        assert (progress["status"], progress["reason"]) == ("False", "InOrderStartupPolicyInProgress")
        w.stop()
        first_added = next(i for i, (t, n, _) in enumerate(seen) if t == "ADDED" and n == "io-0-second-0")
        slice_job = [r for t, n, r in seen[:first_added] if n == "io-0-slice-0"]
        assert slice_job and slice_job[-1] == HOSTS, seen  # the first Job was ready before the second came
        reasons = [e.reason for e in sorted(kube.events(kind="JobSet"), key=lambda e: e.first_timestamp)]
        assert "InOrderStartupPolicyInProgress" in reasons and "InOrderStartupPolicyCompleted" in reasons
