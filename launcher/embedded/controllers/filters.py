"""The scheduler's filters and messages, pure: what kube-scheduler's default plugins decide for a pod
and a node, in their order (NodeUnschedulable, TaintToleration, NodeAffinity, NodeResourcesFit,
InterPodAffinity; a node reports its first failing filter), and the FitError text with the default
preemption plugin's post-filter message.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from launcher.core.podfit import pod_requests, quantity, tolerates
from launcher.embedded.types import objects

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


# ---- pure filters -----------------------------------------------------------------------------


def node_selector_matches(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    lbls = objects.labels(node)
    for k, v in (spec.get("nodeSelector") or {}).items():
        if lbls.get(k) != v:
            return False
    na = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not na:
        return True
    fields = {"metadata.name": objects.meta(node).get("name", "")}
    for term in na.get("nodeSelectorTerms") or []:
        exprs, fexprs = term.get("matchExpressions") or [], term.get("matchFields") or []
        if not exprs and not fexprs:
            continue  # an empty term matches no objects
        if all(objects.match_expression(lbls, e) for e in exprs) and all(
            objects.match_expression(fields, e) for e in fexprs
        ):
            return True
    return False


def untolerated_taint(pod: Mapping[str, Any], node: Mapping[str, Any]) -> dict[str, Any] | None:
    tols = (pod.get("spec") or {}).get("tolerations") or []
    for t in (node.get("spec") or {}).get("taints") or []:
        if t.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not tolerates(tols, t):
            return t
    return None


def _term_namespaces(term: Mapping[str, Any], pod_ns: str) -> set[str] | None:
    """None means every namespace (an empty namespaceSelector)."""
    if term.get("namespaceSelector") is not None:
        return None
    return set(term.get("namespaces") or [pod_ns])


def _term_matches(term: Mapping[str, Any], owner_ns: str, pod: Mapping[str, Any]) -> bool:
    nss = _term_namespaces(term, owner_ns)
    if nss is not None and (objects.meta(pod).get("namespace") or "") not in nss:
        return False
    return objects.match_label_selector(objects.labels(pod), term.get("labelSelector"))


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
        return objects.labels(self.nodes[node]).get(key) if node in self.nodes else None

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
    ns = objects.meta(pod).get("namespace") or ""
    for term in _required(pod, "podAffinity"):
        key = term.get("topologyKey") or ""
        dv = view.domain(node, key)
        if any(_term_matches(term, ns, e) for e in view.pods_in_domain(key, dv)):
            continue
        # The first pod of a group may go anywhere when nothing matches the term yet and it
        # matches its own term (upstream special case).
        anywhere = view.any_bound_match(term, ns)
        if anywhere or not _term_matches(term, ns, pod) or dv is None:
            return R_AFFINITY
    for term in _required(pod, "podAntiAffinity"):
        key = term.get("topologyKey") or ""
        dv = view.domain(node, key)
        if any(_term_matches(term, ns, e) for e in view.pods_in_domain(key, dv) if e is not pod):
            return R_ANTI_AFFINITY
    # Existing pods' anti-affinity against this pod.
    for e, n in view.anti:
        for term in _required(e, "podAntiAffinity"):
            key = term.get("topologyKey") or ""
            dv = view.domain(node, key)
            same = dv is not None and dv == view.domain(n, key)
            if same and _term_matches(term, objects.meta(e).get("namespace") or "", pod):
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
    name = objects.meta(node)["name"]
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


def pool_order(view: ClusterView) -> list[list[str]]:
    """Nodes grouped by node pool (name order) so a pass can skip whole pools at once."""
    pools: dict[str, list[str]] = {}
    for name in sorted(view.nodes):
        pools.setdefault(objects.labels(view.nodes[name]).get(objects.NODEPOOL_LABEL, ""), []).append(name)
    return [pools[k] for k in sorted(pools)]


def pool_uniform_reason(pod: Mapping[str, Any], node: Mapping[str, Any]) -> list[str] | None:
    """Reasons shared by a whole pool when its first node fails a label/taint filter that does not
    depend on the node's hostname; None when nodes must be checked one by one."""
    spec = pod.get("spec") or {}
    if objects.HOSTNAME_LABEL in json.dumps([spec.get("nodeSelector"), spec.get("affinity")]):
        return None
    if (node.get("spec") or {}).get("unschedulable"):
        return None
    t = untolerated_taint(pod, node)
    if t is not None:
        return None  # taints can differ per node (impending termination is per node)
    if not node_selector_matches(pod, node):
        return [R_SELECTOR]
    return None


def schedule_fast(
    pod: Mapping[str, Any], view: ClusterView, pools: list[list[str]]
) -> tuple[str | None, str | None]:
    """schedule_one, faster: whole pools rejected on node labels (identical within a GKE pool), and
    nodes without the chips skipped before the full filter chain. Only when nothing fits are the
    exact per-node reasons computed, for the message."""
    req = pod_requests(pod)
    tpu = req.get(objects.TPU_RESOURCE, 0.0)
    for names in pools:
        if pool_uniform_reason(pod, view.nodes[names[0]]) is not None:
            continue
        for name in names:
            if tpu and view.free(name, objects.TPU_RESOURCE) < tpu:
                continue
            if not filter_node(pod, view.nodes[name], view, req):
                return name, None
    reasons: Counter = Counter()
    for names in pools:
        uniform = pool_uniform_reason(pod, view.nodes[names[0]])
        if uniform is not None:
            for r in uniform:
                reasons[r] += len(names)
            continue
        for name in names:
            reasons.update(filter_node(pod, view.nodes[name], view, req))
    return None, fit_error(len(view.nodes), reasons)
