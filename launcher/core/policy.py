"""(run record, observation) -> one decision. Pure: no client, no clock, no disk (the presets come in
as a catalog). Called by the controller's pass (launcher/controller/loop.py).

`decide` runs the rules below in this order, one function each; the first that returns a Decision
is the pass's (as jobset's executeFailurePolicy walks its rules, kubernetes-sigs/jobset
pkg/controllers/failure_policy.go). README "What the controller does" numbers them the same way.

1. Finished: when the trainer reports the final step, the run is finished, whatever else is going on.
2. Next segment: with no live segment, the next one starts once the previous one's pods are gone,
   on the best-fitting rung (the first one on the requested shape), after any application-failure
   backoff and within the segment limit.
3. The JobSet: a live segment whose JobSet never got created is created again; one deleted behind
   the controller's back ends the segment; one that completed short of the final step fails the run.
4. Application failures have their own budget with exponential backoff; preemptions, lost peers
   (trainer exit 43: a host died under the segment) and capacity changes never spend it.
   Configuration errors end the run at once. A JobSet suspended or being deleted is waited for.
5. Capacity loss — pods unschedulable past a grace period, or unschedulable while the cluster no
   longer has room for the shape (its node pools gone or terminating) — ends the segment; the next
   one runs on the largest feasible shape of the ladder that fits.
6. Capacity return — a larger feasible shape has fitted for a stability window — ends the segment
   the same way (the trainer checkpoints on SIGTERM and exits 42, so no step is lost) and grows.
7. Same-size disruptions are JobSet's job: its failure policy restarts on DisruptionTarget and exit
   42 without counting. The controller does not fight it: it waits.

In-place runs (`RunSpec.restart_mode`, docs/contract.md "World (in-place restarts)") run INPLACE_RULES
instead: a segment is one world over slices that each have their own JobSet, and a shape change is
one NEW_WORLD decision (the current segment ended and the next recorded together), after which
only the leaving slices' JobSets are deleted and only the new ones' created:

1. Finished, as above.
2. Next world: with no live segment (launch, or after a failure ended one), every slice JobSet of
   the run is deleted and its pods waited for, then the first world starts on the best-fitting rung.
3. Missing slices: a slice of the world whose JobSet does not exist is created again (a controller
   that stopped between recording and creating; one deleted behind its back restarts as in 6).
4. A slice JobSet that gave up (failed), or more crashes counted by the slice JobSets together than
   the run's `max_restarts`, ends the world as an application failure (budget, backoff).
5. A lost slice — its node pool gone or unhealthy, or its pods unschedulable with no room (or past
   the grace period) — leaves: the survivors, in their order, form the next world on the largest
   feasible rung that fits (new slices added when the cluster has room for them).
6. A slice that JobSet restarted under the world (a preemption) once every slice runs again: the
   same slices, a new world (the survivors' trainers exited 43, or 42 when the preempted slice's
   SIGTERM stopped the world, and wait for it). A crashed host's pod stays Running: its node
   turning NotReady makes its slice lost (5).
7. Capacity return, as rule 6 above: the new slices' JobSets are created while the world trains
   on (`Segment.joining`); 7a. once their pods run, the next world takes them in after the
   survivors (dropped, their JobSets deleted, if their capacity goes meanwhile).
8. Otherwise wait.

Every decision carries its reason, in words a person on call can act on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from launcher.core import record
from launcher.core import world as worlds
from launcher.core.exits import EXIT_PEER_LOST
from launcher.core.plan import Plan, Rung
from launcher.core.presets import Catalog
from launcher.core.record import RunRecord, new_segment
from launcher.core.signals import observation as signals
from launcher.core.signals.slices import SliceView
from launcher.core.words import (
    Action,
    Cause,
    EndKind,
    FailureKind,
    Phase,
    ReshapeMode,
    RunState,
    TrainerState,
)


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    record: RunRecord  # the record to write (compare-and-swap) before acting
    jobset: str | None = None  # JobSet to create or delete
    # Delete the segment's pods with a zero grace period: its hosts are gone, so its survivors'
    # collectives can never finish a step and the SIGTERM save has nothing to write.
    force: bool = False
    # In place: the slices whose JobSets to delete, and those whose JobSets to create.
    slices_delete: tuple[str, ...] = ()
    slices_create: tuple[str, ...] = ()

    @property
    def acts(self) -> bool:
        return self.action != Action.WAIT


def best_fit(
    ladder: list[Rung], obs: signals.Observation, *, stable_before: float | None = None
) -> Rung | None:
    """The largest feasible rung that fits the schedulable capacity (and has fitted since
    `stable_before`, when given). Ladders are sorted largest first."""
    for rung in ladder:
        if not rung.feasible:
            continue
        since = obs.fits_since(rung.shape.preset.name, rung.shape.slices)
        if since is None:
            continue
        if stable_before is not None and since > stable_before:
            continue
        return rung
    return None


def pool_for(rung: Rung, obs: signals.Observation, previous: tuple[str, ...]) -> str | None:
    """The node pool a segment on `rung` names, or None: one slice only (several need JobSet's
    exclusive placement to spread them), on a free whole slice of its preset, one of the `previous`
    segment's pools first (a slice the run just held: its nodes have the image). Naming it spares
    the segment's follower pods a wait for their leader (render.render_jobset)."""
    if rung.shape.slices != 1:
        return None
    free = obs.free_pools.get(rung.shape.preset.name, ())
    return next((p for p in free if p in previous), free[0] if free else None)


