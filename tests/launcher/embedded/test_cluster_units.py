"""The cluster half's pure decisions: scheduler filters and messages, pod failure policy, JobSet
failure-policy rule matching, Job status transitions, the kubelet's environment rewrite, node labels."""

import datetime as dt
import inspect
import re
import socket
from collections import Counter
from dataclasses import replace

import pytest

from launcher.adapters.preset_files import make_shape
from launcher.core.errors import UserError
from launcher.core.render import failure_policies, render_jobset
from launcher.core.spec import RunSpec
from launcher.embedded import nodes
from launcher.embedded.admission.defaults import PRIORITY_LABEL
from launcher.embedded.controllers import filters, jobactions, jobfailures, jobpods, jobsetactions
from launcher.embedded.controllers.job import SYNC_BATCH_S, JobController
from launcher.embedded.kubelet import podenv
from launcher.embedded.store.store import RESOURCES
from launcher.embedded.types import objects

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def pool(preset="tpu7x-4x4x4", name="np-a", spot=False):
    return nodes.FakeNodePool(name=name, shape=nodes.load_shape(preset), spot=spot, simulate=True)


def test_node_labels_taints_and_capacity_match_gke():
    n = nodes.node_object(pool("tpu7x-4x4x4"), 3)
    lbl = n["metadata"]["labels"]
    assert lbl["cloud.google.com/gke-tpu-accelerator"] == "tpu7x"
    assert lbl["cloud.google.com/gke-tpu-topology"] == "4x4x4"
    assert lbl["cloud.google.com/gke-nodepool"] == "np-a"
    # A placement policy is the user's own: nodes carry one only when the preset names it.
    assert "cloud.google.com/placement-policy-name" not in lbl
    assert lbl["node.kubernetes.io/instance-type"] == "tpu7x-standard-4t"
    assert lbl["cloud.google.com/machine-family"] == "tpu7x"
    assert lbl["kubernetes.io/hostname"] == n["metadata"]["name"]
    assert "cloud.google.com/gke-spot" not in lbl
    assert n["spec"]["taints"] == [{"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}]
    assert n["status"]["allocatable"]["google.com/tpu"] == "4"
    # What the renderer's pods select is exactly what the node carries.
    assert make_shape("tpu7x-4x4x4").preset.node_selector().items() <= lbl.items()
    named = replace(nodes.load_shape("tpu7x-4x4x4"), placement_policy="tpu7x-128-4x4x4-placement-policy")
    placed = nodes.node_object(nodes.FakeNodePool("np-p", named, spot=False, simulate=True), 0)["metadata"][
        "labels"
    ]
    assert placed["cloud.google.com/placement-policy-name"] == "tpu7x-128-4x4x4-placement-policy"
    assert named.node_selector().items() <= placed.items()
    single = nodes.node_object(pool("tpu7x-2x2x1", spot=True), 0)["metadata"]["labels"]
    assert "cloud.google.com/placement-policy-name" not in single  # single-host pools have none
    assert single["cloud.google.com/gke-spot"] == "true"
    names = pool("tpu7x-8x8x48").node_names
    assert len(set(names)) == 768 and all(len(x) <= 63 for x in names)


def test_nodepool_spec_parsing():
    specs = nodes.parse_nodepools("tpu7x-2x2x1:4, tpu7x-4x4x4:1:spot:sim")
    pools = nodes.expand_pools(specs, simulate=False)
    assert [p.name for p in pools] == [f"tpu7x-2x2x1-np-{i}" for i in range(4)] + ["tpu7x-4x4x4-np-0"]
    assert pools[-1].spot and not pools[0].spot
    assert pools[-1].simulate and not pools[0].simulate
    for bad in ("tpu7x-2x2x1:0", "nope-1x1:2", "tpu7x-2x2x1:two", "tpu7x-2x2x1:vm", ""):
        with pytest.raises(UserError):
            nodes.parse_nodepools(bad)


def test_the_default_cluster_fits_a_two_slice_run():
    from launcher.embedded import cli
    from launcher.embedded.cluster import DEFAULT_NODEPOOLS

    assert inspect.signature(cli.up).parameters["nodepools"].default == DEFAULT_NODEPOOLS
    (spec,) = nodes.parse_nodepools(DEFAULT_NODEPOOLS)
    # GKE multislice needs multi-host slices: make_shape refuses 2 slices of a single-host preset.
    assert spec.count == 2 and make_shape(spec.preset, spec.count).preset.multi_host


def _pod(name, labels=None, sel=None, tpu=4, affinity=None, ns="default"):
    spec = {
        "containers": [{"name": "c", "resources": {"limits": {"google.com/tpu": str(tpu)}}}],
        "tolerations": [{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}],
        "nodeSelector": sel or {},
    }
    if affinity:
        spec["affinity"] = affinity
    return {"metadata": {"name": name, "namespace": ns, "labels": labels or {}}, "spec": spec}


def _view(pools_, bound=None):
    ns = {}
    for p in pools_:
        for i in range(p.shape.hosts):
            n = nodes.node_object(p, i)
            ns[n["metadata"]["name"]] = n
    return filters.ClusterView(nodes=ns, bound=bound or {})


def test_fit_error_has_the_upstream_shape():
    view = _view([pool("tpu7x-2x2x1", "a"), pool("tpu7x-2x2x1", "b"), pool("tpu7x-4x4x4", "c")])
    # a and b are full; c's 16 nodes have the wrong topology.
    for n in list(view.nodes):
        if "-a-" in n or "-b-" in n:
            view.add(_pod(f"x{n}"), n)
    p = _pod("p", sel={"cloud.google.com/gke-tpu-topology": "2x2x1"})
    node, msg = filters.schedule_one(p, view)
    assert node is None
    assert msg == (
        "0/18 nodes are available: 16 node(s) didn't match Pod's node affinity/selector, "
        "2 Insufficient google.com/tpu. preemption: 0/18 nodes are available: "
        "16 Preemption is not helpful for scheduling, 2 No preemption victims found for incoming pod."
    )
    untolerated = _pod("q")
    untolerated["spec"]["tolerations"] = []
    _, msg = filters.schedule_one(untolerated, view)
    assert msg.startswith(
        "0/18 nodes are available: 18 node(s) had untolerated taint {google.com/tpu: present}."
    )


def test_exclusive_placement_keeps_jobs_in_their_own_pool():
    view = _view([pool("tpu7x-2x4x4", "a"), pool("tpu7x-2x4x4", "b")])  # 8 nodes per pool
    topo = "cloud.google.com/gke-nodepool"

    def leader(name, key, priority="0"):
        labels = {objects.JOB_KEY: key, PRIORITY_LABEL: priority}  # the label JobSet's pod webhook sets
        return _pod(name, labels, affinity=jobpods.exclusive_affinity(key, topo, priority), tpu=1)

    leader_a = leader("a0", "ka")
    node, _ = filters.schedule_one(leader_a, view)
    view.add(leader_a, node)
    pool_a = view.domain(node, topo)
    # Job b's leader may not share job a's pool even though a's nodes have free chips.
    leader_b = leader("b0", "kb")
    node_b, _ = filters.schedule_one(leader_b, view)
    assert view.domain(node_b, topo) != pool_a
    view.add(leader_b, node_b)
    # A third job has nowhere to go: both pools are taken.
    node_c, msg = filters.schedule_one(leader("c0", "kc"), view)
    assert node_c is None
    assert "16 node(s) didn't match pod anti-affinity rules" in msg
    # Exclusive placement holds within a priority level only (JobSet v0.12 #1057).
    node_d, _ = filters.schedule_one(leader("d0", "kd", priority="1000"), view)
    assert node_d is not None


def test_jobset_pod_webhook_labels_the_priority():
    from launcher.embedded.admission import defaults

    def created(ann, priority=None):
        pod = {"metadata": {"name": "p", "annotations": ann}, "spec": {"containers": []}}
        if priority is not None:
            pod["spec"]["priority"] = priority
        defaults.on_create(RESOURCES["pods"], pod)
        return pod["metadata"].get("labels") or {}

    assert created({objects.JOBSET_NAME: "js"})[PRIORITY_LABEL] == "0"
    assert created({objects.JOBSET_NAME: "js"}, priority=1000)[PRIORITY_LABEL] == "1000"
    assert PRIORITY_LABEL not in created({})  # not a JobSet's pod
    assert PRIORITY_LABEL not in created({objects.JOBSET_NAME: "js", objects.NODE_SELECTOR_STRATEGY: "true"})


def test_pod_failure_policy_messages_and_rule_indexes():
    policy, _ = failure_policies(RunSpec(run="r", run_dir="/d", global_batch=8))

    def failed(code=None, disrupted=False):
        st = {"phase": "Failed", "conditions": [], "containerStatuses": []}
        if code is not None:
            st["containerStatuses"] = [{"name": "trainer", "state": {"terminated": {"exitCode": code}}}]
        if disrupted:
            st["conditions"].append(
                {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}
            )
        return {"metadata": {"name": "p", "namespace": "ns"}, "status": st}

    assert jobfailures.match_pod_failure_policy(policy, failed(2)) == (
        "FailJob",
        "Container trainer for pod ns/p failed with exit code 2 matching FailJob rule at index 2",
    )
    assert jobfailures.match_pod_failure_policy(policy, failed(42))[1].endswith(
        "exit code 42 matching FailJob rule at index 1"
    )
    # Disruption wins over the exit code (rule 0 is checked first).
    assert jobfailures.match_pod_failure_policy(policy, failed(42, disrupted=True)) == (
        "FailJob",
        "Pod ns/p has condition DisruptionTarget matching FailJob rule at index 0",
    )
    assert jobfailures.match_pod_failure_policy(policy, failed(1)) == (None, None)
    notin = {"rules": [{"action": "Ignore", "onExitCodes": {"operator": "NotIn", "values": [1]}}]}
    assert jobfailures.match_pod_failure_policy(notin, failed(3))[0] == "Ignore"
    assert jobfailures.match_pod_failure_policy(notin, failed(1))[0] is None


def _failed_job(name, reason, message, t="2026-01-01T00:00:00Z"):
    return {
        "metadata": {"name": name, "labels": {objects.RJOB_NAME: "slice"}},
        "status": {
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": t,
                }
            ]
        },
    }


