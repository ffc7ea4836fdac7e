"""The in-place mode's rules (`RestartMode.IN_PLACE`; docs/contract.md "World (in-place restarts)"): a
segment is one world over slices that each have their own JobSet, and a shape change is one
NEW_WORLD decision (the current segment ended and the next recorded together), after which only the
leaving slices' JobSets are deleted and only the new ones' created. Called through the package's
`decide` (launcher/core/policy/__init__.py), which runs RULES in this order, but for 7a, which runs
before 7 (the two never both decide: 7 starts a grow only while no slice is joining, 7a acts only on
joining slices); the first that returns a Decision is the pass's.

1. Finished (shared.finished), as in recreate.
2. Next world: with no live segment (launch, or after a failure ended one), every slice JobSet of
   the run is deleted and its pods waited for, then the first world starts on the best-fitting rung.
3. Missing slices: a slice of the world whose JobSet does not exist is created again (a controller
   that stopped between recording and creating; one deleted behind its back restarts as in 6).
4. A slice JobSet that gave up (failed), or more crashes counted by the slice JobSets together than
   the run's `max_restarts`, ends the world as an application failure (budget, backoff).
5. A lost slice — its node pool gone or unhealthy, or its pods unschedulable with no room (or past
   the grace period), or its JobSet suspended by Kueue (evicted once the world ran, or not
   admitted within the grace period) — leaves: the survivors, in their order, form the next world
   on the largest feasible rung that fits (new slices added when the cluster has room for them; in
   a Kueue queue never: admission is the capacity signal). A suspended slice's JobSet stays in
   the queue as a joining slice (7a takes it in once admitted). No world is published while a
   slice it names is not admitted (`publishable`; docs/gke.md "Kueue").
6. A slice that JobSet restarted under the world (a preemption) once every slice runs again: the
   same slices, a new world (the survivors' trainers exited 43, or 42 when the preempted slice's
   SIGTERM stopped the world, and wait for it). A crashed host's pod stays Running: its node
   turning NotReady makes its slice lost (5).
7. Capacity return, as recreate's rule 6 (in a Kueue queue at once, without the nodes fitting:
   Kueue admits the new slices when there is room): the new slices' JobSets are created while
   the world trains on (`Segment.joining`); 7a. once their pods run, the next world takes them in after the
   survivors (dropped, their JobSets deleted, if their capacity goes meanwhile).
8. Otherwise wait.

Every decision carries its reason, in words a person on call can act on.
"""

from __future__ import annotations

from dataclasses import replace

from contract.words import RestartMode
from launcher.core import record
from launcher.core import world as worlds
from launcher.core.plan import Plan, Rung
from launcher.core.policy.shared import (
    Decision,
    Rule,
    best_fit,
    book_host_disruptions,
    end_segment,
    finished,
    gave_up_on_host,
    held_back,
    live_segment,
    next_rung,
    no_fit,
    shape_words,
)
from launcher.core.presets import Catalog
from launcher.core.record import RunRecord, new_segment
from launcher.core.signals import observation as signals
from launcher.core.signals.slices import SliceView
from launcher.core.words import Action, EndKind, Phase, RunState, WaitReason

MODE = RestartMode.IN_PLACE
# A segment is a world of slices, each its own JobSet, published in the run's world ConfigMap to the
# pods' supervisors (launcher/core/world.py): the controller publishes it and deletes it at the end.
WORLD = True


def bookkeep(rec: RunRecord, obs: signals.Observation) -> RunRecord:
    """What the observation adds to an in-place segment: when every slice of its world first ran,
    the node pools its slices' pods are on, the trainer's step target; to the record, the host
    disruptions."""
    rec = book_host_disruptions(rec, obs)
    seg = rec.current
    if seg is not None and seg.live:
        changes: dict = {}
        views = [obs.slices.get(s) for s in seg.slice_ids]
        if seg.running_at is None and all(v is not None and v.running for v in views):
            changes["running_at"] = obs.now
        pools = tuple(sorted(set(seg.nodepools) | {p for v in views if v for p in v.pools}))
        if pools != seg.nodepools:
            changes["nodepools"] = pools
        if changes:
            rec = rec.with_segment(replace(seg, **changes))
    total = (obs.trainer or {}).get("total_steps")
    if total and rec.total_steps != total:
        rec = replace(rec, total_steps=int(total))
    return rec