def _shape_words(rung: Rung) -> str:
    plan = rung.plan
    assert isinstance(plan, Plan)
    return f"{rung.shape} ({rung.shape.devices} devices, micro-batch {plan.micro_batch} × {plan.grad_accum} accum)"


def bookkeep(rec: RunRecord, obs: signals.Observation) -> RunRecord:
    """Facts the observation adds to the record: when the segment first ran, on which node pools,
    its JobSet's uid and restart counters, the trainer's step target."""
    seg = rec.current
    if seg is not None and seg.live and obs.segment == seg.index:
        changes: dict = {}
        if obs.jobset_uid and seg.jobset_uid != obs.jobset_uid:
            changes["jobset_uid"] = obs.jobset_uid
        if obs.phase == Phase.RUNNING and seg.running_at is None:
            changes["running_at"] = obs.now
        pools = tuple(sorted(set(seg.nodepools) | set(obs.nodepools_in_use)))
        if pools != seg.nodepools:
            changes["nodepools"] = pools
        if obs.restarts > seg.restarts:
            changes.update(restart_causes(seg, obs))
            if "uncounted_failures" in changes:  # a crash all the same: the run's budget pays
                rec = replace(rec, app_failures=rec.app_failures + 1)
        elif (failing := signals.stronger(seg.failing, obs.causes.get(seg.restarts))) != seg.failing:
            changes["failing"] = failing
        if changes:
            rec = rec.with_segment(replace(seg, **changes))
    total = (obs.trainer or {}).get("total_steps")
    if total and rec.total_steps != total:
        rec = replace(rec, total_steps=int(total))
    return rec


def restart_causes(seg: record.Segment, obs: signals.Observation) -> dict:
    """The segment's restart counters once JobSet has restarted it (obs.restarts > seg.restarts).

    JobSet says which restarts counted toward maxRestarts (application failures). Of the others,
    the first one's cause is what the failed pods of attempt `seg.restarts` showed, now or in an
    earlier pass (`seg.failing`): a lost peer, or a crash that made its peers exit 43 first (which
    the pod failure policy then took for a lost peer); any further ones in the same jump (missed
    between two passes) stay preemptions, as JobSet's rule calls them.
    """
    counted = max(seg.restarts_counted, obs.restarts_counted)
    uncounted = (obs.restarts - seg.restarts) - (counted - seg.restarts_counted)
    cause = signals.stronger(seg.failing, obs.causes.get(seg.restarts))
    changes = {"restarts": obs.restarts, "restarts_counted": counted, "failing": None}
    if uncounted > 0 and cause == Cause.PEER_LOST:
        changes["peer_lost"] = seg.peer_lost + 1
    elif uncounted > 0 and cause == Cause.APP_FAILURE:
        changes["uncounted_failures"] = seg.uncounted_failures + 1
    return changes


