"""The child Jobs of a JobSet: their names, labels and annotations, the headless Service's name
(subdomain), the Job built for one replica of a replicated Job (`construct_job`), and how the
existing children are sorted (active, succeeded, failed, of an earlier restart) and counted into
`status.replicatedJobsStatus`. Names and labels are upstream's (kubernetes-sigs/jobset v0.12).

Pure. Called by `jobsetactions.decide` and `jobset.JobSetController` (the Service lookup).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from launcher.embedded.types import objects


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
    return net.get("subdomain") or objects.meta(js)["name"]


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
        objects.GROUP_NAME: group,
        objects.GROUP_REPLICAS: str(sum(int(r.get("replicas", 1)) for r in members)),
        objects.JOB_GROUP_INDEX: str(before + idx),
    }


def jobset_labels(js: Mapping[str, Any], rjob: Mapping[str, Any], idx: int) -> dict[str, str]:
    """labelAndAnnotateObject: the same map goes on Jobs and pod templates, as labels and annotations."""
    m = objects.meta(js)
    name = job_name(m["name"], rjob["name"], idx)
    total = sum(int(r.get("replicas", 1)) for r in js["spec"]["replicatedJobs"])
    out = {
        objects.JOBSET_NAME: m["name"],
        objects.JOBSET_UID: m.get("uid", ""),
        objects.RJOB_NAME: rjob["name"],
        objects.RESTART_ATTEMPT: str(int((js.get("status") or {}).get("restarts") or 0)),
        objects.RJOB_REPLICAS: str(int(rjob.get("replicas", 1))),
        objects.GLOBAL_REPLICAS: str(total),
        objects.JOB_INDEX: str(idx),
        objects.JOB_KEY: job_key(m.get("namespace") or "default", name),
        objects.JOB_GLOBAL_INDEX: str(global_job_index(js, rjob["name"], idx)),
        **group_labels(js, rjob, idx),
    }
    coord = (js.get("spec") or {}).get("coordinator")
    if coord:
        out[objects.COORDINATOR] = (
            f"{m['name']}-{coord['replicatedJob']}-{int(coord.get('jobIndex', 0))}-"
            f"{int(coord.get('podIndex', 0))}.{subdomain(js)}"
        )
    return out


def construct_job(js: Mapping[str, Any], rjob: Mapping[str, Any], idx: int) -> dict[str, Any]:
    m = objects.meta(js)
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
    excl = objects.annotations(js).get(objects.EXCLUSIVE_KEY) or (tm.get("annotations") or {}).get(
        objects.EXCLUSIVE_KEY
    )
    if excl:
        ann_extra[objects.EXCLUSIVE_KEY] = excl
        strat = objects.annotations(js).get(objects.NODE_SELECTOR_STRATEGY)
        if strat is not None:
            ann_extra[objects.NODE_SELECTOR_STRATEGY] = strat
    job_meta = {
        "name": job_name(m["name"], rjob["name"], idx),
        "namespace": m.get("namespace"),
        "labels": {**(tm.get("labels") or {}), **extra},
        "annotations": {**(tm.get("annotations") or {}), **ann_extra},
        "ownerReferences": [objects.owner_ref(js, objects.JOBSET_API_VERSION, "JobSet")],
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
    c = objects.get_condition(job, "Failed")
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
        attempt = objects.labels(j).get(objects.RESTART_ATTEMPT, "")
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
        s = stats.get(objects.labels(j).get(objects.RJOB_NAME, ""))
        if s is None:
            continue
        st, sp = j.get("status") or {}, j.get("spec") or {}
        pods = int(n) if (n := sp.get("parallelism")) is not None else 1
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
            s = stats.get(objects.labels(j).get(objects.RJOB_NAME, ""))
            if s is not None:
                s[kind] += 1
    return list(stats.values())
