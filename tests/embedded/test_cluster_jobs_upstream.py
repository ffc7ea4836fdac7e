"""Jobs and JobSets as upstream, through the official client (simulate mode): JobSet dependsOn,
backoffLimitPerIndex with maxFailedIndexes and the FailIndex action, restartPolicy OnFailure."""

import copy

from tests.embedded.cluster_helpers import HOSTS, condition, rendered, running
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
