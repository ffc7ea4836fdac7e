"""The reconcile loop: watch -> observe -> decide -> act -> record.

Level-triggered, as Kubernetes controllers are written: watches on JobSets, Pods, Nodes, Events
and the run records keep caches (launcher/adapters/informer.py) and wake the loop (a timer resyncs it);
each pass reads the caches, never the API (launcher/controller/snapshot.py: what the caches hold, the snapshot
of a pass, a run's observation), asks the pure policy for one decision, writes the run record with
a compare-and-swap, and only then acts. Whoever loses the swap re-reads and decides again, and segment k's JobSet has a
fixed name, so a second controller or a restarted one never submits a segment twice. Each run is
owned by whoever holds its Lease; the ledger (`events.jsonl`) gets a line for every change in what
was observed and every action. Built by `reslice watch` and `launch` (launcher/cli/watch.py,
launcher/controller/launch.py), the sweep and the in-cluster controller.
"""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace

from kubernetes.utils.retry import retry_on_conflict

from contract.words import STATE_SOURCE, StateSource, read_state_source
from launcher.adapters.informer import Cache
from launcher.adapters.kube import RECORD_KEY, Conflict, Kube, record_name, record_of
from launcher.adapters.preset_files import load_catalog
from launcher.adapters.rundir import RunDir
from launcher.controller.health import LoopState
from launcher.controller.lease import Leases
from launcher.controller.snapshot import SOURCES, WATCHED, Created, EventsJoin, Snapshot, observe_run
from launcher.core import policy
from launcher.core import world as worlds
from launcher.core.accounting import jobset_attempt
from launcher.core.errors import UserError
from launcher.core.labels import (
    LABEL_RUN,
    LABEL_SEGMENT,
    LABEL_SLICE,
    slice_jobset_name,
    world_configmap_name,
)
from launcher.core.plan import run_ladder
from launcher.core.presets import Catalog
from launcher.core.record import RunRecord
from launcher.core.render import render_jobset, render_slice_jobset
from launcher.core.signals import observation as signals
from launcher.core.words import Action, LedgerKind, RunState

# The least time from one pass to the next while watch events keep coming.
COALESCE_S = 0.02
# How often a controller that has its process to itself (Controller.own_process) collects and
# freezes its heap again.
FREEZE_EVERY_S = 600.0


def _opened() -> threading.Event:
    event = threading.Event()
    event.set()
    return event


def default_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass
class PassResult:
    run: str
    decision: policy.Decision | None
    observation: signals.Observation | None
    conflict: bool = False


