"""What kube-controller-manager does to nodes and the pods on them: PodGC, taint-based eviction and
the node lifecycle controller's heartbeat monitor.

- PodGC (kubernetes `pkg/controller/podgc/gc_controller.go`, `gcOrphaned`): a pod bound to a node
  that no longer exists is marked `Failed` with `DisruptionTarget` (reason `DeletionByPodGC`) and
  force-deleted, whoever deleted the node. Upstream waits for its periodic sweep (plus a quarantine);
  here it acts on the node's DELETED event.
- Taint eviction (`pkg/controller/tainteviction/taint_eviction.go`): a pod on a node with a
  `NoExecute` taint it does not tolerate is deleted at once; one that tolerates every such taint
  is deleted after the smallest `tolerationSeconds` among the matching tolerations (never when
  none sets it). Before deleting, the pod gets `DisruptionTarget` with reason
  `DeletionByTaintManager`; the deletion is graceful (the pod's own grace period). A pod already
  terminating (someone else deleted it) is marked too, as upstream's `handleNodeUpdate` does.
- Heartbeats (`pkg/controller/nodelifecycle/node_lifecycle_controller.go`): a node whose kubelet
  has not posted status for `node_monitor_grace_s` (upstream `--node-monitor-grace-period`)
  gets every condition `Unknown` (reason `NodeStatusUnknown`, "Kubelet stopped posting node
  status.") and the `node.kubernetes.io/unreachable` taints (NoSchedule and NoExecute); its pods
  get `Ready: False`. The fake kubelets post no heartbeats: a node stops "heartbeating" when a
  fault partitions it (`partition`), and resumes with `heal`.

`evictions` is pure; `NodeLifecycle` reads the state, calls it and applies what it returns.
"""

from __future__ import annotations

import copy
import datetime as dt
import threading
import time
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, cast

from launcher.core import rfc3339
from launcher.core.podfit import tolerates
from launcher.embedded.controllers.runtime import ControllerLoop, EventRecorder, log
from launcher.embedded.types import objects
from launcher.embedded.types.resources import RESOURCES

UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
PODGC_MESSAGE = "PodGC: node no longer exists"
TAINT_MESSAGE = "Taint manager: deleting due to NoExecute taint"
UNKNOWN_REASON = "NodeStatusUnknown"
UNKNOWN_MESSAGE = "Kubelet stopped posting node status."
NODE_MONITOR_GRACE_S = 40.0  # upstream --node-monitor-grace-period's default (Kubernetes 1.29+)


# ---- pure pieces ------------------------------------------------------------------------------


def no_execute_taints(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("effect") == "NoExecute"]


def eviction_delay(pod: Mapping[str, Any], taints: Sequence[Mapping[str, Any]]) -> float | None:
    """Seconds after the taints until the pod is deleted: 0 when one is not tolerated, the smallest
    tolerationSeconds of the tolerations that match (upstream getMinTolerationTime), None: never."""
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    least: float | None = None
    for taint in taints:
        matching = [t for t in tolerations if tolerates([t], taint)]
        if not matching:
            return 0.0
        for t in matching:
            secs = t.get("tolerationSeconds")
            if secs is not None:
                secs = max(0.0, float(secs))
                least = secs if least is None else min(least, secs)
    return least


def evictions(
    node: Mapping[str, Any], pods: list[Mapping[str, Any]], now: dt.datetime
) -> list[tuple[str, str, float]]:
    """(namespace, name, seconds from now) for each live pod on the node a NoExecute taint evicts.
    The time counts from the newest taint's timeAdded (when the taint manager would have seen it)."""
    taints = no_execute_taints(node)
    if not taints:
        return []
    added = [rfc3339.parse(t.get("timeAdded")) for t in taints]
    since = max((a for a in added if a is not None), default=now)
    elapsed = max(0.0, (now - since).total_seconds())
    out = []
    for p in pods:
        # A pod someone else is deleting is still the taint manager's (upstream processes every pod
        # on the node and marks it, whoever deleted it first); it acts on each pod once.
        if objects.pod_terminal(p) or evicted_by_taints(p):
            continue
        delay = eviction_delay(p, taints)
        if delay is not None:
            ns, name = objects.key_of(p)
            out.append((ns, name, max(0.0, delay - elapsed)))
    return out


def evicted_by_taints(pod: Mapping[str, Any]) -> bool:
    """The taint manager already marked and deleted this pod (upstream keeps the fired work item)."""
    c = objects.get_condition(pod, "DisruptionTarget")
    return objects.pod_deleting(pod) and c is not None and c.get("reason") == "DeletionByTaintManager"


