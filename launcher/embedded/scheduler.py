"""The scheduler: binds pending pods to nodes, or leaves them Pending with the upstream message.

Filters run in kube-scheduler's default order and a node reports its first failing filter:
NodeUnschedulable, TaintToleration, NodeAffinity (nodeSelector + required node affinity),
NodeResourcesFit, InterPodAffinity. JobSet's exclusive placement reaches the scheduler the way it
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
import re
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from launcher.embedded import objects as o
from launcher.embedded.runtime import EventRecorder, log

RETRY_S = 30.0

# Filter failure reasons (kube-scheduler plugin messages).
R_UNSCHEDULABLE = "node(s) were unschedulable"
R_SELECTOR = "node(s) didn't match Pod's node affinity/selector"
R_AFFINITY = "node(s) didn't match pod affinity rules"
R_ANTI_AFFINITY = "node(s) didn't match pod anti-affinity rules"
R_EXISTING_ANTI = "node(s) didn't satisfy existing pods anti-affinity rules"
R_TOO_MANY_PODS = "Too many pods"

# Preemption can't help nodes that failed these (UnschedulableAndUnresolvable upstream).
UNRESOLVABLE_PREFIXES = (R_UNSCHEDULABLE, R_SELECTOR, R_AFFINITY, "node(s) had untolerated taint")


def taint_reason(taint: Mapping[str, Any]) -> str:
    return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value') or ''}}}"


_QTY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {
    "": 1,
    "m": 1e-3,
    "k": 1e3,
    "K": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def quantity(v: Any) -> float:
    """resource.Quantity → float ('500m' → 0.5, '8Gi' → 8589934592)."""
    if isinstance(v, int | float):
        return float(v)
    m = _QTY.match(str(v).strip())
    if not m or m.group(2) not in _SUFFIX:
        raise ValueError(f"bad quantity {v!r}")
    return float(m.group(1)) * _SUFFIX[m.group(2)]


def pod_requests(pod: Mapping[str, Any]) -> dict[str, float]:
    """Effective requests: per container requests, defaulting to limits (API server defaulting)."""
    req: dict[str, float] = {}
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for k, v in merged.items():
            req[k] = req.get(k, 0.0) + quantity(v)
    return req


# ---- pure filters -----------------------------------------------------------------------------


def node_selector_matches(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    lbls = o.labels(node)
    for k, v in (spec.get("nodeSelector") or {}).items():
        if lbls.get(k) != v:
            return False
    na = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not na:
        return True
    fields = {"metadata.name": o.meta(node).get("name", "")}
    for term in na.get("nodeSelectorTerms") or []:
        exprs, fexprs = term.get("matchExpressions") or [], term.get("matchFields") or []
        if not exprs and not fexprs:
            continue  # an empty term matches no objects
        if all(o.match_expression(lbls, e) for e in exprs) and all(
            o.match_expression(fields, e) for e in fexprs
        ):
            return True
    return False


def untolerated_taint(pod: Mapping[str, Any], node: Mapping[str, Any]) -> dict[str, Any] | None:
    tols = (pod.get("spec") or {}).get("tolerations") or []
    for t in (node.get("spec") or {}).get("taints") or []:
        if t.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not o.tolerates(tols, t):
            return t
    return None


def _term_namespaces(term: Mapping[str, Any], pod_ns: str) -> set[str] | None:
    """None means every namespace (an empty namespaceSelector)."""
    if term.get("namespaceSelector") is not None:
        return None
    return set(term.get("namespaces") or [pod_ns])


def _term_matches(term: Mapping[str, Any], owner_ns: str, pod: Mapping[str, Any]) -> bool:
    nss = _term_namespaces(term, owner_ns)
    if nss is not None and (o.meta(pod).get("namespace") or "") not in nss:
        return False
    return o.match_label_selector(o.labels(pod), term.get("labelSelector"))


def _required(pod: Mapping[str, Any], kind: str) -> list[dict[str, Any]]:
    aff = ((pod.get("spec") or {}).get("affinity") or {}).get(kind) or {}
    return aff.get("requiredDuringSchedulingIgnoredDuringExecution") or []


@dataclass
class ClusterView:
    """What one scheduling pass reads: nodes and the pods bound to them (non-terminal)."""

    nodes: dict[str, dict[str, Any]]
    bound: dict[str, list[dict[str, Any]]]  # node name → pods
    used: dict[str, dict[str, float]] = field(default_factory=dict)
    anti: list[tuple[dict[str, Any], str]] = field(default_factory=list)  # pods with anti-affinity
    _domains: dict[str, dict[str | None, list[dict[str, Any]]]] = field(default_factory=dict)
    _any: dict[str, bool] = field(default_factory=dict)
    _alloc: dict[str, dict[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bound, self.bound = self.bound, {}
        for n, pods in bound.items():
            for p in pods:
                self.add(p, n)

    def add(self, pod: dict[str, Any], node: str) -> None:
        self.bound.setdefault(node, []).append(pod)
        u = self.used.setdefault(node, {"pods": 0.0})
        u["pods"] = u.get("pods", 0.0) + 1
        for k, v in pod_requests(pod).items():
            u[k] = u.get(k, 0.0) + v
        if _required(pod, "podAntiAffinity"):
            self.anti.append((pod, node))
        self._any.clear()
        for key, idx in self._domains.items():
            idx.setdefault(self.domain(node, key), []).append(pod)

    def alloc(self, node: str) -> dict[str, float]:
        """The node's allocatable, parsed once per pass."""
        a = self._alloc.get(node)
        if a is None:
            raw = (self.nodes[node].get("status") or {}).get("allocatable") or {}
            a = self._alloc[node] = {k: quantity(v) for k, v in raw.items()}
        return a

    def free(self, node: str, resource: str) -> float:
        return self.alloc(node).get(resource, 0.0) - self.used.get(node, {}).get(resource, 0.0)

    def domain(self, node: str, key: str) -> str | None:
        return o.labels(self.nodes[node]).get(key) if node in self.nodes else None

    def any_bound_match(self, term: Mapping[str, Any], ns: str) -> bool:
        k = json.dumps([term, ns], sort_keys=True)
        if k not in self._any:
            self._any[k] = any(_term_matches(term, ns, e) for pods in self.bound.values() for e in pods)
        return self._any[k]

    def pods_in_domain(self, key: str, value: str | None) -> list[dict[str, Any]]:
        if value is None:
            return []
        idx = self._domains.get(key)
        if idx is None:
            idx = self._domains[key] = {}
            for n, pods in self.bound.items():
                idx.setdefault(self.domain(n, key), []).extend(pods)
        return idx.get(value, [])


