"""A rendered JobSet on the embedded cluster: child Jobs and pods as upstream names and labels them,
real processes that see their identity, exclusive node pools, logs through the API; and, in
simulate mode, completion, ttlSecondsAfterFinished, suspend/resume and the success policy."""

import itertools
import json
import re
import threading

from kubernetes import watch

from tests.launcher.embedded.cluster_helpers import HOSTS, condition, rendered, running, terminal, wait_for

PRINT_ENV = (
    "import json, os; "
    "print(json.dumps({k: v for k, v in os.environ.items() "
    "if k.startswith(('RESLICE_', 'MEGASCALE_', 'JAX_', 'JOB_COMPLETION_INDEX'))}))"
)


def test_rendered_two_slice_jobset_runs_processes_that_know_who_they_are():
    with running("tpu7x-2x2x2:4") as kube:
        kube.create_jobset(rendered("alpha", PRINT_ENV))
        kube.create_jobset(rendered("beta", PRINT_ENV))
        for name in ("alpha-0", "beta-0"):
            js = terminal(kube, name)
            assert js["status"]["terminalState"] == "Completed"
            assert condition(js, "Completed")["reason"] == "AllJobsCompleted"
            assert js["status"]["replicatedJobsStatus"] == [
                {"name": "slice", "ready": 0, "succeeded": 2, "failed": 0, "active": 0, "suspended": 0}
            ]
        jobs = {j.metadata.name: j for j in kube.batch.list_namespaced_job("default").items}
        assert sorted(jobs) == ["alpha-0-slice-0", "alpha-0-slice-1", "beta-0-slice-0", "beta-0-slice-1"]
        assert all(
            condition(
                j.to_dict() | {"status": {"conditions": [c.to_dict() for c in j.status.conditions]}},
                "Complete",
            )
            for j in jobs.values()
        )

        coordinators, pools, hosts, lifetimes = {}, {}, {}, {}
        for pod in kube.pods():
            m, lbl = pod.metadata, pod.metadata.labels
            js_name, idx = lbl["jobset.sigs.k8s.io/jobset-name"], lbl["jobset.sigs.k8s.io/job-index"]
            host = lbl["batch.kubernetes.io/job-completion-index"]
            hosts.setdefault((js_name, idx), []).append(host)
            assert re.fullmatch(rf"{js_name}-slice-{idx}-{host}-[bcdfghjklmnpqrstvwxz2456789]{{5}}", m.name)
            assert pod.spec.hostname == f"{js_name}-slice-{idx}-{host}" and pod.spec.subdomain == js_name
            assert host == m.annotations["batch.kubernetes.io/job-completion-index"]
            assert lbl["jobset.sigs.k8s.io/replicatedjob-name"] == "slice"
            assert lbl["jobset.sigs.k8s.io/job-global-index"] == idx
            assert lbl["jobset.sigs.k8s.io/restart-attempt"] == "0"
            assert lbl["jobset.sigs.k8s.io/replicatedjob-replicas"] == "2"
            assert lbl["batch.kubernetes.io/job-name"] == f"{js_name}-slice-{idx}" == lbl["job-name"]
            assert lbl["controller-uid"] == jobs[f"{js_name}-slice-{idx}"].metadata.uid
            assert (
                m.annotations["alpha.jobset.sigs.k8s.io/exclusive-topology"]
                == "cloud.google.com/gke-nodepool"
            )
            assert pod.status.phase == "Succeeded"
            assert pod.status.container_statuses[0].state.terminated.exit_code == 0
            assert pod.status.container_statuses[0].state.terminated.reason == "Completed"
            node = kube.core.read_node(pod.spec.node_name)
            pools.setdefault((js_name, idx), set()).add(node.metadata.labels["cloud.google.com/gke-nodepool"])
            term = pod.status.container_statuses[0].state.terminated
            lifetimes[(js_name, idx, host)] = (pod.status.start_time, term.finished_at)

            env = json.loads(kube.core.read_namespaced_pod_log(m.name, "default").strip().splitlines()[-1])
            assert env["RESLICE_RUN"] == js_name[: -len("-0")]
            assert env["RESLICE_SLICE_INDEX"] == idx == env["MEGASCALE_SLICE_ID"]
            assert env["JOB_COMPLETION_INDEX"] == host
            assert env["RESLICE_RESTART_ATTEMPT"] == "0"
            assert env["RESLICE_NUM_SLICES"] == "2" and env["RESLICE_NUM_PROCESSES"] == str(2 * HOSTS)
            assert env["RESLICE_HOSTS_PER_SLICE"] == str(HOSTS)
            assert env["JAX_PLATFORMS"] == "cpu" and env["JAX_NUM_CPU_DEVICES"] == "8"  # 4 chips x 2
            # A bare hostname: process 0's pod's own address (podenv.AddressMap), its status.podIP.
            assert re.fullmatch(r"127\.\d+\.\d+\.\d+", env["MEGASCALE_COORDINATOR_ADDRESS"])
            if (idx, host) == ("0", "0"):
                assert pod.status.pod_ip == env["MEGASCALE_COORDINATOR_ADDRESS"]
            assert re.fullmatch(r"127\.0\.0\.1:\d+", env["RESLICE_COORDINATOR"])
            coordinators.setdefault(js_name, set()).add(env["RESLICE_COORDINATOR"])
            coordinators.setdefault(js_name, set()).add(env["MEGASCALE_COORDINATOR_ADDRESS"])
        # Every host of every slice ran once, as its own completion index.
        assert {k: sorted(v) for k, v in hosts.items()} == {
            (js, str(i)): [str(h) for h in range(HOSTS)] for js in ("alpha-0", "beta-0") for i in range(2)
        }
        # One coordinator per JobSet, seen alike by its processes; two JobSets never share one.
        assert all(len(v) == 2 for v in coordinators.values())
        assert coordinators["alpha-0"] != coordinators["beta-0"]
        # Exclusive topology: each child Job's hosts in one node pool, and a Job's leader (index 0,
        # the pod with JobSet's anti-affinity) never shares its pool with another Job's running pod:
        # the leader is not scheduled next to one, and none is scheduled next to it (existing pods'
        # anti-affinity). That is all upstream promises. Its scheduler's pod informer holds only
        # non-terminal pods (pkg/scheduler/scheduler.go, newPodInformer:
        # status.phase!=Succeeded,Failed), and followers are created once their leader is scheduled
        # (JobSet's pod webhook), so with pods this short another Job's leader can take the pool
        # between a finished leader and its follower, whose Jobs then overlap in time there.
        # Timestamps are whole seconds, cut the same way: `<=` still holds.
        assert all(len(v) == 1 for v in pools.values())
        for a, b in itertools.permutations(lifetimes, 2):
            if a[2] == "0" and a[:2] != b[:2] and pools[a[:2]] == pools[b[:2]]:
                (a0, a1), (b0, b1) = lifetimes[a], lifetimes[b]
                assert a1 <= b0 or b1 <= a0, (a, b, lifetimes[a], lifetimes[b])
        svc = kube.core.read_namespaced_service("alpha-0", "default")
        assert svc.spec.cluster_ip == "None" and svc.spec.selector == {
            "jobset.sigs.k8s.io/jobset-name": "alpha-0"
        }


