"""Faults, each the sequence the real components produce on GKE:

- preempt: a spot VM's termination notice. The node gets the
  `cloud.google.com/impending-node-termination:NoSchedule` taint; the kubelet's graceful node shutdown
  marks each pod `DisruptionTarget` (reason `TerminationByKubelet`), sends SIGTERM, waits the grace
  period, SIGKILLs, and leaves the pod `Failed` with reason `Terminated`; then the VMs are gone: the
  nodes are deleted and the pods on them removed (GKE deletes pods of preempted spot nodes).
- remove: capacity vanishes without notice. The nodes are deleted; PodGC marks every pod still
  running there `Failed` with `DisruptionTarget` (reason `DeletionByPodGC`) and force-deletes it; the
  processes die with the machine (SIGKILL).
- restore: the node pool's nodes come back (same names, as a recreated instance group's do).
- kill_pod: a container killed hard (SIGKILL): exit code 137, pod `Failed`, left in the API.
- crash_host: the pod's host dies without notice (host error, kernel panic) and reboots: its
  processes are SIGKILLed, no DisruptionTarget, no graceful shutdown. By default the reboot is
  instant: the node stays Ready and its kubelet, back at once, does what upstream's does for a
  container it last saw Running and can no longer find (kubernetes/kubernetes
  pkg/kubelet/kubelet_pods.go `convertToAPIContainerStatuses` and `getPhase`, then
  pkg/kubelet/status/status_manager.go `TerminatePod`): a `restartPolicy: Never` pod turns `Failed`,
  its container's `lastState.terminated` and then `state.terminated` ContainerStatusUnknown, exit
  137, restartCount one more. With `down_s` the host stays down that long first: no heartbeats (as
  `partition`), so the node turns NotReady after the node monitor grace period and the pod is
  reported by nobody, still `Running`; at the reboot (`heal`) its kubelet reports it as above.

Node faults (one node): `drain` (kubectl drain: cordon, evict through the eviction API),
`uncordon`, `repair` (GKE auto-repair: the node deleted and recreated, PodGC fails its pods),
`partition` / `heal` (the kubelet's heartbeats stop and resume; launcher/embedded/controllers/nodelife.py).

Called by `EmbeddedCluster`'s fault methods (launcher/embedded/cluster.py), which tests call and
`reslice cluster ...` reaches through the cluster's /embedded/v1/ routes; typed against
`FaultTarget`, not the cluster, so that this module does not import it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Protocol

from launcher.core import rfc3339
from launcher.core.errors import UserError
from launcher.embedded.controllers.nodelife import UNSCHEDULABLE_TAINT, mark_failed_by_podgc
from launcher.embedded.kubelet.podstatus import SHUTDOWN_MESSAGE
from launcher.embedded.nodes import FakeNodePool, node_object
from launcher.embedded.types import objects

IMPENDING_TAINT = {"key": objects.IMPENDING_TERMINATION_TAINT, "value": "", "effect": "NoSchedule"}


class FaultTarget(Protocol):
    """What a fault acts through: the embedded cluster's store, components and node pools.
    `EmbeddedCluster` (launcher/embedded/cluster.py) is one and calls these functions with itself;
    this module does not import it, so the two are no import circle."""

    store: Any
    res: dict[str, Any]
    kubelet: Any
    nodelife: Any
    node_events: Any
    pools: dict[str, FakeNodePool]

    @property
    def node_pool_of(self) -> dict[str, str]: ...

    def pool_name(self, name: str) -> str: ...

    def mark_gone(self, pool: str, gone: bool) -> None: ...


def _pods_on(cluster: FaultTarget, node_names: set[str]) -> list[dict[str, Any]]:
    """The pods bound to these nodes, node by node from the store's index (not every pod of a
    cluster that may hold tens of thousands decoded to find a slice's)."""
    res = cluster.res["pods"]
    pods = [p for n in node_names for p in cluster.store.list(res, field_selector=f"spec.nodeName={n}")[0]]
    return sorted(pods, key=objects.key_of)


def _existing_nodes(cluster: FaultTarget, pool: str) -> list[dict[str, Any]]:
    items, _ = cluster.store.list(cluster.res["nodes"], label_selector=f"{objects.NODEPOOL_LABEL}={pool}")
    return items


