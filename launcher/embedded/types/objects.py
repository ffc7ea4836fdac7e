"""Small pure helpers over Kubernetes objects as plain dicts (the cluster half's common vocabulary).

Everything here takes and returns data: timestamps, conditions, label selectors, owner references.
The controllers, the scheduler and the kubelet share them so that they agree on the details the real
components agree on (RFC 3339 times, condition transition times, selector rules). Tolerations and
pod requests are launcher/core/podfit.py's: preflight needs them too, without the embedded cluster.
"""

# No `from __future__ import annotations`: it would bind `annotations`, a function of this module, to
# the __future__ feature for a type checker. Every annotation here evaluates on Python 3.11.

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from launcher.core import rfc3339

# Upstream label and annotation keys (kubernetes-sigs/jobset api/jobset/v1alpha2, kubernetes batch/v1).
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID = "jobset.sigs.k8s.io/jobset-uid"
GROUP_NAME = "jobset.sigs.k8s.io/group-name"
GROUP_REPLICAS = "jobset.sigs.k8s.io/group-replicas"
JOB_GROUP_INDEX = "jobset.sigs.k8s.io/job-group-index"
RJOB_NAME = "jobset.sigs.k8s.io/replicatedjob-name"
RJOB_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
GLOBAL_REPLICAS = "jobset.sigs.k8s.io/global-replicas"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
JOB_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"
JOB_KEY = "jobset.sigs.k8s.io/job-key"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
COORDINATOR = "jobset.sigs.k8s.io/coordinator"
EXCLUSIVE_KEY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
NODE_SELECTOR_STRATEGY = "alpha.jobset.sigs.k8s.io/node-selector"

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
JOB_NAME = "batch.kubernetes.io/job-name"
LEGACY_CONTROLLER_UID = "controller-uid"
LEGACY_JOB_NAME = "job-name"

TPU_RESOURCE = "google.com/tpu"
NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"
ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
HOSTNAME_LABEL = "kubernetes.io/hostname"
IMPENDING_TERMINATION_TAINT = "cloud.google.com/impending-node-termination"

JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


def labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return meta(obj).get("labels") or {}


def annotations(obj: Mapping[str, Any]) -> dict[str, str]:
    return meta(obj).get("annotations") or {}


def key_of(obj: Mapping[str, Any]) -> tuple[str, str]:
    m = meta(obj)
    return (m.get("namespace") or "", m["name"])


# ---- conditions -------------------------------------------------------------------------------


def get_condition(obj: Mapping[str, Any], ctype: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return c
    return None


def condition_true(obj: Mapping[str, Any], ctype: str) -> bool:
    c = get_condition(obj, ctype)
    return c is not None and c.get("status") == "True"


def set_condition(
    conditions: list[dict[str, Any]],
    ctype: str,
    status: str,
    reason: str,
    message: str,
    when: str | None = None,
    probe_fields: bool = False,
) -> bool:
    """Add or update a condition in place; returns whether anything changed.

    lastTransitionTime moves only when the status changes, as upstream helpers do. Pod and Job
    conditions also carry lastProbeTime (probe_fields=True) — null for conditions nobody probes.
    """
    when = when or rfc3339.stamp()
    for c in conditions:
        if c.get("type") != ctype:
            continue
        changed = False
        if c.get("status") != status:
            c["status"] = status
            c["lastTransitionTime"] = when
            changed = True
        if c.get("reason") != reason or c.get("message") != message:
            c["reason"], c["message"] = reason, message
            changed = True
        return changed
    cond: dict[str, Any] = {"type": ctype, "status": status}
    if probe_fields:
        cond["lastProbeTime"] = None
    cond.update({"lastTransitionTime": when, "reason": reason, "message": message})
    conditions.append(cond)
    return True


# ---- selectors --------------------------------------------------------------------------------


def match_expression(values: Mapping[str, str], expr: Mapping[str, Any]) -> bool:
    """One matchExpressions entry (label selector or node selector requirement)."""
    key, op = expr.get("key", ""), expr.get("operator")
    vals = expr.get("values") or []
    present = key in values
    if op == "In":
        return present and values[key] in vals
    if op == "NotIn":
        return not present or values[key] not in vals
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and vals:
        try:
            have, want = int(values[key]), int(vals[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def match_label_selector(lbls: Mapping[str, str], selector: Mapping[str, Any] | None) -> bool:
    """metav1.LabelSelector. None matches nothing (as in pod affinity terms); {} matches everything."""
    if selector is None:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if lbls.get(k) != v:
            return False
    return all(match_expression(lbls, e) for e in selector.get("matchExpressions") or [])


# ---- owner references -------------------------------------------------------------------------


def owner_ref(owner: Mapping[str, Any], api_version: str, kind: str) -> dict[str, Any]:
    m = meta(owner)
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": m["name"],
        "uid": m["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    for ref in meta(obj).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref.get("uid")
    return None


# ---- pods -------------------------------------------------------------------------------------


def pod_phase(pod: Mapping[str, Any]) -> str:
    return (pod.get("status") or {}).get("phase") or "Pending"


def pod_terminal(pod: Mapping[str, Any]) -> bool:
    return pod_phase(pod) in ("Succeeded", "Failed")


def pod_deleting(pod: Mapping[str, Any]) -> bool:
    return bool(meta(pod).get("deletionTimestamp"))


def pod_ready(pod: Mapping[str, Any]) -> bool:
    return condition_true(pod, "Ready")


def pod_tpu_request(pod: Mapping[str, Any]) -> int:
    """google.com/tpu asked by the pod: sum over containers of requests (falling back to limits,
    which is what the API server defaults requests to for extended resources)."""
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        v = (res.get("requests") or {}).get(TPU_RESOURCE, (res.get("limits") or {}).get(TPU_RESOURCE, 0))
        total += int(v)
    return total


def compress_indexes(indexes: Iterable[int]) -> str:
    """Job status.completedIndexes: '1,3-5,7' (three or more consecutive numbers become a range)."""
    out: list[str] = []
    xs = sorted(set(indexes))
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        if j - i >= 2:
            out.append(f"{xs[i]}-{xs[j]}")
        else:
            out.extend(str(x) for x in xs[i : j + 1])
        i = j + 1
    return ",".join(out)
