"""Kubernetes objects -> one Observation of a run. Pure: no client, no clock, no disk. Called by the
controller's pass (launcher/controller/loop.py); the policy (launcher/core/policy/) reads the observation and
the words it uses (the JobSet phases and the restart causes, re-exported here).

The inputs are the objects as the API serves them (plain dicts, camelCase): the run's JobSets and
Pods, every Node, and recent Events. docs/platform.md §4 lists the signals read here: DisruptionTarget
reasons, impending-termination and unreachable taints, node pools vanishing, Unschedulable pods and
FailedScheduling events, JobSet conditions and counters, Kueue suspension.
What the nodes say is launcher/core/signals/nodes.py, what the pods and the JobSet say
launcher/core/signals/pods.py; this module joins them, with the events, into the observation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from functools import partial

from launcher.core import rfc3339
from launcher.core.labels import LABEL_RUN
from launcher.core.presets import Preset
from launcher.core.signals.basics import ByVersion, SameInputs
from launcher.core.signals.nodes import free_slices, node_facts, nodes_view
from launcher.core.signals.pods import (
    CAUSE_WORDS,
    Failure,
    departed_disruptions,
    host_losses,
    jobset_phase,
    pod_view,
    run_pods,
    stronger,
)
from launcher.core.signals.slices import SliceView, run_slices
from launcher.core.words import Phase

# What the policy reads of the signals besides the Observation (the words are launcher.core.words').
__all__ = [
    "CAUSE_WORDS",
    "Failure",
    "JobSetView",
    "Observation",
    "OneJobSet",
    "SliceJobSets",
    "observe",
    "stronger",
]


@dataclass(frozen=True)
class OneJobSet:
    """What `observe` looks at in recreate (`RestartMode.RECREATE`): segment `index` is one JobSet,
    `name`, and its pods carry the segment's index."""

    index: int | None
    name: str | None


@dataclass(frozen=True)
class SliceJobSets:
    """What `observe` looks at in place (`RestartMode.IN_PLACE`): segment `index` is a world of
    slices, each its own JobSet of `hosts` pods, and the pods carry their slice, not a segment.
    `local_port`: on the embedded cluster (the run's `world_api`), a port free on the host its pods
    share with the controller, for a new world's coordinator (launcher/core/world.coordinator)."""

    index: int | None
    hosts: int
    local_port: int | None = None


@dataclass(frozen=True)
class JobSetView:
    """Recreate's view of its segment's one JobSet (empty in place, and before the JobSet exists)."""

    uid: str | None = None
    restarts: int = 0
    restarts_counted: int = 0


@dataclass(frozen=True)
class Observation:
    """One pass's observation of a run: a common part, then a view per restart mode. The common part
    is the segment's pods together (in place, every slice's: the ledger's line), the node pools and
    the capacity, and the run directory's progress. Recreate's view is its one JobSet (`jobset`);
    in place's, each slice's JobSet and pods (`slices`) and the port a world's coordinator may take
    (`local_port`). The other mode's view is empty."""

    now: float
    segment: int | None  # the segment this observes (the record's current one)
    phase: Phase
    failure: Failure | None
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
    # Per preset, the free whole slices `capacity` counts, by node pool name, in its order.
    free_pools: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # `<jobset uid>/<attempt>` of the run's restart attempts a host disruption failed, from the
    # pods in view and those deleted since the last pass (signals/pods.host_losses).
    host_losses: frozenset[str] = frozenset()
    # Recreate's view: the segment's JobSet.
    jobset: JobSetView = JobSetView()
    # In place's view: each slice's JobSet and pods (signals/slices.py), by slice id; the port for
    # a new world's coordinator on the embedded cluster (SliceJobSets.local_port).
    slices: dict[str, SliceView] = field(default_factory=dict)
    local_port: int | None = None

    def fits(self, preset: str, slices: int) -> bool:
        return len(self.capacity.get(preset, ())) >= slices

    def fits_since(self, preset: str, slices: int) -> float | None:
        times = self.capacity.get(preset, ())
        return times[slices - 1] if len(times) >= slices else None

    def summary(self) -> dict:
        """What the ledger keeps of it; changes in it are what is worth a line."""
        return {
            "segment": self.segment,
            "phase": self.phase,
            "failure": self.failure and self.failure.__dict__,
            "restarts": self.jobset.restarts,
            "pods": f"{self.pods_running}/{self.pods_expected} running",
            "unschedulable": self.unschedulable,
            "disruptions": list(self.disruptions),
            "lost_nodepools": list(self.lost_nodepools),
            "capacity": {k: len(v) for k, v in self.capacity.items() if v},
            "pods_alive": self.run_pods_alive,
            "committed_step": self.committed_step,
            **(
                {
                    "slices": {
                        s: f"{v.phase} {v.pods_running}/{v.pods_alive}"
                        for s, v in sorted(self.slices.items())
                    }
                }
                if self.slices
                else {}
            ),
        }