def insufficient(
    pod_req: Mapping[str, float], alloc: Mapping[str, float], used: Mapping[str, float]
) -> list[str]:
    """NodeResourcesFit: every resource the node lacks (allocatable already parsed)."""
    out = []
    if used.get("pods", 0.0) + 1 > alloc.get("pods", 110.0):
        out.append(R_TOO_MANY_PODS)
    for k, v in sorted(pod_req.items()):
        if v > 0 and used.get(k, 0.0) + v > alloc.get(k, 0.0) + 1e-9:
            out.append(f"Insufficient {k}")
    return out


def inter_pod_affinity(pod: Mapping[str, Any], node: str, view: ClusterView) -> str | None:
    """InterPodAffinity filter for required terms, in upstream's order (the pod's affinity, its
    anti-affinity, then existing pods' anti-affinity); returns a failure reason or None."""
    ns = o.meta(pod).get("namespace") or ""
    for term in _required(pod, "podAffinity"):
        key = term.get("topologyKey")
        dv = view.domain(node, key)
        if any(_term_matches(term, ns, e) for e in view.pods_in_domain(key, dv)):
            continue
        # The first pod of a group may go anywhere when nothing matches the term yet and it
        # matches its own term (upstream special case).
        anywhere = view.any_bound_match(term, ns)
        if anywhere or not _term_matches(term, ns, pod) or dv is None:
            return R_AFFINITY
    for term in _required(pod, "podAntiAffinity"):
        key = term.get("topologyKey")
        dv = view.domain(node, key)
        if any(_term_matches(term, ns, e) for e in view.pods_in_domain(key, dv) if e is not pod):
            return R_ANTI_AFFINITY
    # Existing pods' anti-affinity against this pod.
    for e, n in view.anti:
        for term in _required(e, "podAntiAffinity"):
            key = term.get("topologyKey")
            dv = view.domain(node, key)
            same = dv is not None and dv == view.domain(n, key)
            if same and _term_matches(term, o.meta(e).get("namespace") or "", pod):
                return R_EXISTING_ANTI
    return None