def world_restarts(obs: signals.Observation, slices: tuple[str, ...]) -> int:
    """The JobSet restarts of a world's slices so far: a world records them when it starts, and a
    later rise is a slice restarted under it."""
    return sum(v.restarts for s in slices if (v := obs.slices.get(s)) is not None)


def attempts(obs: signals.Observation, slices: tuple[str, ...]) -> tuple[int, ...]:
    """Each slice's JobSet restart attempt (0 for one not created yet): which pods a world is for."""
    return tuple(v.restarts if (v := obs.slices.get(s)) is not None and v.jobset else 0 for s in slices)


def new_world(
    rec: RunRecord, obs: signals.Observation, rung: Rung, slices: tuple[str, ...], why: str
) -> record.Segment:
    """The next segment of an in-place run: the world of `slices` on `rung`, its epoch its index,
    its coordinator chosen here (`worlds.coordinator`), before the record that holds it is written."""
    plan = rung.plan
    assert isinstance(plan, Plan)
    seg = new_segment(rec, rung.shape, plan, obs.now, why, obs.committed_step)
    return replace(
        seg,
        slice_ids=slices,
        coordinator=worlds.coordinator(rec.spec, slices, seg.index, obs.local_port),
        restarts=world_restarts(obs, slices),
        attempts=attempts(obs, slices),
        jobset=slices_words(rec.name, slices),
    )


def slices_words(run: str, slices: tuple[str, ...]) -> str:
    """A world's JobSets in its segment's `jobset` field: the slices' names, comma-separated."""
    return ",".join(f"{run}-s{s}" for s in slices)


def _reshape(
    rec: RunRecord,
    obs: signals.Observation,
    rung: Rung,
    slices: tuple[str, ...],
    kind: EndKind,
    reason: str,
    *,
    force: bool = False,
    gone: tuple[str, ...] = (),
    queued: tuple[str, ...] = (),
) -> Decision:
    """End the current world and record the next one in the same write: NEW_WORLD. `gone`: slices
    of the current world whose hosts are gone (the next world's `lost`). `queued`: leaving slices
    whose JobSets Kueue holds suspended: kept, as the next world's joining slices, so that their
    Workloads keep their place in the queue and rejoin when admitted again (rule 7a)."""
    seg = live_segment(rec)
    ended = end_segment(rec, obs, kind, reason, RunState.RUNNING)
    nxt = replace(
        new_world(ended, obs, rung, slices, f"after segment {seg.index} ({kind})"), lost=gone, joining=queued
    )
    leaving = tuple(s for s in seg.slice_ids if s not in slices and s not in queued)
    joining = tuple(s for s in slices if s not in seg.slice_ids)
    words = (
        f"; segment {nxt.index}: slices [{', '.join(slices)}] on {shape_words(rung)}"
        + (f", leaving: {', '.join(leaving)}" if leaving else "")
        + (f", queued in Kueue: {', '.join(queued)}" if queued else "")
        + (f", joining: {', '.join(joining)}" if joining else "")
    )
    return Decision(
        Action.NEW_WORLD,
        reason + words,
        replace(ended.with_segment(nxt), state=RunState.RUNNING, reason=reason + words),
        force=force,
        slices_delete=leaving,
        slices_create=tuple(s for s in joining if s not in seg.joining),  # theirs exist (rule 7a)
    )


def next_world(
    rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog
) -> Decision | None:
    """2. No live segment: delete what is left of the run's slices, wait for their pods,
    then start a world on the best-fitting rung (the first on the requested shape)."""
    seg = rec.current
    if seg is not None and seg.live:
        return None
    left = tuple(sorted(s for s, v in obs.slices.items() if v.jobset))
    if left:
        return Decision(
            Action.DELETE,
            f"segment {seg.index if seg else '-'} is over: deleting the JobSets of slices {', '.join(left)}",
            rec,
            slices_delete=left,
        )
    alive = any(v.pods_alive for v in obs.slices.values()) or bool(obs.run_pods_alive)
    if held := held_back(rec, obs, alive):
        return held
    chosen = next_rung(rec, obs, ladder)
    if isinstance(chosen, Decision):
        return chosen
    rung, why = chosen
    slices = worlds.world_slices((), (), rung.shape.slices)
    new = new_world(rec, obs, rung, slices, why)
    reason = f"segment {new.index} on {shape_words(rung)}, slices [{', '.join(slices)}] {why}"
    return Decision(
        Action.START_SEGMENT,
        reason,
        replace(rec.with_segment(new), state=RunState.RUNNING, reason=reason),
        slices_create=slices,
    )


