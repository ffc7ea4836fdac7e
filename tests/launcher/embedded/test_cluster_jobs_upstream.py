"""Jobs and JobSets as upstream, through the official client (simulate mode): JobSet dependsOn,
backoffLimitPerIndex with maxFailedIndexes and the FailIndex action, restartPolicy OnFailure."""

import copy

from launcher.core import rfc3339
from tests.launcher.embedded.cluster_helpers import HOSTS, condition, rendered, running
from tests.support.wait import wait_for

RJOB = "jobset.sigs.k8s.io/replicatedjob-name"


def _running(kube, selector, n=HOSTS):
    return wait_for(
        lambda: len(r := [p for p in kube.pods(selector) if p.status.phase == "Running"]) == n and r,
        what=f"{selector} running",
    )


def test_depends_on_complete_creates_the_replicated_job_once_the_first_succeeded():
    with running("tpu7x-2x2x2:2", mode="simulate") as kube:
        js = rendered("do", "unused", slices=1)
        rj = js["spec"]["replicatedJobs"]
        rj.append(
            copy.deepcopy(rj[0]) | {"name": "after", "dependsOn": [{"name": "slice", "status": "Complete"}]}
        )
        js["spec"]["successPolicy"] = {"operator": "All"}
        kube.create_jobset(js)
        _running(kube, f"{RJOB}=slice")
        wait_for(lambda: kube.jobset("do-0")["status"]["replicatedJobsStatus"][0]["ready"] == 1, what="ready")
        kube.cluster.settle()
        # Ready is not Complete: the dependent replicated Job is not created yet.
        assert [j.metadata.name for j in kube.batch.list_namespaced_job("default").items] == ["do-0-slice-0"]
        assert kube.cluster.sim_finish(f"{RJOB}=slice", 0) == HOSTS
        _running(kube, f"{RJOB}=after")
        kube.cluster.sim_finish(f"{RJOB}=after", 0)
        done = wait_for(lambda: condition(kube.jobset("do-0"), "Completed"), what="completed")
        assert done["status"] == "True"


def _indexed_job(name, **spec):
    tolerate = [{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed",
            "completions": 3,
            "parallelism": 3,
            **spec,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "tolerations": tolerate,
                    "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "60"]}],
                }
            },
        },
    }


def _index(n):
    return f"batch.kubernetes.io/job-completion-index={n}"


def test_job_controller_per_index_limits_and_on_failure_restarts():
    """One cluster for both (a cluster start costs more than either check)."""
    with running("tpu7x-2x2x2:1", mode="simulate") as kube:
        _backoff_limit_per_index_fail_index_and_max_failed_indexes(kube)
        _restart_policy_on_failure_restarts_in_place_and_counts_against_backoff_limit(kube)