def _let_requests_in() -> None:
    """Between two objects of a fault that changes hundreds: a kube-apiserver serves every request
    on its own goroutine, so one component deleting a node pool does not queue another client's
    write behind it. Here the loop released the store's lock and took it back before a request
    thread waiting for it ran (a Python lock is not fair): the controller's record PUT waited for
    most of a 768-node deletion. A zero-length sleep releases the interpreter and lets it in."""
    time.sleep(0)


def _gc_pod(cluster: FaultTarget, pod: dict[str, Any]) -> None:
    """PodGC on an orphaned pod, done at once (the fault's answer reports it gone): marked, then
    force-deleted."""
    ns, name = objects.key_of(pod)
    mark_failed_by_podgc(cluster.store, pod)
    try:
        cluster.store.delete(cluster.res["pods"], ns, name, grace_period_seconds=0)
    except Exception as e:
        if getattr(e, "code", None) != 404:
            raise


def _delete_nodes(cluster: FaultTarget, pool: str) -> list[str]:
    names = []
    for n in _existing_nodes(cluster, pool):
        name = objects.meta(n)["name"]
        try:
            cluster.store.delete(cluster.res["nodes"], None, name)
        except Exception as e:
            if getattr(e, "code", None) != 404:
                raise
        cluster.node_events.event(
            n, "Normal", "RemovingNode", f"Node {name} event: Removing Node {name} from Controller"
        )
        names.append(name)
        _let_requests_in()
    cluster.mark_gone(pool, True)
    return names


def preempt(cluster: FaultTarget, pool: str, grace_s: float = 15.0, wait: bool = True) -> dict[str, Any]:
    """The GKE spot preemption sequence on every node of `pool`. Pods get `grace_s` (capped by their
    own terminationGracePeriodSeconds) between SIGTERM and SIGKILL: GKE's kubelet gives ordinary pods
    part of a spot VM's notice (core.presets.SPOT_NOTICE_S). With wait=False it returns once the pods
    have their DisruptionTarget and SIGTERM; the grace period and node removal run behind."""
    pool = cluster.pool_name(pool)
    nodes = _existing_nodes(cluster, pool)
    if not nodes:
        raise UserError(f"node pool {pool} has no nodes (removed or preempted already?)")
    res = cluster.res["nodes"]
    for n in nodes:
        taints = [
            t
            for t in (n.get("spec") or {}).get("taints") or []
            if t.get("key") != objects.IMPENDING_TERMINATION_TAINT
        ]
        taints.append({**IMPENDING_TAINT, "timeAdded": rfc3339.stamp()})
        cluster.store.patch(res, None, objects.meta(n)["name"], {"spec": {"taints": taints}}, "merge")
    names = {objects.meta(n)["name"] for n in nodes}
    pods = [p for p in _pods_on(cluster, names) if not objects.pod_terminal(p)]
    kubelet = cluster.kubelet
    runs = {r.uid: r for r in kubelet.runs()}
    waiting = []
    for p in pods:
        uid = objects.meta(p)["uid"]
        grace = min(float(grace_s), float((p.get("spec") or {}).get("terminationGracePeriodSeconds") or 30))
        run = runs.get(uid)
        if run is None:
            continue  # never started here: PodGC takes it with the node
        kubelet.disrupt(uid, "TerminationByKubelet", SHUTDOWN_MESSAGE)
        for c in (p.get("spec") or {}).get("containers") or []:
            kubelet.recorder.event(p, "Normal", "Killing", f"Stopping container {c['name']}", host=run.node)
        kubelet.terminate(run, grace, cause="shutdown")
        waiting.append(run)

    def finish() -> None:
        deadline = time.monotonic() + float(grace_s) + 10.0
        for r in waiting:
            r.done.wait(max(0.0, deadline - time.monotonic()))
        _delete_nodes(cluster, pool)
        for p in _pods_on(cluster, names):
            _gc_pod(cluster, p)

    if wait:
        finish()
    else:
        threading.Thread(target=finish, name=f"preempt-{pool}", daemon=True).start()
    return {"nodepool": pool, "nodes": sorted(names), "pods": sorted(objects.meta(p)["name"] for p in pods)}


