"""Kubernetes objects -> one Observation of a run. Pure: no client, no clock, no disk.

The inputs are the objects as the API serves them (plain dicts, camelCase): the run's JobSets and
Pods, every Node, and recent Events. docs/platform.md §4 lists the signals read here: DisruptionTarget
reasons, impending-termination and unreachable taints, node pools vanishing, Unschedulable pods and
FailedScheduling events, JobSet conditions and counters, Kueue suspension.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace

from launcher import rfc3339
from launcher.presets import LABEL_NODEPOOL, Preset
from launcher.render import EXIT_PEER_LOST, EXIT_PREEMPTED, LABEL_RESTART_ATTEMPT, LABEL_RUN, LABEL_SEGMENT

# Node taints that mean "this node is going away or cannot be trusted".
BAD_TAINTS = {
    "cloud.google.com/impending-node-termination",
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unschedulable",
    "ToBeDeletedByClusterAutoscaler",
}


def _conditions(obj: dict) -> dict[str, dict]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def _true(obj: dict, ctype: str) -> dict | None:
    cond = _conditions(obj).get(ctype)
    return cond if cond and cond.get("status") == "True" else None


# --- nodes and capacity ------------------------------------------------------------------------


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
    ready = _conditions(node).get("Ready")
    if ready is None or ready.get("status") != "True":
        return "NotReady"
    return None


def node_healthy(node: dict) -> bool:
    return node_problem(node) is None


def node_since(node: dict) -> float:
    """When the node became usable: created, or last turned Ready, whichever is later."""
    created = rfc3339.seconds(node["metadata"].get("creationTimestamp")) or 0.0
    ready = rfc3339.seconds((_conditions(node).get("Ready") or {}).get("lastTransitionTime")) or 0.0
    return max(created, ready)


@dataclass(frozen=True)
class NodePool:
    name: str
    labels: dict[str, str]
    nodes: int
    healthy: int
    since: float  # when the last of its nodes became usable
    busy: bool  # occupied by live pods that are not this run's

    def whole_slice_of(self, preset: Preset) -> bool:
        sel = preset.node_selector()
        return all(self.labels.get(k) == v for k, v in sel.items()) and self.healthy == preset.hosts


class _Memo:
    """What a function made of an object, by the object's uid and resourceVersion: the API never
    serves two different objects under one pair, so a pass at 3,072 pods re-reads only those that
    changed since the last (as client-go's indexers spare the reconcilers). Objects without a
    version (tables in tests) are computed every time. Bounded: cleared when full."""

    def __init__(self, fn, most: int = 100_000) -> None:
        self._fn, self._most, self._got = fn, most, {}

    def __call__(self, obj: dict):
        meta = obj["metadata"]
        key = (meta.get("uid"), meta.get("resourceVersion"))
        if key[1] is None:
            return self._fn(obj)
        got = self._got.get(key)
        if got is None:
            if len(self._got) >= self._most:
                self._got.clear()
            got = self._got[key] = self._fn(obj)
        return got


_node_facts = _Memo(lambda n: (node_healthy(n), node_since(n)))


def nodepools(nodes: Iterable[dict], foreign_nodes: AbstractSet[str]) -> dict[str, NodePool]:
    """Group nodes by `cloud.google.com/gke-nodepool`. `foreign_nodes`: nodes running other workloads."""
    groups: dict[str, list[dict]] = {}
    for node in nodes:
        pool = (node["metadata"].get("labels") or {}).get(LABEL_NODEPOOL)
        if pool:
            groups.setdefault(pool, []).append(node)
    pools = {}
    for name, members in groups.items():
        facts = [_node_facts(n) for n in members]
        labels = members[0]["metadata"].get("labels") or {}
        pools[name] = NodePool(
            name=name,
            labels=labels,
            nodes=len(members),
            healthy=sum(ok for ok, _ in facts),
            since=max((since for ok, since in facts if ok), default=0.0),
            busy=any(n["metadata"]["name"] in foreign_nodes for n in members),
        )
    return pools


def capacity(pools: Iterable[NodePool], presets: Iterable[Preset]) -> dict[str, tuple[float, ...]]:
    """Per preset: the `since` times of every free, healthy, whole slice, earliest first.

    A shape of n slices of preset P fits when there are at least n entries, and has fitted since
    the n-th entry.
    """
    pools = [p for p in pools if not p.busy]
    return {
        preset.name: tuple(sorted(p.since for p in pools if p.whole_slice_of(preset))) for preset in presets
    }


# --- pods --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodView:
    name: str
    segment: int | None
    attempt: int
    phase: str
    node: str | None
    deleting: bool
    unschedulable_since: float | None
    unschedulable_message: str | None
    disruption: str | None  # DisruptionTarget reason
    exit_code: int | None
    reason: str | None  # pod status reason (Terminated, NodeShutdown, Evicted...)
    exit_reason: str | None = None  # the container's: Error, OOMKilled, ContainerStatusUnknown...

    @property
    def alive(self) -> bool:
        return self.phase not in {"Succeeded", "Failed"}


def pod_view(pod: dict) -> PodView:
    meta, status = pod["metadata"], pod.get("status") or {}
    labels = meta.get("labels") or {}
    sched = _conditions(pod).get("PodScheduled")
    unsched = (
        sched if sched and sched.get("status") == "False" and sched.get("reason") == "Unschedulable" else None
    )
    disruption = _true(pod, "DisruptionTarget")
    exit_code = exit_reason = None
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term is not None:
            exit_code, exit_reason = term.get("exitCode"), term.get("reason")
    segment = labels.get(LABEL_SEGMENT)
    return PodView(
        name=meta["name"],
        segment=int(segment) if segment is not None and segment.isdigit() else None,
        attempt=int(labels.get(LABEL_RESTART_ATTEMPT, "0") or 0),
        phase=status.get("phase") or "Pending",
        node=(pod.get("spec") or {}).get("nodeName"),
        deleting=bool(meta.get("deletionTimestamp")),
        unschedulable_since=rfc3339.seconds(unsched.get("lastTransitionTime")) if unsched else None,
        unschedulable_message=unsched.get("message") if unsched else None,
        disruption=disruption.get("reason") if disruption else None,
        exit_code=exit_code,
        reason=status.get("reason"),
        exit_reason=exit_reason,
    )


_pod_view = _Memo(pod_view)


# --- why an attempt failed -----------------------------------------------------------------------

# Causes of a JobSet restart, as the failed pods of the attempt tell it.
PREEMPTION = "preemption"  # a DisruptionTarget, or the trainer saved and exited 42
PEER_LOST = "peer-lost"  # the trainer exited 43: a host of the segment died under it
APP_FAILURE = "app-failure"  # a trainer failed on its own (any other exit, no disruption)
CAUSE_WORDS = {
    PREEMPTION: "a preemption or disruption",
    PEER_LOST: f"a lost peer: a host of the segment died (trainer exit {EXIT_PEER_LOST})",
    APP_FAILURE: "an application failure",
}
# When the pods of one attempt disagree, the strongest cause wins: a crash makes its peers exit 43
# (their collectives fail), and a preempted host's peers may do the same before it saves.
_STRENGTH = {PEER_LOST: 0, PREEMPTION: 1, APP_FAILURE: 2}


def stronger(a: str | None, b: str | None) -> str | None:
    return max((c for c in (a, b) if c), key=_STRENGTH.__getitem__, default=None)


def pod_cause(v: PodView) -> str | None:
    """What a failed pod says about its attempt's failure. None when it says nothing: not failed;
    failed while being deleted (the restart's doing, not its cause: the controller has usually seen
    the cause before, as a pod fails a second or more before JobSet restarts); or a container that
    vanished with its host (ContainerStatusUnknown)."""
    if v.phase != "Failed":
        return None
    if v.disruption or v.reason in {"Terminated", "NodeShutdown"}:
        return PREEMPTION
    if v.deleting or v.exit_reason == "ContainerStatusUnknown":
        return None
    if v.exit_code == EXIT_PREEMPTED:
        return PREEMPTION
    if v.exit_code == EXIT_PEER_LOST:
        return PEER_LOST
    return APP_FAILURE


def attempt_causes(pods: Iterable[PodView]) -> dict[int, str]:
    """Per restart attempt that has failed pods in view: the strongest cause they show."""
    out: dict[int, str] = {}
    for v in pods:
        if (cause := pod_cause(v)) is not None:
            out[v.attempt] = stronger(out.get(v.attempt), cause) or cause
    return out


# --- the JobSet --------------------------------------------------------------------------------

ABSENT = "absent"
DELETING = "deleting"
PENDING = "pending"
RUNNING = "running"
RESTARTING = "restarting"
SUSPENDED = "suspended"
COMPLETED = "completed"
FAILED = "failed"


@dataclass(frozen=True)
class Failure:
    kind: str  # config-error | max-restarts | other
    reason: str
    message: str


def jobset_phase(jobset: dict | None, pods: list[PodView], expected_pods: int) -> tuple[str, Failure | None]:
    if jobset is None:
        return ABSENT, None
    if jobset["metadata"].get("deletionTimestamp"):
        return DELETING, None
    if cond := _true(jobset, "Completed"):
        return COMPLETED, None
    if cond := _true(jobset, "Failed"):
        reason = cond.get("reason", "")
        message = cond.get("message", "")
        # FailJobSet is only ever the config-error rule's action (render.failure_policies).
        kind = {"FailJobSetFailurePolicyAction": "config-error", "ReachedMaxRestarts": "max-restarts"}.get(
            reason, "other"
        )
        return FAILED, Failure(kind=kind, reason=reason, message=message)
    if (jobset.get("spec") or {}).get("suspend") or _true(jobset, "Suspended"):
        return SUSPENDED, None
    attempt = int((jobset.get("status") or {}).get("restarts") or 0)
    current = [p for p in pods if p.attempt == attempt and not p.deleting]
    stale = [p for p in pods if p.attempt < attempt or (p.deleting and p.alive)]
    if stale or any(p.phase == "Failed" for p in current):
        return RESTARTING, None
    if len(current) == expected_pods and all(p.phase == "Running" for p in current):
        return RUNNING, None
    return PENDING, None


# --- the observation ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    now: float
    segment: int | None  # the segment this observes (the record's current one)
    phase: str
    failure: Failure | None
    jobset_uid: str | None
    restarts: int
    restarts_counted: int
    pods_expected: int
    pods_running: int
    pods_pending: int
    unschedulable: int
    unschedulable_since: float | None
    unschedulable_message: str | None
    disruptions: tuple[str, ...]  # human-readable, for the ledger and the live view
    nodepools_in_use: tuple[str, ...]
    lost_nodepools: tuple[str, ...]  # pools the segment ran on that are gone or unhealthy
    capacity: dict[str, tuple[float, ...]]
    live_jobsets: tuple[str, ...]  # every JobSet of the run not being deleted
    run_pods_alive: int  # pods of any segment of the run that still exist
    last_exit_code: int | None
    committed_step: int | None
    trainer: dict | None = field(default=None)  # status.json
    # Restart attempt -> why its pods failed (attempt_causes), for those still in view.
    causes: dict[int, str] = field(default_factory=dict)
    # Of lost_nodepools: those whose nodes were deleted (not merely unhealthy): their hosts are gone.
    gone_nodepools: tuple[str, ...] = ()

    def fits(self, preset: str, slices: int) -> bool:
        return len(self.capacity.get(preset, ())) >= slices

    def fits_since(self, preset: str, slices: int) -> float | None:
        times = self.capacity.get(preset, ())
        return times[slices - 1] if len(times) >= slices else None

    def summary(self) -> dict:
        """What the ledger records; changes in it are what is worth a line."""
        return {
            "segment": self.segment,
            "phase": self.phase,
            "failure": self.failure and self.failure.__dict__,
            "restarts": self.restarts,
            "pods": f"{self.pods_running}/{self.pods_expected} running",
            "unschedulable": self.unschedulable,
            "disruptions": list(self.disruptions),
            "lost_nodepools": list(self.lost_nodepools),
            "capacity": {k: len(v) for k, v in self.capacity.items() if v},
            "pods_alive": self.run_pods_alive,
            "committed_step": self.committed_step,
        }


class _Same:
    """The last few results of `fn`, by its arguments: `small` (a tuple) compared by equality and
    the big ones (the caches' tuples of objects) by identity. The controller's caches hand out
    the same tuple until they change (launcher/informer.py), so a pass after an event on the nodes
    does not walk 3,072 pods again, and a pass over unchanged caches walks nothing. Lists (tables
    in tests, a pass that read the API) are computed every time. One entry by default: each holds
    a generation of the caches' objects alive (with two, the controller peaked at 209 MiB loaded)."""

    def __init__(self, fn, most: int = 1) -> None:
        self._fn, self._most, self._got = fn, most, []

    def __call__(self, small: tuple, *big):
        if not all(isinstance(b, tuple | frozenset) for b in big):  # a list may change in place
            return self._fn(*small, *big)
        for held_small, held_big, result in self._got:
            if held_small == small and all(a is b for a, b in zip(held_big, big, strict=True)):
                return result
        result = self._fn(*small, *big)
        self._got = [(small, big, result), *self._got[: self._most - 1]]
        return result


@dataclass(frozen=True)
class _RunPods:
    """What the run's pods alone say (a node event leaves it as it was)."""

    own: int  # pods of the run, any segment
    seg_pods: tuple[PodView, ...]  # of the segment observed
    others: frozenset[str]  # nodes that live pods of other runs in `pods` are on
    placed: tuple[str, ...]  # nodes of the segment's live pods
    pending: tuple[PodView, ...]
    unsched: tuple[PodView, ...]
    disruptions: tuple[str, ...]
    exit_codes: tuple[int, ...]
    running: int
    causes: dict[int, str]


def _run_pods(run: str, segment: int | None, pods: Sequence[dict]) -> _RunPods:
    own = [p for p in pods if (p["metadata"].get("labels") or {}).get(LABEL_RUN) == run]
    views = [_pod_view(p) for p in own]
    own_names = {p["metadata"]["name"] for p in own}
    others = frozenset(
        p["spec"]["nodeName"]
        for p in pods
        if p["metadata"]["name"] not in own_names
        and (p.get("spec") or {}).get("nodeName")
        and (p.get("status") or {}).get("phase") not in {"Succeeded", "Failed"}
    )
    seg_pods = tuple(v for v in views if v.segment == segment)
    pending = tuple(v for v in seg_pods if v.alive and not v.deleting and v.node is None)
    disruptions = [f"pod {v.name}: DisruptionTarget {v.disruption}" for v in seg_pods if v.disruption]
    disruptions += [
        f"pod {v.name}: {v.reason}" for v in seg_pods if v.reason in {"Terminated", "NodeShutdown"}
    ]
    disruptions += [
        f"pod {v.name}: peer lost (exit {EXIT_PEER_LOST})" for v in seg_pods if v.exit_code == EXIT_PEER_LOST
    ]
    return _RunPods(
        own=len(own),
        seg_pods=seg_pods,
        others=others,
        placed=tuple({v.node for v in seg_pods if v.node and v.alive}),
        pending=pending,
        unsched=tuple(v for v in pending if v.unschedulable_since is not None),
        disruptions=tuple(disruptions),
        exit_codes=tuple(v.exit_code for v in seg_pods if v.exit_code not in (None, 0)),
        running=sum(v.phase == "Running" and not v.deleting for v in seg_pods),
        causes=attempt_causes(seg_pods),
    )


@dataclass(frozen=True)
class _Nodes:
    pools: dict[str, NodePool]
    pool_of: dict[str, str | None]  # node name -> its node pool
    bad_taints: tuple[tuple[str, str], ...]  # (node, taint key) of every node with a BAD_TAINTS taint


def _nodes(nodes: Sequence[dict], foreign_nodes: AbstractSet[str]) -> _Nodes:
    pool_of = {n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get(LABEL_NODEPOOL) for n in nodes}
    bad = tuple(
        (n["metadata"]["name"], t["key"])
        for n in nodes
        for t in (n.get("spec") or {}).get("taints") or []
        if t.get("key") in BAD_TAINTS
    )
    return _Nodes(nodepools(nodes, foreign_nodes), pool_of, bad)


_run_pods_memo = _Same(_run_pods)
_nodes_memo = _Same(_nodes)


def observe(
    *,
    now: float,
    run: str,
    segment: int | None,
    segment_jobset: str | None,
    segment_nodepools: Iterable[str],
    expected_pods: int,
    jobsets: Sequence[dict],
    pods: Sequence[dict],
    nodes: Sequence[dict],
    events: Sequence[dict],
    presets: Iterable[Preset],
    foreign_nodes: AbstractSet[str] = frozenset(),
    committed_step: int | None,
    trainer: dict | None,
    slice_hosts: int = 0,
) -> Observation:
    """Build the observation of `run` whose current segment is `segment` (JobSet `segment_jobset`).
    `foreign_nodes`: nodes that live pods of other workloads (not in `pods`) are on; `slice_hosts`:
    nodes per slice of the segment (a pool with fewer has lost hosts for good)."""
    small = (
        run,
        segment,
        segment_jobset,
        tuple(segment_nodepools),
        expected_pods,
        tuple(presets),
        slice_hosts,
    )
    got = _observe_memo(small, jobsets, pods, nodes, events, foreign_nodes)
    return replace(got, now=now, committed_step=committed_step, trainer=trainer)


def _observe(
    run: str,
    segment: int | None,
    segment_jobset: str | None,
    segment_nodepools: tuple[str, ...],
    expected_pods: int,
    presets: tuple[Preset, ...],
    slice_hosts: int,
    jobsets: Sequence[dict],
    pods: Sequence[dict],
    nodes: Sequence[dict],
    events: Sequence[dict],
    foreign_nodes: AbstractSet[str],
) -> Observation:
    mine = _run_pods_memo((run, segment), pods)
    seg_pods = mine.seg_pods
    # No copy of a big set of other workloads' nodes when no other run shares the namespace.
    foreign_nodes = (mine.others | foreign_nodes) if mine.others else foreign_nodes
    by_name = {j["metadata"]["name"]: j for j in jobsets}
    jobset = by_name.get(segment_jobset) if segment_jobset else None
    phase, failure = jobset_phase(jobset, list(seg_pods), expected_pods)
    js_status = (jobset or {}).get("status") or {}

    known = _nodes_memo((), nodes, foreign_nodes)
    pools, node_pool = known.pools, known.pool_of
    in_use = sorted({pool for node in mine.placed if (pool := node_pool.get(node))})
    lost = sorted(
        name
        for name in set(segment_nodepools) | set(in_use)
        if name not in pools
        or pools[name].healthy < max(pools[name].nodes, slice_hosts)  # unhealthy, or hosts deleted
        or pools[name].healthy == 0
    )

    pending, unsched = mine.pending, mine.unsched
    message = next((v.unschedulable_message for v in unsched if v.unschedulable_message), None)
    if unsched and not message:
        message = _latest_failed_scheduling(events, {v.name for v in unsched})

    disruptions = list(mine.disruptions)
    ours = set(in_use) | set(segment_nodepools)
    disruptions += [
        f"node {name}: taint {key}" for name, key in known.bad_taints if node_pool.get(name) in ours
    ]
    disruptions += [f"node pool {name}: gone" for name in lost if name not in pools]

    exit_codes = mine.exit_codes
    return Observation(
        now=0.0,
        segment=segment,
        phase=phase,
        failure=failure,
        jobset_uid=(jobset or {}).get("metadata", {}).get("uid"),
        restarts=int(js_status.get("restarts") or 0),
        restarts_counted=int(js_status.get("restartsCountTowardsMax") or 0),
        pods_expected=expected_pods,
        pods_running=mine.running,
        pods_pending=len(pending),
        unschedulable=len(unsched),
        unschedulable_since=min((v.unschedulable_since for v in unsched), default=None),
        unschedulable_message=message,
        disruptions=tuple(sorted(set(disruptions))),
        nodepools_in_use=tuple(in_use),
        lost_nodepools=tuple(lost),
        capacity=capacity(pools.values(), presets),
        live_jobsets=tuple(
            sorted(n for n, j in by_name.items() if not j["metadata"].get("deletionTimestamp"))
        ),
        run_pods_alive=mine.own,
        last_exit_code=exit_codes[-1] if exit_codes else None,
        committed_step=None,
        trainer=None,
        causes=mine.causes,
        gone_nodepools=tuple(n for n in lost if n not in pools or pools[n].nodes < slice_hosts),
    )


_observe_memo = _Same(_observe)


def _latest_failed_scheduling(events: Sequence[dict], pod_names: set[str]) -> str | None:
    hits = [
        e
        for e in events
        if e.get("reason") in {"FailedScheduling", "NotTriggerScaleUp"}
        and (e.get("involvedObject") or {}).get("name") in pod_names
    ]
    hits.sort(key=lambda e: rfc3339.seconds(e.get("lastTimestamp") or e.get("eventTime")) or 0.0)
    return hits[-1].get("message") if hits else None