def missing_slices(
    rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog
) -> Decision | None:
    """3. A slice of the world whose JobSet does not exist: created (again). One being
    deleted is waited for (its name is the new one's). A slice JobSet not in the world: deleted."""
    seg = live_segment(rec)
    # Left over from a world whose decision was recorded but not carried out (a controller that
    # stopped in between): JobSets of slices no longer in the world.
    extra = tuple(
        sorted(
            s for s, v in obs.slices.items() if v.jobset and s not in seg.slice_ids and s not in seg.joining
        )
    )
    if extra:
        return Decision(
            Action.DELETE,
            f"deleting the JobSet(s) of slice(s) {', '.join(extra)}, not in segment {seg.index}",
            rec,
            slices_delete=extra,
        )
    absent = tuple(s for s in seg.slice_ids if (v := obs.slices.get(s)) is None or not v.jobset)
    if not absent:
        return None
    deleting = [s for s in absent if (v := obs.slices.get(s)) is not None and v.pods_alive]
    if deleting:
        return Decision(Action.WAIT, f"waiting for the old pods of slice(s) {', '.join(deleting)} to go", rec)
    return Decision(
        Action.CREATE_JOBSET,
        f"creating the JobSet(s) of slice(s) {', '.join(absent)} of segment {seg.index}",
        rec,
        slices_create=absent,
    )


def world_failed(
    rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog
) -> Decision | None:
    """4. Application failures: a slice JobSet that gave up, or crashes that the slice
    JobSets' failure policies counted (`restartsCountTowardsMax`), summed over the run's slices,
    beyond the run's `max_restarts`. A recreate run's one JobSet gives up on its (max_restarts + 1)th
    counted crash wherever in the segment it happened; each slice JobSet has a `maxRestarts` of its
    own, so without the sum a crash loop that moves between slices, or one that each new world
    starts again, would go on N times longer. The world ends as recreate rule 4 ends a segment: the run's
    budget pays the counted restarts and the failure (app_failures + counted + 1, as that rule adds
    them), then backoff and a fresh start (every slice JobSet deleted: their counters start over,
    as a recreate segment's new JobSet's do), or the run fails."""
    seg, now, knobs = live_segment(rec), obs.now, rec.knobs
    failed = [s for s in seg.slice_ids if (v := obs.slices.get(s)) is not None and v.phase == Phase.FAILED]
    # JobSet counted the restarts a host disruption caused as crashes: the run does not.
    counted = sum(
        v.restarts_counted - rec.forgiven(v.jobset_uid, v.restarts_counted)
        for v in obs.slices.values()
        if v.jobset
    )
    if not failed and counted <= rec.spec.max_restarts:
        return None
    everything = tuple(sorted(s for s, v in obs.slices.items() if v.jobset))
    if failed and all(
        gave_up_on_host(rec, v.jobset_uid, v.restarts) for s in failed for v in [obs.slices[s]]
    ):
        # A slice JobSet reached its own maxRestarts on a reboot: it cannot restart again, so the
        # world starts afresh (every slice JobSet new), uncharged and without a backoff.
        reason = (
            f"host disruption: slice(s) {', '.join(failed)} reached their JobSets' maxRestarts on a host"
            " that rebooted (its container gone); not the run's failure: starting again"
        )
        ended = end_segment(rec, obs, EndKind.HOST_DISRUPTION, reason, RunState.RESHAPING)
        return Decision(Action.END, reason, ended, slices_delete=everything)
    # A JobSet that gave up adds its last failure; the sum's last counted restart is the crash that
    # went over the limit.
    count = rec.app_failures + counted + (1 if failed else 0)
    what = (
        f"slice(s) {', '.join(failed)} failed"
        if failed
        else f"{counted} crashes restarted slice JobSets, over max_restarts {rec.spec.max_restarts}"
    )
    if count > knobs.app_failure_budget:
        reason = f"crash loop: {count} application failures exceed the budget of {knobs.app_failure_budget} ({what})"
        ended = end_segment(rec, obs, EndKind.APP_FAILURE, reason, RunState.FAILED)
        return Decision(
            Action.FAIL,
            reason,
            replace(ended, app_failures=count, finished_at=now),
            slices_delete=everything,
        )
    backoff = knobs.app_backoff_s * 2 ** (count - 1)
    reason = f"application failure {count}/{knobs.app_failure_budget} ({what}); retrying in {backoff:.0f}s"
    ended = end_segment(rec, obs, EndKind.APP_FAILURE, reason, RunState.RESHAPING)
    return Decision(
        Action.END,
        reason,
        replace(ended, app_failures=count, next_submit_at=now + backoff),
        slices_delete=everything,
    )


