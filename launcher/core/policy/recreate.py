"""The recreate mode's rules (`RestartMode.RECREATE`, the default): a segment is one JobSet, and a
shape change ends it and starts the next, every pod recreated. Called through the package's `decide`
(launcher/core/policy/__init__.py), which runs RULES in this order, one function each; the first that
returns a Decision is the pass's (as jobset's executeFailurePolicy walks its rules,
kubernetes-sigs/jobset pkg/controllers/failure_policy.go). docs/design.md "What the controller does" numbers
them the same way.

1. Finished (shared.finished): when the trainer reports the final step, the run is finished,
   whatever else is going on.
2. Next segment: with no live segment, the next one starts once the previous one's pods are gone,
   on the best-fitting rung (the first one on the requested shape), after any application-failure
   backoff and within the segment limit.
3. The JobSet: a live segment whose JobSet never got created is created again; one deleted behind
   the controller's back ends the segment; one that completed short of the final step fails the run.
4. Application failures have their own budget with exponential backoff; preemptions, lost peers
   (trainer exit 43: a host died under the segment) and capacity changes never spend it.
   Configuration errors end the run at once. A JobSet being deleted is waited for; one that Kueue
   suspended (evicted, or not admitted within the grace period) ends the segment and the next one
   is smaller (4a, `suspended`).
5. Capacity loss — pods unschedulable past a grace period, or unschedulable while the cluster no
   longer has room for the shape (its node pools gone or terminating) — ends the segment; the next
   one runs on the largest feasible shape of the ladder that fits.
6. Capacity return — a larger feasible shape has fitted for a stability window — ends the segment
   the same way (the trainer checkpoints on SIGTERM and exits 42, so no step is lost) and grows.
7. Same-size disruptions are JobSet's job: its failure policy restarts on DisruptionTarget and exit
   42 without counting. The controller does not fight it: it waits.

Every decision carries its reason, in words a person on call can act on.
"""

from __future__ import annotations

from dataclasses import replace

from contract.exits import Exit
from contract.words import RestartMode
from launcher.core import record
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
    pool_for,
    shape_words,
)
from launcher.core.presets import Catalog
from launcher.core.record import RunRecord, new_segment
from launcher.core.signals import observation as signals
from launcher.core.words import Action, Cause, EndKind, FailureKind, Phase, RunState, WaitReason

MODE = RestartMode.RECREATE
# No world: a segment is one JobSet of every slice, nothing is published to the pods' supervisors.
WORLD = False


def publishable(rec: RunRecord, obs: signals.Observation) -> bool:
    """No world to publish: a segment is one JobSet."""
    return False


def bookkeep(rec: RunRecord, obs: signals.Observation) -> RunRecord:
    """Facts the observation adds to the record: when the segment first ran, on which node pools,
    its JobSet's uid and restart counters, the trainer's step target, the host disruptions."""
    rec = book_host_disruptions(rec, obs)
    seg = rec.current
    if seg is not None and seg.live and obs.segment == seg.index:
        changes: dict = {}
        if obs.jobset.uid and seg.jobset_uid != obs.jobset.uid:
            changes["jobset_uid"] = obs.jobset.uid
        if obs.phase == Phase.RUNNING and seg.running_at is None:
            changes["running_at"] = obs.now
        pools = tuple(sorted(set(seg.nodepools) | set(obs.nodepools_in_use)))
        if pools != seg.nodepools:
            changes["nodepools"] = pools
        if obs.jobset.restarts > seg.restarts:
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
    """The segment's restart counters once JobSet has restarted it (obs.jobset.restarts > seg.restarts).

    JobSet says which restarts counted toward maxRestarts (application failures). Of the others,
    the first one's cause is what the failed pods of attempt `seg.restarts` showed, now or in an
    earlier pass (`seg.failing`): a lost peer, or a crash that made its peers exit 43 first (which
    the pod failure policy then took for a lost peer); any further ones in the same jump (missed
    between two passes) stay preemptions, as JobSet's rule calls them.
    """
    counted = max(seg.restarts_counted, obs.jobset.restarts_counted)
    uncounted = (obs.jobset.restarts - seg.restarts) - (counted - seg.restarts_counted)
    cause = signals.stronger(seg.failing, obs.causes.get(seg.restarts))
    changes = {"restarts": obs.jobset.restarts, "restarts_counted": counted, "failing": None}
    if uncounted > 0 and cause == Cause.PEER_LOST:
        changes["peer_lost"] = seg.peer_lost + 1
    elif uncounted > 0 and cause == Cause.APP_FAILURE:
        changes["uncounted_failures"] = seg.uncounted_failures + 1
    elif uncounted > 0 and cause == Cause.HOST_DISRUPTION:
        changes["host_disrupted"] = seg.host_disrupted + 1
    return changes


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
    if held := held_back(rec, obs, bool(obs.run_pods_alive)):
        return held
    chosen = next_rung(rec, obs, ladder)
    if isinstance(chosen, Decision):
        return chosen
    rung, why = chosen
    plan = rung.plan
    assert isinstance(plan, Plan)
    # The first segment leaves placement to JobSet: its pools may still be scaling up from zero.
    pool = pool_for(rung, obs, seg.nodepools) if seg is not None else None
    new = new_segment(rec, rung.shape, plan, now, why, obs.committed_step, pool)
    reason = f"segment {new.index} on {shape_words(rung)}{f' (node pool {pool})' if pool else ''} {why}"
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
    seg = live_segment(rec)
    if obs.phase == Phase.ABSENT:
        if seg.jobset_uid is None:
            return Decision(
                Action.CREATE_JOBSET, f"creating JobSet {seg.jobset} of segment {seg.index}", rec, seg.jobset
            )
        reason = f"JobSet {seg.jobset} disappeared"
        return Decision(
            Action.END, reason, end_segment(rec, obs, EndKind.DISAPPEARED, reason, RunState.RESHAPING), None
        )
    if obs.phase == Phase.COMPLETED:
        reason = (
            f"JobSet {seg.jobset} completed but the trainer did not report the final step "
            f"(committed step {obs.committed_step}, target {rec.total_steps})"
        )
        return Decision(
            Action.FAIL,
            reason,
            replace(end_segment(rec, obs, EndKind.FAILED, reason, RunState.FAILED), finished_at=obs.now),
        )
    return None