def test_unschedulable_slice_stays_pending_with_the_scheduler_message():
    with running("tpu7x-2x2x2:1") as kube:
        kube.create_jobset(rendered("wide", "import time; time.sleep(30)", slices=2))
        pending = wait_for(
            lambda: [
                p
                for p in kube.pods()
                if (c := next((c for c in p.status.conditions or [] if c.type == "PodScheduled"), None))
                and c.status == "False"
            ],
            what="a pending pod",
        )
        # Only the waiting slice's leader: its followers are created once it is bound.
        (pod,) = pending
        assert pod.metadata.labels["batch.kubernetes.io/job-completion-index"] == "0"
        cond = next(c for c in pod.status.conditions if c.type == "PodScheduled")
        # The other slice's leader holds one host of the only pool; exclusive placement (the
        # leader's anti-affinity) keeps this leader off the other host.
        expected = (
            "0/2 nodes are available: 1 Insufficient google.com/tpu, "
            "1 node(s) didn't match pod anti-affinity rules. "
            "preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod."
        )
        assert (pod.status.phase, cond.reason, cond.message) == ("Pending", "Unschedulable", expected)
        ev = wait_for(lambda: kube.events("FailedScheduling"), what="FailedScheduling")
        assert (
            ev[0].type == "Warning"
            and ev[0].message == expected
            and ev[0].involved_object.name == pod.metadata.name
        )
        assert ev[0].source.component == "default-scheduler"
        wait_for(
            lambda: sum(p.status.phase == "Running" for p in kube.pods()) == HOSTS,
            what="the other slice running",
        )
        st = wait_for(
            lambda: (s := kube.jobset("wide-0")["status"]["replicatedJobsStatus"][0])["ready"] == 1 and s
        )
        assert (st["ready"], st["active"]) == (1, 2)  # one Job ready, both active