class Memos:
    """What a controller keeps between its passes so that a pass re-reads only what changed: the
    views of pods and the facts of nodes by resourceVersion, and the last result of each step of
    `observe` by its inputs (the caches hand out the same tuples until they change). One per
    controller (its `memos` field), never shared between two; `observe` without one computes
    everything afresh."""

    def __init__(self) -> None:
        self.pod_views = ByVersion(pod_view)
        self.node_facts = ByVersion(node_facts)
        self.run_pods = SameInputs(partial(run_pods, memo=self.pod_views))
        self.nodes = SameInputs(partial(nodes_view, memo=self.node_facts))
        # The same tuple while the cache's is unchanged: `observe` then skips a steady pass's walk
        # over the run's pods.
        self.run_jobsets = SameInputs(jobsets_of_run)
        self.observe = SameInputs(partial(_observe, memos=self))
        # An in-place run's slices (launcher/core/signals/slices.py), by the same inputs.
        self.slices = SameInputs(partial(run_slices, view=self.pod_views))


def jobsets_of_run(run: str, jobsets: Sequence[dict]) -> tuple[dict, ...]:
    return tuple(j for j in jobsets if (j["metadata"].get("labels") or {}).get(LABEL_RUN) == run)


def observe(
    *,
    now: float,
    run: str,
    of: OneJobSet | SliceJobSets,
    segment_nodepools: Iterable[str],
    expected_pods: int,
    jobsets: Sequence[dict],
    pods: Sequence[dict],
    nodes: Sequence[dict],
    events: Sequence[dict],
    presets: Iterable[Preset],
    departed_pods: Sequence[dict] = (),
    foreign_nodes: AbstractSet[str] = frozenset(),
    committed_step: int | None,
    trainer: dict | None,
    slice_hosts: int = 0,
    memos: Memos | None = None,
) -> Observation:
    """Build the observation of `run`'s current segment, as its restart mode sees it (`of`): the
    common part, then the mode's view. `foreign_nodes`: nodes that live pods of other workloads (not
    in `pods`) are on; `slice_hosts`: nodes per slice of the segment (a pool with fewer has lost
    hosts for good); `memos`: the controller's (a fresh one without)."""
    memos = memos if memos is not None else Memos()
    # In place the pods carry their slice, not a segment: the segment's pods are those without one.
    segment, segment_jobset = (of.index, of.name) if isinstance(of, OneJobSet) else (None, None)
    small = (
        run,
        segment,
        segment_jobset,
        tuple(segment_nodepools),
        expected_pods,
        tuple(presets),
        slice_hosts,
    )
    got = memos.observe(small, jobsets, pods, nodes, events, foreign_nodes)
    if gone := departed_disruptions(run, segment, departed_pods):
        got = replace(got, disruptions=tuple(sorted({*got.disruptions, *gone})))
    lost = host_losses(run, [*pods, *departed_pods])
    got = replace(got, now=now, committed_step=committed_step, trainer=trainer, host_losses=lost)
    if isinstance(of, OneJobSet):
        return got
    # Memoized by the same inputs: each of the run's pods' view recomputed every pass was most of
    # an in-place decision's time at the seeds' scale (bench.reslice_scale's epoch_decided_s).
    views = memos.slices((run, of.hosts), jobsets, pods, nodes)
    return replace(got, segment=of.index, slices=views, local_port=of.local_port)


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
    *,
    memos: Memos,
) -> Observation:
    mine = memos.run_pods((run, segment), pods)
    seg_pods = mine.seg_pods
    # No copy of a big set of other workloads' nodes when no other run shares the namespace.
    foreign_nodes = (mine.others | foreign_nodes) if mine.others else foreign_nodes
    by_name = {j["metadata"]["name"]: j for j in jobsets}
    jobset = by_name.get(segment_jobset) if segment_jobset else None
    phase, failure = jobset_phase(jobset, list(seg_pods), expected_pods)
    js_status = (jobset or {}).get("status") or {}

    known = memos.nodes((), nodes, foreign_nodes)
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
    free = free_slices(pools.values(), presets)
    return Observation(
        now=0.0,
        segment=segment,
        phase=phase,
        failure=failure,
        jobset=JobSetView(
            uid=(jobset or {}).get("metadata", {}).get("uid"),
            restarts=int(js_status.get("restarts") or 0),
            restarts_counted=int(js_status.get("restartsCountTowardsMax") or 0),
        ),
        pods_expected=expected_pods,
        pods_running=mine.running,
        pods_pending=len(pending),
        unschedulable=len(unsched),
        unschedulable_since=min((v.unschedulable_since for v in unsched), default=None),
        unschedulable_message=message,
        disruptions=tuple(sorted(set(disruptions))),
        nodepools_in_use=tuple(in_use),
        lost_nodepools=tuple(lost),
        capacity={preset: tuple(p.since for p in slices) for preset, slices in free.items()},
        free_pools={preset: tuple(p.name for p in slices) for preset, slices in free.items()},
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


def _latest_failed_scheduling(events: Sequence[dict], pod_names: set[str]) -> str | None:
    hits = [
        e
        for e in events
        if e.get("reason") in {"FailedScheduling", "NotTriggerScaleUp"}
        and (e.get("involvedObject") or {}).get("name") in pod_names
    ]
    hits.sort(key=lambda e: rfc3339.seconds(e.get("lastTimestamp") or e.get("eventTime")) or 0.0)
    return hits[-1].get("message") if hits else None