def slice_lost(
    rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog
) -> Decision | None:
    """5. Lost slices leave the world; the survivors keep their pods. A slice is lost when
    the node pools its pods are on are gone or unhealthy, or its pods are unschedulable while the
    cluster has no room for the world (at once) or past the grace period."""
    seg, now, knobs = live_segment(rec), obs.now, rec.knobs
    current = seg.shape(catalog)
    lost_pools, gone_pools = set(obs.lost_nodepools), set(obs.gone_nodepools)
    no_room = not obs.fits(current.preset.name, current.slices)
    lost, waiting, gone = [], [], []
    views = {sid: obs.slices.get(sid) for sid in seg.slice_ids}
    # A gone pool the world ran on that no slice's live pods are on now: its nodes (and their pool
    # label) went first, its pods with them or soon after. One TPU slice is one node pool, so as
    # many such pools as slices on no pool at all are exactly those slices; anything else waits for
    # a clearer sign (their replacement pods unschedulable, below).
    vanished = (gone_pools & set(seg.nodepools)) - {p for v in views.values() if v for p in v.pools}
    homeless = {sid for sid, v in views.items() if v is None or not v.pools}
    vanished_with = homeless if vanished and len(vanished) == len(homeless) else set()
    evicted, unadmitted = held_by_kueue(rec, obs)
    for sid, v in views.items():
        if sid in evicted:
            lost.append(sid)
        elif sid in unadmitted:
            waiting.append(sid)
        elif sid in vanished_with or (v is not None and set(v.pools) & gone_pools):
            lost.append(sid)
            gone.append(sid)
        elif v is None:
            continue
        elif set(v.pools) & lost_pools:  # unhealthy, not deleted: its processes may still run
            lost.append(sid)
        elif v.unschedulable:  # a pod of the world replaced by one without a node: its process is gone
            waited = now - (v.unschedulable_since or now)
            if no_room or waited >= knobs.unschedulable_grace_s:
                lost.append(sid)
                gone.append(sid)
            else:
                waiting.append(sid)
    if not lost:
        if unadmitted:
            return Decision(
                Action.WAIT,
                f"waiting for Kueue to admit slice(s) {', '.join(unadmitted)} of segment {seg.index}"
                f" (grace {knobs.unschedulable_grace_s:.0f}s)",
                rec,
                wait=WaitReason.ADMISSION,
            )
        if waiting:
            return Decision(
                Action.WAIT,
                f"pods of slice(s) {', '.join(waiting)} unschedulable (grace {knobs.unschedulable_grace_s:.0f}s)",
                rec,
            )
        return None
    # A slice Kueue has not admitted yet leaves with the lost ones, its JobSet kept in the queue.
    survivors = [s for s in seg.slice_ids if s not in lost and s not in unadmitted]
    queued = tuple(s for s in seg.slice_ids if s in evicted or s in unadmitted)
    if queued_run(rec):
        # Kueue's admission is the capacity signal: the next world is the survivors (all admitted)
        # or fewer, never a slice whose JobSet would first have to be admitted.
        rung = admitted_fit(ladder, current.preset.name, len(survivors))
    else:
        rung = best_fit([r for r in ladder if r.shape.devices < current.devices], obs)
    how = "evicted by Kueue" if seg.running_at is not None else "not admitted by Kueue in time"
    held = f"{how}: {', '.join(queued)}" if queued else ""
    pools = f"node pools lost: {', '.join(sorted(lost_pools))}" if lost_pools else ""
    why = "; ".join(w for w in (held, pools) if w) or "pods unschedulable"
    cause = f"slice(s) {', '.join(lost)} lost ({why})"
    if rung is None:
        if queued_run(rec):
            wait, words = (
                WaitReason.ADMISSION,
                f"fewer admitted slices than the ladder's smallest {current.preset.name} rung",
            )
        else:
            wait, words = no_fit(ladder, obs, current.devices)
        return Decision(Action.WAIT, f"{cause}; waiting for capacity ({wait}): {words}", rec, wait=wait)
    same = rung.shape.preset.name == current.preset.name
    slices = worlds.world_slices(seg.slice_ids, survivors if same else (), rung.shape.slices)
    kind = EndKind.EVICTED if set(lost) <= set(evicted) else EndKind.CAPACITY_LOST
    what = "Kueue" if kind == EndKind.EVICTED else "capacity lost"
    reason = f"{what}: {cause}; shrinking {current} -> {rung.shape} in place"
    return _reshape(
        rec,
        obs,
        rung,
        slices,
        kind,
        reason,
        force=bool(gone_pools),
        gone=tuple(gone),
        queued=queued if same else (),
    )