def test_simulated_jobset_completes_then_ttl_deletes_it():
    with running("tpu7x-4x4x4:2", mode="simulate") as kube:
        js = rendered("sim", "unused", preset="tpu7x-4x4x4", slices=2)
        js["spec"]["ttlSecondsAfterFinished"] = 1
        kube.create_jobset(js)
        wait_for(lambda: sum(p.status.phase == "Running" for p in kube.pods()) == 32, what="32 running pods")
        # Each Job's 16 pods fill one node pool: followers carry their leader's pool as a selector.
        pool_of = {
            n.metadata.name: n.metadata.labels["cloud.google.com/gke-nodepool"]
            for n in kube.core.list_node().items
        }
        by_job: dict[str, set[str]] = {}
        for p in kube.pods():
            by_job.setdefault(p.metadata.labels["job-name"], set()).add(pool_of[p.spec.node_name])
            if p.metadata.labels["batch.kubernetes.io/job-completion-index"] != "0":
                assert p.spec.node_selector["cloud.google.com/gke-nodepool"] == pool_of[p.spec.node_name]
        assert sorted(map(len, by_job.values())) == [1, 1] and len(set.union(*by_job.values())) == 2
        st = wait_for(
            lambda: (
                kube.jobset("sim-0")["status"]["replicatedJobsStatus"][0]["ready"] == 2
                and kube.jobset("sim-0")["status"]
            )
        )
        assert st["replicatedJobsStatus"][0]["active"] == 2
        # A 1 s TTL can delete the JobSet before a poll sees it finished, so read its life from a
        # watch: the Completed state, then the deletion.
        seen: list[tuple[str, str | None]] = []
        stream = watch.Watch()

        def record() -> None:
            for ev in stream.stream(
                kube.custom.list_namespaced_custom_object,
                "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", timeout_seconds=60,
            ):  # fmt: skip
                seen.append((ev["type"], (ev["object"].get("status") or {}).get("terminalState")))
                if ev["type"] == "DELETED":
                    return

        recorder = threading.Thread(target=record, daemon=True)
        recorder.start()
        assert kube.cluster.sim_finish("jobset.sigs.k8s.io/jobset-name=sim-0", 0) == 32
        recorder.join(timeout=30)
        stream.stop()
        assert any(state == "Completed" for _, state in seen) and seen[-1][0] == "DELETED", seen
        assert not kube.custom.list_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", "default", "jobsets"
        )["items"]
        wait_for(
            lambda: not kube.pods() and not kube.batch.list_namespaced_job("default").items,
            what="children collected",
        )


