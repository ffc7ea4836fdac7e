"""One reconcile of one JobSet, decided without I/O: `decide` (jobset, its child Jobs, whether its
Service exists, now) → `JobSetActions`, in upstream's order: replicated-job statuses; a finished
JobSet deletes its active Jobs and honours ttlSecondsAfterFinished; Jobs of earlier restart
attempts are deleted (foreground, so a Job disappears only after its pods); a failed Job runs the
failure policy; succeeded Jobs run the success policy; missing Jobs are created (not while old ones
remain under BlockingRecreate, nor before the replicated Jobs they depend on are Ready/Complete);
suspend/resume. Condition reasons, messages and events are upstream's (sigs.k8s.io/jobset/pkg/constants).

Pure. Called by `jobset.JobSetController`, which reads the state and applies the actions.
"""

from __future__ import annotations

import copy
import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from launcher.core import rfc3339
from launcher.embedded.controllers.jobsetjobs import (
    classify,
    construct_job,
    dns_hostnames,
    job_failure,
    job_name,
    replicated_jobs_status,
    subdomain,
)
from launcher.embedded.types import objects

# Reasons and messages (sigs.k8s.io/jobset/pkg/constants).
REACHED_MAX_RESTARTS = ("ReachedMaxRestarts", "jobset failed due to reaching max number of restarts")
FAILED_JOBS = ("FailedJobs", "jobset failed due to one or more job failures")
FAIL_JOBSET_ACTION = ("FailJobSetFailurePolicyAction", "applying FailJobSet failure policy action")
RESTART_ACTION = ("RestartJobSetFailurePolicyAction", "applying RestartJobSet failure policy action")
RESTART_IGNORE_ACTION = (
    "RestartJobSetAndIgnoreMaxRestartsFailurePolicyAction",
    "applying RestartJobSetAndIgnoreMaxRestarts failure policy action",
)
COMPLETED = ("AllJobsCompleted", "jobset completed successfully")
SUSPENDED = ("SuspendedJobs", "jobset is suspended")
RESUMED = ("ResumeJobs", "jobset is resumed")
RESTARTING = "RestartingJobSet"
# RestartingJobSet=False reasons and messages (pkg/constants, setRestartingConditionFalse callers).
RESTART_JOBS_READY = ("JobsReady", "all jobs are ready")
RESTART_JOBSET_FAILED = ("JobSetFailed", "jobset failed")
RESTART_JOBSET_COMPLETED = "JobSetCompleted"  # message: "jobset completed successfully"
RESTART_JOBSET_SUSPENDED = "JobSetSuspended"  # message: "jobset is suspended"
# (type, reason, message) of the InOrder startup policy's conditions (pkg/constants, startup_policy.go).
STARTUP_IN_PROGRESS = (
    "StartupPolicyInProgress",
    "InOrderStartupPolicyInProgress",
    "in order startup policy is in progress",
)
STARTUP_COMPLETED = (
    "StartupPolicyCompleted",
    "InOrderStartupPolicyCompleted",
    "in order startup policy has completed",
)


@dataclass
class JobSetActions:
    """What one reconcile of a JobSet does to its child Jobs, its Service, its status and itself."""

    create_jobs: list[dict[str, Any]] = field(default_factory=list)
    delete_jobs: list[str] = field(default_factory=list)  # foreground
    suspend_jobs: dict[str, bool] = field(default_factory=dict)  # job name → spec.suspend
    # job name → the pod template fields a resume merges in from its replicated Job's template
    # (what Kueue may have changed while the JobSet was suspended: `resumed_template`)
    resume_templates: dict[str, dict[str, Any]] = field(default_factory=dict)
    service: dict[str, Any] | None = None
    status: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    delete_jobset: bool = False
    requeue_after: float | None = None