def filter_node(
    pod: Mapping[str, Any], node: Mapping[str, Any], view: ClusterView, req: Mapping[str, float] | None = None
) -> list[str]:
    """The failure reasons of one node for one pod ([] = feasible), first failing filter only."""
    if (node.get("spec") or {}).get("unschedulable"):
        return [R_UNSCHEDULABLE]
    t = untolerated_taint(pod, node)
    if t is not None:
        return [taint_reason(t)]
    if not node_selector_matches(pod, node):
        return [R_SELECTOR]
    name = o.meta(node)["name"]
    bad = insufficient(
        req if req is not None else pod_requests(pod), view.alloc(name), view.used.get(name, {})
    )
    if bad:
        return bad
    r = inter_pod_affinity(pod, name, view)
    return [r] if r else []


def fit_error(num_nodes: int, reasons: Counter) -> str:
    """FitError.Error() plus the default preemption plugin's post-filter message."""
    if num_nodes == 0:
        return "no nodes available to schedule pods"
    hist = ", ".join(sorted(f"{v} {k}" for k, v in reasons.items()))
    msg = f"0/{num_nodes} nodes are available: {hist}."
    # Per node: preemption cannot help nodes that failed an unresolvable filter; for the rest there
    # are no lower-priority victims here (every pod runs at the same priority).
    unresolvable = sum(v for k, v in reasons.items() if k.startswith(UNRESOLVABLE_PREFIXES))
    resolvable = num_nodes - unresolvable
    parts = []
    if resolvable > 0:
        parts.append(f"{resolvable} No preemption victims found for incoming pod")
    if unresolvable > 0:
        parts.append(f"{unresolvable} Preemption is not helpful for scheduling")
    return f"{msg} preemption: 0/{num_nodes} nodes are available: {', '.join(sorted(parts))}."


def schedule_one(pod: Mapping[str, Any], view: ClusterView) -> tuple[str | None, str | None]:
    """(node name, None) or (None, FitError message). Picks the first feasible node in name order
    within the most-filled node pool, which keeps a Job's pods packed like a slice."""
    req = pod_requests(pod)
    reasons: Counter = Counter()
    for name in sorted(view.nodes):
        r = filter_node(pod, view.nodes[name], view, req)
        if not r:
            return name, None
        reasons.update(r)
    return None, fit_error(len(view.nodes), reasons)


# ---- the scheduler (I/O) ----------------------------------------------------------------------