def unreachable_node(node: dict[str, Any], when: str) -> dict[str, Any]:
    """The node as the lifecycle controller leaves it once its heartbeats stopped."""
    node = copy.deepcopy(dict(node))
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("status") != "Unknown":
            c.update(
                status="Unknown", reason=UNKNOWN_REASON, message=UNKNOWN_MESSAGE, lastTransitionTime=when
            )
    spec = node.setdefault("spec", {})
    taints = [t for t in spec.get("taints") or [] if t.get("key") not in (UNREACHABLE_TAINT, NOT_READY_TAINT)]
    taints += [
        {"key": UNREACHABLE_TAINT, "effect": "NoSchedule", "timeAdded": when},
        {"key": UNREACHABLE_TAINT, "effect": "NoExecute", "timeAdded": when},
    ]
    spec["taints"] = taints
    return node


def reachable_node(node: dict[str, Any], when: str) -> dict[str, Any]:
    """The node once its kubelet posts status again: Ready, the unreachable taints gone."""
    node = copy.deepcopy(dict(node))
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("status") == "Unknown":
            ready = c.get("type") == "Ready"
            c.update(
                status="True" if ready else "False",
                reason="KubeletReady"
                if ready
                else f"KubeletHasSufficient{c['type'].removesuffix('Pressure')}",
                message="kubelet is posting ready status" if ready else "kubelet has recovered",
                lastTransitionTime=when,
                lastHeartbeatTime=when,
            )
    spec = node.setdefault("spec", {})
    spec["taints"] = [t for t in spec.get("taints") or [] if t.get("key") != UNREACHABLE_TAINT]
    return node


# ---- the controller ---------------------------------------------------------------------------


def mark_failed_by_podgc(store: Any, pod: Mapping[str, Any]) -> None:
    """PodGC's mark on a pod whose node is gone, before it force-deletes it (upstream
    markFailedAndDeletePodWithCondition): a pod not yet terminal becomes Failed with a
    DisruptionTarget condition (DeletionByPodGC). Called by `NodeLifecycle.gc_pod` and by the
    faults that delete nodes under their pods (`faults.py`: preempt, remove, repair)."""
    if objects.pod_terminal(pod):
        return
    pods = RESOURCES["pods"]
    ns, name = objects.key_of(pod)
    for _ in range(10):  # read-modify-write: the kubelet writes this pod too
        try:
            cur = store.get(pods, ns, name)
        except Exception as e:
            if getattr(e, "code", None) == 404:
                return
            raise
        if objects.pod_terminal(cur):
            return
        st = cur.setdefault("status", {})
        objects.set_condition(
            st.setdefault("conditions", []),
            "DisruptionTarget",
            "True",
            "DeletionByPodGC",
            PODGC_MESSAGE,
            probe_fields=True,
        )
        st["phase"] = "Failed"
        try:
            store.update(pods, cur, subresource="status")
            return
        except Exception as e:
            if getattr(e, "code", None) == 404:
                return
            if getattr(e, "code", None) != 409:
                raise


