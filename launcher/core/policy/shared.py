"""What both restart modes' rules use: the Decision a rule returns, rule 1 (the trainer finished),
what holds the next segment back, choosing its rung, and ending the live segment in the record.

Imported by launcher/core/policy/recreate.py and in_place.py (the two rule books) and by the package's
`decide`; the controller (launcher/controller/loop.py) reads `Decision`. Pure, as the whole policy is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from launcher.core import record
from launcher.core.plan import Plan, Rung
from launcher.core.presets import Catalog
from launcher.core.record import RunRecord
from launcher.core.signals import observation as signals
from launcher.core.words import Action, EndKind, RunState, TrainerState, WaitReason


@dataclass(frozen=True)
class Decision:
    """One pass's decision: the action, its reason, the record to write, and every object to act on,
    so that the controller acts on it alone (Controller._act), whatever the run's restart mode: a
    recreate decision names its segment's one JobSet (`jobset`), an in-place one its slices'."""

    action: Action
    reason: str
    record: RunRecord  # the record to write (compare-and-swap) before acting
    jobset: str | None = None  # recreate: the segment's JobSet to create or delete
    # Delete the segment's pods with a zero grace period: its hosts are gone, so its survivors'
    # collectives can never finish a step and the SIGTERM save has nothing to write.
    force: bool = False
    # In place: the slices whose JobSets to delete, and those whose JobSets to create.
    slices_delete: tuple[str, ...] = ()
    slices_create: tuple[str, ...] = ()
    # Why the run waits for capacity, when it does (the ledger's `wait` key).
    wait: WaitReason | None = None
    # In place: whether the live world of `record` may be published (every slice it names admitted
    # by Kueue); set by the package's `decide` from the mode's `publishable`.
    publish: bool = False

    @property
    def acts(self) -> bool:
        return self.action != Action.WAIT


# A rule: (record, observation, ladder, catalog) -> its decision, or None to let the next rule decide.
Rule = Callable[[RunRecord, signals.Observation, list[Rung], Catalog], Decision | None]


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


def no_fit(ladder: list[Rung], obs: signals.Observation, below: int | None = None) -> tuple[WaitReason, str]:
    """Why no rung (of fewer than `below` devices, when given) is chosen, in words: none fits the
    cluster, or only rungs the run cannot hold do (their reason from the plan: the batch, or the
    HBM estimate), so that the wait says what would help (more capacity, not a smaller shape)."""
    rungs = [r for r in ladder if below is None or r.shape.devices < below]
    fitting = [r for r in rungs if obs.fits_since(r.shape.preset.name, r.shape.slices) is not None]
    if not fitting:
        return WaitReason.NO_ROOM, "no feasible shape of the ladder fits the cluster"
    # A shape that is not one at all (a multislice of single hosts) says least: name another first.
    rung = next((r for r in fitting if not r.shape.error), fitting[0])
    why = rung.plan.reason if not isinstance(rung.plan, Plan) else ""
    return (
        WaitReason.ONLY_INFEASIBLE,
        f"only shapes the run cannot hold fit the cluster ({rung.shape}: {why})",
    )


def pool_for(rung: Rung, obs: signals.Observation, previous: tuple[str, ...]) -> str | None:
    """The node pool a segment on `rung` names, or None: one slice only (several need JobSet's
    exclusive placement to spread them), on a free whole slice of its preset, one of the `previous`
    segment's pools first (a slice the run just held: its nodes have the image). Naming it spares
    the segment's follower pods a wait for their leader (render.render_jobset)."""
    if rung.shape.slices != 1:
        return None
    free = obs.free_pools.get(rung.shape.preset.name, ())
    return next((p for p in free if p in previous), free[0] if free else None)


def shape_words(rung: Rung) -> str:
    """A rung in a decision's reason: its shape, devices and batch plan."""
    plan = rung.plan
    assert isinstance(plan, Plan)
    return f"{rung.shape} ({rung.shape.devices} devices, micro-batch {plan.micro_batch} × {plan.grad_accum} accum)"