@dataclass
class Controller:
    kube: Kube
    identity: str = field(default_factory=default_identity)
    resync_s: float = 5.0
    lease_s: int = 15
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic  # Lease renewals: passed in so tests step it
    on_pass: Callable[[PassResult], None] | None = None
    # The presets, read once when the controller is built: a pass never reads a preset file.
    catalog: Catalog = field(default_factory=load_catalog)
    # Per run: what the ledger last recorded, so that only changes get a line.
    _last: dict[str, tuple[dict, str]] = field(default_factory=dict)
    _unusable_seen: set[str | None] = field(default_factory=set)
    _restores_seen: set[tuple] = field(default_factory=set)
    _wake: threading.Event = field(default_factory=threading.Event)
    # Set while the watches may apply events to the caches; cleared while a pass decides
    # (`_deciding`).
    _ingest: threading.Event = field(default_factory=_opened)
    # Why the loop was woken, counted: watch events per kind, and watch errors such as 410 Gone.
    wakeups: Counter = field(default_factory=Counter)
    last_error: str | None = None
    # For the health probes (time.monotonic): when the loop started and last finished a pass.
    started_at: float = field(default_factory=time.monotonic)
    turned_at: float | None = None
    pass_ok: bool = False
    # Fed by the watches while run_forever runs; empty otherwise (then a pass reads the API).
    caches: dict[str, Cache] = field(default_factory=dict)
    # Per run: (the version we replaced, the record we wrote, its version), until the cache shows
    # it: a pass right after a write must not decide on the record from before it.
    _written: dict[str, tuple[str, RunRecord, str]] = field(default_factory=dict)
    _stale: set[str] = field(default_factory=set)  # runs whose record lost a swap: GET it next
    _created: Created = field(default_factory=Created)  # JobSets created, until the cache shows them
    # When the first watch event since the last pass arrived: an action's ledger line says how
    # long the controller took from there to the record written (`woken_at`).
    _woken_at: float | None = None
    _pass_woken_at: float | None = None
    _events_join: EventsJoin = field(default_factory=EventsJoin)
    # What its passes keep of the objects that did not change (launcher.core.signals.observation).
    memos: signals.Memos = field(default_factory=signals.Memos)
    # The process is this controller alone (`reslice watch`): its GC is tuned for the latency of
    # decisions (`_tune_process`).
    own_process: bool = False
    _frozen_at: float | None = None

    def __post_init__(self) -> None:
        # The Leases of the runs it owns (launcher/controller/lease.py).
        self.leases = Leases(self.kube, self.identity, self.lease_s, self.monotonic)

    def synced(self) -> bool:
        return bool(self.caches) and all(c.synced.is_set() for c in self.caches.values())

    def snapshot(self) -> Snapshot:
        if self.synced():
            caches = self.caches
            items = {name: c.items() for name, c in caches.items() if name not in {"records", "foreign-pods"}}
            items["jobsets"] = self._created.over(caches["jobsets"], self.monotonic())
            departed = caches["pods"].take_departed()
            return Snapshot.of(items, caches["foreign-pods"].indexed(), self._events_join, departed)
        return Snapshot.read(self.kube)

    def record(self, run: str) -> tuple[RunRecord, str] | None:
        """The run record and its version: from the cache (with our own last write laid over it
        until the watch delivers it), or from the API."""
        if not self.synced() or run in self._stale:
            self._stale.discard(run)
            return self.kube.get_record(run)
        cm = self.caches["records"].get(self.kube.namespace, record_name(run))
        if cm is None:
            return None
        got = record_of(cm)
        written = self._written.get(run)
        if written is not None:
            if got[1] == written[0]:
                return written[1], written[2]
            del self._written[run]
        return got

    def live_runs(self) -> list[str]:
        """Every run of the namespace that has not ended."""
        if not self.synced():
            return [r.name for r in self.kube.records() if not r.terminal]
        recs = (
            record_of(cm) for cm in self.caches["records"].items() if RECORD_KEY in (cm.get("data") or {})
        )
        # An ended in-place run stays until its world is deleted (a controller that stopped in between).
        return [rec.name for rec, _ in recs if not rec.terminal or self._world_left(rec)]

    # --- one pass ------------------------------------------------------------------------------

    def reconcile(self, run: str, snap: Snapshot | None = None) -> PassResult:
        got = self.record(run)
        if got is None:
            return PassResult(run, None, None)
        rec, rv = got
        if rec.terminal:
            self._clean_world(rec)  # recorded as ended, then the controller stopped
            return PassResult(run, policy.Decision(Action.WAIT, f"run is {rec.state}", rec), None)
        # The run directory (gs:// in production) is read before the watches are held off: a slow
        # read there must not stall them. The record is swapped by resourceVersion, so deciding on
        # caches a little newer than it is safe.
        rundir = RunDir(rec.spec.run_dir, rec.spec.trainer)
        progress = (rundir.latest_committed_step(), rundir.status())
        with self._deciding():
            snap = snap or self.snapshot()
            obs = observe_run(rec, snap, progress, self.clock(), self.catalog, self.memos)
            ladder = run_ladder(rec.spec, rec.requested(self.catalog), self.catalog)
            decision = policy.decide(rec, obs, ladder, self.catalog)
        decided_at = time.time()  # the record's PUT follows: what the API server takes is after this

        entries = []
        summary = obs.summary()
        last_summary, last_reason = self._last.get(run, ({}, ""))
        if summary != last_summary:
            entries.append({"kind": LedgerKind.OBSERVE, **summary})
        entries += self._new_unusable(obs.trainer)
        entries += self._new_restore(run, obs.trainer)
        if decision.record != rec:
            try:
                self._written[run] = (rv, decision.record, self.kube.update_record(decision.record, rv))
            except Conflict:
                # Someone else changed the record since we read it: decide again on fresh state.
                self._written.pop(run, None)
                self._stale.add(run)
                self._log(
                    rundir, entries + [{"kind": LedgerKind.CONFLICT, "reason": "record changed; re-reading"}]
                )
                self._last[run] = (summary, last_reason)
                self._wake.set()
                return PassResult(run, decision, obs, conflict=True)
        # In place, the world goes out as soon as it is recorded, ahead of the ledger's lines: the
        # survivors' supervisors start over meanwhile. On gs:// a ledger append is three requests
        # (reload, download, upload of the whole ledger), in the way of every new segment otherwise.
        published = self._publish_recorded(decision)
        if decision.acts or decision.reason != last_reason:
            entries.append(
                {
                    "kind": LedgerKind.ACT if decision.acts else LedgerKind.WAIT,
                    "action": decision.action,
                    "reason": decision.reason,
                    "segment": decision.record.current.index if decision.record.current else None,
                    "state": decision.record.state,
                    **(
                        {"woken_at": woken, "decided_at": decided_at}
                        if decision.acts and (woken := self._pass_woken_at)
                        else {}
                    ),
                    **({"zero_grace": True} if decision.force else {}),
                    **({"wait": decision.wait} if decision.wait else {}),
                }
            )
        # The ledger gets the decision before the action: a controller that dies in between
        # leaves its intent on record, and the next one's takeover line follows it.
        self._log(rundir, entries)
        self._last[run] = (summary, decision.reason)
        where = f"{decision.action}:{decision.record.current.index if decision.record.current else '-'}"
        crash_point(f"after-record:{where}")
        try:
            self._act(decision, published)
            if not decision.acts and decision.publish and self._world_behind(decision.record):
                # Recorded, then the controller stopped; or held back until Kueue admitted its slices.
                self.publish_world(decision.record)
            elif not decision.acts:
                self._beat_world(decision.record, obs)
            if decision.record.terminal:
                self._clean_world(decision.record)
        except UserError as e:  # the cluster refused the JobSet (422): retrying cannot help
            self._fail(run, rundir, f"cannot submit: {e}")
        crash_point(f"after-act:{where}")
        result = PassResult(run, decision, obs)
        if self.on_pass:
            self.on_pass(result)
        return result

    def _publish_recorded(self, d: policy.Decision) -> bool:
        """Publish the world an in-place decision recorded (a new segment, or one whose JobSets are
        created again); True when this pass has published it (or found it published)."""
        seg = d.record.current
        if (
            not policy.rules_for(d.record.spec).WORLD
            or seg is None
            or not seg.live
            or d.action not in {Action.START_SEGMENT, Action.NEW_WORLD, Action.CREATE_JOBSET}
            or not d.publish  # a slice of it not admitted by Kueue yet: a later pass publishes it
        ):
            return False
        self.publish_world(d.record)
        return True

    def _act(self, d: policy.Decision, published: bool = False) -> None:
        """A decision's acts, in this order, whatever the run's restart mode: what the decision says
        is all there is to it (a recreate decision names its segment's one JobSet, `jobset`; an
        in-place one its slices'). The world published (in place: the record holds it already;
        `published`: `reconcile` did, before the ledger's lines), the JobSets to delete (their pods
        at once when their hosts are gone), the JobSets to create. Publishing first: the survivors
        start over as soon as possible, and leaving pods are told by the world, not by a signal
        (docs/contract.md); a controller that stops before the rest leaves it to the next pass
        (policy/in_place.py rule 3)."""
        rec = d.record
        run, spec, seg = rec.name, rec.spec, rec.current
        live = seg is not None and seg.live
        starts = d.action in {Action.START_SEGMENT, Action.NEW_WORLD, Action.CREATE_JOBSET}
        if not published and live and starts and d.publish and policy.rules_for(spec).WORLD:
            self.publish_world(rec)
        if d.jobset and d.action in {Action.END, Action.DELETE}:
            self.kube.delete_jobset(d.jobset)
            if d.force and seg is not None:
                self.kube.delete_pods_now(f"{LABEL_RUN}={run},{LABEL_SEGMENT}={seg.index}")
        for sid in d.slices_delete:
            self.kube.delete_jobset(slice_jobset_name(run, sid))
            if d.force:
                self.kube.delete_pods_now(f"{LABEL_RUN}={run},{LABEL_SLICE}={sid}")
        if not live or seg is None:  # `live` implies a segment; the checker cannot tell
            return
        if d.jobset and d.action in {Action.START_SEGMENT, Action.CREATE_JOBSET}:
            self._created_jobset(render_jobset(spec, seg.shape(self.catalog), seg.index, seg.pool))
        preset = self.catalog.preset(seg.preset)
        for sid in d.slices_create:
            self._created_jobset(render_slice_jobset(spec, preset, sid))

    def _created_jobset(self, jobset: dict) -> None:
        """Create `jobset`, and hold it in the JobSets the next pass sees until the watch shows it."""
        created = self.kube.create_jobset(jobset)
        if created is not None and (cache := self.caches.get("jobsets")) is not None:
            created["metadata"].setdefault("namespace", self.kube.namespace)
            self._created.add(created, cache, self.monotonic())

    def _world_left(self, rec: RunRecord) -> bool:
        """Whether an ended in-place run's world ConfigMap may still exist: from the cache when it
        runs, else say so (deleting an absent one is a 404, nothing more)."""
        if not policy.rules_for(rec.spec).WORLD:
            return False
        if not self.synced():
            return True
        return self.caches["records"].get(self.kube.namespace, world_configmap_name(rec.name)) is not None

    def _clean_world(self, rec: RunRecord) -> None:
        """An ended in-place run: delete its world ConfigMap; its ServiceAccount, Role and
        RoleBinding are owned by it (`reslice launch`), so the garbage collector deletes them. What a
        recreate run leaves is its record (the history `reslice status` reads) and, for
        ttlSecondsAfterFinished, its JobSet: the world is neither."""
        if self._world_left(rec):
            self.kube.delete_world(world_configmap_name(rec.name))

    def _world_behind(self, rec: RunRecord) -> bool:
        """Whether an in-place run's world ConfigMap may hold an older epoch than its live segment:
        from the cache when it runs (no request), else say so (publish_world reads it)."""
        seg = rec.current
        if not policy.rules_for(rec.spec).WORLD or seg is None or not seg.live:
            return False
        if not self.synced():
            return True
        cm = self.caches["records"].get(self.kube.namespace, world_configmap_name(rec.name))
        epoch = worlds.published_epoch(cm)
        return epoch is None or epoch < seg.index

    def _beat_world(self, rec: RunRecord, obs: signals.Observation) -> None:
        """While the live world waits for slices being recreated, its `heartbeat` every HEARTBEAT_S
        (launcher/core/world.py `beat`): the survivors' supervisors wait as long as it beats. From
        the cache (no request) and only when synced; a conflict waits for the next beat."""
        seg = rec.current
        if not policy.rules_for(rec.spec).WORLD or seg is None or not seg.live or not self.synced():
            return
        cm = self.caches["records"].get(self.kube.namespace, world_configmap_name(rec.name))
        doc = worlds.beat(worlds.published(cm), seg, obs.slices, time.time())
        if doc is None or cm is None:
            return
        with contextlib.suppress(Conflict):
            self.kube.publish_world(worlds.configmap(rec.spec, doc), cm["metadata"]["resourceVersion"])

    def publish_world(self, rec: RunRecord) -> bool:
        """Publish the world of `rec`'s live in-place segment unless the ConfigMap already holds its
        epoch or a later one: the record holds the epoch before this is called, so a restarted
        controller publishes the same world, and never one epoch twice. True if it wrote."""
        seg = rec.current
        if seg is None or not seg.live or not seg.slice_ids:
            return False
        name = world_configmap_name(rec.name)
        # From the cache when it runs (a stale one is a Conflict, read again next pass).
        cache = self.caches.get("records") if self.synced() else None
        cm = cache.get(self.kube.namespace, name) if cache is not None else self.kube.world(name)
        if (epoch := worlds.published_epoch(cm)) is not None and epoch >= seg.index:
            return False
        doc = worlds.document(rec.spec, self.catalog.preset(seg.preset), seg, time.time())
        try:
            self.kube.publish_world(
                worlds.configmap(rec.spec, doc), cm["metadata"]["resourceVersion"] if cm else None
            )
        except Conflict:  # written meanwhile: the next pass reads it again
            self._wake.set()
            return False
        return True

    def _fail(self, run: str, rundir: RunDir, reason: str) -> None:
        def mark_failed() -> None:
            got = self.kube.get_record(run)
            if got is None:  # deleted behind the controller's back: nothing left to mark
                return
            rec, rv = got
            self.kube.update_record(
                replace(rec, state=RunState.FAILED, reason=reason, finished_at=self.clock()), rv
            )

        with contextlib.suppress(Conflict):  # still changing after client-go's 5 tries: the ledger says it
            retry_on_conflict(mark_failed)
        self._log(
            rundir,
            [{"kind": LedgerKind.ACT, "action": Action.FAIL, "reason": reason, "state": RunState.FAILED}],
        )

    def _new_unusable(self, trainer: dict | None) -> list[dict]:
        """Ledger lines for the checkpoints the trainer found unusable and moved aside (status.json),
        each once per controller: the run lost the steps since the previous committed one."""
        out = []
        for u in (trainer or {}).get("unusable_checkpoints") or []:
            if isinstance(u, dict) and (moved := u.get("moved_to")) not in self._unusable_seen:
                self._unusable_seen.add(moved)
                out.append(
                    {
                        "kind": LedgerKind.UNUSABLE_CHECKPOINT,
                        **{k: u.get(k) for k in ("step", "moved_to", "reason")},
                    }
                )
        return out

    def _new_restore(self, run: str, trainer: dict | None) -> list[dict]:
        """One ledger line per trainer incarnation that restored a step (status.json's `restored`):
        where its state came from, e.g. "restored step 41 from memory"."""
        r = (trainer or {}).get("restored")
        if not isinstance(r, dict) or not isinstance(r.get("step"), int):
            return []
        source = read_state_source(r)  # an older trainer's `from` too
        if source in (None, StateSource.FRESH):
            return []
        key = (run, r.get("segment"), jobset_attempt(r))
        if key in self._restores_seen:
            return []
        self._restores_seen.add(key)
        return [
            {
                "kind": LedgerKind.RESTORE,
                "segment": r.get("segment"),
                "jobset_attempt": jobset_attempt(r),
                STATE_SOURCE: source,
                "step": r["step"],
                "message": f"restored step {r['step']} from {source}",
            }
        ]

    def _log(self, rundir: RunDir, entries: list[dict]) -> None:
        if entries:
            now = self.clock()
            rundir.log({"time": now, "controller": self.identity, **e} for e in entries)

    # --- ownership -----------------------------------------------------------------------------

    def own(self, run: str, rundir: RunDir | None = None) -> bool:
        """Hold the run's Lease (`Leases.acquire`). The ledger notes a new hold, and a takeover."""
        held, newly, previous = self.leases.acquire(run)
        if newly:
            entry = {"kind": LedgerKind.TAKEOVER if previous else LedgerKind.LEASE, "holder": self.identity}
            if previous:
                entry["previous"] = previous
            got = rundir or self._rundir(run)
            if got:
                self._log(got, [entry])
        return held

    def release(self, run: str) -> None:
        self.leases.release(run)

    def _rundir(self, run: str) -> RunDir | None:
        got = self.record(run)
        return RunDir(got[0].spec.run_dir, got[0].spec.trainer) if got else None

    # --- the loop ------------------------------------------------------------------------------

    def wake(self, why: str = "") -> None:
        self.wakeups[why] += 1
        self._woken_at = self._woken_at or time.time()
        self._wake.set()

    def run_forever(
        self, runs: Callable[[], Iterable[str]], stop: threading.Event, until_done: bool = False
    ) -> None:
        """Reconcile `runs()` on every wake-up or resync until `stop` (or, with `until_done`,
        until every run is terminal)."""
        halt = threading.Event()  # stops the watches when this loop ends, whatever ended it
        self.started_at = time.monotonic()
        self.start_caches(halt)
        try:
            # As client-go's WaitForCacheSync: no pass decides on a half-listed world.
            while not stop.is_set() and not self.synced():
                self._wake.clear()
                self._wake.wait(1.0)
            self._tune_process()
            while not stop.is_set():
                self._wake.clear()
                try:
                    done = self.pass_once(list(runs()))
                except Exception as e:  # the API may be restarting: keep the loop alive, retry soon
                    self.last_error = f"{type(e).__name__}: {e}"
                    self._turned(ok=False)
                    stop.wait(1.0)
                    continue
                self._turned(ok=True)
                if until_done and done:
                    return
                self._tune_process()
                self._wake.wait(min(self.resync_s, self.leases.until_renewal(self.resync_s)))
                # Coalesce a burst of watch events into one pass: passes at least COALESCE_S apart.
                # The first event after a quiet spell (a node pool lost) is acted on at once.
                stop.wait(max(0.0, (self.turned_at or 0.0) + COALESCE_S - time.monotonic()))
        finally:
            halt.set()
            self.caches = {}

    def _tune_process(self) -> None:
        """For a controller that has its process to itself: its heap collected once, then frozen
        (``gc.freeze``), when the caches have listed and every FREEZE_EVERY_S after. The caches
        hold the run's pods and nodes, tens of thousands of long-lived objects, and every full
        collection of the cyclic GC walked them all, landing inside decisions
        (`bench.controller_scale` measures it; docs/measurements.md). Frozen, collections skip them; their JSON has no
        cycles, so reference counting still frees them when a watch event replaces them."""
        if not self.own_process:
            return
        now = time.monotonic()
        if self._frozen_at is not None and now - self._frozen_at < FREEZE_EVERY_S:
            return
        gc.collect()
        gc.freeze()
        self._frozen_at = now

    @contextlib.contextmanager
    def _deciding(self) -> Iterator[None]:
        """The watches hold off applying events while a pass reads and decides. In a burst (a node
        pool lost: 768 node and 1,536 pod events at 4 x tpu7x-8x8x48) the watch threads decode
        JSON for most of a second and share the interpreter lock with the pass, which then takes
        several times its own CPU to decide (bench.controller_scale; docs/measurements.md). Each watch
        decodes at most one more event meanwhile; the API server buffers the rest (a real one, a
        watch channel; the embedded one, 50,000 events), and the pass decides on one state."""
        self._ingest.clear()
        try:
            yield
        finally:
            self._ingest.set()

    def start_caches(self, halt: threading.Event) -> None:
        """Start a watch thread per cache; they run until `halt`."""
        self.caches = {name: Cache(src) for name, src in SOURCES.items()}
        for name, cache in self.caches.items():
            threading.Thread(
                target=cache.run,
                args=(self.kube.lists, self.wake, halt, self._ingest.wait),
                name=f"watch-{name}",
                daemon=True,
            ).start()

    def _turned(self, ok: bool) -> None:
        self.pass_ok = ok
        self.turned_at = time.monotonic()

    def loop_state(self) -> LoopState:
        return LoopState(
            started_at=self.started_at,
            turned_at=self.turned_at,
            pass_ok=self.pass_ok,
            error=None if self.pass_ok else self.last_error,
            unsynced=tuple(
                name for name in WATCHED if not (c := self.caches.get(name)) or not c.synced.is_set()
            ),
        )

    def pass_once(self, runs: list[str]) -> bool:
        """One pass over `runs`; True when all of them are terminal."""
        self._pass_woken_at, self._woken_at = self._woken_at, None
        self.leases.forget_all_but(runs)
        snap = None
        all_done = True
        for run in runs:
            if not self.own(run):
                all_done = False
                continue
            snap = snap or self.snapshot()
            result = self.reconcile(run, snap)
            rec = result.decision.record if result.decision else None
            if rec is None or not rec.terminal:
                all_done = False
            if result.decision and result.decision.action in {
                Action.START_SEGMENT,
                Action.NEW_WORLD,
                Action.END,
                Action.DELETE,
                Action.CREATE_JOBSET,
            }:
                snap = None  # the world changed: the next run re-reads it
                self._wake.set()
        return all_done


def crash_point(name: str) -> None:
    """Fault injection for crash-consistency tests: `RESLICE_CRASH_POINT=after-record:start-segment:1`
    makes the controller die (as if SIGKILLed) right after it recorded segment 1 and before it
    created its JobSet — the worst moment for a controller to go."""
    if os.environ.get("RESLICE_CRASH_POINT") == name:
        os._exit(137)