def _needs_scheduling(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    return (
        not spec.get("nodeName")
        and not o.pod_terminal(pod)
        and not o.pod_deleting(pod)
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
            o.meta(pod).get("namespace"),
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
        from launcher.embedded.store import RESOURCES

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
            self._nodes = {o.meta(n)["name"]: n for n in nodes}
            self._pods = {o.meta(p)["uid"]: p for p in pods if not o.pod_terminal(p)}
        self.kick()

    def kick(self) -> None:
        with self._cv:
            self._dirty = True
            self._cv.notify_all()

    def idle(self) -> bool:
        with self._cv:
            return not self._dirty and not self._busy

    def _on_event(self, event: str, res: Any, obj: Mapping[str, Any]) -> None:
        if res.plural == "nodes":
            name = o.meta(obj)["name"]
            with self._lock:
                if event == "DELETED":
                    self._nodes.pop(name, None)
                else:
                    self._nodes[name] = obj  # type: ignore[assignment]
            self.kick()
        elif res.plural == "pods":
            uid = o.meta(obj).get("uid")
            gone = event == "DELETED" or o.pod_terminal(obj)
            with self._lock:
                was_bound = bool(((self._pods.get(uid) or {}).get("spec") or {}).get("nodeName"))
                if gone:
                    self._pods.pop(uid, None)
                    self._last_msg.pop(uid, None)
                else:
                    self._pods[uid] = obj  # type: ignore[assignment]
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
                o.meta(p).get("creationTimestamp") or "",
                int(o.meta(p).get("resourceVersion") or 0),
            )
        )
        view = ClusterView(nodes=nodes, bound=bound)
        failed_sigs: dict[str, str] = {}
        pool_order = _pool_order(view)
        for pod in pending:
            sig = _signature(pod)
            if sig is not None and sig in failed_sigs:
                self._unschedulable(pod, failed_sigs[sig])
                continue
            node, msg = _schedule_fast(pod, view, pool_order)
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
        ns, name = o.key_of(pod)
        uid = o.meta(pod).get("uid")
        try:
            cur = self.store.patch(
                self.pods_res, ns, name, {"metadata": {"uid": uid}, "spec": {"nodeName": node}}, "merge"
            )
            for _ in range(20):
                conds = copy.deepcopy((cur.get("status") or {}).get("conditions") or [])
                o.set_condition(conds, "PodScheduled", "True", "", "", probe_fields=True)
                for c in conds:
                    if c["type"] == "PodScheduled":
                        c.pop("reason", None)
                        c.pop("message", None)
                patch = {
                    "metadata": {"resourceVersion": o.meta(cur)["resourceVersion"]},
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
        uid = o.meta(pod).get("uid")
        ns, name = o.key_of(pod)
        with self._lock:
            repeat = self._last_msg.get(uid) == msg
            self._last_msg[uid] = msg
        self.recorder.event(pod, "Warning", "FailedScheduling", msg)
        if repeat:
            return
        try:
            cur = self.store.get(self.pods_res, ns, name)
            conds = list((cur.get("status") or {}).get("conditions") or [])
            if not o.set_condition(conds, "PodScheduled", "False", "Unschedulable", msg, probe_fields=True):
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


def _pool_order(view: ClusterView) -> list[list[str]]:
    """Nodes grouped by node pool (name order) so a pass can skip whole pools at once."""
    pools: dict[str, list[str]] = {}
    for name in sorted(view.nodes):
        pools.setdefault(o.labels(view.nodes[name]).get(o.NODEPOOL_LABEL, ""), []).append(name)
    return [pools[k] for k in sorted(pools)]


def _pool_uniform_reason(pod: Mapping[str, Any], node: Mapping[str, Any]) -> list[str] | None:
    """Reasons shared by a whole pool when its first node fails a label/taint filter that does not
    depend on the node's hostname; None when nodes must be checked one by one."""
    spec = pod.get("spec") or {}
    if "kubernetes.io/hostname" in json.dumps([spec.get("nodeSelector"), spec.get("affinity")]):
        return None
    if (node.get("spec") or {}).get("unschedulable"):
        return None
    t = untolerated_taint(pod, node)
    if t is not None:
        return None  # taints can differ per node (impending termination is per node)
    if not node_selector_matches(pod, node):
        return [R_SELECTOR]
    return None


def _schedule_fast(
    pod: Mapping[str, Any], view: ClusterView, pools: list[list[str]]
) -> tuple[str | None, str | None]:
    """schedule_one, faster: whole pools rejected on node labels (identical within a GKE pool), and
    nodes without the chips skipped before the full filter chain. Only when nothing fits are the
    exact per-node reasons computed, for the message."""
    req = pod_requests(pod)
    tpu = req.get(o.TPU_RESOURCE, 0.0)
    for names in pools:
        if _pool_uniform_reason(pod, view.nodes[names[0]]) is not None:
            continue
        for name in names:
            if tpu and view.free(name, o.TPU_RESOURCE) < tpu:
                continue
            if not filter_node(pod, view.nodes[name], view, req):
                return name, None
    reasons: Counter = Counter()
    for names in pools:
        uniform = _pool_uniform_reason(pod, view.nodes[names[0]])
        if uniform is not None:
            for r in uniform:
                reasons[r] += len(names)
            continue
        for name in names:
            reasons.update(filter_node(pod, view.nodes[name], view, req))
    return None, fit_error(len(view.nodes), reasons)