def queued_run(rec: RunRecord) -> bool:
    """Whether Kueue admits the run's JobSets (`--queue`: each slice JobSet its own Workload)."""
    return bool(rec.spec.queue)


def admitted(rec: RunRecord, view: SliceView | None) -> bool:
    """Whether a world may name the slice: Kueue admitted its JobSet (spec.suspend false). A JobSet
    not seen yet is one about to be created: suspended in a queued run (render.py renders it so,
    as Kueue's webhook would), running at once otherwise."""
    if view is None or not view.jobset:
        return not queued_run(rec)
    return not view.suspended


def held_by_kueue(rec: RunRecord, obs: signals.Observation) -> tuple[list[str], list[str]]:
    """(evicted, unadmitted): the live world's slices that Kueue holds. Once the world has run, a
    slice JobSet suspended again was evicted or preempted (kueue jobframework/reconciler.go stopJob:
    JobSet.Suspend(); JobSet's controller suspends its Jobs and the Job controller deletes their
    pods): lost at once. A world that has not run yet waits the unschedulable grace period for
    Kueue to admit its slices (a ProvisioningRequest admission check may take that long); then the
    slices still held count as evicted: the world starts on those admitted."""
    seg = live_segment(rec)
    held = [s for s in seg.slice_ids if not admitted(rec, obs.slices.get(s))]
    if not held:
        return [], []
    if seg.running_at is not None or obs.now - seg.submitted_at >= rec.knobs.unschedulable_grace_s:
        # Only JobSets that exist stay queued; one not created yet is created by rule 3 first.
        return [s for s in held if (v := obs.slices.get(s)) is not None and v.jobset], []
    return [], held


def admitted_fit(ladder: list[Rung], preset: str, slices: int) -> Rung | None:
    """The largest feasible rung of `preset` with at most `slices` slices (those Kueue admitted)."""
    return next(
        (r for r in ladder if r.feasible and r.shape.preset.name == preset and r.shape.slices <= slices),
        None,
    )


def publishable(rec: RunRecord, obs: signals.Observation) -> bool:
    """Whether the live world may be published: every slice it names is admitted. No world names
    a slice Kueue has not admitted: its pods do not exist, so the world could never form."""
    seg = rec.current
    if seg is None or not seg.live:
        return False
    return all(admitted(rec, obs.slices.get(s)) for s in seg.slice_ids)