def first_failed(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    return min(
        jobs, key=lambda j: ((job_failure(j) or {}).get("lastTransitionTime") or "", objects.meta(j)["name"])
    )


def rule_applies(rule: Mapping[str, Any], job: Mapping[str, Any]) -> bool:
    cond = job_failure(job) or {}
    reasons = rule.get("onJobFailureReasons") or []
    if reasons and cond.get("reason") not in reasons:
        return False
    patterns = rule.get("onJobFailureMessagePatterns") or []
    if patterns and not any(re.search(p, cond.get("message") or "") for p in patterns):
        return False
    targets = rule.get("targetReplicatedJobs") or []
    return not targets or objects.labels(job).get(objects.RJOB_NAME) in targets


def match_failure_policy(
    rules: list[Mapping[str, Any]], failed: list[dict[str, Any]]
) -> tuple[int | None, dict[str, Any]]:
    """(index of the first rule any failed Job matches, the earliest-failed such Job); rules are
    tried in order. (None, earliest failed Job) when no rule matches."""
    for i, rule in enumerate(rules):
        matched = [j for j in failed if rule_applies(rule, j)]
        if matched:
            return i, first_failed(matched)
    return None, first_failed(failed)


def dependencies_reached(
    rjob: Mapping[str, Any], replicas_of: Mapping[str, int], stats: Mapping[str, Mapping[str, int]]
) -> bool:
    """Upstream dependencyReachedStatus (pkg/controllers/depends_on.go): every replicated Job this one
    depends on has all its Jobs succeeded (Complete) or ready, failed or succeeded (Ready). Only
    earlier replicated Jobs count (the webhook rejects a later one)."""
    for dep in rjob.get("dependsOn") or []:
        st, want = stats.get(dep.get("name", "")), replicas_of.get(dep.get("name", ""))
        if st is None:
            return False
        if dep.get("status") == "Complete" and want != st.get("succeeded", 0):
            return False
        reached = st.get("ready", 0) + st.get("failed", 0) + st.get("succeeded", 0)
        if dep.get("status") == "Ready" and want != reached:
            return False
    return True


def _msg(base: str, job: Mapping[str, Any]) -> str:
    return f"{base} (first failed job: {objects.meta(job)['name']})"


def set_startup(
    conds: list[dict[str, Any]], cond: tuple[str, str, str], when: str, todo: JobSetActions
) -> None:
    """Upstream updateCondition for the two exclusive startup conditions: a True one flips the other
    True one to False (status only); an event when anything changed."""
    ctype, reason, msg = cond
    other = STARTUP_COMPLETED[0] if ctype == STARTUP_IN_PROGRESS[0] else STARTUP_IN_PROGRESS[0]
    changed = False
    for c in conds:
        if c.get("type") == other and c.get("status") == "True":
            c["status"] = "False"
            changed = True
    if objects.set_condition(conds, ctype, "True", reason, msg, when) or changed:
        todo.events.append(("Normal", reason, msg))


def _finished(js: Mapping[str, Any]) -> dict[str, Any] | None:
    for c in (js.get("status") or {}).get("conditions") or []:
        if c.get("type") in ("Completed", "Failed") and c.get("status") == "True":
            return c
    return None


def decide(
    js: Mapping[str, Any], jobs: list[dict[str, Any]], service_exists: bool, now: dt.datetime
) -> JobSetActions:
    spec = js.get("spec") or {}
    status = copy.deepcopy(dict(js.get("status") or {}))
    status.setdefault("restarts", 0)
    conds: list[dict[str, Any]] = status.setdefault("conditions", [])
    when = rfc3339.stamp(now)
    todo = JobSetActions(status=status)
    children = classify(js, jobs)
    status["replicatedJobsStatus"] = replicated_jobs_status(js, children)

    def set_cond(ctype: str, st: str, reason: str, msg: str, etype: str | None) -> None:
        if objects.set_condition(conds, ctype, st, reason, msg, when) and etype:
            todo.events.append((etype, reason, msg))

    def restarting_false(reason: str, msg: str) -> None:
        # setRestartingConditionFalse: never added, but an existing one (True or False) takes the
        # new terminal reason and message, with a Normal event when it changed.
        if objects.get_condition({"status": status}, RESTARTING) is not None:
            set_cond(RESTARTING, "False", reason, msg, "Normal")

    def fail(reason: str, msg: str) -> None:
        set_cond("Failed", "True", reason, msg, "Warning")
        status["terminalState"] = "Failed"
        restarting_false(*RESTART_JOBSET_FAILED)

    done = _finished({"status": status})
    if done is not None:
        todo.delete_jobs = [objects.meta(j)["name"] for j in children.active if not objects.pod_deleting(j)]
        ttl = spec.get("ttlSecondsAfterFinished")
        if ttl is not None:
            at = rfc3339.parse(done.get("lastTransitionTime"))
            left = int(ttl) - ((now - at).total_seconds() if at else 0)
            if left <= 0:
                todo.delete_jobset = True
            else:
                todo.requeue_after = left
        return todo

    todo.delete_jobs = [objects.meta(j)["name"] for j in children.previous if not objects.pod_deleting(j)]
    total = sum(int(r.get("replicas", 1)) for r in spec.get("replicatedJobs") or [])
    ready = sum(s["ready"] + s["succeeded"] for s in status["replicatedJobsStatus"])
    if not spec.get("suspend") and ready == total:  # allJobsReady, before the failure policy
        restarting_false(*RESTART_JOBS_READY)

    if children.failed:
        fp = spec.get("failurePolicy")
        if fp is None:
            fail(FAILED_JOBS[0], _msg(FAILED_JOBS[1], first_failed(children.failed)))
            return todo
        rules = fp.get("rules") or []
        i, job = match_failure_policy(rules, children.failed)
        action = rules[i].get("action") if i is not None else "RestartJobSet"
        rule_name = (rules[i].get("name") or f"failurePolicyRule{i}") if i is not None else None
        if action == "FailJobSet":
            fail(FAIL_JOBSET_ACTION[0], _msg(FAIL_JOBSET_ACTION[1], job))
            return todo
        counts = action == "RestartJobSet"
        if counts and int(status.get("restartsCountTowardsMax") or 0) >= int(fp.get("maxRestarts") or 0):
            fail(REACHED_MAX_RESTARTS[0], _msg(REACHED_MAX_RESTARTS[1], job))
            return todo
        reason, base = RESTART_ACTION if counts else RESTART_IGNORE_ACTION
        msg = _msg(base, job)
        status["restarts"] = int(status.get("restarts") or 0) + 1
        if counts:
            status["restartsCountTowardsMax"] = int(status.get("restartsCountTowardsMax") or 0) + 1
        todo.events.append(("Warning", reason, msg))
        why = f"FailurePolicy_{rule_name}" if rule_name else "DefaultFailurePolicy"
        if objects.set_condition(conds, RESTARTING, "True", why, msg, when):
            todo.events.append(("Warning", why, msg))  # setCondition's event, besides the action's
        todo.requeue_after = 0.0  # the next pass deletes this attempt's Jobs
        return todo

    if children.successful:
        sp = spec.get("successPolicy") or {"operator": "All"}
        targets = sp.get("targetReplicatedJobs") or []
        ok = [
            j
            for j in children.successful
            if not targets or objects.labels(j).get(objects.RJOB_NAME) in targets
        ]
        if sp.get("operator") == "Any":
            need = 1
        else:
            need = sum(
                int(r.get("replicas", 1))
                for r in spec.get("replicatedJobs") or []
                if not targets or r["name"] in targets
            )
        if len(ok) >= need:
            set_cond("Completed", "True", COMPLETED[0], COMPLETED[1], "Normal")
            status["terminalState"] = "Completed"
            restarting_false(RESTART_JOBSET_COMPLETED, COMPLETED[1])
            todo.delete_jobs += [
                objects.meta(j)["name"] for j in children.active if not objects.pod_deleting(j)
            ]
            return todo

    if dns_hostnames(js) and not service_exists:
        m = objects.meta(js)
        todo.service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": subdomain(js),
                "namespace": m.get("namespace"),
                "ownerReferences": [objects.owner_ref(js, objects.JOBSET_API_VERSION, "JobSet")],
            },
            "spec": {
                "clusterIP": "None",
                "selector": {objects.JOBSET_NAME: m["name"]},
                "publishNotReadyAddresses": (
                    (spec.get("network") or {}).get("publishNotReadyAddresses", True)
                ),
            },
        }

    blocking = (spec.get("failurePolicy") or {}).get("restartStrategy") == "BlockingRecreate"
    existing = {objects.meta(j)["name"] for j in jobs}
    in_order = (spec.get("startupPolicy") or {}).get("startupPolicyOrder") == "InOrder" and not spec.get(
        "suspend"
    )
    if not (blocking and children.previous):
        rstats = {s["name"]: s for s in status["replicatedJobsStatus"]}
        waiting = False
        replicas_of: dict[str, int] = {}
        for r in spec.get("replicatedJobs") or []:
            replicas = int(r.get("replicas", 1))
            replicas_of[r["name"]] = replicas
            if not dependencies_reached(r, replicas_of, rstats):
                continue  # upstream: created once what it depends on is Ready/Complete
            st = rstats.get(r["name"]) or {}
            if in_order and st.get("failed", 0) + st.get("ready", 0) + st.get("succeeded", 0) == replicas:
                continue  # upstream allReplicasStarted: on to the next replicated Job
            for idx in range(replicas):
                if job_name(objects.meta(js)["name"], r["name"], idx) not in existing:
                    todo.create_jobs.append(construct_job(js, r, idx))
            if in_order:  # wait for this replicated Job's Jobs to be ready before the next
                waiting = True
                set_startup(conds, STARTUP_IN_PROGRESS, when, todo)
                break
        if in_order and not waiting:
            set_startup(conds, STARTUP_COMPLETED, when, todo)

    if spec.get("suspend"):
        for j in children.active:
            if not (j.get("spec") or {}).get("suspend"):
                todo.suspend_jobs[objects.meta(j)["name"]] = True
        set_cond("Suspended", "True", SUSPENDED[0], SUSPENDED[1], "Normal")
        restarting_false(RESTART_JOBSET_SUSPENDED, SUSPENDED[1])
    else:
        templates = {r["name"]: (r.get("template") or {}).get("spec", {}).get("template") or {}
                     for r in spec.get("replicatedJobs") or []}  # fmt: skip
        for j in children.active:
            if (j.get("spec") or {}).get("suspend"):
                todo.suspend_jobs[objects.meta(j)["name"]] = False
                rjob = (objects.meta(j).get("labels") or {}).get(objects.RJOB_NAME)
                if rjob in templates:
                    todo.resume_templates[objects.meta(j)["name"]] = resumed_template(j, templates[rjob])
        sus = objects.get_condition({"status": status}, "Suspended")
        if sus is not None and sus.get("status") == "True":
            set_cond("Suspended", "False", RESUMED[0], RESUMED[1], "Normal")
    return todo


