"""What the controller's caches keep of each object (launcher/controller/snapshot.py's sources): the fields the
signals read (launcher/core/signals/: pods.py, nodes.py, observation.py) and nothing else, as client-go
informers keep what a controller's transform leaves. A trainer pod as served is many times what the
signals read of it (env, args, volumes, twenty labels, five conditions; sizes in docs/measurements.md,
"Figures behind the code's constants"), and so is a TPU node; of a pod of another workload they read
only the node it takes.
Strings that recur across objects (label keys and values, condition types, phases, timestamps,
node names) are interned, so that 3,072 pods hold one "Running" and a pod's nodeName is its node's
name. Pure; called by the caches (launcher/adapters/informer.py) as each object arrives. Reading a field
not kept here is a bug the signals tests catch: each of their cases also runs on projected objects.
"""

from __future__ import annotations

import sys

from launcher.core.labels import (
    LABEL_JOBSET_UID,
    LABEL_RESTART_ATTEMPT,
    LABEL_RUN,
    LABEL_SEGMENT,
    LABEL_SLICE,
)
from launcher.core.presets import (
    LABEL_ACCELERATOR,
    LABEL_INSTANCE_TYPE,
    LABEL_NODEPOOL,
    LABEL_PLACEMENT,
    LABEL_SPOT,
    LABEL_TOPOLOGY,
)

_intern = sys.intern

# signals/pods.run_pods and pod_view: the run, the segment, the JobSet restart attempt and uid.
POD_LABELS = (LABEL_RUN, LABEL_SEGMENT, LABEL_SLICE, LABEL_RESTART_ATTEMPT, LABEL_JOBSET_UID)
# pod_view: unschedulable (PodScheduled False) and disrupted (DisruptionTarget True).
POD_CONDITIONS = ("PodScheduled", "DisruptionTarget")
# signals/nodes: the pool a node is in, and every label a preset's node selector names.
NODE_LABELS = (
    LABEL_NODEPOOL,
    LABEL_ACCELERATOR,
    LABEL_TOPOLOGY,
    LABEL_INSTANCE_TYPE,
    LABEL_PLACEMENT,
    LABEL_SPOT,
)
# signals/nodes.node_problem and node_since.
NODE_CONDITIONS = ("Ready",)
_CONDITION_FIELDS = ("type", "status", "reason", "message", "lastTransitionTime")


def _str(value):
    return _intern(value) if type(value) is str else value


def _meta(meta: dict, labels: tuple[str, ...], fields: tuple[str, ...]) -> dict:
    """name, uid and resourceVersion (the signals' memos key on them), the named `fields`
    (interned) and the named labels."""
    out = {k: meta[k] for k in ("uid", "resourceVersion") if k in meta}
    out["name"] = _intern(meta["name"])
    out.update((k, _str(meta[k])) for k in fields if k in meta)
    have = meta.get("labels") or {}
    out["labels"] = {_intern(k): _str(have[k]) for k in labels if k in have}
    return out


def _conditions(status: dict, types: tuple[str, ...]) -> list[dict]:
    return [
        {k: _str(c[k]) for k in _CONDITION_FIELDS if k in c}
        for c in status.get("conditions") or []
        if c.get("type") in types
    ]


def run_pod(pod: dict) -> dict:
    """A pod of a run: its labels, node, phase, scheduling and disruption conditions, and the exit
    of each terminated container, now (`state`) and before (`lastState`: a host's reboot says so
    there first, signals/pods.host_loss_of)."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    exits = []
    for cs in status.get("containerStatuses") or []:
        kept = {}
        for field in ("state", "lastState"):
            term = (cs.get(field) or {}).get("terminated")
            if term is not None:
                kept[field] = {"terminated": {k: _str(term.get(k)) for k in ("exitCode", "reason")}}
        if kept:
            exits.append(kept)
    return {
        "metadata": _meta(meta, POD_LABELS, ("namespace", "deletionTimestamp")),
        "spec": {"nodeName": _str(spec.get("nodeName"))},
        "status": {
            "phase": _str(status.get("phase")),
            "reason": _str(status.get("reason")),
            "conditions": _conditions(status, POD_CONDITIONS),
            "containerStatuses": exits,
        },
    }


def tpu_node(obj: dict) -> dict:
    """A TPU node: its pool and selector labels, whether it is cordoned, its taints' keys, and its
    Ready condition."""
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    kept_spec = {"taints": [{"key": _str(t.get("key"))} for t in spec.get("taints") or []]}
    if "unschedulable" in spec:
        kept_spec["unschedulable"] = spec["unschedulable"]
    return {
        "metadata": _meta(meta, NODE_LABELS, ("creationTimestamp", "deletionTimestamp")),
        "spec": kept_spec,
        "status": {"conditions": _conditions(status, NODE_CONDITIONS)},
    }


def node_taken(pod: dict) -> str | None:
    """A pod of another workload: only the node it takes."""
    return _str((pod.get("spec") or {}).get("nodeName"))


def scheduling_event(ev: dict) -> dict:
    """A scheduling event (signals._latest_failed_scheduling): which pod, why, when, the message."""
    meta = ev["metadata"]
    return {
        "metadata": {"name": meta["name"], "namespace": _str(meta.get("namespace"))},
        "involvedObject": {"name": (ev.get("involvedObject") or {}).get("name")},
        **{k: _str(ev[k]) for k in ("reason", "message", "lastTimestamp", "eventTime") if k in ev},
    }