def _backoff_limit_per_index_fail_index_and_max_failed_indexes(kube):
    rules = [{"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [42]}}]
    job = _indexed_job("pi", backoffLimitPerIndex=0, maxFailedIndexes=1, podFailurePolicy={"rules": rules})
    kube.batch.create_namespaced_job("default", job)
    _running(kube, "job-name=pi", 3)
    pods = kube.pods("job-name=pi")
    assert {p.metadata.annotations["batch.kubernetes.io/job-index-failure-count"] for p in pods} == {"0"}
    read = lambda: kube.batch.read_namespaced_job("pi", "default")  # noqa: E731
    assert read().spec.backoff_limit == 2**31 - 1  # defaulted so only the per-index limit applies
    kube.cluster.sim_finish(_index(0), 42)  # FailIndex: index 0 is failed, not retried
    wait_for(lambda: read().status.failed_indexes == "0", what="index 0 failed")
    kube.cluster.sim_finish(_index(2), 0)
    wait_for(lambda: read().status.completed_indexes == "2", what="index 2 done")
    kube.cluster.settle()
    assert len(kube.pods(_index(0))) == 1 and read().status.active == 1
    assert not [c for c in read().status.conditions or [] if c.type == "FailureTarget"]
    kube.cluster.sim_finish(_index(1), 1)  # a counted failure at backoffLimitPerIndex 0
    failed = wait_for(
        lambda: next((c for c in read().status.conditions or [] if c.type == "Failed"), None),
        what="Failed",
    )
    assert (failed.reason, failed.message) == (
        "MaxFailedIndexesExceeded",
        "Job has exceeded the specified maximal number of failed indexes",
    )
    st = read().status
    assert (st.failed_indexes, st.failed, st.succeeded) == ("0,1", 2, 1)


def test_a_retried_index_carries_its_failure_count_and_all_indexes_finished_is_failed_indexes():
    import datetime as dt

    from launcher.embedded.controllers import jobactions
    from launcher.embedded.controllers.jobfailures import INDEX_FAILURE_COUNT
    from launcher.embedded.types import objects

    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    spec = _indexed_job("r", backoffLimitPerIndex=1)["spec"] | {"completions": 2, "parallelism": 2}
    js = {"metadata": {"name": "r", "namespace": "default", "uid": "u"}, "spec": spec, "status": {}}

    def pod(uid, index, phase, count, ago_s):
        end = rfc3339.stamp(now - dt.timedelta(seconds=ago_s))
        return {
            "metadata": {
                "uid": uid,
                "name": f"r-{index}-{uid}",
                "annotations": {objects.COMPLETION_INDEX: str(index), INDEX_FAILURE_COUNT: str(count)},
            },
            "status": {
                "phase": phase,
                "containerStatuses": [
                    {"name": "c", "state": {"terminated": {"exitCode": 1, "finishedAt": end}}}
                ],
            },
        }

    first, done = pod("a", 0, "Failed", 0, 5), pod("b", 1, "Succeeded", 0, 5)
    plan = jobactions.decide(js, [first, done], {}, None, now)
    assert plan.create == [] and 4 < plan.requeue_after <= 5  # the index's own 10 s backoff
    plan = jobactions.decide(js, [first, done], {}, None, now + dt.timedelta(seconds=5))
    [new] = plan.create
    assert new["metadata"]["annotations"][INDEX_FAILURE_COUNT] == "1"
    assert plan.status["failedIndexes"] == ""
    # The retry fails too (count 1 == the limit): the index is failed; with index 1 done, the Job is.
    js["status"] = {"completedIndexes": "1"}
    plan = jobactions.decide(js, [first, pod("c", 0, "Failed", 1, 1)], {}, None, now)
    assert plan.status["failedIndexes"] == "0" and plan.create == []
    target = next(c for c in plan.status["conditions"] if c["type"] == "FailureTarget")
    assert (target["reason"], target["message"]) == ("FailedIndexes", "Job has failed indexes")


def test_restarting_jobset_condition_takes_each_terminal_reason():
    import datetime as dt

    from launcher.embedded.controllers import jobsetactions
    from launcher.embedded.controllers.jobsetjobs import construct_job
    from launcher.embedded.types import objects

    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    js = rendered("rs", "unused")
    js["metadata"] |= {"uid": "u", "namespace": "default"}
    rjob = js["spec"]["replicatedJobs"][0]

    def jobs(**status):
        out = []
        for i in range(2):
            j = construct_job(js, rjob, i)
            j["metadata"]["ownerReferences"][0]["uid"] = "u"
            j["status"] = dict(status)
            out.append(j)
        return out

    def restarting(plan):
        c = objects.get_condition({"status": plan.status}, "RestartingJobSet")
        return c and (c["status"], c["reason"], c["message"])

    # Never added by a terminal reason: only a restart creates it.
    assert restarting(jobsetactions.decide(js, jobs(ready=HOSTS), True, now)) is None
    js["status"] = {
        "conditions": [{"type": "RestartingJobSet", "status": "True", "reason": "DefaultFailurePolicy"}]
    }
    plan = jobsetactions.decide(js, jobs(ready=HOSTS), True, now)
    assert restarting(plan) == ("False", "JobsReady", "all jobs are ready")
    assert ("Normal", "JobsReady", "all jobs are ready") in plan.events
    js["spec"]["suspend"] = True  # a False one still takes the next reason
    js["status"] = plan.status
    assert restarting(jobsetactions.decide(js, jobs(ready=HOSTS), True, now)) == (
        "False",
        "JobSetSuspended",
        "jobset is suspended",
    )
    js["spec"]["suspend"] = False
    done = jobs(succeeded=HOSTS, conditions=[{"type": "Complete", "status": "True"}])
    assert restarting(jobsetactions.decide(js, done, True, now)) == (
        "False",
        "JobSetCompleted",
        "jobset completed successfully",
    )


def _restart_policy_on_failure_restarts_in_place_and_counts_against_backoff_limit(kube):
    for name, limit in (("oa", 3), ("ob", 1)):
        job = _indexed_job(name, completions=1, parallelism=1, backoffLimit=limit)
        job["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
        kube.batch.create_namespaced_job("default", job)
    [first] = _running(kube, "job-name=oa", 1)
    _running(kube, "job-name=ob", 1)
    kube.cluster.sim_finish("job-name=oa", 1)
    cs = wait_for(
        lambda: (p := kube.pods("job-name=oa")[0]).status.container_statuses[0].restart_count == 1 and p,
        what="restarted",
    )
    # The same pod, running again; the exit is its container's lastState.
    assert cs.metadata.uid == first.metadata.uid and cs.status.phase == "Running"
    status = cs.status.container_statuses[0]
    assert status.state.running and status.last_state.terminated.exit_code == 1
    kube.cluster.sim_finish("job-name=ob", 1)  # one restart reaches backoffLimit 1
    read = lambda: kube.batch.read_namespaced_job("ob", "default")  # noqa: E731
    failed = wait_for(
        lambda: next((c for c in read().status.conditions or [] if c.type == "Failed"), None),
        what="Failed",
    )
    assert (failed.reason, failed.message) == (
        "BackoffLimitExceeded",
        "Job has reached the specified backoff limit",
    )
    kube.cluster.settle()
    oa = kube.batch.read_namespaced_job("oa", "default").status
    assert oa.active == 1 and not oa.failed and not oa.conditions
    created = [e for e in kube.events("SuccessfulCreate") if e.involved_object.kind == "Job"]
    assert sorted(e.involved_object.name for e in created if e.involved_object.name in ("oa", "ob")) == [
        "oa",
        "ob",
    ]  # no replacement pods
