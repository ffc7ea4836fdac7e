"""The pods a Job creates and what the Job controller reads off them: the pod for a completion
index (labels, `JOB_COMPLETION_INDEX`, the job-tracking finalizer), the exclusive-placement affinity
JobSet's pod webhooks add to it, and the finish time, leader node and "may leave the API" test.

Pure. Called by `jobactions.decide` (the pods to create) and by `job.JobController` (which pods
to release, where the leader runs).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from launcher.embedded.admission.defaults import PRIORITY_LABEL
from launcher.embedded.types import objects

# Upstream's job-tracking finalizer: a pod cannot leave the API before the controller counted it.
TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"


def completion_index(pod: Mapping[str, Any]) -> int | None:
    v = objects.annotations(pod).get(
        objects.COMPLETION_INDEX, objects.labels(pod).get(objects.COMPLETION_INDEX)
    )
    return int(v) if v is not None and str(v).isdigit() else None


def finish_time(pod: Mapping[str, Any]) -> str:
    times = [
        ((cs.get("state") or {}).get("terminated") or {}).get("finishedAt") or ""
        for cs in (pod.get("status") or {}).get("containerStatuses") or []
    ]
    times += [c.get("lastTransitionTime") or "" for c in (pod.get("status") or {}).get("conditions") or []]
    return max(times, default="")


def exclusive_affinity(job_key: str, topology_key: str, priority: str = "0") -> dict[str, Any]:
    """What JobSet's pod mutating webhook puts on a leader pod for exclusive placement: exclusive
    among Jobs of the same priority (v0.12.0 setExclusiveAffinities, the priority label's term)."""
    return {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchExpressions": [{"key": objects.JOB_KEY, "operator": "In", "values": [job_key]}]
                    },
                    "topologyKey": topology_key,
                    "namespaceSelector": {},
                }
            ]
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchExpressions": [
                            {"key": objects.JOB_KEY, "operator": "Exists"},
                            {"key": objects.JOB_KEY, "operator": "NotIn", "values": [job_key]},
                            {"key": PRIORITY_LABEL, "operator": "In", "values": [priority]},
                        ]
                    },
                    "topologyKey": topology_key,
                    "namespaceSelector": {},
                }
            ]
        },
    }


def exclusive_topology(job: Mapping[str, Any]) -> str | None:
    ann = objects.annotations(job.get("spec", {}).get("template", {}))
    if objects.EXCLUSIVE_KEY in ann and objects.NODE_SELECTOR_STRATEGY not in ann:
        return ann[objects.EXCLUSIVE_KEY]
    return None


def pod_for_index(
    job: Mapping[str, Any],
    index: int | None,
    leader_domain: str | None,
    extra_annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The pod the Job controller creates for a completion index (None for NonIndexed)."""
    m = objects.meta(job)
    tmpl = copy.deepcopy((job.get("spec") or {}).get("template") or {})
    tm = tmpl.get("metadata") or {}
    lbls = dict(tm.get("labels") or {})
    ann = {**(tm.get("annotations") or {}), **(extra_annotations or {})}
    lbls.update(
        {
            objects.CONTROLLER_UID: m["uid"],
            objects.JOB_NAME: m["name"],
            objects.LEGACY_CONTROLLER_UID: m["uid"],
            objects.LEGACY_JOB_NAME: m["name"],
        }
    )
    spec = tmpl.get("spec") or {}
    gen = f"{m['name']}-"
    if index is not None:
        lbls[objects.COMPLETION_INDEX] = str(index)
        ann[objects.COMPLETION_INDEX] = str(index)
        gen = f"{m['name']}-{index}-"
        spec["hostname"] = f"{m['name']}-{index}"
        for c in spec.get("containers") or []:
            env = c.setdefault("env", [])
            if not any(e.get("name") == "JOB_COMPLETION_INDEX" for e in env):
                env.append(
                    {
                        "name": "JOB_COMPLETION_INDEX",
                        "valueFrom": {
                            "fieldRef": {
                                "apiVersion": "v1",
                                "fieldPath": f"metadata.annotations['{objects.COMPLETION_INDEX}']",
                            }
                        },
                    }
                )
    topo = exclusive_topology(job)
    if topo and objects.JOB_KEY in lbls:
        if index in (0, None):
            # The pod's priority as Priority admission will leave it (no PriorityClass lookup here).
            prio = str(spec.get("priority", 0))
            spec["affinity"] = {
                **(spec.get("affinity") or {}),
                **exclusive_affinity(lbls[objects.JOB_KEY], topo, prio),
            }
        elif leader_domain is not None:
            spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), topo: leader_domain}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": gen,
            "namespace": m.get("namespace"),
            "labels": lbls,
            "annotations": ann,
            "ownerReferences": [objects.owner_ref(job, "batch/v1", "Job")],
            "finalizers": [TRACKING_FINALIZER],
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def finished(pod: Mapping[str, Any]) -> bool:
    """A pod whose tracking finalizer may go: terminal, or deleted before it ever ran.

    A running pod keeps it until the kubelet reports the end, even when its Job is being deleted:
    the store removes a pod as soon as its last finalizer goes (upstream waits for the kubelet's
    grace-0 delete when deletionGracePeriodSeconds > 0), so releasing early would end a graceful
    termination at once and break BlockingRecreate.
    """
    return objects.pod_terminal(pod) or (
        objects.pod_deleting(pod) and not (pod.get("spec") or {}).get("nodeName")
    )


def leader_node(pods: list[Mapping[str, Any]]) -> str | None:
    """The node of the Job's leader pod (completion index 0), or None while it is unbound.

    JobSet's pod webhook finds the leader by name and admits followers once it has a nodeName,
    whatever its phase (kubernetes-sigs/jobset v0.12.0, pkg/webhooks/pod_webhook.go): a leader
    that already finished, or is terminating, still places its followers. A live leader wins
    over an old one.
    """
    leaders = [p for p in pods if completion_index(p) == 0 and (p.get("spec") or {}).get("nodeName")]
    live = [p for p in leaders if not objects.pod_terminal(p) and not objects.pod_deleting(p)]
    chosen = (live or leaders)[:1]
    return chosen[0]["spec"]["nodeName"] if chosen else None