def _end(rec: RunRecord, obs: signals.Observation, kind: EndKind, reason: str, state: RunState) -> RunRecord:
    seg = rec.current
    assert seg is not None
    ended = replace(seg, ended_at=obs.now, end_kind=kind, end_reason=reason, end_step=obs.committed_step)
    return replace(rec.with_segment(ended), state=state, reason=reason)


def _trainer_finished(rec: RunRecord, obs: signals.Observation) -> bool:
    status = obs.trainer or {}
    total = rec.total_steps or status.get("total_steps")
    return status.get("state") == TrainerState.FINISHED and total is not None and obs.committed_step == total


def decide(rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog) -> Decision:
    """The one decision of this pass for the run, with the record to write before acting: the first
    rule of RULES that decides."""
    if rec.terminal:
        return Decision(Action.WAIT, f"run is {rec.state}: {rec.reason}", rec)
    in_place = rec.spec.restart_mode == ReshapeMode.IN_PLACE
    rec = bookkeep_world(rec, obs) if in_place else bookkeep(rec, obs)
    for rule in INPLACE_RULES if in_place else RULES:
        if (decision := rule(rec, obs, ladder, catalog)) is not None:
            return decision
    raise AssertionError("the last rule always decides")


def finished(
    rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog
) -> Decision | None:
    """1. The trainer reports the final step: done, whatever else is going on."""
    if not _trainer_finished(rec, obs):
        return None
    seg = rec.current
    reason = f"trainer finished step {obs.committed_step}"
    if seg and seg.live:
        done = _end(rec, obs, EndKind.FINISHED, reason, RunState.FINISHED)
    elif seg and seg.end_step != obs.committed_step:
        # Ended (say for a grow) but its trainer reached the final step before it stopped: the
        # segment ended by finishing, and the restart it was ended for never happened.
        was = f"{reason}, before the {seg.end_kind} it was ended for: {seg.end_reason}"
        done = rec.with_segment(
            replace(seg, end_kind=EndKind.FINISHED, end_reason=was, end_step=obs.committed_step)
        )
    else:
        done = rec
    return Decision(
        Action.FINISH, reason, replace(done, state=RunState.FINISHED, reason=reason, finished_at=obs.now)
    )


def _held_back(rec: RunRecord, obs: signals.Observation, pods_alive: bool) -> Decision | None:
    """What holds the next segment back, in either restart mode: the run's old pods still alive,
    the back-off after an application failure, or the limit of segments (the run then fails)."""
    if pods_alive:
        return Decision(Action.WAIT, f"waiting for {obs.run_pods_alive} pod(s) of the run to terminate", rec)
    if obs.now < rec.next_submit_at:
        return Decision(
            Action.WAIT, f"backing off after an application failure until {rec.next_submit_at:.0f}", rec
        )
    if len(rec.segments) >= rec.knobs.max_segments:
        reason = f"reached the limit of {rec.knobs.max_segments} segments"
        return Decision(
            Action.FAIL, reason, replace(rec, state=RunState.FAILED, reason=reason, finished_at=obs.now)
        )
    return None


def _next_rung(rec: RunRecord, obs: signals.Observation, ladder: list[Rung]) -> tuple[Rung, str] | Decision:
    """The next segment's rung and why, or a WAIT while no rung fits. The first segment asks for
    the requested shape even if it does not fit yet: node pools may be autoscaled from zero, and
    rule 5 shrinks it if capacity never comes."""
    seg = rec.current
    if seg is None:
        return ladder[0], "launch"
    rung = best_fit(ladder, obs)
    if rung is None:
        reason = "waiting for capacity: no feasible shape of the ladder fits the cluster"
        return Decision(Action.WAIT, reason, replace(rec, state=RunState.WAITING, reason=reason))
    return rung, f"after segment {seg.index} ({seg.end_kind})"


