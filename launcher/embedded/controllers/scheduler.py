"""The scheduler: binds pending pods to nodes, or leaves them Pending with the upstream message.

The decisions are filters.py's (kube-scheduler's default filters in their order); this module is the
loop around them. JobSet's exclusive placement reaches the scheduler the way it
does on GKE: as required pod affinity / anti-affinity on the leader pod and a node-pool nodeSelector
on the followers (see job.py), so nothing here knows about JobSets.

An unschedulable pod gets `PodScheduled=False, reason=Unschedulable` and a `FailedScheduling`
event whose message is the scheduler's FitError text, e.g.
`0/4 nodes are available: 2 Insufficient google.com/tpu, 2 node(s) didn't match Pod's node
affinity/selector. preemption: 0/4 nodes are available: 2 No preemption victims found for incoming
pod, 2 Preemption is not helpful for scheduling.` Pending pods are retried when nodes or pods change,
and every RETRY_S.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Mapping
from typing import Any

from launcher.embedded.controllers.filters import ClusterView, pod_requests, pool_order, schedule_fast
from launcher.embedded.controllers.runtime import EventRecorder, log
from launcher.embedded.types import objects

RETRY_S = 30.0


def _needs_scheduling(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    return (
        not spec.get("nodeName")
        and not objects.pod_terminal(pod)
        and not objects.pod_deleting(pod)
        and (spec.get("schedulerName") or "default-scheduler") == "default-scheduler"
        and not spec.get("schedulingGates")
    )


def _signature(pod: Mapping[str, Any]) -> str | None:
    """Pods with equal signatures get equal answers within one pass (none has pod affinity)."""
    spec = pod.get("spec") or {}
    aff = spec.get("affinity") or {}
    if aff.get("podAffinity") or aff.get("podAntiAffinity"):
        return None
    return json.dumps(
        [
            objects.meta(pod).get("namespace"),
            spec.get("nodeSelector"),
            aff.get("nodeAffinity"),
            spec.get("tolerations"),
            sorted(pod_requests(pod).items()),
        ],
        sort_keys=True,
    )


class Scheduler:
    """One thread; a pass schedules every pending pod against caches kept by store events."""

    def __init__(self, store: Any, events: Any = None) -> None:
        from launcher.embedded.store.store import RESOURCES

        self.store = store
        self.events = events if events is not None else store
        self.pods_res = RESOURCES["pods"]
        self.nodes_res = RESOURCES["nodes"]
        self.recorder = EventRecorder(store, "default-scheduler")
        self._lock = threading.Lock()
        self._nodes: dict[str, dict[str, Any]] = {}
        self._pods: dict[str, dict[str, Any]] = {}  # uid → pod (pending, or bound and not terminal)
        self._last_msg: dict[str, str] = {}
        self._cv = threading.Condition()
        self._dirty = True
        self._busy = False
        self._stop = False
        self._thread: threading.Thread | None = None
        self._unsub: Any = None

    def start(self) -> None:
        self._unsub = self.events.subscribe(self._on_event)
        self.resync()
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._unsub:
            self._unsub()
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread:
            self._thread.join(timeout=10)

    def resync(self) -> None:
        nodes, _ = self.store.list(self.nodes_res)
        pods, _ = self.store.list(self.pods_res)
        with self._lock:
            self._nodes = {objects.meta(n)["name"]: n for n in nodes}
            self._pods = {objects.meta(p)["uid"]: p for p in pods if not objects.pod_terminal(p)}
        self.kick()

    def kick(self) -> None:
        with self._cv:
            self._dirty = True
            self._cv.notify_all()

    def idle(self) -> bool:
        with self._cv:
            return not self._dirty and not self._busy

    def _on_event(self, event: str, res: Any, obj: dict[str, Any]) -> None:
        if res.plural == "nodes":
            name = objects.meta(obj)["name"]
            with self._lock:
                if event == "DELETED":
                    self._nodes.pop(name, None)
                else:
                    self._nodes[name] = obj
            self.kick()
        elif res.plural == "pods":
            uid = objects.meta(obj).get("uid") or ""
            gone = event == "DELETED" or objects.pod_terminal(obj)
            with self._lock:
                was_bound = bool(((self._pods.get(uid) or {}).get("spec") or {}).get("nodeName"))
                if gone:
                    self._pods.pop(uid, None)
                    self._last_msg.pop(uid, None)
                else:
                    self._pods[uid] = obj
            # A new pending pod, or capacity freed by a pod going away.
            if (gone and was_bound) or (not gone and _needs_scheduling(obj)):
                self.kick()

    def _run(self) -> None:
        while True:
            with self._cv:
                if not self._dirty and not self._stop:
                    self._cv.wait(RETRY_S)
                if self._stop:
                    return
                self._dirty = False
                self._busy = True
            try:
                self.schedule_pass()
            except Exception:
                log.exception("scheduler pass")
                time.sleep(0.2)
                self.kick()
            finally:
                with self._cv:
                    self._busy = False

    def schedule_pass(self) -> None:
        with self._lock:
            nodes = dict(self._nodes)
            pods = list(self._pods.values())
        bound: dict[str, list[dict[str, Any]]] = {}
        pending = []
        for p in pods:
            n = (p.get("spec") or {}).get("nodeName")
            if n:
                bound.setdefault(n, []).append(p)
            elif _needs_scheduling(p):
                pending.append(p)
        if not pending:
            return
        # Queue order: priority, then creation (resourceVersion breaks same-second ties).
        pending.sort(
            key=lambda p: (
                -int((p.get("spec") or {}).get("priority") or 0),
                objects.meta(p).get("creationTimestamp") or "",
                int(objects.meta(p).get("resourceVersion") or 0),
            )
        )
        view = ClusterView(nodes=nodes, bound=bound)
        failed_sigs: dict[str, str] = {}
        pools = pool_order(view)
        for pod in pending:
            sig = _signature(pod)
            if sig is not None and sig in failed_sigs:
                self._unschedulable(pod, failed_sigs[sig])
                continue
            node, msg = schedule_fast(pod, view, pools)
            if node is None:
                if sig is not None:
                    failed_sigs[sig] = msg or ""
                self._unschedulable(pod, msg or "")
                continue
            if self._bind(pod, node):
                view.add(pod, node)

    def _bind(self, pod: Mapping[str, Any], node: str) -> bool:
        """Two writes where the pods/binding subresource makes one: spec.nodeName, then the
        PodScheduled condition — with a resourceVersion precondition, because the kubelet may
        already be writing the pod's status (a merge patch would replace its conditions)."""
        ns, name = objects.key_of(pod)
        uid = objects.meta(pod).get("uid")
        try:
            cur = self.store.patch(
                self.pods_res, ns, name, {"metadata": {"uid": uid}, "spec": {"nodeName": node}}, "merge"
            )
            for _ in range(20):
                conds = copy.deepcopy((cur.get("status") or {}).get("conditions") or [])
                objects.set_condition(conds, "PodScheduled", "True", "", "", probe_fields=True)
                for c in conds:
                    if c["type"] == "PodScheduled":
                        c.pop("reason", None)
                        c.pop("message", None)
                patch = {
                    "metadata": {"resourceVersion": objects.meta(cur)["resourceVersion"]},
                    "status": {"conditions": conds},
                }
                try:
                    self.store.patch(self.pods_res, ns, name, patch, "merge", subresource="status")
                    break
                except Exception as e:
                    if getattr(e, "code", None) != 409:
                        raise
                    cur = self.store.get(self.pods_res, ns, name)
        except Exception as e:
            if getattr(e, "code", None) not in (404, 409):
                log.exception("bind %s/%s", ns, name)
            return False
        self.recorder.event(pod, "Normal", "Scheduled", f"Successfully assigned {ns}/{name} to {node}")
        return True

    def _unschedulable(self, pod: Mapping[str, Any], msg: str) -> None:
        uid = objects.meta(pod).get("uid") or ""
        ns, name = objects.key_of(pod)
        with self._lock:
            repeat = self._last_msg.get(uid) == msg
            self._last_msg[uid] = msg
        self.recorder.event(pod, "Warning", "FailedScheduling", msg)
        if repeat:
            return
        try:
            cur = self.store.get(self.pods_res, ns, name)
            conds = list((cur.get("status") or {}).get("conditions") or [])
            if not objects.set_condition(
                conds, "PodScheduled", "False", "Unschedulable", msg, probe_fields=True
            ):
                return
            self.store.patch(
                self.pods_res,
                ns,
                name,
                {"status": {"phase": "Pending", "conditions": conds}},
                "merge",
                subresource="status",
            )
        except Exception as e:
            if getattr(e, "code", None) not in (404, 409):
                log.exception("mark unschedulable %s/%s", ns, name)
