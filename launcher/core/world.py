"""An in-place run's worlds: which slices take part, in what order, with which coordinator, and the
document the controller publishes for each (docs/contract.md "World (in-place restarts)"). Pure.
Called by the policy (a new segment of an in-place run is a new world) and by the controller,
which records the world in the run record before it writes the world ConfigMap.

A segment of an in-place run is one world, and its index is the world's epoch: segments are
numbered consecutively and each is recorded (compare-and-swap) before anything acts on it, so
epochs strictly increase and a restarted controller continues from the recorded one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence

from contract import world as world_doc
from launcher.core.labels import LABEL_RUN, REPLICATED_JOB, slice_jobset_name, world_configmap_name
from launcher.core.presets import Preset
from launcher.core.record import Segment
from launcher.core.signals.slices import SliceView
from launcher.core.spec import RESERVED_PORTS, RunSpec

# How often the controller refreshes the world's `heartbeat` while the world waits for slices being
# recreated (docs/contract.md "The document"): the survivors' supervisors wait past their
# RESLICE_PEER_LOST_WAIT_S while they see it change (trainer/elastic/world.py HEARTBEAT_FRESH_S).
HEARTBEAT_S = 10.0
# How many coordinator ports an in-place run cycles through, one per segment (by its epoch): a
# previous segment's coordination-service client (a child still saving) must never reach the next's.
PORTS_PER_RUN = 8


def world_slices(old: Sequence[str], surviving: Iterable[str], count: int) -> tuple[str, ...]:
    """The slices of the next world, in process order: the surviving slices of `old` in their old
    order (so the old process 0's slice stays first while it takes part: the contract's one
    ordering, docs/contract.md), then new slice ids, the smallest not in use, up to `count`.

    Ids are reused: a run's ids stay below its requested slice count, so its JobSet names stay as
    short as the launch checked. An id is only reused after the slice that had it left the world.
    """
    keep = set(surviving)
    kept = [s for s in old if s in keep][:count]
    fresh = (str(i) for i in range(count * 2 + len(old)) if str(i) not in set(old))
    new = [next(fresh) for _ in range(count - len(kept))]
    return (*kept, *new)


def epoch_port(base: int, epoch: int) -> int:
    """The coordinator port of epoch `epoch`: a different one from the previous epoch's, cycling
    through PORTS_PER_RUN ports from `base` that TPU hosts do not use (render.RESERVED_PORTS)."""
    usable: list[int] = []
    port = base
    while len(usable) < PORTS_PER_RUN and port <= 65535:
        if port not in RESERVED_PORTS:
            usable.append(port)
        port += 1
    return usable[epoch % len(usable)]


def host0(run: str, slice_id: str) -> str:
    """The stable DNS name of host 0 of a slice's JobSet (enableDNSHostnames)."""
    js = slice_jobset_name(run, slice_id)
    return f"{js}-{REPLICATED_JOB}-0-0.{js}"


def coordinator(spec: RunSpec, slices: Sequence[str], epoch: int, local_port: int | None = None) -> str:
    """Process 0 of a world. On a real cluster: host 0 of its first slice, on this epoch's port. On
    the embedded cluster (the run's pods reach the API at `world_api`, and share the controller's
    host): `127.0.0.1:<local_port>`, a port the controller found free (docs/contract.md)."""
    if spec.world_api:
        assert local_port is not None, "on the embedded cluster the controller observes a free port"
        return f"127.0.0.1:{local_port}"
    return f"{host0(spec.run, slices[0])}:{epoch_port(spec.coordinator_port, epoch)}"


def document(spec: RunSpec, preset: Preset, seg: Segment, published: float) -> dict:
    """The world of in-place segment `seg` (its epoch is its index) as the supervisors read it."""
    assert seg.slice_ids and seg.coordinator, "an in-place segment records its slices and coordinator"
    doc: dict = {
        world_doc.RUN: spec.run,
        world_doc.EPOCH: seg.index,
        world_doc.SLICES: list(seg.slice_ids),
        world_doc.HOSTS_PER_SLICE: preset.hosts,
        world_doc.COORDINATOR: seg.coordinator,
        world_doc.GLOBAL_BATCH: spec.global_batch,
        world_doc.MICRO_BATCH: seg.micro_batch,
        world_doc.GRAD_ACCUM: seg.grad_accum,
        world_doc.SEGMENT: seg.index,
        world_doc.PUBLISHED: published,
    }
    if seg.lost:
        doc[world_doc.LOST] = list(seg.lost)
    if seg.attempts:
        doc[world_doc.ATTEMPTS] = dict(zip(seg.slice_ids, seg.attempts, strict=True))
    if len(seg.slice_ids) > 1:
        host = seg.coordinator.rpartition(":")[0]
        address = host if spec.world_api else host0(spec.run, seg.slice_ids[0])
        doc[world_doc.MEGASCALE] = {
            world_doc.MEGASCALE_ADDRESS: address,
            world_doc.MEGASCALE_PORT: spec.megascale_port,
        }
    else:
        doc[world_doc.MEGASCALE] = {}
    return doc


def awaits_slices(seg: Segment, slices: Mapping[str, SliceView]) -> bool:
    """Whether the live world `seg` waits for slices of its own: one not running (JobSet restarting
    it, its replacement pods not scheduled or not started yet). Its survivors' trainers exited and
    their supervisors wait for the world that takes that slice back in."""
    return any((v := slices.get(s)) is None or not v.running for s in seg.slice_ids)


def beat(doc: dict | None, seg: Segment, slices: Mapping[str, SliceView], now: float) -> dict | None:
    """The published world document `doc` with its `heartbeat` refreshed to `now`, when one is due:
    it is `seg`'s world, `seg` waits for slices (awaits_slices), and the last beat (or the
    publication) is HEARTBEAT_S old. None otherwise. A controller that is gone stops beating, and
    the survivors end their wait (trainer/elastic/world.py `keep_waiting`)."""
    if not doc or doc.get(world_doc.EPOCH) != seg.index or not seg.live or not awaits_slices(seg, slices):
        return None
    last = doc.get(world_doc.HEARTBEAT) or doc.get(world_doc.PUBLISHED) or 0.0
    if now - float(last) < HEARTBEAT_S:
        return None
    return {**doc, world_doc.HEARTBEAT: now}


def configmap(spec: RunSpec, doc: dict | None) -> dict:
    """The world ConfigMap holding `doc`, written whole in one update (a reader never sees half).
    Without a document: the empty one `reslice launch` creates, which owns the run's world access
    (render.render_world_access) and which the controller deletes when the run ends."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": world_configmap_name(spec.run),
            "namespace": spec.namespace,
            "labels": {LABEL_RUN: spec.run},
        },
        "data": {world_doc.DATA_KEY: json.dumps(doc, sort_keys=True)} if doc is not None else {},
    }


def published(cm: dict | None) -> dict | None:
    """The world document a ConfigMap holds, or None."""
    try:
        doc = json.loads(((cm or {}).get("data") or {})[world_doc.DATA_KEY])
    except (KeyError, TypeError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def published_epoch(cm: dict | None) -> int | None:
    """The epoch a world ConfigMap holds, or None (absent, or not a world)."""
    try:
        return int(json.loads(((cm or {}).get("data") or {})[world_doc.DATA_KEY])[world_doc.EPOCH])
    except (KeyError, TypeError, ValueError):
        return None