def next_segment(
    rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog
) -> Decision | None:
    """2. No live segment: submit the next one once the previous one's pods are gone. Decides
    whenever there is no live segment, so the rules after it always have one."""
    seg = rec.current
    if seg is not None and seg.live:
        return None
    now = obs.now
    if seg is not None and seg.jobset in obs.live_jobsets:
        return Decision(
            Action.DELETE,
            f"segment {seg.index} is over ({seg.end_kind}): deleting {seg.jobset}",
            rec,
            seg.jobset,
        )
    if held := _held_back(rec, obs, bool(obs.run_pods_alive)):
        return held
    chosen = _next_rung(rec, obs, ladder)
    if isinstance(chosen, Decision):
        return chosen
    rung, why = chosen
    plan = rung.plan
    assert isinstance(plan, Plan)
    # The first segment leaves placement to JobSet: its pools may still be scaling up from zero.
    pool = pool_for(rung, obs, seg.nodepools) if seg is not None else None
    new = new_segment(rec, rung.shape, plan, now, why, obs.committed_step, pool)
    reason = f"segment {new.index} on {_shape_words(rung)}{f' (node pool {pool})' if pool else ''} {why}"
    return Decision(
        Action.START_SEGMENT,
        reason,
        replace(rec.with_segment(new), state=RunState.RUNNING, reason=reason),
        new.jobset,
    )


def jobset_gone(
    rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog
) -> Decision | None:
    """3. A live segment whose JobSet does not exist: never created (the controller stopped between
    recording and creating it), or deleted behind our back; or one that completed without the
    trainer's final step."""
    seg = _live(rec)
    if obs.phase == Phase.ABSENT:
        if seg.jobset_uid is None:
            return Decision(
                Action.CREATE_JOBSET, f"creating JobSet {seg.jobset} of segment {seg.index}", rec, seg.jobset
            )
        reason = f"JobSet {seg.jobset} disappeared"
        return Decision(Action.END, reason, _end(rec, obs, EndKind.LOST, reason, RunState.RESHAPING), None)
    if obs.phase == Phase.COMPLETED:
        reason = (
            f"JobSet {seg.jobset} completed but the trainer did not report the final step "
            f"(committed step {obs.committed_step}, target {rec.total_steps})"
        )
        return Decision(
            Action.FAIL,
            reason,
            replace(_end(rec, obs, EndKind.FAILED, reason, RunState.FAILED), finished_at=obs.now),
        )
    return None


def failures(
    rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog
) -> Decision | None:
    """4. Failures that JobSet gave up on, a budget spent by crashes JobSet did not count, and a
    JobSet that is suspended or being deleted."""
    seg, now, knobs = _live(rec), obs.now, rec.knobs
    if obs.phase == Phase.FAILED and obs.failure is not None:
        if obs.failure.kind == FailureKind.CONFIG_ERROR:
            reason = f"configuration error (trainer exit code 2): {obs.failure.message}"
            return Decision(
                Action.FAIL,
                reason,
                replace(_end(rec, obs, EndKind.FAILED, reason, RunState.FAILED), finished_at=now),
            )
        count = rec.app_failures + obs.restarts_counted + 1
        last = (
            f"last exit code {obs.last_exit_code}" if obs.last_exit_code is not None else obs.failure.message
        )
        if count > knobs.app_failure_budget:
            reason = (
                f"crash loop: {count} application failures exceed the budget of "
                f"{knobs.app_failure_budget} ({last}); preemptions so far: {rec.preemptions()}"
            )
            ended = _end(rec, obs, EndKind.APP_FAILURE, reason, RunState.FAILED)
            return Decision(Action.FAIL, reason, replace(ended, app_failures=count, finished_at=now))
        backoff = knobs.app_backoff_s * 2 ** (count - 1)
        reason = (
            f"application failure {count}/{knobs.app_failure_budget} ({last}); retrying in {backoff:.0f}s"
        )
        ended = _end(rec, obs, EndKind.APP_FAILURE, reason, RunState.RESHAPING)
        return Decision(
            Action.END, reason, replace(ended, app_failures=count, next_submit_at=now + backoff), seg.jobset
        )

    # A crash whose peers' exit 43 made JobSet restart without counting still spends the budget.
    if rec.app_failures > knobs.app_failure_budget:
        reason = (
            f"crash loop: {rec.app_failures} application failures exceed the budget of "
            f"{knobs.app_failure_budget} (a trainer crashed and its peers exited {EXIT_PEER_LOST});"
            f" preemptions so far: {rec.preemptions()}"
        )
        ended = _end(rec, obs, EndKind.APP_FAILURE, reason, RunState.FAILED)
        return Decision(Action.END, reason, replace(ended, finished_at=now), seg.jobset)  # JobSet would go on

    if obs.phase in {Phase.SUSPENDED, Phase.DELETING}:
        return Decision(Action.WAIT, f"JobSet {seg.jobset} is {obs.phase}", rec)
    return None


