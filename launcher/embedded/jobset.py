"""The JobSet controller (jobset.x-k8s.io/v1alpha2, the behaviour of kubernetes-sigs/jobset v0.12).

Reconcile follows upstream's order: replicated-job statuses; a finished JobSet deletes its active
Jobs and honours ttlSecondsAfterFinished; Jobs of earlier restart attempts are deleted (foreground,
so a Job disappears only after its pods); a failed Job runs the failure policy; succeeded Jobs run
the success policy; missing Jobs are created (not while old ones remain under BlockingRecreate, nor
before the replicated Jobs they depend on are Ready/Complete);
suspend/resume. Names, labels, condition reasons, messages and events are upstream's.

`decide` is pure; `JobSetController` reads, calls it and applies the plan.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from launcher import rfc3339
from launcher.embedded import objects as o
from launcher.embedded.runtime import Controller, EventRecorder

# The upstream release whose behaviour this controller follows; `/embedded/v1/info` reports it, as
# the embedded cluster has no jobset-controller-manager Deployment whose image tag would say it.
EMULATED_VERSION = "v0.12.0"

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
class Plan:
    create_jobs: list[dict[str, Any]] = field(default_factory=list)
    delete_jobs: list[str] = field(default_factory=list)  # foreground
    suspend_jobs: dict[str, bool] = field(default_factory=dict)  # job name → spec.suspend
    service: dict[str, Any] | None = None
    status: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    delete_jobset: bool = False
    requeue_after: float | None = None


# ---- pure pieces ------------------------------------------------------------------------------


def job_name(js: str, rjob: str, idx: int) -> str:
    return f"{js}-{rjob}-{idx}"


def job_key(namespace: str, name: str) -> str:
    """jobset.sigs.k8s.io/job-key: SHA-1 of '<namespace>/<job name>' (jobHashKey upstream)."""
    return hashlib.sha1(f"{namespace}/{name}".encode()).hexdigest()


def dns_hostnames(js: Mapping[str, Any]) -> bool:
    net = (js.get("spec") or {}).get("network")
    if net is None:  # the webhook defaults a missing network to enableDNSHostnames: true
        return True
    return bool(net.get("enableDNSHostnames", True))


def subdomain(js: Mapping[str, Any]) -> str:
    net = (js.get("spec") or {}).get("network") or {}
    return net.get("subdomain") or o.meta(js)["name"]


def global_job_index(js: Mapping[str, Any], rjob: str, idx: int) -> int:
    total = 0
    for r in (js.get("spec") or {}).get("replicatedJobs") or []:
        if r["name"] == rjob:
            return total + idx
        total += int(r.get("replicas", 1))
    return total + idx


def group_labels(js: Mapping[str, Any], rjob: Mapping[str, Any], idx: int) -> dict[str, str]:
    """groupName (the CRD defaults it to "default"), replicas in the group, the Job's index in it."""
    group = rjob.get("groupName") or "default"
    members = [
        r
        for r in (js.get("spec") or {}).get("replicatedJobs") or []
        if (r.get("groupName") or "default") == group
    ]
    before = 0
    for r in members:
        if r["name"] == rjob["name"]:
            break
        before += int(r.get("replicas", 1))
    return {
        o.GROUP_NAME: group,
        o.GROUP_REPLICAS: str(sum(int(r.get("replicas", 1)) for r in members)),
        o.JOB_GROUP_INDEX: str(before + idx),
    }


