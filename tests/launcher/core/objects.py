"""Realistic Kubernetes objects (as the API serves them) for table-driven signal and policy tests.

Shapes follow GKE and upstream JobSet: node labels and taints, pod conditions with their reasons,
JobSet status conditions and counters (docs/platform.md §2–4).
"""

from __future__ import annotations

from launcher.adapters.preset_files import load_preset
from launcher.core import rfc3339
from launcher.core.presets import LABEL_NODEPOOL

T0 = 1_800_000_000.0


def node(
    name: str, pool: str, preset: str = "tpu7x-2x2x1", *, ready: bool = True, taints=(), since: float = T0
) -> dict:
    p = load_preset(preset)
    labels = {
        **p.node_selector(),
        LABEL_NODEPOOL: pool,
        "node.kubernetes.io/instance-type": p.machine_type,
        "kubernetes.io/hostname": name,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "creationTimestamp": rfc3339.stamp(since),
            "uid": f"uid-{name}",
        },
        "spec": {
            "taints": [{"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}]
            + [{"key": k, "effect": "NoSchedule"} for k in taints]
        },
        "status": {
            "capacity": {"google.com/tpu": str(p.chips_per_host)},
            "allocatable": {"google.com/tpu": str(p.chips_per_host)},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "Unknown",
                    "reason": "KubeletReady" if ready else "NodeStatusUnknown",
                    "lastTransitionTime": rfc3339.stamp(since),
                }
            ],
        },
    }


def pool(name: str, preset: str = "tpu7x-2x2x1", **kw) -> list[dict]:
    hosts = load_preset(preset).hosts
    return [node(f"gke-{name}-{i}", name, preset, **kw) for i in range(hosts)]


def pod(
    name: str,
    run: str = "demo",
    segment: int = 0,
    *,
    attempt: int = 0,
    phase: str = "Running",
    node_name: str | None = "gke-np-0-0",
    unschedulable_since: float | None = None,
    unschedulable_message: str = "0/4 nodes are available: 4 Insufficient google.com/tpu. preemption: 0/4 nodes are available: 4 No preemption victims found for incoming pod.",
    disruption: str | None = None,
    exit_code: int | None = None,
    reason: str | None = None,
    deleting: bool = False,
    exit_reason: str | None = None,
    last_exit_reason: str | None = None,  # lastState.terminated's (exit 137), the container waiting
) -> dict:
    conditions = []
    if unschedulable_since is not None:
        node_name = None
        phase = "Pending"
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": unschedulable_message,
                "lastTransitionTime": rfc3339.stamp(unschedulable_since),
            }
        )
    elif node_name:
        conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": rfc3339.stamp(T0)})
    if disruption:
        conditions.append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": disruption,
                "message": {
                    "TerminationByKubelet": "Pod was terminated in response to imminent node shutdown.",
                    "DeletionByPodGC": "PodGC: node no longer exists",
                    "PreemptionByScheduler": "Kubernetes Scheduler: preempting to accommodate a higher priority pod",
                }.get(disruption, disruption),
                "lastTransitionTime": rfc3339.stamp(T0),
            }
        )
    status = {"phase": phase, "conditions": conditions}
    if reason:
        status["reason"] = reason
    if last_exit_reason is not None:
        # What upstream's kubelet first writes after a reboot (kubelet_pods.go): waiting, the
        # vanished container in lastState; `state.terminated` comes later (TerminatePod).
        status["containerStatuses"] = [
            {
                "name": "trainer",
                "ready": False,
                "restartCount": 1,
                "state": {"waiting": {"reason": "ContainerCreating"}},
                "lastState": {"terminated": {"exitCode": 137, "reason": last_exit_reason}},
            }
        ]
    if exit_code is not None:
        status["containerStatuses"] = [
            {
                "name": "trainer",
                "ready": False,
                "restartCount": 0,
                "state": {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": exit_reason or ("Error" if exit_code else "Completed"),
                    }
                },
            }
        ]
    meta = {
        "name": name,
        "namespace": "default",
        "uid": f"uid-{name}",
        "labels": {
            "reslice.dev/run": run,
            "reslice.dev/segment": str(segment),
            "jobset.sigs.k8s.io/jobset-name": f"{run}-{segment}",
            "jobset.sigs.k8s.io/restart-attempt": str(attempt),
            "jobset.sigs.k8s.io/jobset-uid": f"uid-{run}-{segment}",
        },
    }
    if deleting:
        meta["deletionTimestamp"] = rfc3339.stamp(T0)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": node_name},
        "status": status,
    }


def jobset(
    name: str = "demo-0",
    run: str = "demo",
    *,
    restarts: int = 0,
    counted: int = 0,
    condition: tuple[str, str, str] | None = None,
    suspend: bool = False,
    deleting: bool = False,
) -> dict:
    conditions = []
    if condition:
        ctype, reason, message = condition
        conditions.append({"type": ctype, "status": "True", "reason": reason, "message": message})
    meta = {"name": name, "namespace": "default", "uid": f"uid-{name}", "labels": {"reslice.dev/run": run}}
    if deleting:
        meta["deletionTimestamp"] = rfc3339.stamp(T0)
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": meta,
        "spec": {"suspend": suspend},
        "status": {"restarts": restarts, "restartsCountTowardsMax": counted, "conditions": conditions},
    }


def failed_scheduling(pod_name: str, message: str, at: float) -> dict:
    return {
        "kind": "Event",
        "metadata": {"name": f"{pod_name}.1", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": pod_name, "namespace": "default"},
        "reason": "FailedScheduling",
        "type": "Warning",
        "message": message,
        "lastTimestamp": rfc3339.stamp(at),
        "source": {"component": "default-scheduler"},
    }