def resumed_template(job: dict[str, Any], template: dict[str, Any]) -> dict[str, Any]:
    """The Job's pod template fields as upstream's `resumeJob` leaves them on resume
    (kubernetes-sigs/jobset pkg/controllers/jobset_controller.go): labels, annotations and the node
    selector merged with the replicated Job's template (its values win), tolerations and scheduling
    gates with the template's appended where missing. Kueue may have changed them on the JobSet
    while it was suspended (its admitted flavor's node selector, TAS: kueue
    pkg/controller/jobs/jobset/jobset_controller.go RunWithPodSetsInfo)."""
    have = (job.get("spec") or {}).get("template") or {}
    meta, pod = have.get("metadata") or {}, have.get("spec") or {}
    want_meta, want_pod = template.get("metadata") or {}, template.get("spec") or {}

    def merged_list(key: str) -> list:
        out = list(pod.get(key) or [])
        return out + [x for x in want_pod.get(key) or [] if x not in out]

    return {
        "metadata": {
            "labels": {**(meta.get("labels") or {}), **(want_meta.get("labels") or {})},
            "annotations": {**(meta.get("annotations") or {}), **(want_meta.get("annotations") or {})},
        },
        "spec": {
            "nodeSelector": {**(pod.get("nodeSelector") or {}), **(want_pod.get("nodeSelector") or {})},
            "tolerations": merged_list("tolerations"),
            "schedulingGates": merged_list("schedulingGates"),
        },
    }