def jobset_labels(js: Mapping[str, Any], rjob: Mapping[str, Any], idx: int) -> dict[str, str]:
    """labelAndAnnotateObject: the same map goes on Jobs and pod templates, as labels and annotations."""
    m = o.meta(js)
    name = job_name(m["name"], rjob["name"], idx)
    total = sum(int(r.get("replicas", 1)) for r in js["spec"]["replicatedJobs"])
    out = {
        o.JOBSET_NAME: m["name"],
        o.JOBSET_UID: m.get("uid", ""),
        o.RJOB_NAME: rjob["name"],
        o.RESTART_ATTEMPT: str(int((js.get("status") or {}).get("restarts") or 0)),
        o.RJOB_REPLICAS: str(int(rjob.get("replicas", 1))),
        o.GLOBAL_REPLICAS: str(total),
        o.JOB_INDEX: str(idx),
        o.JOB_KEY: job_key(m.get("namespace") or "default", name),
        o.JOB_GLOBAL_INDEX: str(global_job_index(js, rjob["name"], idx)),
        **group_labels(js, rjob, idx),
    }
    coord = (js.get("spec") or {}).get("coordinator")
    if coord:
        out[o.COORDINATOR] = (
            f"{m['name']}-{coord['replicatedJob']}-{int(coord.get('jobIndex', 0))}-"
            f"{int(coord.get('podIndex', 0))}.{subdomain(js)}"
        )
    return out


def construct_job(js: Mapping[str, Any], rjob: Mapping[str, Any], idx: int) -> dict[str, Any]:
    m = o.meta(js)
    tmpl = copy.deepcopy(rjob.get("template") or {})
    tm = tmpl.get("metadata") or {}
    spec = tmpl.get("spec") or {}
    spec.setdefault("completionMode", "Indexed")  # webhook default
    pod_tmpl = spec.setdefault("template", {})
    pod_meta = pod_tmpl.setdefault("metadata", {})
    pod_spec = pod_tmpl.setdefault("spec", {})
    if not pod_spec.get("restartPolicy"):
        pod_spec["restartPolicy"] = "OnFailure"  # webhook default
    extra = jobset_labels(js, rjob, idx)
    ann_extra = dict(extra)
    excl = o.annotations(js).get(o.EXCLUSIVE_KEY) or (tm.get("annotations") or {}).get(o.EXCLUSIVE_KEY)
    if excl:
        ann_extra[o.EXCLUSIVE_KEY] = excl
        strat = o.annotations(js).get(o.NODE_SELECTOR_STRATEGY)
        if strat is not None:
            ann_extra[o.NODE_SELECTOR_STRATEGY] = strat
    job_meta = {
        "name": job_name(m["name"], rjob["name"], idx),
        "namespace": m.get("namespace"),
        "labels": {**(tm.get("labels") or {}), **extra},
        "annotations": {**(tm.get("annotations") or {}), **ann_extra},
        "ownerReferences": [o.owner_ref(js, o.JOBSET_API_VERSION, "JobSet")],
    }
    pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **extra}
    pod_meta["annotations"] = {**(pod_meta.get("annotations") or {}), **ann_extra}
    if dns_hostnames(js):
        pod_spec["subdomain"] = subdomain(js)
    spec["suspend"] = bool((js.get("spec") or {}).get("suspend"))
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": job_meta, "spec": spec}


def job_finished(job: Mapping[str, Any]) -> str | None:
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") in ("Complete", "Failed") and c.get("status") == "True":
            return c["type"]
    return None


def job_failure(job: Mapping[str, Any]) -> dict[str, Any] | None:
    c = o.get_condition(job, "Failed")
    return c if c and c.get("status") == "True" else None


@dataclass
class ChildJobs:
    active: list[dict[str, Any]] = field(default_factory=list)
    successful: list[dict[str, Any]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)
    previous: list[dict[str, Any]] = field(default_factory=list)


def classify(js: Mapping[str, Any], jobs: list[dict[str, Any]]) -> ChildJobs:
    restarts = int((js.get("status") or {}).get("restarts") or 0)
    out = ChildJobs()
    for j in jobs:
        attempt = o.labels(j).get(o.RESTART_ATTEMPT, "")
        if not attempt.isdigit() or int(attempt) < restarts:
            out.previous.append(j)
            continue
        kind = job_finished(j)
        {"Failed": out.failed, "Complete": out.successful}.get(kind or "", out.active).append(j)
    return out