def test_jobset_rules_tell_config_errors_from_preemption_and_crashes():
    _, fp = failure_policies(RunSpec(run="r", run_dir="/d", global_batch=8))
    rules = fp["rules"]
    exit2 = _failed_job(
        "j-0",
        "PodFailurePolicy",
        "Container trainer for pod ns/p failed with exit code 2 matching FailJob rule at index 2",
    )
    exit42 = _failed_job(
        "j-1",
        "PodFailurePolicy",
        "Container trainer for pod ns/p failed with exit code 42 matching FailJob rule at index 1",
    )
    crash = _failed_job("j-2", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
    assert jobsetactions.match_failure_policy(rules, [exit2])[0] == 0
    assert jobsetactions.match_failure_policy(rules, [exit42])[0] == 1
    assert jobsetactions.match_failure_policy(rules, [crash])[0] == 2
    # Rules are tried in order: a config error anywhere fails the JobSet even if a preemption is older.
    early42 = _failed_job(
        "j-1", "PodFailurePolicy", exit42["status"]["conditions"][0]["message"], "2025-01-01T00:00:00Z"
    )
    i, j = jobsetactions.match_failure_policy(rules, [early42, exit2])
    assert (i, j["metadata"]["name"]) == (0, "j-0")
    assert jobsetactions.match_failure_policy([], [crash, exit2]) == (
        None,
        exit2,
    )  # earliest failure, then by name
    early_crash = _failed_job("j-2", "BackoffLimitExceeded", "x", "2025-01-01T00:00:00Z")
    assert jobsetactions.match_failure_policy([], [exit2, early_crash]) == (None, early_crash)


def _js(max_restarts=1):
    js = render_jobset(
        RunSpec(run="r", run_dir="/d", global_batch=32, max_restarts=max_restarts),
        make_shape("tpu7x-2x2x2", 2),
    )
    js["metadata"]["uid"] = "uid-js"
    return js


def test_jobset_restart_counting_and_max_restarts():
    js = _js(max_restarts=1)
    crash = _failed_job("r-0-slice-0", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
    crash["metadata"]["labels"][objects.RESTART_ATTEMPT] = "0"
    plan = jobsetactions.decide(js, [crash], True, NOW)
    st = plan.status
    assert (st["restarts"], st["restartsCountTowardsMax"]) == (1, 1)
    cond = objects.get_condition({"status": st}, "RestartingJobSet")
    assert (
        cond["status"] == "True"
        and cond["reason"] == "FailurePolicy_" + js["spec"]["failurePolicy"]["rules"][2]["name"]
    )
    assert (
        "Warning",
        "RestartJobSetFailurePolicyAction",
        "applying RestartJobSet failure policy action (first failed job: r-0-slice-0)",
    ) in plan.events
    # Next attempt fails too: the count is spent.
    js["status"] = st
    crash["metadata"]["labels"][objects.RESTART_ATTEMPT] = "1"
    plan = jobsetactions.decide(js, [crash], True, NOW)
    failed = objects.get_condition({"status": plan.status}, "Failed")
    assert failed["reason"] == "ReachedMaxRestarts"
    assert (
        failed["message"]
        == "jobset failed due to reaching max number of restarts (first failed job: r-0-slice-0)"
    )
    assert plan.status["terminalState"] == "Failed"
    assert objects.get_condition({"status": plan.status}, "RestartingJobSet")["reason"] == "JobSetFailed"


def test_jobset_child_jobs_labels_and_blocking_recreate():
    js = _js()
    js["status"] = {"restarts": 2}
    plan = jobsetactions.decide(js, [], False, NOW)
    assert [j["metadata"]["name"] for j in plan.create_jobs] == ["r-0-slice-0", "r-0-slice-1"]
    j1 = plan.create_jobs[1]
    lbl = j1["metadata"]["labels"]
    assert (
        lbl[objects.JOB_INDEX] == "1"
        and lbl[objects.JOB_GLOBAL_INDEX] == "1"
        and lbl[objects.RESTART_ATTEMPT] == "2"
    )
    assert lbl[objects.RJOB_REPLICAS] == "2" and lbl[objects.JOBSET_NAME] == "r-0"
    assert re.fullmatch("[0-9a-f]{40}", lbl[objects.JOB_KEY])
    pod_tmpl = j1["spec"]["template"]
    assert pod_tmpl["metadata"]["labels"][objects.JOB_INDEX] == "1"
    assert pod_tmpl["metadata"]["annotations"][objects.EXCLUSIVE_KEY] == "cloud.google.com/gke-nodepool"
    assert pod_tmpl["spec"]["subdomain"] == "r-0"
    assert plan.service["spec"]["clusterIP"] == "None"
    # An old attempt's Job still exists: BlockingRecreate creates nothing and deletes it.
    old = {
        "metadata": {
            "name": "r-0-slice-0",
            "labels": {objects.RESTART_ATTEMPT: "1", objects.RJOB_NAME: "slice"},
        }
    }
    plan = jobsetactions.decide(js, [old], True, NOW)
    assert plan.create_jobs == [] and plan.delete_jobs == ["r-0-slice-0"]


def _indexed_job(completions=2, policy=None, backoff=0):
    return {
        "metadata": {"name": "j", "namespace": "ns", "uid": "u1", "labels": {}},
        "spec": {
            "completions": completions,
            "parallelism": completions,
            "completionMode": "Indexed",
            "backoffLimit": backoff,
            "podFailurePolicy": policy,
            "template": {"metadata": {}, "spec": {"containers": [{"name": "trainer"}], "subdomain": "s"}},
        },
        "status": {},
    }


def test_job_creates_indexed_pods_and_fails_only_after_pods_are_gone():
    policy, _ = failure_policies(RunSpec(run="r", run_dir="/d", global_batch=8))
    job = _indexed_job(policy=policy)
    plan = jobactions.decide(job, [], {}, None, NOW)
    p1 = plan.create[1]
    assert p1["metadata"]["generateName"] == "j-1-" and p1["spec"]["hostname"] == "j-1"
    assert (
        p1["metadata"]["annotations"][objects.COMPLETION_INDEX]
        == "1"
        == p1["metadata"]["labels"][objects.COMPLETION_INDEX]
    )
    assert p1["metadata"]["finalizers"] == ["batch.kubernetes.io/job-tracking"]
    env = p1["spec"]["containers"][0]["env"]
    assert (
        env[-1]["valueFrom"]["fieldRef"]["fieldPath"]
        == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    dead = {
        "metadata": {
            "name": "j-0-abcde",
            "namespace": "ns",
            "uid": "p0",
            "annotations": {objects.COMPLETION_INDEX: "0"},
        },
        "status": {
            "phase": "Failed",
            "containerStatuses": [{"name": "trainer", "state": {"terminated": {"exitCode": 2}}}],
        },
    }
    alive = {
        "metadata": {
            "name": "j-1-fghij",
            "namespace": "ns",
            "uid": "p1",
            "annotations": {objects.COMPLETION_INDEX: "1"},
        },
        "status": {"phase": "Running"},
    }
    plan = jobactions.decide(job, [dead, alive], {}, None, NOW)
    conds = {c["type"]: c for c in plan.status["conditions"]}
    assert conds["FailureTarget"]["reason"] == "PodFailurePolicy" and "Failed" not in conds
    assert plan.delete == ["j-1-fghij"] and plan.create == []
    job["status"] = plan.status
    alive["status"]["phase"] = "Failed"  # terminated by the deletion
    plan = jobactions.decide(job, [dead, alive], {}, None, NOW)
    failed = objects.get_condition({"status": plan.status}, "Failed")
    assert (
        failed["message"]
        == "Container trainer for pod ns/j-0-abcde failed with exit code 2 matching FailJob rule at index 2"
    )
    assert ("Warning", "PodFailurePolicy", failed["message"]) in plan.events


def test_job_followers_wait_for_the_leaders_domain():
    job = _indexed_job(completions=3)
    job["spec"]["template"]["metadata"] = {
        "annotations": {objects.EXCLUSIVE_KEY: "cloud.google.com/gke-nodepool"},
        "labels": {objects.JOB_KEY: "k"},
    }
    plan = jobactions.decide(job, [], {}, None, NOW)
    assert [p["metadata"]["generateName"] for p in plan.create] == ["j-0-"]
    assert plan.create[0]["spec"]["affinity"]["podAntiAffinity"]
    leader = {
        "metadata": {"name": "j-0-x", "uid": "p0", "annotations": {objects.COMPLETION_INDEX: "0"}},
        "spec": {"nodeName": "n"},
        "status": {"phase": "Running"},
    }
    plan = jobactions.decide(job, [leader], {}, "pool-7", NOW)
    assert [p["spec"]["nodeSelector"] for p in plan.create] == [
        {"cloud.google.com/gke-nodepool": "pool-7"}
    ] * 2


def test_followers_follow_a_leader_that_already_finished():
    # JobSet's pod webhook admits followers once the leader pod has a node, whatever its phase: a
    # leader that exits before its followers exist must not leave them uncreated.
    def leader(phase, node, deleting=False):
        meta = {"name": f"j-0-{node}", "annotations": {objects.COMPLETION_INDEX: "0"}}
        if deleting:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return {"metadata": meta, "spec": {"nodeName": node}, "status": {"phase": phase}}

    follower = {"metadata": {"annotations": {objects.COMPLETION_INDEX: "1"}}, "spec": {"nodeName": "f"}}
    assert jobpods.leader_node([leader("Succeeded", "done")]) == "done"
    assert jobpods.leader_node([leader("Running", "going", deleting=True)]) == "going"
    assert jobpods.leader_node([leader("Failed", "old"), leader("Running", "new")]) == "new"
    assert (
        jobpods.leader_node([{"metadata": {"annotations": {objects.COMPLETION_INDEX: "0"}}, "spec": {}}])
        is None
    )
    assert jobpods.leader_node([follower]) is None


def test_hostname_rewrite_and_expansion():
    js = {
        "metadata": {"name": "run-0", "uid": "u"},
        "spec": {"replicatedJobs": [{"name": "slice"}], "network": {"subdomain": "run-0"}},
    }
    pat = podenv.hostname_pattern(js)
    ports, addresses = podenv.PortMap(), podenv.AddressMap()
    rw = lambda v: podenv.rewrite_hosts(  # noqa: E731
        v, pat, lambda p: ports.get("u", "0", p), lambda h: addresses.get("u", "0", h)
    )
    a = rw("run-0-slice-0-0.run-0:8476")
    assert re.fullmatch(r"127\.0\.0\.1:\d+", a) and a != "127.0.0.1:8476"
    assert rw("run-0-slice-0-0.run-0.default.svc.cluster.local:8476") == a  # same (uid, attempt, port)
    # A bare hostname is that pod's own loopback address (MaxText appends its fixed port 1234):
    # the same for every name of the pod, another for another pod, attempt or JobSet.
    host = rw("run-0-slice-1-3")
    assert re.fullmatch(r"127\.\d+\.\d+\.\d+", host) and not host.startswith("127.0.0.")
    assert rw("run-0-slice-1-3.run-0") == host == addresses.get("u", "0", "run-0-slice-1-3")
    others = {
        rw("run-0-slice-0-0"),
        addresses.get("u", "1", "run-0-slice-1-3"),
        addresses.get("v", "0", "run-0-slice-1-3"),
    }
    assert host not in others and len(others) == 3
    with socket.socket() as s:  # bindable as it is: all of 127/8 is loopback
        s.bind((host, 0))
    assert rw("other-0-slice-0-0.run-0:8476") == "other-0-slice-0-0.run-0:8476"  # not this JobSet's
    assert ports.get("u", "1", 8476) != ports.get("u", "0", 8476)  # a new attempt, a new port
    assert podenv.expand("$(A)-$(B)-$$(A)", {"A": "x"}) == "x-$(B)-$(A)"
    pod = {
        "metadata": {"name": "p", "namespace": "n", "labels": {"k": "v"}, "annotations": {"a": "b"}},
        "spec": {"nodeName": "nd"},
    }
    assert [
        podenv.field_value(pod, f)
        for f in ("metadata.labels['k']", "metadata.annotations['a']", "spec.nodeName", "status.podIP")
    ] == ["v", "b", "nd", "127.0.0.1"]
    assert podenv.field_value(pod, "status.podIP", host) == host
    env = podenv.local_env(
        {"X": "run-0-slice-0-0:1"}, {"PATH": "/bin"}, chips=4, devices_per_chip=2, hostname="h", rewrite=rw
    )
    assert env["PATH"] == "/bin" and env["JAX_PLATFORMS"] == "cpu" and env["JAX_NUM_CPU_DEVICES"] == "8"
    assert env["X"].startswith("127.0.0.1:")
    simulated = "--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_use_fusion_emitters=false"
    simulated += " --xla_backend_optimization_level=1"
    assert env["XLA_FLAGS"] == simulated and env["OPENBLAS_NUM_THREADS"] == "1"
    # The user's own XLA flags are kept, a YNN setting of theirs too.
    mine = {"XLA_FLAGS": "--xla_dump_to=/d", "OPENBLAS_NUM_THREADS": "2"}
    env = podenv.local_env({}, mine, chips=4, devices_per_chip=2, hostname="h", rewrite=None)
    assert env["XLA_FLAGS"] == f"--xla_dump_to=/d {simulated}" and env["OPENBLAS_NUM_THREADS"] == "2"
    mine = "--xla_cpu_experimental_ynn_fusion_type=individual_dot --xla_backend_optimization_level=3"
    assert (
        podenv.simulated_host({"XLA_FLAGS": mine})["XLA_FLAGS"]
        == f"{mine} --xla_cpu_use_fusion_emitters=false"
    )


def test_fit_error_counts_each_node_once_per_reason():
    msg = filters.fit_error(3, Counter({"Insufficient google.com/tpu": 3}))
    assert msg == (
        "0/3 nodes are available: 3 Insufficient google.com/tpu. "
        "preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod."
    )


def test_jobset_without_failure_policy_fails_on_the_first_failed_job():
    js = _js()
    del js["spec"]["failurePolicy"]
    crash = _failed_job("r-0-slice-1", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
    crash["metadata"]["labels"][objects.RESTART_ATTEMPT] = "0"
    plan = jobsetactions.decide(js, [crash], True, NOW)
    failed = objects.get_condition({"status": plan.status}, "Failed")
    assert (failed["reason"], failed["message"]) == (
        "FailedJobs",
        "jobset failed due to one or more job failures (first failed job: r-0-slice-1)",
    )
    assert plan.status["restarts"] == 0 and plan.create_jobs == []


def test_finished_pods_of_a_deleted_job_lose_their_tracking_finalizer():
    # A pod failed and was deleted while its Job existed, but the Job was deleted before the Job
    # controller got to it: no more events will come for that pod, so the Job's own deletion must
    # release it (found at 1,024 pods: a shrink waited forever for such pods to go).
    from launcher.embedded.controllers.jobpods import TRACKING_FINALIZER
    from launcher.embedded.store.store import RESOURCES, Store

    store = Store()
    pods = RESOURCES["pods"]
    body = {
        "metadata": {
            "name": "p",
            "labels": {"batch.kubernetes.io/controller-uid": "job-uid"},
            "finalizers": [TRACKING_FINALIZER],
        },
        "spec": {"nodeName": "gone-node", "containers": [{"name": "c", "image": "i"}]},
    }
    store.create(pods, body, "default")
    pod = store.get(pods, "default", "p")
    pod["status"] = {"phase": "Failed"}
    store.update(pods, pod, subresource="status")
    store.delete(pods, "default", "p", grace_period_seconds=0)  # held by the finalizer
    assert store.get(pods, "default", "p")["metadata"]["deletionTimestamp"]
    jobs = JobController(store)
    job = {"metadata": {"name": "j", "namespace": "default", "uid": "job-uid"}}
    keys = jobs.keys_for("DELETED", RESOURCES["jobs"], job)
    assert keys == [("orphans", "default", "job-uid")]
    jobs.reconcile(keys[0])
    with pytest.raises(Exception, match="not found"):
        store.get(pods, "default", "p")


def test_a_burst_of_pod_events_costs_one_job_sync_and_a_spec_change_syncs_at_once():
    # Upstream's Job controller batches pod events (syncJobBatchPeriod, 1 s): 768 pods starting
    # must not mean thousands of syncs, each re-reading every pod of the Job.
    import threading

    from launcher.embedded.store.store import RESOURCES, Store
    from tests.support.fakeclock import FakeClock
    from tests.support.wait import wait_for

    clock = FakeClock()
    synced: list[tuple[object, float]] = []
    done = threading.Event()

    class Counting(JobController):
        def reconcile(self, key):
            synced.append((key, clock.monotonic()))
            done.set()
            return None

    ctl = Counting(Store(), clock=clock)
    ctl._job_keys["job-uid"] = ("default", "j")
    pod = {"metadata": {"name": "p", "namespace": "default", "ownerReferences": [
        {"uid": "job-uid", "controller": True, "kind": "Job", "apiVersion": "batch/v1", "name": "j"}]}}  # fmt: skip
    job = {"metadata": {"name": "j", "namespace": "default", "uid": "job-uid", "generation": 1}}
    ctl.start()
    try:
        t0 = clock.monotonic()
        for _ in range(200):
            ctl._on_event("MODIFIED", RESOURCES["pods"], pod)
        ctl._on_event("ADDED", RESOURCES["jobs"], job)  # a new Job: now
        assert done.wait(10) and synced[0][1] == t0
        clock.wait_for_waiter()  # the worker waits for the batch to fall due
        clock.step(SYNC_BATCH_S - 0.1)
        clock.wait_for_waiter()
        assert len(synced) == 1  # the batch is not due yet
        clock.step(0.1)
        wait_for(lambda: len(synced) == 2, timeout=10, what="the batched sync", interval=0.01)
        clock.wait_for_waiter()
        assert [k for k, _ in synced] == [("job", "default", "j")] * 2  # 200 pod events: one sync
        assert synced[1][1] - t0 >= SYNC_BATCH_S
        ctl._on_event("MODIFIED", RESOURCES["jobs"], job)  # status only: batched
        ctl._on_event("MODIFIED", RESOURCES["jobs"], {"metadata": {**job["metadata"], "generation": 2}})
        wait_for(lambda: len(synced) == 3, timeout=10, what="the spec change's sync", interval=0.01)
        assert synced[2][1] == synced[1][1]  # the spec change did not wait for the batch
        assert not ctl.idle()  # a batched sync is still due
        clock.wait_for_waiter()
        clock.step(SYNC_BATCH_S)
        wait_for(lambda: len(synced) == 4 and ctl.idle(), timeout=10, what="the second batch", interval=0.01)
        assert synced[3][1] - synced[2][1] == SYNC_BATCH_S
    finally:
        ctl.stop()


def test_taint_eviction_marks_a_pod_someone_else_is_deleting_once():
    from launcher.embedded.controllers import nodelife

    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    node = {"spec": {"taints": [{"key": "x", "effect": "NoExecute", "timeAdded": "2026-01-01T00:00:00Z"}]}}

    def pod(name, deleting=False, marked=False, phase="Running"):
        meta = {"name": name, "namespace": "d"} | ({"deletionTimestamp": "t"} if deleting else {})
        conds = [{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}]
        return {
            "metadata": meta,
            "spec": {},
            "status": {"phase": phase, "conditions": conds if marked else []},
        }

    pods = [
        pod("live"),
        pod("terminating", deleting=True),  # a JobSet restart deleted it first: upstream still marks it
        pod("marked", deleting=True, marked=True),  # already done by the taint manager
        pod("done", phase="Failed"),
    ]
    assert [n for _, n, _ in nodelife.evictions(node, pods, now)] == ["live", "terminating"]


def test_default_toleration_seconds_follow_the_clusters_setting():
    from launcher.embedded.admission import defaults

    def tolerations(toleration_s=None, own=()):
        pod = {"metadata": {"name": "p"}, "spec": {"containers": [], "tolerations": list(own)}}
        kw = {} if toleration_s is None else {"toleration_s": toleration_s}
        defaults.on_create(RESOURCES["pods"], pod, **kw)
        return {t["key"]: t.get("tolerationSeconds") for t in pod["spec"]["tolerations"]}

    unreachable, not_ready = "node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"
    assert tolerations() == {not_ready: 300, unreachable: 300}  # kube-apiserver's default
    assert tolerations(1) == {not_ready: 1, unreachable: 1}
    own = [{"key": unreachable, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 7}]
    assert tolerations(1, own) == {unreachable: 7, not_ready: 1}  # a pod's own toleration stays