def capacity_lost(
    rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog
) -> Decision | None:
    """5. Capacity loss. Node pools of the segment gone or terminating, with no room left for the
    shape, is decided at once: waiting for JobSet to restart every pod only to find them
    unschedulable costs a full recreate (minutes at a thousand pods). A segment on a named pool has
    room only there: on another pool it starts again, same shape."""
    seg, now, knobs = _live(rec), obs.now, rec.knobs
    current = seg.shape(catalog)
    pool_lost = seg.pool is not None and seg.pool not in obs.free_pools.get(current.preset.name, ())
    no_room = pool_lost or not obs.fits(current.preset.name, current.slices)
    pools_lost = bool(obs.lost_nodepools) and no_room
    if not (obs.unschedulable or pools_lost):
        return None
    waited = now - (obs.unschedulable_since or now)
    if not (no_room or waited >= knobs.unschedulable_grace_s):
        return Decision(
            Action.WAIT,
            f"{obs.unschedulable} pod(s) unschedulable for {waited:.0f}s (grace {knobs.unschedulable_grace_s:.0f}s)",
            rec,
        )
    most = current.devices if pool_lost else current.devices - 1
    rung = best_fit([r for r in ladder if r.shape.devices <= most], obs)
    causes = []
    if obs.unschedulable:
        causes.append(
            f"{obs.unschedulable} pod(s) unschedulable for {waited:.0f}s"
            + (f" ({obs.unschedulable_message})" if obs.unschedulable_message else "")
        )
    if obs.lost_nodepools:
        causes.append(f"node pools lost: {', '.join(obs.lost_nodepools)}")
    elif pool_lost:
        causes.append(f"node pool {seg.pool} is no longer free")
    cause = "; ".join(causes)
    if rung is None:
        return Decision(Action.WAIT, f"{cause}; no smaller feasible shape fits either", rec)
    how = "on another node pool" if rung.shape.devices == current.devices else "shrinking"
    reason = f"capacity lost: {cause}; {how} {current} -> {_shape_words(rung)}"
    ended = _end(rec, obs, EndKind.CAPACITY_LOST, reason, RunState.RESHAPING)
    # A node pool terminating (a preemption notice) still lets the trainer save; one gone does not.
    return Decision(Action.END, reason, ended, seg.jobset, force=bool(obs.gone_nodepools))