def replicated_jobs_status(js: Mapping[str, Any], jobs: ChildJobs) -> list[dict[str, Any]]:
    stats = {
        r["name"]: {"name": r["name"], "ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 0}
        for r in (js.get("spec") or {}).get("replicatedJobs") or []
    }
    for j in jobs.active:
        s = stats.get(o.labels(j).get(o.RJOB_NAME, ""))
        if s is None:
            continue
        st, sp = j.get("status") or {}, j.get("spec") or {}
        pods = int(sp.get("parallelism") if sp.get("parallelism") is not None else 1)
        if sp.get("completions") is not None:
            pods = min(pods, int(sp["completions"]))
        if int(st.get("succeeded") or 0) + int(st.get("ready") or 0) >= pods:
            s["ready"] += 1
        if int(st.get("active") or 0) > 0:
            s["active"] += 1
        if sp.get("suspend"):
            s["suspended"] += 1
    for kind, lst in (("succeeded", jobs.successful), ("failed", jobs.failed)):
        for j in lst:
            s = stats.get(o.labels(j).get(o.RJOB_NAME, ""))
            if s is not None:
                s[kind] += 1
    return list(stats.values())


def first_failed(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    return min(
        jobs, key=lambda j: ((job_failure(j) or {}).get("lastTransitionTime") or "", o.meta(j)["name"])
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
    return not targets or o.labels(job).get(o.RJOB_NAME) in targets


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
    return f"{base} (first failed job: {o.meta(job)['name']})"


def set_startup(conds: list[dict[str, Any]], cond: tuple[str, str, str], when: str, plan: Plan) -> None:
    """Upstream updateCondition for the two exclusive startup conditions: a True one flips the other
    True one to False (status only); an event when anything changed."""
    ctype, reason, msg = cond
    other = STARTUP_COMPLETED[0] if ctype == STARTUP_IN_PROGRESS[0] else STARTUP_IN_PROGRESS[0]
    changed = False
    for c in conds:
        if c.get("type") == other and c.get("status") == "True":
            c["status"] = "False"
            changed = True
    if o.set_condition(conds, ctype, "True", reason, msg, when) or changed:
        plan.events.append(("Normal", reason, msg))


def _finished(js: Mapping[str, Any]) -> dict[str, Any] | None:
    for c in (js.get("status") or {}).get("conditions") or []:
        if c.get("type") in ("Completed", "Failed") and c.get("status") == "True":
            return c
    return None


def decide(js: Mapping[str, Any], jobs: list[dict[str, Any]], service_exists: bool, now: dt.datetime) -> Plan:
    spec = js.get("spec") or {}
    status = copy.deepcopy(dict(js.get("status") or {}))
    status.setdefault("restarts", 0)
    conds: list[dict[str, Any]] = status.setdefault("conditions", [])
    when = rfc3339.stamp(now)
    plan = Plan(status=status)
    children = classify(js, jobs)
    status["replicatedJobsStatus"] = replicated_jobs_status(js, children)

    def set_cond(ctype: str, st: str, reason: str, msg: str, etype: str | None) -> None:
        if o.set_condition(conds, ctype, st, reason, msg, when) and etype:
            plan.events.append((etype, reason, msg))

    def restarting_false(reason: str, msg: str) -> None:
        # setRestartingConditionFalse: never added, but an existing one (True or False) takes the
        # new terminal reason and message, with a Normal event when it changed.
        if o.get_condition({"status": status}, RESTARTING) is not None:
            set_cond(RESTARTING, "False", reason, msg, "Normal")

    def fail(reason: str, msg: str) -> None:
        set_cond("Failed", "True", reason, msg, "Warning")
        status["terminalState"] = "Failed"
        restarting_false(*RESTART_JOBSET_FAILED)

    done = _finished({"status": status})
    if done is not None:
        plan.delete_jobs = [o.meta(j)["name"] for j in children.active if not o.pod_deleting(j)]
        ttl = spec.get("ttlSecondsAfterFinished")
        if ttl is not None:
            at = rfc3339.parse(done.get("lastTransitionTime"))
            left = int(ttl) - ((now - at).total_seconds() if at else 0)
            if left <= 0:
                plan.delete_jobset = True
            else:
                plan.requeue_after = left
        return plan

    plan.delete_jobs = [o.meta(j)["name"] for j in children.previous if not o.pod_deleting(j)]
    total = sum(int(r.get("replicas", 1)) for r in spec.get("replicatedJobs") or [])
    ready = sum(s["ready"] + s["succeeded"] for s in status["replicatedJobsStatus"])
    if not spec.get("suspend") and ready == total:  # allJobsReady, before the failure policy
        restarting_false(*RESTART_JOBS_READY)

    if children.failed:
        fp = spec.get("failurePolicy")
        if fp is None:
            fail(FAILED_JOBS[0], _msg(FAILED_JOBS[1], first_failed(children.failed)))
            return plan
        rules = fp.get("rules") or []
        i, job = match_failure_policy(rules, children.failed)
        action = rules[i].get("action") if i is not None else "RestartJobSet"
        rule_name = (rules[i].get("name") or f"failurePolicyRule{i}") if i is not None else None
        if action == "FailJobSet":
            fail(FAIL_JOBSET_ACTION[0], _msg(FAIL_JOBSET_ACTION[1], job))
            return plan
        counts = action == "RestartJobSet"
        if counts and int(status.get("restartsCountTowardsMax") or 0) >= int(fp.get("maxRestarts") or 0):
            fail(REACHED_MAX_RESTARTS[0], _msg(REACHED_MAX_RESTARTS[1], job))
            return plan
        reason, base = RESTART_ACTION if counts else RESTART_IGNORE_ACTION
        msg = _msg(base, job)
        status["restarts"] = int(status.get("restarts") or 0) + 1
        if counts:
            status["restartsCountTowardsMax"] = int(status.get("restartsCountTowardsMax") or 0) + 1
        plan.events.append(("Warning", reason, msg))
        why = f"FailurePolicy_{rule_name}" if rule_name else "DefaultFailurePolicy"
        o.set_condition(conds, RESTARTING, "True", why, msg, when)
        plan.requeue_after = 0.0  # the next pass deletes this attempt's Jobs
        return plan

    if children.successful:
        sp = spec.get("successPolicy") or {"operator": "All"}
        targets = sp.get("targetReplicatedJobs") or []
        ok = [j for j in children.successful if not targets or o.labels(j).get(o.RJOB_NAME) in targets]
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
            plan.delete_jobs += [o.meta(j)["name"] for j in children.active if not o.pod_deleting(j)]
            return plan

    if dns_hostnames(js) and not service_exists:
        m = o.meta(js)
        plan.service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": subdomain(js),
                "namespace": m.get("namespace"),
                "ownerReferences": [o.owner_ref(js, o.JOBSET_API_VERSION, "JobSet")],
            },
            "spec": {
                "clusterIP": "None",
                "selector": {o.JOBSET_NAME: m["name"]},
                "publishNotReadyAddresses": (
                    (spec.get("network") or {}).get("publishNotReadyAddresses", True)
                ),
            },
        }

    blocking = (spec.get("failurePolicy") or {}).get("restartStrategy") == "BlockingRecreate"
    existing = {o.meta(j)["name"] for j in jobs}
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
                if job_name(o.meta(js)["name"], r["name"], idx) not in existing:
                    plan.create_jobs.append(construct_job(js, r, idx))
            if in_order:  # wait for this replicated Job's Jobs to be ready before the next
                waiting = True
                set_startup(conds, STARTUP_IN_PROGRESS, when, plan)
                break
        if in_order and not waiting:
            set_startup(conds, STARTUP_COMPLETED, when, plan)

    if spec.get("suspend"):
        for j in children.active:
            if not (j.get("spec") or {}).get("suspend"):
                plan.suspend_jobs[o.meta(j)["name"]] = True
        set_cond("Suspended", "True", SUSPENDED[0], SUSPENDED[1], "Normal")
        restarting_false(RESTART_JOBSET_SUSPENDED, SUSPENDED[1])
    else:
        for j in children.active:
            if (j.get("spec") or {}).get("suspend"):
                plan.suspend_jobs[o.meta(j)["name"]] = False
        sus = o.get_condition({"status": status}, "Suspended")
        if sus is not None and sus.get("status") == "True":
            set_cond("Suspended", "False", RESUMED[0], RESUMED[1], "Normal")
    return plan


# ---- the controller ---------------------------------------------------------------------------


class JobSetController(Controller):
    name = "jobset-controller"

    def __init__(self, store: Any, events: Any = None) -> None:
        super().__init__(store, events)
        from launcher.embedded.store import RESOURCES

        self.jobsets = RESOURCES["jobsets"]
        self.jobs = RESOURCES["jobs"]
        self.services = RESOURCES.get("services")
        self.recorder = EventRecorder(store, "jobset-controller")
        self._keys: dict[str, tuple[str, str]] = {}  # jobset uid → (ns, name)

    def resync(self) -> None:
        items, _ = self.store.list(self.jobsets)
        for js in items:
            self._keys[o.meta(js)["uid"]] = o.key_of(js)
            self.enqueue(o.key_of(js))

    def keys_for(self, event: str, res: Any, obj: Mapping[str, Any]) -> list[Hashable]:
        if res.plural == "jobsets":
            if event == "DELETED":
                self._keys.pop(o.meta(obj)["uid"], None)
                return []
            self._keys[o.meta(obj)["uid"]] = o.key_of(obj)
            return [o.key_of(obj)]
        if res.plural == "jobs":
            owner = o.controller_uid(obj)
            if owner in self._keys:
                return [self._keys[owner]]
        return []

    def reconcile(self, key: Hashable) -> float | None:
        ns, name = key  # type: ignore[misc]
        try:
            js = self.store.get(self.jobsets, ns, name)
        except Exception as e:
            if getattr(e, "code", None) == 404:
                return None
            raise
        if o.pod_deleting(js):
            return None
        managed_by = (js.get("spec") or {}).get("managedBy")
        if managed_by and managed_by != "jobset.sigs.k8s.io/jobset-controller":
            return None
        uid = o.meta(js)["uid"]
        jobs, _ = self.store.list(self.jobs, namespace=ns, label_selector=f"{o.JOBSET_NAME}={name}")
        jobs = [j for j in jobs if o.controller_uid(j) == uid]
        svc_exists = True
        if self.services is not None and o.meta(js).get("name"):
            try:
                self.store.get(self.services, ns, subdomain(js))
            except Exception as e:
                if getattr(e, "code", None) != 404:
                    raise
                svc_exists = False
        plan = decide(js, jobs, svc_exists, o.now())
        if plan.delete_jobset:
            self.store.delete(self.jobsets, ns, name, propagation="Foreground")
            return None
        for jname in plan.delete_jobs:
            try:
                self.store.delete(self.jobs, ns, jname, propagation="Foreground")
            except Exception as e:
                if getattr(e, "code", None) != 404:
                    raise
        if plan.service is not None and self.services is not None:
            try:
                self.store.create(self.services, plan.service, ns)
            except Exception as e:
                if getattr(e, "code", None) != 409:
                    raise
        for job in plan.create_jobs:
            try:
                self.store.create(self.jobs, job, ns)
            except Exception as e:
                if getattr(e, "code", None) != 409:
                    self.recorder.event(js, "Warning", "JobCreationFailed", str(e))
                    raise
        for jname, suspend in plan.suspend_jobs.items():
            self.store.patch(self.jobs, ns, jname, {"spec": {"suspend": suspend}}, "merge")
        status = dict(plan.status)
        if not status.get("conditions"):
            status.pop("conditions", None)  # omitempty, as the API serializes it
        if status != (js.get("status") or {}):
            js = dict(js)
            js["status"] = status
            self.store.update(self.jobsets, js, subresource="status")
        for etype, reason, msg in plan.events:
            self.recorder.event(js, etype, reason, msg)
        return plan.requeue_after
