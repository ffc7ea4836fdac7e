"""Nodes -> node pools and capacity: which nodes can be trusted with a slice, each node pool as
observed, and per preset the free whole slices. Pure. Called by launcher/core/signals/observation.py (the
observation) and launcher/core/capacity/pools.py (`reslice preflight`'s node rows share `node_problem`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from launcher.core import rfc3339
from launcher.core.presets import LABEL_NODEPOOL, Preset
from launcher.core.signals.basics import ByVersion, conditions

# Node taints that mean "this node is going away or cannot be trusted".
BAD_TAINTS = {
    "cloud.google.com/impending-node-termination",
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unschedulable",
    "ToBeDeletedByClusterAutoscaler",
}


def node_problem(node: dict) -> str | None:
    """Why the node cannot be trusted with a slice now, or None: the one rule the controller and
    `reslice preflight` share."""
    if node["metadata"].get("deletionTimestamp"):
        return "being deleted"
    if (node.get("spec") or {}).get("unschedulable"):
        return "cordoned"
    for t in (node.get("spec") or {}).get("taints") or []:
        if t.get("key") in BAD_TAINTS:
            return f"tainted {t['key']}"
    ready = conditions(node).get("Ready")
    if ready is None or ready.get("status") != "True":
        return "NotReady"
    return None


def node_healthy(node: dict) -> bool:
    return node_problem(node) is None


def node_since(node: dict) -> float:
    """When the node became usable: created, or last turned Ready, whichever is later."""
    created = rfc3339.seconds(node["metadata"].get("creationTimestamp")) or 0.0
    ready = rfc3339.seconds((conditions(node).get("Ready") or {}).get("lastTransitionTime")) or 0.0
    return max(created, ready)


@dataclass(frozen=True)
class PoolObservation:
    name: str
    labels: dict[str, str]
    nodes: int
    healthy: int
    since: float  # when the last of its nodes became usable
    busy: bool  # occupied by live pods that are not this run's

    def whole_slice_of(self, preset: Preset) -> bool:
        sel = preset.node_selector()
        return all(self.labels.get(k) == v for k, v in sel.items()) and self.healthy == preset.hosts


def node_facts(node: dict) -> tuple[str, str | None, bool, float, tuple[str, ...]]:
    """All a pass reads of one node: name, pool, healthy, usable since, its BAD_TAINTS keys."""
    meta = node["metadata"]
    bad = tuple(t["key"] for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") in BAD_TAINTS)
    return (
        meta["name"],
        (meta.get("labels") or {}).get(LABEL_NODEPOOL),
        node_healthy(node),
        node_since(node),
        bad,
    )


def nodepools(nodes: Sequence[dict], foreign_nodes: AbstractSet[str]) -> dict[str, PoolObservation]:
    """Group nodes by `cloud.google.com/gke-nodepool`. `foreign_nodes`: nodes running other workloads."""
    return _pools(nodes, [node_facts(n) for n in nodes], foreign_nodes)


def _pools(
    nodes: Sequence[dict], facts: list[tuple], foreign_nodes: AbstractSet[str]
) -> dict[str, PoolObservation]:
    acc: dict[str, list] = {}  # pool -> [labels, nodes, healthy, since, busy], in one walk
    for node, (name, pool, ok, since, _) in zip(nodes, facts, strict=True):
        if not pool:
            continue
        a = acc.get(pool)
        if a is None:
            a = acc[pool] = [node["metadata"].get("labels") or {}, 0, 0, 0.0, False]
        a[1] += 1
        if ok:
            a[2] += 1
            a[3] = max(a[3], since)
        a[4] = a[4] or name in foreign_nodes
    return {p: PoolObservation(p, *a) for p, a in acc.items()}


def free_slices(
    pools: Iterable[PoolObservation], presets: Iterable[Preset]
) -> dict[str, tuple[PoolObservation, ...]]:
    """Per preset: every free, healthy, whole slice, earliest usable first (then by name).

    A shape of n slices of preset P fits when there are at least n of them, and has fitted since
    the n-th one's `since` (the observation's `capacity`); a one-slice segment may name one
    (its `free_pools`).
    """
    free = sorted((p for p in pools if not p.busy), key=lambda p: (p.since, p.name))
    return {preset.name: tuple(p for p in free if p.whole_slice_of(preset)) for preset in presets}


@dataclass(frozen=True)
class NodesView:
    """What the nodes alone say (a pod event leaves it as it was)."""

    pools: dict[str, PoolObservation]
    pool_of: dict[str, str | None]  # node name -> its node pool
    bad_taints: tuple[tuple[str, str], ...]  # (node, taint key) of every node with a BAD_TAINTS taint


def nodes_view(
    nodes: Sequence[dict], foreign_nodes: AbstractSet[str], *, memo: ByVersion | None = None
) -> NodesView:
    """What the nodes say. `memo`: the caller's ByVersion(node_facts), which spares it the nodes that
    did not change since its last call (the controller's, launcher.core.signals.observation.Memos)."""
    facts_of = memo if memo is not None else node_facts
    if memo is not None:
        memo.retain(nodes)  # the facts of deleted nodes go
    facts = [facts_of(n) for n in nodes]
    pool_of = {name: pool for name, pool, *_ in facts}
    bad = tuple((f[0], key) for f in facts for key in f[4])
    return NodesView(_pools(nodes, facts, foreign_nodes), pool_of, bad)