def slice_restarted(
    rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog
) -> Decision | None:
    """6. JobSet restarted a slice of the world (a preemption, a pod killed): once every
    slice runs again, the same slices form a new world (the survivors' trainers exited 43, or 42
    when a preempted slice's SIGTERM stopped the world, and wait for one; the restarted pods'
    supervisors end the child they started in the old one)."""
    seg = live_segment(rec)
    views = [obs.slices.get(s) for s in seg.slice_ids]
    if not all(v is not None and v.running for v in views):
        return None
    if world_restarts(obs, seg.slice_ids) <= seg.restarts:
        return None
    rung = next((r for r in ladder if r.shape == seg.shape(catalog) and r.feasible), None)
    if rung is None:
        return None
    hosts = sorted(
        s
        for s, v in zip(seg.slice_ids, views, strict=True)
        if v is not None and v.restarts > 0 and f"{v.jobset_uid}/{v.restarts - 1}" in rec.host_disruptions
    )
    why = (
        f"a host disruption: a host of slice(s) {', '.join(hosts)} rebooted, its container gone; not counted"
        if hosts
        else "JobSet failure policy"
    )
    reason = f"a slice of segment {seg.index} restarted ({why}): the same slices in a new segment"
    return _reshape(rec, obs, rung, seg.slice_ids, EndKind.NEW_ATTEMPT, reason)


def world_grows(
    rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog
) -> Decision | None:
    """7. Capacity return: as recreate rule 6 (the grow window, a checkpoint this world
    committed), new slices join the survivors."""
    seg, knobs = live_segment(rec), rec.knobs
    current = seg.shape(catalog)
    requested = rec.requested(catalog)
    running = all((v := obs.slices.get(s)) is not None and v.running for s in seg.slice_ids)
    progressed = obs.committed_step is not None and obs.committed_step > (seg.start_step or 0)
    if seg.joining or not (knobs.grow and running and current.devices < requested.devices):
        return None
    if queued_run(rec) and current.preset.name == requested.preset.name:
        # Kueue's admission is the capacity signal: the missing slices' JobSets go into the queue
        # at once, without waiting for nodes to fit (under a ProvisioningRequest admission check the
        # nodes appear only after the Workload is admitted: kueue
        # pkg/controller/admissionchecks/provisioning/controller.go), and rule 7a takes them in
        # once Kueue admits them and their pods run.
        slices = worlds.world_slices(seg.slice_ids, seg.slice_ids, requested.slices)
        joining = tuple(s for s in slices if s not in seg.slice_ids)
        if stale := [s for s in joining if s in obs.slices]:
            return Decision(
                Action.WAIT, f"growing: waiting for the old pods of slice(s) {', '.join(stale)} to go", rec
            )
        reason = (
            f"growing {current} -> {requested} in place: slice(s) {', '.join(joining)} queued in Kueue"
            f" {rec.spec.queue} (segment {seg.index} trains on until they are admitted and their pods run)"
        )
        return Decision(
            Action.CREATE_JOBSET,
            reason,
            replace(rec.with_segment(replace(seg, joining=joining)), reason=reason),
            slices_create=joining,
        )
    if not progressed:
        return None
    rung = best_fit(ladder, obs, stable_before=obs.now - knobs.grow_window_s)
    if rung is None or rung.shape.devices <= current.devices:
        return None
    same = rung.shape.preset.name == current.preset.name
    slices = worlds.world_slices(seg.slice_ids, seg.slice_ids if same else (), rung.shape.slices)
    stale = [s for s in slices if s not in seg.slice_ids and s in obs.slices]
    if stale:
        return Decision(
            Action.WAIT,
            f"growing: waiting for the old JobSet and pods of slice(s) {', '.join(stale)} to go",
            rec,
        )
    reason = f"capacity returned: {rung.shape} has fitted for {knobs.grow_window_s:.0f}s; growing {current} -> {rung.shape} in place"
    if not same:  # another preset: no pod survives, the next world is all new slices
        return _reshape(rec, obs, rung, slices, EndKind.GROW, reason)
    # The world trains on while the new slices' pods are scheduled and started; rule 7a takes them in.
    joining = tuple(s for s in slices if s not in seg.slice_ids)
    reason += f": slice(s) {', '.join(joining)} joining (segment {seg.index} trains on until their pods run)"
    return Decision(
        Action.CREATE_JOBSET,
        reason,
        replace(rec.with_segment(replace(seg, joining=joining)), reason=reason),
        slices_create=joining,
    )