def remove(cluster: FaultTarget, pool: str) -> dict[str, Any]:
    """Capacity gone: nodes deleted, pods on them failed by PodGC and removed, processes killed."""
    pool = cluster.pool_name(pool)
    nodes = _existing_nodes(cluster, pool)
    if not nodes:
        raise UserError(f"node pool {pool} has no nodes (removed already?)")
    names = {objects.meta(n)["name"] for n in nodes}
    pods = _pods_on(cluster, names)
    _delete_nodes(cluster, pool)
    runs = {r.uid: r for r in cluster.kubelet.runs()}
    for p in pods:
        run = runs.get(objects.meta(p)["uid"])
        if run is not None:
            run.cause = "gone"  # the machine is gone: nobody reports the exit
            cluster.kubelet.kill(run.uid)
        _gc_pod(cluster, p)
        _let_requests_in()
    return {"nodepool": pool, "nodes": sorted(names), "pods": sorted(objects.meta(p)["name"] for p in pods)}


def restore(cluster: FaultTarget, pool: str) -> dict[str, Any]:
    """Recreate the node pool's nodes (Ready, untainted)."""
    pool = cluster.pool_name(pool)
    np = cluster.pools[pool]
    existing = {objects.meta(n)["name"] for n in _existing_nodes(cluster, pool)}
    created = []
    for i in range(np.shape.hosts):
        node = node_object(np, i)
        name = objects.meta(node)["name"]
        if name in existing:
            continue
        made = cluster.store.create(cluster.res["nodes"], node)
        cluster.node_events.event(
            made, "Normal", "RegisteredNode", f"Node {name} event: Registered Node {name} in Controller"
        )
        created.append(name)
    cluster.mark_gone(pool, False)
    return {"nodepool": pool, "nodes": created}


def _pod(cluster: FaultTarget, namespace: str, name: str) -> dict[str, Any]:
    try:
        return cluster.store.get(cluster.res["pods"], namespace, name)
    except Exception as e:
        if getattr(e, "code", None) == 404:
            raise UserError(f"pod {namespace}/{name} not found") from None
        raise


def kill_pod(cluster: FaultTarget, namespace: str, name: str) -> dict[str, Any]:
    """SIGKILL the pod's containers: it ends Failed with exit code 137."""
    uid = objects.meta(_pod(cluster, namespace, name))["uid"]
    run = next((r for r in cluster.kubelet.runs() if r.uid == uid), None)
    if run is None or not cluster.kubelet.kill(uid):
        raise UserError(f"pod {namespace}/{name} is not running")
    run.done.wait(10)
    return {"pod": f"{namespace}/{name}", "exitCode": 137}


def crash_host(cluster: FaultTarget, namespace: str, name: str, down_s: float = 0.0) -> dict[str, Any]:
    """The host of a running pod crashes and reboots (module doc). With `down_s` > 0 the host stays
    down that long before its reboot: its kubelet died with it, so the node's heartbeats stop
    (NotReady after the node monitor grace period, as `partition`) and nothing reports the pod until
    the host is back (`heal`)."""
    pod = _pod(cluster, namespace, name)
    uid = objects.meta(pod)["uid"]
    node = (pod.get("spec") or {}).get("nodeName") or ""
    run = next((r for r in cluster.kubelet.runs() if r.uid == uid), None)
    if run is None or run.done.is_set():
        raise UserError(f"pod {namespace}/{name} is not running")
    down = down_s > 0 and bool(node)
    if down:
        partition(cluster, node)  # first: the kubelet must not report the pod before the reboot
    if not cluster.kubelet.crash(uid):
        if down:
            heal(cluster, node)
        raise UserError(f"pod {namespace}/{name} is not running")
    run.done.wait(10)
    if down:

        def reboot() -> None:
            with contextlib.suppress(Exception):  # the cluster may have been closed meanwhile
                heal(cluster, node)

        timer = threading.Timer(down_s, reboot)
        timer.daemon = True
        timer.start()
    return {"pod": f"{namespace}/{name}", "node": node, "down_s": down_s}


# ---- node faults (one node, as GKE's upgrades, auto-repair and network faults hit them) --------


def _node(cluster: FaultTarget, name: str) -> dict[str, Any]:
    try:
        return cluster.store.get(cluster.res["nodes"], None, name)
    except Exception as e:
        if getattr(e, "code", None) == 404:
            raise UserError(f"node {name} not found") from None
        raise


def _known_node(cluster: FaultTarget, name: str) -> str:
    if name not in cluster.node_pool_of:
        raise UserError(f"unknown node {name!r}")
    return name