def test_suspend_and_resume():
    with running("tpu7x-2x2x2:2", mode="simulate") as kube:
        js = rendered("sus", "unused")
        js["spec"]["suspend"] = True
        kube.create_jobset(js)
        st = wait_for(lambda: condition(kube.jobset("sus-0"), "Suspended"), what="Suspended")
        assert (st["status"], st["reason"], st["message"]) == ("True", "SuspendedJobs", "jobset is suspended")
        wait_for(lambda: len(kube.batch.list_namespaced_job("default").items) == 2)
        assert all(j.spec.suspend for j in kube.batch.list_namespaced_job("default").items)
        assert kube.pods() == []
        wait_for(lambda: kube.jobset("sus-0")["status"]["replicatedJobsStatus"][0]["suspended"] == 2)
        kube.custom.patch_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", "sus-0", {"spec": {"suspend": False}}
        )
        wait_for(
            lambda: sum(p.status.phase == "Running" for p in kube.pods()) == 2 * HOSTS,
            what="pods after resume",
        )
        st = condition(kube.jobset("sus-0"), "Suspended")
        assert (st["status"], st["reason"]) == ("False", "ResumeJobs")
        assert wait_for(lambda: [e.message for e in kube.events("ResumeJobs")]) == ["jobset is resumed"]


def test_success_policy_any_of_a_target():
    with running("tpu7x-2x2x2:3", mode="simulate") as kube:
        js = rendered("any", "unused", slices=1)
        rj = js["spec"]["replicatedJobs"]
        rj.append(json.loads(json.dumps(rj[0])) | {"name": "workers", "replicas": 2})
        js["spec"]["successPolicy"] = {"operator": "Any", "targetReplicatedJobs": ["workers"]}
        kube.create_jobset(js)
        wait_for(
            lambda: sum(p.status.phase == "Running" for p in kube.pods()) == 3 * HOSTS, what="3 Jobs running"
        )
        kube.cluster.sim_finish("jobset.sigs.k8s.io/replicatedjob-name=slice", 0)  # not a target
        wait_for(lambda: kube.jobset("any-0")["status"]["replicatedJobsStatus"][0]["succeeded"] == 1)
        assert "terminalState" not in kube.jobset("any-0")["status"]
        kube.cluster.sim_finish("jobset.sigs.k8s.io/job-global-index=2", 0)  # workers-1
        assert terminal(kube, "any-0")["status"]["terminalState"] == "Completed"
        # The still-running worker's Job is deleted with the finished JobSet's active Jobs.
        wait_for(
            lambda: (
                [j.metadata.name for j in kube.batch.list_namespaced_job("default").items]
                == ["any-0-slice-0", "any-0-workers-1"]
            )
        )


def test_per_pool_kubelet_mode_and_simulated_run_time():
    from kubernetes import client

    from launcher.embedded.cluster import EmbeddedCluster, NodePoolSpec

    pools = [
        NodePoolSpec("tpu7x-2x2x2", 1, names=("sim-pool",), simulate=True),
        NodePoolSpec("tpu7x-2x2x2", 1),
    ]
    with EmbeddedCluster(pools, mode="process", sim_duration_s=0.3) as cluster:
        api = cluster.api_client()
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        custom.create_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", rendered("mix", "print('real process')")
        )
        wait_for(
            lambda: (
                custom.get_namespaced_custom_object(
                    "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", "mix-0"
                )
                .get("status", {})
                .get("terminalState")
                == "Completed"
            ),
            what="both slices done (one by the timer)",
        )
        logs: dict[str, list[str]] = {}
        for p in core.list_namespaced_pod("default").items:
            pool = core.read_node(p.spec.node_name).metadata.labels["cloud.google.com/gke-nodepool"]
            logs.setdefault(pool, []).append(core.read_namespaced_pod_log(p.metadata.name, "default").strip())
            assert p.status.phase == "Succeeded"
        assert logs == {"sim-pool": [""] * HOSTS, "tpu7x-2x2x2-np-0": ["real process"] * HOSTS}
