"""The run record: a run's spec, its segments and its counters. Pure data.

Stored as JSON in the ConfigMap `reslice-<run>` (adapters/kube.py does the I/O with optimistic concurrency),
so that a restarted controller, a second `reslice watch` and the in-cluster controller all read one
truth. Every change to it goes through a compare-and-swap on the ConfigMap's resourceVersion.

The JSON carries `schema_version`. A field this reslice does not know is refused (UserError), not
dropped: a record written by a newer reslice, rewritten by an older one, would lose it silently.
Older records still load: one from before the version (none) has its retired fields dropped; versions
0 and 1 keep the knobs under `policy`, the name version 2 gave back to launcher/core/policy/'s rules.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace

from launcher.core.errors import UserError
from launcher.core.labels import jobset_name
from launcher.core.plan import Plan
from launcher.core.presets import Catalog, Shape
from launcher.core.spec import RunSpec
from launcher.core.words import Cause, EndKind, RunState

# Run states.

# 2: the knobs' key is `knobs` (was `policy`); 3: a segment's `pool`; 4: the spec's `restart_mode` and
# `world_api`, a segment's `slice_ids`, `coordinator` and `joining` (in-place runs); 5: a segment's
# `lost` (in-place runs); 6: the record's `host_disruptions`, a segment's `host_disrupted`
SCHEMA_VERSION = 6
# What records without a schema_version may hold that this reslice no longer has (section -> names).
_RETIRED_V0 = {"policy": {"preemption_budget"}}
TERMINAL = {RunState.FINISHED, RunState.FAILED, RunState.STOPPED}
# A segment's `end_kind` as records written before the words were renamed spell it (read, never
# written): "lost" is now capacity's word alone, "restart" the restart mode's.
END_KINDS_RENAMED = {"lost": EndKind.DISAPPEARED, "restart": EndKind.NEW_ATTEMPT}


@dataclass(frozen=True)
class Knobs:
    """The run's knobs: grace periods, windows and budgets (seconds / counts) that the rules of
    launcher/core/policy/ read."""

    unschedulable_grace_s: float = 120.0  # pods Pending this long = capacity is not coming
    grow_window_s: float = 300.0  # a larger shape must fit this long before growing back
    grow: bool = True
    app_failure_budget: int = 3  # failed segments (after JobSet's own maxRestarts) before giving up
    app_backoff_s: float = 30.0  # doubled after each failed segment
    max_segments: int = 999


@dataclass(frozen=True)
class Segment:
    index: int
    preset: str
    slices: int
    devices: int
    micro_batch: int
    grad_accum: int
    jobset: str
    submitted_at: float
    reason: str  # why this segment was started on this shape
    running_at: float | None = None  # first time every pod was Running
    ended_at: float | None = None
    end_reason: str | None = None
    end_kind: EndKind | None = None
    start_step: int | None = None  # committed step it resumed from
    end_step: int | None = None  # committed step when it ended
    nodepools: tuple[str, ...] = ()
    jobset_uid: str | None = None  # set once the JobSet is seen: a later absence means it was deleted
    restarts: int = 0  # JobSet restarts within the segment (status.restarts)
    restarts_counted: int = 0  # of those, counted toward maxRestarts (application failures)
    # Of the uncounted ones, those whose pods said a peer was lost (trainer exit 43), and those
    # whose pods showed a crash next to the peers' exit 43 it caused (they spend the run's budget).
    peer_lost: int = 0
    uncounted_failures: int = 0
    # Of the uncounted ones, those whose pods showed a host disruption (a peer's 43 failed the Job
    # before the rebooted host's pod did): booked in RunRecord.host_disruptions, not preemptions.
    host_disrupted: int = 0
    failing: Cause | None = None  # why the current attempt's pods are failing (signals/pods.pod_cause)
    # The node pool a one-slice segment's JobSet names (render.render_jobset), or None: JobSet's
    # exclusive placement chooses.
    pool: str | None = None
    # In-place runs (RunSpec.restart_mode): a segment is one world, published as the epoch equal to
    # its index. `slice_ids` are its slices in process order (each one JobSet, render.render_slice_jobset),
    # `coordinator` its process 0's host:port: both recorded before the world is published, so a
    # restarted controller publishes the same world, never another one under the same epoch.
    slice_ids: tuple[str, ...] = ()
    coordinator: str | None = None
    # Slices whose JobSets a grow created while this world trains on: the next world takes them in
    # once their pods run (their supervisors wait for a world that has their slice).
    joining: tuple[str, ...] = ()
    # Slices of the previous world whose hosts were gone when this world was decided (their node
    # pools deleted, or their pods replaced by pods without a node): its world says so, and the survivors' supervisors kill their trainers
    # instead of asking them to save a step that can never finish (docs/contract.md "World").
    lost: tuple[str, ...] = ()
    # The restart attempt of each of `slice_ids`' JobSets (status.restarts) when the world was
    # decided, in the same order: its world names them, and a pod of another attempt (its slice
    # restarted since: a rebooted host) waits for the next world instead of joining this one.
    attempts: tuple[int, ...] = ()

    def shape(self, catalog: Catalog) -> Shape:
        return Shape(catalog.preset(self.preset), self.slices)

    @property
    def live(self) -> bool:
        return self.ended_at is None


@dataclass(frozen=True)
class RunRecord:
    spec: RunSpec
    preset: str  # requested shape
    slices: int
    knobs: Knobs = Knobs()
    state: str = RunState.PENDING
    reason: str = "launched"
    created_at: float = 0.0
    finished_at: float | None = None
    segments: tuple[Segment, ...] = ()
    app_failures: int = 0  # failed segments plus counted restarts (and uncounted crashes), over the run
    next_submit_at: float = 0.0  # backoff after an application failure
    total_steps: int | None = None  # learned from the trainer's status.json
    # The restart attempts a host disruption failed (a host rebooted under its pod), as
    # `<jobset uid>/<attempt>`, so that each is booked once: JobSet's failure policy counts such a
    # restart toward its maxRestarts (no podFailurePolicy field tells it apart upstream:
    # docs/design.md "A rebooted host"); the controller forgives them (`forgiven`).
    host_disruptions: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.spec.run

    def requested(self, catalog: Catalog) -> Shape:
        return Shape(catalog.preset(self.preset), self.slices)

    @property
    def current(self) -> Segment | None:
        return self.segments[-1] if self.segments else None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def preemptions(self) -> int:
        return sum(
            s.restarts - s.restarts_counted - s.peer_lost - s.uncounted_failures - s.host_disrupted
            for s in self.segments
        )

    def forgiven(self, jobset_uid: str | None, counted: int, uncounted: int = 0) -> int:
        """Of `counted` restarts JobSet's failure policy counted for the JobSet `jobset_uid`, those a
        host disruption caused: never the run's failure, never its --max-restarts. `uncounted`: of
        that JobSet's host disruptions, those JobSet did not count (a peer's 43 failed the Job
        first: Segment.host_disrupted), which must not forgive a crash it did count."""
        if not jobset_uid:
            return 0
        booked = sum(k.rpartition("/")[0] == jobset_uid for k in self.host_disruptions)
        return min(counted, max(0, booked - uncounted))

    def peer_losses(self) -> int:
        return sum(s.peer_lost for s in self.segments)

    def with_segment(self, segment: Segment) -> RunRecord:
        """Replace the segment of the same index, or append the next one."""
        segs = list(self.segments)
        if segs and segs[-1].index == segment.index:
            segs[-1] = segment
        else:
            assert segment.index == len(segs), "segments are numbered consecutively"
            segs.append(segment)
        return replace(self, segments=tuple(segs))

    def to_json(self) -> str:
        return json.dumps({"schema_version": SCHEMA_VERSION, **asdict(self)}, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> RunRecord:
        raw = json.loads(text)
        name = repr(raw["spec"].get("run")) if isinstance(raw.get("spec"), dict) else "?"
        version = raw.pop("schema_version", 0)
        if not isinstance(version, int) or not 0 <= version <= SCHEMA_VERSION:
            raise UserError(
                f"run record {name}: schema_version {version!r} is not one this reslice reads"
                f" (0-{SCHEMA_VERSION}): upgrade reslice"
            )
        retired = _RETIRED_V0 if version == 0 else {}
        knobs_key = "knobs" if version >= 2 else "policy"

        def known(section: dict, cls: type, where: str) -> dict:
            names = {f.name for f in fields(cls)}
            if where == "record":  # the sections were popped: a name of one left over is not known
                names -= {"spec", "segments", "knobs"}
            # Before the version, unknown top-level fields were dropped on read: they still are.
            if version == 0 and where == "record":
                return {k: v for k, v in section.items() if k in names}
            unknown = sorted(k for k in section if k not in names and k not in retired.get(where, ()))
            if unknown:
                raise UserError(
                    f"run record {name}: unknown field(s) {', '.join(f'{where}.{k}' for k in unknown)}"
                    f" (written by a newer reslice? this one reads schema_version {SCHEMA_VERSION}):"
                    " upgrade reslice"
                )
            return {k: v for k, v in section.items() if k in names}

        spec = known(raw.pop("spec"), RunSpec, "spec")
        spec["overrides"] = tuple(spec.get("overrides", ()))
        spec["env"] = tuple(tuple(kv) for kv in spec.get("env", ()))
        spec["placement_policies"] = tuple(tuple(kv) for kv in spec.get("placement_policies", ()))
        segments = tuple(
            Segment(
                **{
                    **seg,
                    "nodepools": tuple(seg.get("nodepools", ())),
                    "slice_ids": tuple(str(s) for s in seg.get("slice_ids", ())),
                    "joining": tuple(str(s) for s in seg.get("joining", ())),
                    "lost": tuple(str(s) for s in seg.get("lost", ())),
                    "attempts": tuple(int(a) for a in seg.get("attempts", ())),
                    "end_kind": END_KINDS_RENAMED.get(kind, kind) if (kind := seg.get("end_kind")) else kind,
                }
            )
            for seg in (known(s, Segment, "segments") for s in raw.pop("segments", []))
        )
        knobs = Knobs(**known(raw.pop(knobs_key, {}), Knobs, knobs_key))
        top = known(raw, RunRecord, "record")
        top["host_disruptions"] = tuple(str(k) for k in top.get("host_disruptions", ()))
        return RunRecord(spec=RunSpec(**spec), knobs=knobs, segments=segments, **top)


def new_segment(
    record: RunRecord,
    shape: Shape,
    plan: Plan,
    now: float,
    reason: str,
    start_step: int | None,
    pool: str | None = None,
) -> Segment:
    index = len(record.segments)
    return Segment(
        index=index,
        preset=shape.preset.name,
        slices=shape.slices,
        devices=shape.devices,
        micro_batch=plan.micro_batch,
        grad_accum=plan.grad_accum,
        jobset=jobset_name(record.name, index),
        submitted_at=now,
        reason=reason,
        start_step=start_step,
        # Its pool is the segment's from the start: losing it before the pods run ends the segment.
        nodepools=(pool,) if pool else (),
        pool=pool,
    )