def failures(
    rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog
) -> Decision | None:
    """4. Failures that JobSet gave up on, a budget spent by crashes JobSet did not count, and a
    JobSet that is suspended or being deleted."""
    seg, now, knobs = live_segment(rec), obs.now, rec.knobs
    if obs.phase == Phase.FAILED and obs.failure is not None:
        if obs.failure.kind == FailureKind.CONFIG_ERROR:
            reason = f"configuration error (trainer exit code 2): {obs.failure.message}"
            return Decision(
                Action.FAIL,
                reason,
                replace(end_segment(rec, obs, EndKind.FAILED, reason, RunState.FAILED), finished_at=now),
            )
        if obs.failure.kind == FailureKind.MAX_RESTARTS and gave_up_on_host(
            rec, obs.jobset.uid, obs.jobset.restarts
        ):
            reason = (
                f"host disruption: JobSet {seg.jobset} reached its maxRestarts on a host that rebooted"
                " under it (its container gone); not the run's failure: starting again"
            )
            ended = end_segment(rec, obs, EndKind.HOST_DISRUPTION, reason, RunState.RESHAPING)
            return Decision(Action.END, reason, ended, seg.jobset)
        # JobSet counted the restarts a host disruption caused as crashes: the run does not.
        counted = obs.jobset.restarts_counted - rec.forgiven(
            obs.jobset.uid, obs.jobset.restarts_counted, seg.host_disrupted
        )
        count = rec.app_failures + counted + 1
        last = (
            f"last exit code {obs.last_exit_code}" if obs.last_exit_code is not None else obs.failure.message
        )
        if count > knobs.app_failure_budget:
            reason = (
                f"crash loop: {count} application failures exceed the budget of "
                f"{knobs.app_failure_budget} ({last}); preemptions so far: {rec.preemptions()}"
            )
            ended = end_segment(rec, obs, EndKind.APP_FAILURE, reason, RunState.FAILED)
            return Decision(Action.FAIL, reason, replace(ended, app_failures=count, finished_at=now))
        backoff = knobs.app_backoff_s * 2 ** (count - 1)
        reason = (
            f"application failure {count}/{knobs.app_failure_budget} ({last}); retrying in {backoff:.0f}s"
        )
        ended = end_segment(rec, obs, EndKind.APP_FAILURE, reason, RunState.RESHAPING)
        return Decision(
            Action.END, reason, replace(ended, app_failures=count, next_submit_at=now + backoff), seg.jobset
        )

    # A crash whose peers' exit 43 made JobSet restart without counting still spends the budget.
    if rec.app_failures > knobs.app_failure_budget:
        reason = (
            f"crash loop: {rec.app_failures} application failures exceed the budget of "
            f"{knobs.app_failure_budget} (a trainer crashed and its peers exited {Exit.PEER_LOST});"
            f" preemptions so far: {rec.preemptions()}"
        )
        ended = end_segment(rec, obs, EndKind.APP_FAILURE, reason, RunState.FAILED)
        return Decision(Action.END, reason, replace(ended, finished_at=now), seg.jobset)  # JobSet would go on

    if obs.phase == Phase.SUSPENDED:
        return suspended(rec, obs, ladder)
    if obs.phase == Phase.DELETING:
        return Decision(Action.WAIT, f"JobSet {seg.jobset} is {obs.phase}", rec)
    return None