def capacity_returned(
    rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog
) -> Decision | None:
    """6. Capacity return: grow once a larger feasible shape has fitted for the grow window. Only at
    a checkpoint this segment committed itself: a segment that never got to train must not be torn
    down again (no flapping), and the resize then costs no progress."""
    seg, knobs = _live(rec), rec.knobs
    current = seg.shape(catalog)
    requested = rec.requested(catalog)
    progressed = obs.committed_step is not None and obs.committed_step > (seg.start_step or 0)
    if not (knobs.grow and obs.phase == Phase.RUNNING and current.devices < requested.devices and progressed):
        return None
    rung = best_fit(ladder, obs, stable_before=obs.now - knobs.grow_window_s)
    if rung is None or rung.shape.devices <= current.devices:
        return None
    reason = (
        f"capacity returned: {rung.shape} has fitted for {knobs.grow_window_s:.0f}s; "
        f"growing {current} -> {_shape_words(rung)} (the trainer checkpoints on SIGTERM)"
    )
    return Decision(Action.END, reason, _end(rec, obs, EndKind.GROW, reason, RunState.RESHAPING), seg.jobset)


def jobsets_own(rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog) -> Decision:
    """7. Anything else — running, pending inside the grace, restarting after a disruption — is
    JobSet's to handle: wait, saying which."""
    seg = _live(rec)
    current = seg.shape(catalog)
    cause = seg.failing or obs.causes.get(seg.restarts - 1)  # failing now, or the restart under way
    restarting = "restarting (JobSet failure policy)" + (
        f" after {signals.CAUSE_WORDS[cause]}" if cause else ""
    )
    words = {Phase.RUNNING: "running", Phase.PENDING: "starting", Phase.RESTARTING: restarting}
    return Decision(Action.WAIT, f"segment {seg.index} on {current} {words.get(obs.phase, obs.phase)}", rec)


# The rules in the order `decide` runs them: the module docstring's numbering.
RULES = (finished, next_segment, jobset_gone, failures, capacity_lost, capacity_returned, jobsets_own)


def _live(rec: RunRecord) -> record.Segment:
    seg = rec.current
    assert seg is not None and seg.live  # next_segment decides whenever there is none
    return seg


# --- in-place runs -------------------------------------------------------------------------------


def in_place(rec: RunRecord) -> bool:
    return rec.spec.restart_mode == ReshapeMode.IN_PLACE


def bookkeep_world(rec: RunRecord, obs: signals.Observation) -> RunRecord:
    """What the observation adds to an in-place segment: when every slice of its world first ran,
    the node pools its slices' pods are on, the trainer's step target."""
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


def new_world(
    rec: RunRecord, obs: signals.Observation, rung: Rung, slices: tuple[str, ...], why: str
) -> record.Segment:
    """The next segment of an in-place run: the world of `slices` on `rung`, its epoch its index."""
    plan = rung.plan
    assert isinstance(plan, Plan)
    seg = new_segment(rec, rung.shape, plan, obs.now, why, obs.committed_step)
    return replace(
        seg,
        slice_ids=slices,
        coordinator=worlds.coordinator(rec.spec, slices, seg.index),
        restarts=world_restarts(obs, slices),
        jobset=slices_words(rec.name, slices),
    )


