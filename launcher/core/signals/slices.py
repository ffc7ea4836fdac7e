"""An in-place run's slices -> what each one's JobSet and pods say (docs/contract.md "World
(in-place restarts)"): one `SliceView` per slice id the run has a JobSet or pods of. Pure. Called by
the controller's pass (launcher/controller/snapshot.observe_run), read by the policy's in-place
rules (launcher/core/policy/in_place.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from launcher.core.labels import LABEL_RUN, LABEL_SLICE
from launcher.core.presets import LABEL_NODEPOOL
from launcher.core.signals.pods import PodView, jobset_phase, pod_view
from launcher.core.words import Phase, PodPhase


@dataclass(frozen=True)
class SliceView:
    slice_id: str
    jobset: bool  # its JobSet exists and is not being deleted
    phase: Phase  # of its JobSet, as signals.pods.jobset_phase reads it
    restarts: int  # its JobSet's status.restarts
    pods_alive: int  # its pods that still exist and have not ended
    pods_running: int
    pools: tuple[str, ...]  # the node pools its live pods are on
    unschedulable: int
    unschedulable_since: float | None
    uids: tuple[str, ...] = ()  # of its live pods, sorted (the e2e compares them across worlds)
    # Its JobSet's status.restartsCountTowardsMax: the restarts its failure policy counted (crashes)
    restarts_counted: int = 0
    jobset_uid: str | None = None  # its JobSet's: a host disruption booked against it (RunRecord)
    # Its JobSet's spec.suspend: Kueue holds it (not admitted yet, or evicted: Kueue's stopJob sets
    # it and JobSet's controller suspends the Jobs, whose pods the Job controller deletes;
    # docs/gke.md "Kueue").
    suspended: bool = False

    @property
    def running(self) -> bool:
        return self.phase == Phase.RUNNING

    @property
    def admitted(self) -> bool:
        """Its JobSet exists and is not suspended: Kueue admitted it (or no queue holds it)."""
        return self.jobset and not self.suspended


def slice_views(
    run: str,
    jobsets: Sequence[dict],
    pods: Sequence[dict],
    pool_of: Mapping[str, str | None],
    hosts: int,
    view: Callable[[dict], PodView] = pod_view,
) -> dict[str, SliceView]:
    """Per slice id: what its JobSet (`<run>-s<id>`, labelled with the slice) and its pods say.
    `pool_of`: node name -> node pool; `hosts`: pods per slice; `view`: a pod's view (the
    controller's memo of them by resourceVersion: `signals.observation.Memos`)."""

    def of_run(obj: dict) -> str | None:
        labels = obj["metadata"].get("labels") or {}
        return labels.get(LABEL_SLICE) if labels.get(LABEL_RUN) == run else None

    by_slice: dict[str, tuple[list[dict], list[dict]]] = {}
    for jobset in jobsets:
        if (sid := of_run(jobset)) is not None:
            by_slice.setdefault(sid, ([], []))[0].append(jobset)
    for pod in pods:
        if (sid := of_run(pod)) is not None:
            by_slice.setdefault(sid, ([], []))[1].append(pod)
    out: dict[str, SliceView] = {}
    for sid, (sets, slice_pods) in by_slice.items():
        js = sets[0] if sets else None
        views = [view(p) for p in slice_pods]
        uids = {
            p["metadata"].get("uid") or p["metadata"]["name"]: v
            for p, v in zip(slice_pods, views, strict=True)
        }
        live = {u: v for u, v in uids.items() if v.alive and not v.deleting}
        phase, _ = jobset_phase(js, views, hosts)
        unsched = [v for v in live.values() if v.node is None and v.unschedulable_since is not None]
        out[sid] = SliceView(
            slice_id=sid,
            jobset=js is not None and not js["metadata"].get("deletionTimestamp"),
            phase=phase,
            restarts=int(((js or {}).get("status") or {}).get("restarts") or 0),
            pods_alive=len(live),
            pods_running=sum(v.phase == PodPhase.RUNNING for v in live.values()),
            pools=tuple(sorted({p for v in live.values() if v.node and (p := pool_of.get(v.node))})),
            unschedulable=len(unsched),
            unschedulable_since=min(
                (v.unschedulable_since for v in unsched if v.unschedulable_since is not None), default=None
            ),
            uids=tuple(sorted(live)),
            restarts_counted=int(((js or {}).get("status") or {}).get("restartsCountTowardsMax") or 0),
            jobset_uid=(js or {}).get("metadata", {}).get("uid"),
            suspended=bool(((js or {}).get("spec") or {}).get("suspend")),
        )
    return out


def run_slices(
    run: str,
    hosts: int,
    jobsets: Sequence[dict],
    pods: Sequence[dict],
    nodes: Sequence[dict],
    view: Callable[[dict], PodView] = pod_view,
) -> dict[str, SliceView]:
    """`slice_views` with the node pools read from `nodes`: what the controller's memo keeps by its
    inputs (`Memos.slices`), so that a pass over unchanged caches walks none of the run's pods and
    nodes again, and one after a change re-reads only the pods that changed."""
    pool_of = {n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get(LABEL_NODEPOOL) for n in nodes}
    return slice_views(run, jobsets, pods, pool_of, hosts, view)