def suspended(rec: RunRecord, obs: signals.Observation, ladder: list[Rung]) -> Decision:
    """4a. The segment's JobSet is suspended: Kueue holds it (docs/gke.md "Kueue"). Once the segment
    has run, Kueue evicted or preempted it (kueue jobframework/reconciler.go stopJob ->
    JobSet.Suspend(); JobSet suspends its Jobs, whose pods the Job controller deletes): the segment
    ends and the next one is smaller (policy/shared.next_rung), at the same global batch. Not
    admitted yet, it waits the unschedulable grace period, then ends the same way. With no smaller
    feasible rung it waits: Kueue requeues the Workload and admits it again by itself."""
    seg, knobs = live_segment(rec), rec.knobs
    evicted = seg.running_at is not None
    waited = obs.now - seg.submitted_at
    smaller = any(r.feasible and r.shape.devices < seg.devices for r in ladder)
    if not smaller or not (evicted or waited >= knobs.unschedulable_grace_s):
        how = "evicted; Kueue requeues it" if evicted else f"not admitted for {waited:.0f}s"
        reason = f"JobSet {seg.jobset} is suspended by Kueue ({how}): waiting for admission"
        return Decision(Action.WAIT, reason, rec, wait=WaitReason.ADMISSION)
    how = "evicted or preempted" if evicted else f"not admitted within {knobs.unschedulable_grace_s:.0f}s"
    reason = f"JobSet {seg.jobset} suspended by Kueue ({how}): shrinking"
    return Decision(
        Action.END, reason, end_segment(rec, obs, EndKind.EVICTED, reason, RunState.RESHAPING), seg.jobset
    )


def capacity_lost(
    rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog
) -> Decision | None:
    """5. Capacity loss. Node pools of the segment gone or terminating, with no room left for the
    shape, is decided at once: waiting for JobSet to restart every pod only to find them
    unschedulable costs a full recreate (minutes at a thousand pods). A segment on a named pool has
    room only there: on another pool it starts again, same shape."""
    seg, now, knobs = live_segment(rec), obs.now, rec.knobs
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
        wait, words = no_fit(ladder, obs, most + 1)
        return Decision(Action.WAIT, f"{cause}; waiting for capacity ({wait}): {words}", rec, wait=wait)
    how = "on another node pool" if rung.shape.devices == current.devices else "shrinking"
    reason = f"capacity lost: {cause}; {how} {current} -> {shape_words(rung)}"
    ended = end_segment(rec, obs, EndKind.CAPACITY_LOST, reason, RunState.RESHAPING)
    # A node pool terminating (a preemption notice) still lets the trainer save; one gone does not.
    return Decision(Action.END, reason, ended, seg.jobset, force=bool(obs.gone_nodepools))


def capacity_returned(
    rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog
) -> Decision | None:
    """6. Capacity return: grow once a larger feasible shape has fitted for the grow window. Only at
    a checkpoint this segment committed itself: a segment that never got to train must not be torn
    down again (no flapping), and the resize then costs no progress."""
    seg, knobs = live_segment(rec), rec.knobs
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
        f"growing {current} -> {shape_words(rung)} (the trainer checkpoints on SIGTERM)"
    )
    return Decision(
        Action.END, reason, end_segment(rec, obs, EndKind.GROW, reason, RunState.RESHAPING), seg.jobset
    )


def jobsets_own(rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog) -> Decision:
    """7. Anything else — running, pending inside the grace, restarting after a disruption — is
    JobSet's to handle: wait, saying which."""
    seg = live_segment(rec)
    current = seg.shape(catalog)
    cause = seg.failing or obs.causes.get(seg.restarts - 1)  # failing now, or the restart under way
    restarting = "restarting (JobSet failure policy)" + (
        f" after {signals.CAUSE_WORDS[cause]}" if cause else ""
    )
    words = {Phase.RUNNING: "running", Phase.PENDING: "starting", Phase.RESTARTING: restarting}
    return Decision(Action.WAIT, f"segment {seg.index} on {current} {words.get(obs.phase, obs.phase)}", rec)


# The rules in the order `decide` runs them: the module docstring's numbering.
RULES: tuple[Rule, ...] = (
    finished,
    next_segment,
    jobset_gone,
    failures,
    capacity_lost,
    capacity_returned,
    jobsets_own,
)