def drain(cluster: FaultTarget, node: str, timeout_s: float = 60.0, wait: bool = True) -> dict[str, Any]:
    """`kubectl drain`: cordon the node, then evict each of its pods through the eviction API,
    retrying refusals by a PodDisruptionBudget every second until `timeout_s`; with `wait`, until
    the evicted pods are gone."""
    from launcher.embedded.api import eviction

    cur = _node(cluster, node)
    taints = [t for t in (cur.get("spec") or {}).get("taints") or [] if t.get("key") != UNSCHEDULABLE_TAINT]
    taints.append({"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule", "timeAdded": rfc3339.stamp()})
    cluster.store.patch(
        cluster.res["nodes"], None, node, {"spec": {"unschedulable": True, "taints": taints}}, "merge"
    )
    cluster.node_events.event(
        cur, "Normal", "NodeNotSchedulable", f"Node {node} status is now: NodeNotSchedulable"
    )
    deadline = time.monotonic() + timeout_s
    evicted: list[str] = []
    pending = [p for p in _pods_on(cluster, {node}) if not objects.pod_terminal(p)]
    while pending:
        refused = []
        for p in pending:
            ns, name = objects.key_of(p)
            try:
                eviction.evict(cluster.store, ns, name, {"kind": "Eviction", "metadata": {"name": name}})
                evicted.append(name)
            except Exception as e:
                if getattr(e, "code", None) == 429:
                    refused.append(p)
                elif getattr(e, "code", None) != 404:
                    raise
        pending = refused
        if pending:
            if time.monotonic() > deadline:
                raise UserError(
                    f"drain {node}: a disruption budget still refuses {', '.join(objects.meta(p)['name'] for p in pending)}"
                )
            time.sleep(1.0)
    while wait and _pods_on(cluster, {node}) and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"node": node, "evicted": sorted(evicted)}


def uncordon(cluster: FaultTarget, node: str) -> dict[str, Any]:

    cur = _node(cluster, node)
    taints = [t for t in (cur.get("spec") or {}).get("taints") or [] if t.get("key") != UNSCHEDULABLE_TAINT]
    cluster.store.patch(
        cluster.res["nodes"], None, node, {"spec": {"unschedulable": None, "taints": taints}}, "merge"
    )
    return {"node": node}


def repair(cluster: FaultTarget, node: str) -> dict[str, Any]:
    """GKE auto-repair of a broken node: the VM is deleted and recreated, with no graceful
    shutdown. The node leaves the API, PodGC fails and force-deletes its pods (DeletionByPodGC,
    the node lifecycle controller's work), their processes die; the node registers again."""
    _known_node(cluster, node)
    cur = _node(cluster, node)
    pods = [objects.meta(p)["name"] for p in _pods_on(cluster, {node})]
    cluster.store.delete(cluster.res["nodes"], None, node)
    cluster.node_events.event(
        cur, "Normal", "RemovingNode", f"Node {node} event: Removing Node {node} from Controller"
    )
    deadline = time.monotonic() + 10.0
    while _pods_on(cluster, {node}) and time.monotonic() < deadline:
        time.sleep(0.02)  # PodGC acts on the node's DELETED event
    cluster.kubelet.partitioned.discard(node)
    cluster.nodelife.resume_heartbeats(node)
    pool = cluster.pools[cluster.node_pool_of[node]]
    made = cluster.store.create(cluster.res["nodes"], node_object(pool, pool.node_names.index(node)))
    cluster.node_events.event(
        made, "Normal", "RegisteredNode", f"Node {node} event: Registered Node {node} in Controller"
    )
    return {"node": node, "pods": sorted(pods)}


def partition(cluster: FaultTarget, node: str) -> dict[str, Any]:
    """The node's kubelet loses the API server: no heartbeats, no pod status. After the node
    monitor grace period the node is NotReady with the unreachable taints and its pods follow the
    NoExecute taint (after their tolerationSeconds, admission's default when they set none);
    deleted pods stay Terminating, as no kubelet completes their deletion, until `heal` or
    `repair`."""
    _known_node(cluster, node)
    _node(cluster, node)
    cluster.kubelet.partitioned.add(node)
    cluster.nodelife.stop_heartbeats(node)
    return {"node": node, "grace_s": cluster.nodelife.grace_s}


def heal(cluster: FaultTarget, node: str) -> dict[str, Any]:
    """The partition ends: heartbeats resume (Ready, the unreachable taints removed) and the
    kubelet catches up with its pods (terminating the ones deleted meanwhile)."""
    _known_node(cluster, node)
    _node(cluster, node)
    cluster.kubelet.partitioned.discard(node)
    cluster.nodelife.resume_heartbeats(node)
    cluster.kubelet.resync()
    return {"node": node}
