"""What the controller reads in a pass: the sources its caches hold (server-side label and field
selectors, each object projected to the fields the signals read: launcher/adapters/projections.py), one
`Snapshot` of the namespace shared by the runs of a pass, and a run's observation from it
(`observe_run`). Called by launcher/controller/loop.py.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.adapters import projections
from launcher.adapters.informer import Cache, Source
from launcher.adapters.kube import Kube
from launcher.core.labels import LABEL_RUN
from launcher.core.policy import rules_for
from launcher.core.presets import LABEL_ACCELERATOR, LABEL_NODEPOOL, Catalog
from launcher.core.record import RunRecord
from launcher.core.signals import observation as signals
from launcher.core.spec import run_preset

# What the caches hold, filtered by the server (label and field selectors as kube-apiserver
# serves them), so that a namespace and a cluster full of other workloads cost a pass nothing:
SOURCES = {
    # Departed: a JobSet the controller created and then saw deleted is not laid over the cache
    # (Created).
    "jobsets": Source("jobsets", LABEL_RUN, departed=True),
    "pods": Source("pods", LABEL_RUN, keep=projections.run_pod, departed=True),
    # Pods of other workloads only mark nodes busy: the live, scheduled ones, a node each.
    "foreign-pods": Source(
        "pods",
        f"!{LABEL_RUN}",
        "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed",
        projections.node_taken,
        index=lambda node: node,
    ),
    # The shrink ladder only ever uses TPU node pools.
    "nodes": Source("nodes", f"{LABEL_ACCELERATOR},{LABEL_NODEPOOL}", keep=projections.tpu_node),
    # The events the signals read (signals._latest_failed_scheduling); a field selector has no OR.
    "events": Source(
        "events", None, "involvedObject.kind=Pod,reason=FailedScheduling", projections.scheduling_event
    ),
    "events-scale-up": Source(
        "events", None, "involvedObject.kind=Pod,reason=NotTriggerScaleUp", projections.scheduling_event
    ),
    "records": Source("configmaps", LABEL_RUN),
}
WATCHED = tuple(SOURCES)


@dataclass
class Snapshot:
    """One read of the namespace, shared by every run reconciled in a pass."""

    jobsets: Sequence[dict]
    pods: Sequence[dict]
    nodes: Sequence[dict]
    events: Sequence[dict]
    foreign_nodes: frozenset[str] = frozenset()  # nodes live pods of other workloads are on
    departed_pods: Sequence[dict] = ()  # the run pods' last states, of those deleted since the last pass

    @staticmethod
    def read(kube: Kube) -> Snapshot:
        """From the API (a controller whose caches do not run: `reslice launch`'s first pass)."""
        items = {name: _listed(kube, src) for name, src in SOURCES.items() if name != "records"}
        # The foreign-pods source keeps each pod's node name (its `keep`), not the pod.
        nodes: list[Any] = items["foreign-pods"]
        return Snapshot.of(items, frozenset(filter(None, nodes)))

    @staticmethod
    def of(
        items: Mapping[str, Sequence[dict]],
        foreign_nodes: frozenset[str],
        join: Callable[[Sequence[dict], Sequence[dict]], Sequence[dict]] | None = None,
        departed_pods: Sequence[dict] = (),
    ) -> Snapshot:
        failed, no_scale_up = items["events"], items["events-scale-up"]
        events = (join or EventsJoin())(failed, no_scale_up)
        return Snapshot(items["jobsets"], items["pods"], items["nodes"], events, foreign_nodes, departed_pods)


# How long a JobSet the controller created counts as existing while its cache does not show it
# (as long as client-go's controller expectations last: its ExpectationsTimeout).
CREATED_TTL_S = 300.0


@dataclass
class Created:
    """The JobSets a controller created that its cache does not show yet, by name: (the JobSet,
    when, the cache's list count then). As client-go's controller expectations: a pass right after
    a create, before the watch has delivered it (a loaded machine), must not take the JobSet for
    absent and create it again. A wrong guess costs one 409: creating is idempotent."""

    _by_name: dict[str, tuple[dict, float, int]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self._by_name)

    def add(self, jobset: dict, cache: Cache, now: float) -> None:
        self._by_name[jobset["metadata"]["name"]] = (jobset, now, cache.lists)

    def over(self, cache: Cache, now: float) -> tuple[dict, ...]:
        """The cached JobSets, and ours until the cache shows them, their deletion, or a relist
        (the list has them if they exist)."""
        cached = cache.items()
        gone = {o["metadata"].get("uid") for o in cache.take_departed()}
        for name, (js, at, lists) in list(self._by_name.items()):
            meta = js["metadata"]
            if (
                cache.get(meta["namespace"], name) is not None
                or meta.get("uid") in gone
                or cache.lists != lists
                or now - at > CREATED_TTL_S
            ):
                del self._by_name[name]
        return (*cached, *(js for js, _, _ in self._by_name.values())) if self._by_name else cached


@dataclass
class EventsJoin:
    """a + b, the same tuple again while neither changed: a pass over unchanged caches then hands
    signals.observe the very inputs of the last one (which it does not compute again). One per
    controller: a memo shared by two controllers of one process (tests, the bench) would make each
    evict the other's."""

    _last: tuple = (None, None, ())

    def __call__(self, a: Sequence[dict], b: Sequence[dict]) -> Sequence[dict]:
        if not (a and b):
            return a or b
        last = self._last  # one read: the loop's thread and a `reconcile` caller may both join
        if last[0] is a and last[1] is b:
            return last[2]
        joined = (*a, *b)
        self._last = (a, b, joined)
        return joined


def _listed(kube: Kube, src: Source) -> list[dict]:
    keep = src.keep or (lambda o: o)
    return [
        keep(o)
        for items, _ in kube.lists.list_raw(src.kind, src.label_selector, src.field_selector)
        for o in items
    ]


def observe_run(
    rec: RunRecord,
    snap: Snapshot,
    progress: tuple[int | None, dict | None],
    now: float,
    catalog: Catalog,
    memos: signals.Memos,
) -> signals.Observation:
    """The observation of `rec`'s run in `snap`, with `progress`, the run directory's committed step
    and trainer status (read by the caller before it holds the watches off: gs:// in production)."""
    seg = rec.current
    live = seg if seg is not None and seg.live else None
    shape = seg.shape(catalog) if seg else None
    index = seg.index if seg else None
    of: signals.OneJobSet | signals.SliceJobSets
    if rules_for(rec.spec).WORLD:
        hosts = shape.preset.hosts if shape else 0
        of = signals.SliceJobSets(index, hosts, _free_port() if rec.spec.world_api else None)
    else:
        of = signals.OneJobSet(index, seg.jobset if seg else None)
    return signals.observe(
        now=now,
        run=rec.name,
        of=of,
        segment_nodepools=live.nodepools if live else (),
        expected_pods=shape.hosts if shape else 0,
        slice_hosts=shape.preset.hosts if shape else 0,
        jobsets=memos.run_jobsets((rec.name,), snap.jobsets),
        pods=snap.pods,
        departed_pods=snap.departed_pods,
        foreign_nodes=snap.foreign_nodes,
        nodes=snap.nodes,
        events=snap.events,
        presets=[run_preset(rec.spec, p) for p in catalog.values()],
        committed_step=progress[0],
        trainer=progress[1],
        memos=memos,
    )


def _free_port() -> int:
    """A port free on this host now: on the embedded cluster the run's pods share it, and a new
    world's coordinator is `127.0.0.1:<port>` (docs/contract.md), chosen by the policy."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