def end_segment(
    rec: RunRecord, obs: signals.Observation, kind: EndKind, reason: str, state: RunState
) -> RunRecord:
    """The record with its live segment ended now, at the committed step, for `kind` and `reason`."""
    seg = rec.current
    assert seg is not None
    ended = replace(seg, ended_at=obs.now, end_kind=kind, end_reason=reason, end_step=obs.committed_step)
    return replace(rec.with_segment(ended), state=state, reason=reason)


def trainer_finished(rec: RunRecord, obs: signals.Observation) -> bool:
    """Whether the trainer reports the run's final step, committed."""
    status = obs.trainer or {}
    total = rec.total_steps or status.get("total_steps")
    return status.get("state") == TrainerState.FINISHED and total is not None and obs.committed_step == total


def finished(
    rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog
) -> Decision | None:
    """Rule 1 of both modes. The trainer reports the final step: done, whatever else is going on."""
    if not trainer_finished(rec, obs):
        return None
    seg = rec.current
    reason = f"trainer finished step {obs.committed_step}"
    if seg and seg.live:
        done = end_segment(rec, obs, EndKind.FINISHED, reason, RunState.FINISHED)
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


def held_back(rec: RunRecord, obs: signals.Observation, pods_alive: bool) -> Decision | None:
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


def next_rung(rec: RunRecord, obs: signals.Observation, ladder: list[Rung]) -> tuple[Rung, str] | Decision:
    """The next segment's rung and why, or a WAIT while no rung fits. The first segment asks for
    the requested shape even if it does not fit yet: node pools may be autoscaled from zero, and
    capacity loss (rule 5 in either mode) shrinks it if capacity never comes."""
    seg = rec.current
    if seg is None:
        return ladder[0], "launch"
    if seg.end_kind == EndKind.EVICTED:
        # Kueue took the last segment's capacity back: the next is smaller. In a queue, Kueue's
        # admission says whether it fits, not the nodes seen now (a ProvisioningRequest creates them
        # after admission), so the largest smaller feasible rung is asked for.
        smaller = [r for r in ladder if r.shape.devices < seg.devices]
        if rec.spec.queue:
            rung = next((r for r in smaller if r.feasible), None)
        else:
            rung = best_fit(smaller, obs)
        if rung is not None:
            return rung, f"after segment {seg.index} ({seg.end_kind})"
    rung = best_fit(ladder, obs)
    if rung is None:
        wait, words = no_fit(ladder, obs)
        reason = f"waiting for capacity ({wait}): {words}"
        return Decision(Action.WAIT, reason, replace(rec, state=RunState.WAITING, reason=reason), wait=wait)
    return rung, f"after segment {seg.index} ({seg.end_kind})"


def book_host_disruptions(rec: RunRecord, obs: signals.Observation) -> RunRecord:
    """Both modes' bookkeeping: the restart attempts a host disruption failed, added to the record
    once each (RunRecord.host_disruptions), so that the rules forgive the restarts JobSet counted
    for them (RunRecord.forgiven) and `reslice status` books them as what they were."""
    new = obs.host_losses - set(rec.host_disruptions)
    if not new:
        return rec
    return replace(rec, host_disruptions=tuple(sorted({*rec.host_disruptions, *new})))


def gave_up_on_host(rec: RunRecord, jobset_uid: str | None, restarts: int) -> bool:
    """Whether a JobSet that failed (its own maxRestarts reached) failed on a host disruption: the
    pods of its last attempt (`restarts`, as JobSet numbers them) went away with their host. JobSet
    counted the reboots before toward its maxRestarts as any crash; the run does not."""
    return bool(jobset_uid) and f"{jobset_uid}/{restarts}" in rec.host_disruptions


def live_segment(rec: RunRecord) -> record.Segment:
    """The live segment, which every rule after a mode's rule 2 may count on (rule 2 decides whenever
    there is none)."""
    seg = rec.current
    assert seg is not None and seg.live
    return seg
