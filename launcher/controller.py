"""The reconcile loop: watch -> observe -> decide -> act -> record.

Level-triggered, as Kubernetes controllers are written: watches on JobSets, Pods, Nodes and Events
only wake the loop (and a timer resyncs it); each pass re-reads the world, builds one observation
per run, asks the pure policy for one decision, writes the run record with a compare-and-swap, and
only then acts. Whoever loses the swap re-reads and decides again, and segment k's JobSet has a
fixed name, so a second controller or a restarted one never submits a segment twice. Each run is
owned by whoever holds its Lease; the ledger (`events.jsonl`) gets a line for every change in what
was observed and every action.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from launcher import policy as P
from launcher import record as R
from launcher import signals as S
from launcher.errors import UserError
from launcher.health import LoopState
from launcher.kube import Conflict, Kube
from launcher.plan import shrink_ladder
from launcher.presets import load_presets
from launcher.record import RunRecord
from launcher.render import LABEL_RUN, render_jobset, run_preset
from launcher.runs import RunDir

WATCHED = ("jobsets", "pods", "nodes", "events")


def lease_name(run: str) -> str:
    return f"reslice-{run}-controller"


def default_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass
class Snapshot:
    """One read of the namespace, shared by every run reconciled in a pass."""

    jobsets: list[dict]
    pods: list[dict]
    nodes: list[dict]
    events: list[dict]

    @staticmethod
    def read(kube: Kube) -> Snapshot:
        return Snapshot(kube.jobsets(), kube.pods(), kube.nodes(), kube.events())


@dataclass
class PassResult:
    run: str
    decision: P.Decision | None
    observation: S.Observation | None
    conflict: bool = False


@dataclass
class Controller:
    kube: Kube
    identity: str = field(default_factory=default_identity)
    resync_s: float = 5.0
    lease_s: int = 15
    clock: Callable[[], float] = time.time
    on_pass: Callable[[PassResult], None] | None = None
    # Per run: what the ledger last recorded, so that only changes get a line.
    _last: dict[str, tuple[dict, str]] = field(default_factory=dict)
    _held: set[str] = field(default_factory=set)
    _unusable_seen: set[str] = field(default_factory=set)
    _wake: threading.Event = field(default_factory=threading.Event)
    # Why the loop was woken, counted: watch events per kind, and watch errors such as 410 Gone.
    wakeups: Counter = field(default_factory=Counter)
    last_error: str | None = None
    # For the health probes (time.monotonic): when the loop started and last finished a pass.
    started_at: float = field(default_factory=time.monotonic)
    turned_at: float | None = None
    pass_ok: bool = False

    # --- one pass ------------------------------------------------------------------------------

    def reconcile(self, run: str, snap: Snapshot | None = None) -> PassResult:
        got = self.kube.get_record(run)
        if got is None:
            return PassResult(run, None, None)
        rec, rv = got
        if rec.terminal:
            return PassResult(run, P.Decision(P.WAIT, f"run is {rec.state}", rec), None)
        snap = snap or Snapshot.read(self.kube)
        rundir = RunDir(rec.spec.run_dir)
        obs = observe(rec, snap, rundir, self.clock())
        spec = rec.spec
        ladder = shrink_ladder(
            rec.requested,
            spec.global_batch,
            spec.max_micro_batch,
            spec.max_grad_accum,
            model_parallel=spec.model_parallel,
            trainer_config=json.loads(spec.trainer_config) if spec.trainer_config else None,
        )
        decision = P.decide(rec, obs, ladder)

        entries = []
        summary = obs.summary()
        last_summary, last_reason = self._last.get(run, ({}, ""))
        if summary != last_summary:
            entries.append({"kind": "observe", **summary})
        entries += self._new_unusable(obs.trainer)
        if decision.record != rec:
            try:
                self.kube.update_record(decision.record, rv)
            except Conflict:
                # Someone else changed the record since we read it: decide again on fresh state.
                self._log(rundir, entries + [{"kind": "conflict", "reason": "record changed; re-reading"}])
                self._last[run] = (summary, last_reason)
                self._wake.set()
                return PassResult(run, decision, obs, conflict=True)
        if decision.acts or decision.reason != last_reason:
            entries.append(
                {
                    "kind": "act" if decision.acts else "wait",
                    "action": decision.action,
                    "reason": decision.reason,
                    "segment": decision.record.current.index if decision.record.current else None,
                    "state": decision.record.state,
                }
            )
        # The ledger gets the decision before the action: a controller that dies in between
        # leaves its intent on record, and the next one's takeover line follows it.
        self._log(rundir, entries)
        self._last[run] = (summary, decision.reason)
        where = f"{decision.action}:{decision.record.current.index if decision.record.current else '-'}"
        crash_point(f"after-record:{where}")
        try:
            self._act(decision)
        except UserError as e:  # the cluster refused the JobSet (422): retrying cannot help
            self._fail(run, rundir, f"cannot submit: {e}")
        crash_point(f"after-act:{where}")
        result = PassResult(run, decision, obs)
        if self.on_pass:
            self.on_pass(result)
        return result

    def _act(self, d: P.Decision) -> None:
        if d.action in {P.SUBMIT, P.CREATE}:
            seg = d.record.current
            self.kube.create_jobset(render_jobset(d.record.spec, seg.shape(), seg.index))
        elif d.action in {P.END, P.DELETE} and d.jobset:
            self.kube.delete_jobset(d.jobset)

    def _fail(self, run: str, rundir: RunDir, reason: str) -> None:
        for _ in range(5):
            rec, rv = self.kube.get_record(run)
            try:
                self.kube.update_record(
                    replace(rec, state=R.FAILED, reason=reason, finished_at=self.clock()), rv
                )
                break
            except Conflict:
                continue
        self._log(rundir, [{"kind": "act", "action": P.FAIL, "reason": reason, "state": R.FAILED}])

    def _new_unusable(self, trainer: dict | None) -> list[dict]:
        """Ledger lines for the checkpoints the trainer found unusable and moved aside (status.json),
        each once per controller: the run lost the steps since the previous committed one."""
        out = []
        for u in (trainer or {}).get("unusable_checkpoints") or []:
            if isinstance(u, dict) and u.get("moved_to") not in self._unusable_seen:
                self._unusable_seen.add(u.get("moved_to"))
                out.append(
                    {"kind": "unusable-checkpoint", **{k: u.get(k) for k in ("step", "moved_to", "reason")}}
                )
        return out

    def _log(self, rundir: RunDir, entries: list[dict]) -> None:
        if entries:
            now = self.clock()
            rundir.log({"time": now, "controller": self.identity, **e} for e in entries)

    # --- ownership -----------------------------------------------------------------------------

    def own(self, run: str, rundir: RunDir | None = None) -> bool:
        """Hold (or renew) the run's Lease. The ledger notes a takeover from another controller."""
        held, previous = self.kube.acquire_lease(lease_name(run), self.identity, self.lease_s)
        if held and run not in self._held:
            self._held.add(run)
            entry = {"kind": "takeover" if previous else "lease", "holder": self.identity}
            if previous:
                entry["previous"] = previous
            got = rundir or self._rundir(run)
            if got:
                self._log(got, [entry])
        elif not held:
            self._held.discard(run)
        return held

    def release(self, run: str) -> None:
        self.kube.release_lease(lease_name(run), self.identity)
        self._held.discard(run)

    def _rundir(self, run: str) -> RunDir | None:
        got = self.kube.get_record(run)
        return RunDir(got[0].spec.run_dir) if got else None

    # --- the loop ------------------------------------------------------------------------------

    def wake(self, why: str = "") -> None:
        self.wakeups[why] += 1
        self._wake.set()

    def run_forever(
        self, runs: Callable[[], Iterable[str]], stop: threading.Event, until_done: bool = False
    ) -> None:
        """Reconcile `runs()` on every wake-up or resync until `stop` (or, with `until_done`,
        until every run is terminal)."""
        halt = threading.Event()  # stops the watches when this loop ends, whatever ended it
        watchers = [
            threading.Thread(
                target=self.kube.watch_forever,
                args=(kind, self.wake, halt),
                kwargs={"label_selector": LABEL_RUN if kind in {"jobsets", "pods"} else None},
                name=f"watch-{kind}",
                daemon=True,
            )
            for kind in WATCHED
        ]
        self.started_at = time.monotonic()
        for t in watchers:
            t.start()
        try:
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
                self._wake.wait(self.resync_s)
                # Coalesce a burst of watch events into one pass.
                stop.wait(0.05)
        finally:
            halt.set()

    def _turned(self, ok: bool) -> None:
        self.pass_ok = ok
        self.turned_at = time.monotonic()

    def loop_state(self) -> LoopState:
        return LoopState(
            started_at=self.started_at,
            turned_at=self.turned_at,
            pass_ok=self.pass_ok,
            error=None if self.pass_ok else self.last_error,
            # A watch wakes the loop with its bare kind once its list succeeded (errors carry text).
            unsynced=tuple(kind for kind in WATCHED if not self.wakeups[kind]),
        )

    def pass_once(self, runs: list[str]) -> bool:
        """One pass over `runs`; True when all of them are terminal."""
        snap = None
        all_done = True
        for run in runs:
            if not self.own(run):
                all_done = False
                continue
            snap = snap or Snapshot.read(self.kube)
            result = self.reconcile(run, snap)
            rec = result.decision.record if result.decision else None
            if rec is None or not rec.terminal:
                all_done = False
            if result.decision and result.decision.action in {P.SUBMIT, P.END, P.DELETE, P.CREATE}:
                snap = None  # the world changed: the next run re-reads it
                self._wake.set()
        return all_done


def crash_point(name: str) -> None:
    """Fault injection for crash-consistency tests: `RESLICE_CRASH_POINT=after-record:submit:1`
    makes the controller die (as if SIGKILLed) right after it recorded segment 1 and before it
    created its JobSet — the worst moment for a controller to go."""
    if os.environ.get("RESLICE_CRASH_POINT") == name:
        os._exit(137)


def observe(rec: RunRecord, snap: Snapshot, rundir: RunDir, now: float) -> S.Observation:
    seg = rec.current
    live = seg if seg is not None and seg.live else None
    return S.observe(
        now=now,
        run=rec.name,
        segment=seg.index if seg else None,
        segment_jobset=seg.jobset if seg else None,
        segment_nodepools=seg.nodepools if live else (),
        expected_pods=seg.shape().hosts if seg else 0,
        jobsets=[j for j in snap.jobsets if (j["metadata"].get("labels") or {}).get(LABEL_RUN) == rec.name],
        pods=snap.pods,
        nodes=snap.nodes,
        events=snap.events,
        presets=[run_preset(rec.spec, p) for p in load_presets().values()],
        committed_step=rundir.latest_committed_step(),
        trainer=rundir.status(),
    )