def slices_joining(
    rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog
) -> Decision | None:
    """7a. Slices joining after a grow: once every one's pods run, the next world takes
    them in after the survivors; lost meanwhile (their pool gone, their pods unschedulable with no
    room or past the grace period), they are dropped and their JobSets deleted."""
    seg, now, knobs = live_segment(rec), obs.now, rec.knobs
    if not seg.joining:
        return None
    current = seg.shape(catalog)
    views = {s: obs.slices.get(s) for s in seg.joining}
    lost_pools = set(obs.lost_nodepools)
    room = obs.fits(current.preset.name, current.slices + len(seg.joining))

    def lost(v: SliceView | None) -> bool:
        if v is None:
            return False
        waited = now - (v.unschedulable_since or now)
        # Admitted by Kueue, a slice's capacity is on its way (a ProvisioningRequest provisioned
        # it, or TAS placed it): only the grace period drops it, not the nodes seen now.
        no_room = not room and not queued_run(rec)
        return bool(set(v.pools) & lost_pools) or (
            v.unschedulable > 0 and (no_room or waited >= knobs.unschedulable_grace_s)
        )

    if any(lost(v) for v in views.values()):
        reason = f"slice(s) {', '.join(seg.joining)} cannot join: their capacity is gone; segment {seg.index} stays"
        return Decision(
            Action.DELETE,
            reason,
            replace(rec.with_segment(replace(seg, joining=())), reason=reason),
            slices_delete=seg.joining,
        )
    absent = tuple(s for s, v in views.items() if v is None or not v.jobset)
    if absent:
        if any(v is not None and v.pods_alive for s in absent for v in [views[s]]):
            return Decision(
                Action.WAIT, f"joining: the old pods of slice(s) {', '.join(absent)} still going", rec
            )
        return Decision(
            Action.CREATE_JOBSET,
            f"creating the JobSet(s) of joining slice(s) {', '.join(absent)}",
            rec,
            slices_create=absent,
        )
    if not all(v is not None and v.running for v in views.values()):
        return None  # rule 8 waits, saying how they stand
    target = current.slices + len(seg.joining)
    rung = next(
        (
            r
            for r in ladder
            if r.feasible and r.shape.preset.name == current.preset.name and r.shape.slices == target
        ),
        None,
    )
    if rung is None:
        return None
    slices = (*seg.slice_ids, *seg.joining)
    reason = f"capacity returned: slice(s) {', '.join(seg.joining)} running; growing {current} -> {rung.shape} in place"
    return _reshape(rec, obs, rung, slices, EndKind.GROW, reason)


def world_waits(rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog) -> Decision:
    """8. Anything else: wait, saying how the world's slices stand."""
    seg = live_segment(rec)
    states = ", ".join(
        f"{s}{' (joining)' if s in seg.joining else ''}: {v.phase if v else 'absent'}"
        f" {v.pods_running if v else 0}/{seg.shape(catalog).preset.hosts}"
        for s in (*seg.slice_ids, *seg.joining)
        for v in [obs.slices.get(s)]
    )
    words = f"segment {seg.index} on {seg.shape(catalog)} ({states})"
    # A world slice not admitted holds the world back (it is not published); a joining one only
    # its grow, while the world trains on.
    if held := [s for s in seg.slice_ids if not admitted(rec, obs.slices.get(s))]:
        words += f"; not published until Kueue admits slice(s) {', '.join(held)}"
        return Decision(Action.WAIT, words, rec, wait=WaitReason.ADMISSION)
    if queued := [s for s in seg.joining if not admitted(rec, obs.slices.get(s))]:
        words += f"; slice(s) {', '.join(queued)} queued in Kueue"
    return Decision(Action.WAIT, words, rec)


# The rules in the order `decide` runs them: the module docstring's numbering, 7a before 7.
RULES: tuple[Rule, ...] = (
    finished,
    next_world,
    missing_slices,
    world_failed,
    slice_lost,
    slice_restarted,
    slices_joining,
    world_grows,
    world_waits,
)