class NodeLifecycle(ControllerLoop):
    """PodGC, taint eviction and the heartbeat monitor, over every node of the cluster."""

    name = "node-lifecycle"

    def __init__(self, store: Any, events: Any = None, node_monitor_grace_s: float = NODE_MONITOR_GRACE_S):
        super().__init__(store, events)
        self.nodes = RESOURCES["nodes"]
        self.pods = RESOURCES["pods"]
        self.grace_s = node_monitor_grace_s
        self.recorder = EventRecorder(store, "node-controller")
        self.taint_recorder = EventRecorder(store, "taint-eviction-controller")
        self._known: set[str] = set()
        self._silent: dict[str, float] = {}  # node → monotonic time its heartbeats stopped
        self._lock = threading.Lock()

    # -- heartbeats (the faults call these) --------------------------------------------------------
    def stop_heartbeats(self, node: str) -> None:
        with self._lock:
            self._silent.setdefault(node, time.monotonic())
        self.enqueue(("hb", node), after=self.grace_s)

    def resume_heartbeats(self, node: str) -> None:
        with self._lock:
            self._silent.pop(node, None)
        self.enqueue(("hb", node))

    # -- wiring ------------------------------------------------------------------------------------
    def resync(self) -> None:
        nodes, _ = self.store.list(self.nodes)
        self._known = {objects.meta(n)["name"] for n in nodes}
        for n in self._known:
            self.enqueue(("taints", n))
        pods, _ = self.store.list(self.pods)
        for p in pods:
            node = (p.get("spec") or {}).get("nodeName")
            if node and node not in self._known:
                self.enqueue(("gc", *objects.key_of(p)))

    def keys_for(self, event: str, res: Any, obj: Mapping[str, Any]) -> list[Hashable]:
        if res.plural == "nodes":
            name = objects.meta(obj)["name"]
            if event == "DELETED":
                self._known.discard(name)
                return [("gc-node", name)]
            self._known.add(name)
            return [("taints", name)] if no_execute_taints(obj) else []
        if res.plural == "pods" and event != "DELETED":
            node = (obj.get("spec") or {}).get("nodeName")
            if node and node not in self._known:
                return [("gc", *objects.key_of(obj))]
            if node and not objects.pod_terminal(obj) and not objects.pod_deleting(obj):
                return [("taints", node)]
        return []

    def reconcile(self, key: Hashable) -> float | None:
        kind, *rest = cast("tuple[str, ...]", key)  # keys_for enqueues (kind, names...)
        if kind == "gc-node":
            pods, _ = self.store.list(self.pods, field_selector=f"spec.nodeName={rest[0]}")
            for p in pods:
                self.gc_pod(p)
            return None
        if kind == "gc":
            pod = self._get(self.pods, *rest)
            if pod is not None and self._get(self.nodes, None, pod["spec"]["nodeName"]) is None:
                self.gc_pod(pod)
            return None
        if kind == "hb":
            return self._heartbeat(rest[0])
        return self._taints(rest[0])

    def _get(self, res: Any, ns: str | None, name: str) -> dict[str, Any] | None:
        try:
            return self.store.get(res, ns, name)
        except Exception as e:
            if getattr(e, "code", None) == 404:
                return None
            raise

    def _heartbeat(self, name: str) -> float | None:
        node = self._get(self.nodes, None, name)
        if node is None:
            return None
        with self._lock:
            since = self._silent.get(name)
        when = rfc3339.stamp()
        if since is None:
            if any(t.get("key") == UNREACHABLE_TAINT for t in (node.get("spec") or {}).get("taints") or []):
                self._write_node(reachable_node(node, when))
                self.recorder.event(node, "Normal", "NodeReady", f"Node {name} status is now: NodeReady")
            return None
        left = since + self.grace_s - time.monotonic()
        if left > 0:
            return left
        if (ready := objects.get_condition(node, "Ready")) is not None and ready.get("status") == "Unknown":
            return None
        self._write_node(unreachable_node(node, when))
        self.recorder.event(node, "Normal", "NodeNotReady", f"Node {name} status is now: NodeNotReady")
        pods, _ = self.store.list(self.pods, field_selector=f"spec.nodeName={name}")
        for p in pods:  # upstream MarkPodsNotReady
            if not objects.pod_terminal(p):
                self._set_pod_conditions(p, [("Ready", "False", "NodeNotReady", "")])
        return None

    def _write_node(self, node: dict[str, Any]) -> None:
        name = objects.meta(node)["name"]
        self.store.patch(self.nodes, None, name, {"spec": {"taints": node["spec"]["taints"]}}, "merge")
        cur = self._get(self.nodes, None, name)
        if cur is not None:
            cur["status"]["conditions"] = node["status"]["conditions"]
            self.store.update(self.nodes, cur, subresource="status")

    def _taints(self, name: str) -> float | None:
        node = self._get(self.nodes, None, name)
        if node is None or not no_execute_taints(node):
            return None
        pods, _ = self.store.list(self.pods, field_selector=f"spec.nodeName={name}")
        later: list[float] = []
        for ns, pname, delay in evictions(node, pods, objects.now()):
            if delay > 0:
                later.append(delay)
                continue
            pod = self._get(self.pods, ns, pname)
            if pod is None or objects.pod_terminal(pod) or evicted_by_taints(pod):
                continue
            self.taint_recorder.event(
                pod, "Normal", "TaintManagerEviction", f"Marking for deletion Pod {ns}/{pname}"
            )
            self._set_pod_conditions(
                pod, [("DisruptionTarget", "True", "DeletionByTaintManager", TAINT_MESSAGE)]
            )
            try:
                self.store.delete(self.pods, ns, pname)
            except Exception as e:
                if getattr(e, "code", None) != 404:
                    raise
        return min(later) if later else None

    def _set_pod_conditions(self, pod: Mapping[str, Any], conds: list[tuple[str, str, str, str]]) -> None:
        ns, name = objects.key_of(pod)
        for _ in range(10):  # read-modify-write: the kubelet writes this pod too
            cur = self._get(self.pods, ns, name)
            if cur is None or objects.meta(cur).get("uid") != objects.meta(pod).get("uid"):
                return
            st = cur.setdefault("status", {})
            for ctype, status, reason, msg in conds:
                objects.set_condition(
                    st.setdefault("conditions", []), ctype, status, reason, msg, probe_fields=True
                )
            try:
                self.store.update(self.pods, cur, subresource="status")
                return
            except Exception as e:
                if getattr(e, "code", None) == 404:
                    return
                if getattr(e, "code", None) != 409:
                    raise

    def gc_pod(self, pod: Mapping[str, Any]) -> None:
        """PodGC on a pod whose node is gone: Failed with DisruptionTarget, then force-deleted."""
        ns, name = objects.key_of(pod)
        mark_failed_by_podgc(self.store, pod)
        try:
            self.store.delete(self.pods, ns, name, grace_period_seconds=0)
        except Exception as e:
            if getattr(e, "code", None) != 404:
                log.exception("podgc %s/%s", ns, name)