def slices_words(run: str, slices: tuple[str, ...]) -> str:
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
) -> Decision:
    """End the current world and record the next one in the same write: NEW_WORLD. `gone`: slices
    of the current world whose hosts are gone (the next world's `lost`)."""
    seg = _live(rec)
    ended = _end(rec, obs, kind, reason, RunState.RUNNING)
    nxt = replace(new_world(ended, obs, rung, slices, f"after segment {seg.index} ({kind})"), lost=gone)
    leaving = tuple(s for s in seg.slice_ids if s not in slices)
    joining = tuple(s for s in slices if s not in seg.slice_ids)
    words = (
        f"; world {nxt.index}: slices [{', '.join(slices)}] on {_shape_words(rung)}"
        + (f", leaving: {', '.join(leaving)}" if leaving else "")
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
    """In place 2. No live segment: delete what is left of the run's slices, wait for their pods,
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
    if held := _held_back(rec, obs, alive):
        return held
    chosen = _next_rung(rec, obs, ladder)
    if isinstance(chosen, Decision):
        return chosen
    rung, why = chosen
    slices = worlds.world_slices((), (), rung.shape.slices)
    new = new_world(rec, obs, rung, slices, why)
    reason = (
        f"segment {new.index} (world {new.index}) on {_shape_words(rung)}, slices [{', '.join(slices)}] {why}"
    )
    return Decision(
        Action.START_SEGMENT,
        reason,
        replace(rec.with_segment(new), state=RunState.RUNNING, reason=reason),
        slices_create=slices,
    )


def missing_slices(
    rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog
) -> Decision | None:
    """In place 3. A slice of the world whose JobSet does not exist: created (again). One being
    deleted is waited for (its name is the new one's). A slice JobSet not in the world: deleted."""
    seg = _live(rec)
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
            f"deleting the JobSet(s) of slice(s) {', '.join(extra)}, not in world {seg.index}",
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
        f"creating the JobSet(s) of slice(s) {', '.join(absent)} of world {seg.index}",
        rec,
        slices_create=absent,
    )


def world_failed(
    rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog
) -> Decision | None:
    """In place 4. Application failures: a slice JobSet that gave up, or crashes that the slice
    JobSets' failure policies counted (`restartsCountTowardsMax`), summed over the run's slices,
    beyond the run's `max_restarts`. A recreate run's one JobSet gives up on its (max_restarts + 1)th
    counted crash wherever in the segment it happened; each slice JobSet has a `maxRestarts` of its
    own, so without the sum a crash loop that moves between slices, or one that each new world
    starts again, would go on N times longer. The world ends as rule 4 ends a segment: the run's
    budget pays the counted restarts and the failure (app_failures + counted + 1, as rule 4 adds
    them), then backoff and a fresh start (every slice JobSet deleted: their counters start over,
    as a recreate segment's new JobSet's do), or the run fails."""
    seg, now, knobs = _live(rec), obs.now, rec.knobs
    failed = [s for s in seg.slice_ids if (v := obs.slices.get(s)) is not None and v.phase == Phase.FAILED]
    counted = sum(v.restarts_counted for v in obs.slices.values() if v.jobset)
    if not failed and counted <= rec.spec.max_restarts:
        return None
    # A JobSet that gave up adds its last failure; the sum's last counted restart is the crash that
    # went over the limit.
    count = rec.app_failures + counted + (1 if failed else 0)
    what = (
        f"slice(s) {', '.join(failed)} failed"
        if failed
        else f"{counted} crashes restarted slice JobSets, over max_restarts {rec.spec.max_restarts}"
    )
    everything = tuple(sorted(s for s, v in obs.slices.items() if v.jobset))
    if count > knobs.app_failure_budget:
        reason = f"crash loop: {count} application failures exceed the budget of {knobs.app_failure_budget} ({what})"
        ended = _end(rec, obs, EndKind.APP_FAILURE, reason, RunState.FAILED)
        return Decision(
            Action.FAIL,
            reason,
            replace(ended, app_failures=count, finished_at=now),
            slices_delete=everything,
        )
    backoff = knobs.app_backoff_s * 2 ** (count - 1)
    reason = f"application failure {count}/{knobs.app_failure_budget} ({what}); retrying in {backoff:.0f}s"
    ended = _end(rec, obs, EndKind.APP_FAILURE, reason, RunState.RESHAPING)
    return Decision(
        Action.END,
        reason,
        replace(ended, app_failures=count, next_submit_at=now + backoff),
        slices_delete=everything,
    )


def slice_lost(
    rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog
) -> Decision | None:
    """In place 5. Lost slices leave the world; the survivors keep their pods. A slice is lost when
    the node pools its pods are on are gone or unhealthy, or its pods are unschedulable while the
    cluster has no room for the world (at once) or past the grace period."""
    seg, now, knobs = _live(rec), obs.now, rec.knobs
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
    for sid, v in views.items():
        if sid in vanished_with or (v is not None and set(v.pools) & gone_pools):
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
        if waiting:
            return Decision(
                Action.WAIT,
                f"pods of slice(s) {', '.join(waiting)} unschedulable (grace {knobs.unschedulable_grace_s:.0f}s)",
                rec,
            )
        return None
    survivors = [s for s in seg.slice_ids if s not in lost]
    rung = best_fit([r for r in ladder if r.shape.devices < current.devices], obs)
    cause = f"slice(s) {', '.join(lost)} lost" + (
        f" (node pools lost: {', '.join(sorted(lost_pools))})" if lost_pools else " (pods unschedulable)"
    )
    if rung is None:
        return Decision(Action.WAIT, f"{cause}; no smaller feasible shape fits either", rec)
    same = rung.shape.preset.name == current.preset.name
    slices = worlds.world_slices(seg.slice_ids, survivors if same else (), rung.shape.slices)
    reason = f"capacity lost: {cause}; shrinking {current} -> {rung.shape} in place"
    return _reshape(
        rec, obs, rung, slices, EndKind.CAPACITY_LOST, reason, force=bool(gone_pools), gone=tuple(gone)
    )


def slice_restarted(
    rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog
) -> Decision | None:
    """In place 6. JobSet restarted a slice of the world (a preemption, a pod killed): once every
    slice runs again, the same slices form a new world (the survivors' trainers exited 43, or 42
    when a preempted slice's SIGTERM stopped the world, and wait for one; the restarted pods'
    supervisors end the child they started in the old one)."""
    seg = _live(rec)
    views = [obs.slices.get(s) for s in seg.slice_ids]
    if not all(v is not None and v.running for v in views):
        return None
    if world_restarts(obs, seg.slice_ids) <= seg.restarts:
        return None
    rung = next((r for r in ladder if r.shape == seg.shape(catalog) and r.feasible), None)
    if rung is None:
        return None
    reason = f"a slice of world {seg.index} restarted (JobSet failure policy): the same slices in a new world"
    return _reshape(rec, obs, rung, seg.slice_ids, EndKind.RESTART, reason)


def world_grows(
    rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog
) -> Decision | None:
    """In place 7. Capacity return: as rule 6 above (the grow window, a checkpoint this world
    committed), new slices join the survivors."""
    seg, knobs = _live(rec), rec.knobs
    current = seg.shape(catalog)
    requested = rec.requested(catalog)
    running = all((v := obs.slices.get(s)) is not None and v.running for s in seg.slice_ids)
    progressed = obs.committed_step is not None and obs.committed_step > (seg.start_step or 0)
    if seg.joining or not (knobs.grow and running and current.devices < requested.devices and progressed):
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
    reason += f": slice(s) {', '.join(joining)} joining (world {seg.index} trains on until their pods run)"
    return Decision(
        Action.CREATE_JOBSET,
        reason,
        replace(rec.with_segment(replace(seg, joining=joining)), reason=reason),
        slices_create=joining,
    )


def slices_joining(
    rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog
) -> Decision | None:
    """In place 7a. Slices joining after a grow: once every one's pods run, the next world takes
    them in after the survivors; lost meanwhile (their pool gone, their pods unschedulable with no
    room or past the grace period), they are dropped and their JobSets deleted."""
    seg, now, knobs = _live(rec), obs.now, rec.knobs
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
        return bool(set(v.pools) & lost_pools) or (
            v.unschedulable > 0 and (not room or waited >= knobs.unschedulable_grace_s)
        )

    if any(lost(v) for v in views.values()):
        reason = (
            f"slice(s) {', '.join(seg.joining)} cannot join: their capacity is gone; world {seg.index} stays"
        )
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
    """In place 8. Anything else: wait, saying how the world's slices stand."""
    seg = _live(rec)
    states = ", ".join(
        f"{s}{' (joining)' if s in seg.joining else ''}: {v.phase if v else 'absent'}"
        f" {v.pods_running if v else 0}/{seg.shape(catalog).preset.hosts}"
        for s in (*seg.slice_ids, *seg.joining)
        for v in [obs.slices.get(s)]
    )
    return Decision(Action.WAIT, f"world {seg.index} on {seg.shape(catalog)} ({states})", rec)


# The in-place rules in the order `decide` runs them: the module docstring's second numbering.
INPLACE_RULES = (
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
