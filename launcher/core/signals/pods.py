"""Pods and the JobSet -> what the run's pods say: each pod as a `PodView`, why a restart attempt
failed (its cause), and the phase of the segment's JobSet. Pure. Called by launcher/core/signals/observation.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from contract.exits import Exit
from launcher.core import rfc3339
from launcher.core.labels import LABEL_JOBSET_UID, LABEL_RESTART_ATTEMPT, LABEL_RUN, LABEL_SEGMENT
from launcher.core.signals.basics import ByVersion, conditions, true_condition
from launcher.core.words import Cause, FailureKind, HostLoss, Phase, PodPhase

# containerd's exit code for a container whose task died with the host (its record survived the
# reboot, its process did not): reported with reason `HostLoss.RUNTIME_UNKNOWN`.
EXIT_RUNTIME_UNKNOWN = 255


@dataclass(frozen=True)
class PodView:
    name: str
    segment: int | None
    attempt: int
    phase: str
    node: str | None
    deleting: bool
    unschedulable_since: float | None
    unschedulable_message: str | None
    disruption: str | None  # DisruptionTarget reason
    exit_code: int | None
    reason: str | None  # pod status reason (Terminated, NodeShutdown, Evicted...)
    exit_reason: str | None = None  # the container's: Error, OOMKilled, ContainerStatusUnknown...
    # Its container went away with its host (a reboot), as the kubelet reports it (host_loss_of).
    host_loss: HostLoss | None = None
    jobset_uid: str | None = None  # the JobSet it belongs to (JobSet's label), for host_losses

    @property
    def alive(self) -> bool:
        return self.phase not in {PodPhase.SUCCEEDED, PodPhase.FAILED}


def pod_view(pod: dict) -> PodView:
    meta, status = pod["metadata"], pod.get("status") or {}
    labels = meta.get("labels") or {}
    sched = conditions(pod).get("PodScheduled")
    unsched = (
        sched if sched and sched.get("status") == "False" and sched.get("reason") == "Unschedulable" else None
    )
    disruption = true_condition(pod, "DisruptionTarget")
    exit_code = exit_reason = None
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term is not None:
            exit_code, exit_reason = term.get("exitCode"), term.get("reason")
    segment = labels.get(LABEL_SEGMENT)
    deleting = bool(meta.get("deletionTimestamp"))
    return PodView(
        name=meta["name"],
        segment=int(segment) if segment is not None and segment.isdigit() else None,
        attempt=int(labels.get(LABEL_RESTART_ATTEMPT, "0") or 0),
        phase=status.get("phase") or "Pending",
        node=(pod.get("spec") or {}).get("nodeName"),
        deleting=deleting,
        unschedulable_since=rfc3339.seconds(unsched.get("lastTransitionTime")) if unsched else None,
        unschedulable_message=unsched.get("message") if unsched else None,
        disruption=disruption.get("reason") if disruption else None,
        exit_code=exit_code,
        reason=status.get("reason"),
        exit_reason=exit_reason,
        host_loss=host_loss_of(status, deleting),
        jobset_uid=labels.get(LABEL_JOBSET_UID),
    )


def host_loss_of(status: dict, deleting: bool) -> HostLoss | None:
    """Whether the pod's status says its container went away with its host, and how (HostLoss).

    `lastState.terminated` is read as well as `state.terminated`: upstream's kubelet, back after a
    reboot, first writes the pod `Failed` with the container waiting and `lastState.terminated`
    ContainerStatusUnknown ("...when the pod was deleted.  The container used to be Running",
    kubelet_pods.go), and only later `state.terminated` the same (status_manager.go TerminatePod),
    so a reader of `state` alone sees no exit code at first and then a 137 like any SIGKILL. A
    `state.terminated` ContainerStatusUnknown alone, on a pod being deleted, is a container that
    never started (TerminatePod on a pod deleted first): not a host's."""
    if status.get("reason") == HostLoss.UNEXPECTED_ADMISSION:
        return HostLoss.UNEXPECTED_ADMISSION
    for cs in status.get("containerStatuses") or []:
        last = (cs.get("lastState") or {}).get("terminated") or {}
        term = (cs.get("state") or {}).get("terminated") or {}
        if last.get("reason") == HostLoss.CONTAINER_UNKNOWN:
            return HostLoss.CONTAINER_UNKNOWN
        if term.get("reason") == HostLoss.CONTAINER_UNKNOWN and not deleting:
            return HostLoss.CONTAINER_UNKNOWN
        if term.get("reason") == HostLoss.RUNTIME_UNKNOWN and term.get("exitCode") == EXIT_RUNTIME_UNKNOWN:
            return HostLoss.RUNTIME_UNKNOWN
    return None


def host_losses(run: str, pods: Iterable[dict]) -> frozenset[str]:
    """The restart attempts of the run's JobSets that a host disruption failed, as
    `<jobset uid>/<attempt>` (RunRecord.host_disruptions): from the pods in view and those deleted
    since the last pass (JobSet deletes a failed attempt's pods at once), so each is seen once."""
    out = set()
    for p in pods:
        if (p.get("status") or {}).get("phase") != PodPhase.FAILED:
            continue  # the cheap test first: a pass walks every pod of the run
        if (p["metadata"].get("labels") or {}).get(LABEL_RUN) != run:
            continue
        v = pod_view(p)
        if v.phase == PodPhase.FAILED and v.host_loss is not None and v.jobset_uid:
            out.add(f"{v.jobset_uid}/{v.attempt}")
    return frozenset(out)


# --- why an attempt failed -----------------------------------------------------------------------

# Causes of a JobSet restart, as the failed pods of the attempt tell it.
CAUSE_WORDS: dict[str, str] = {
    Cause.PREEMPTION: "a preemption or disruption",
    Cause.PEER_LOST: f"a lost peer: a host of the segment died (trainer exit {Exit.PEER_LOST})",
    Cause.APP_FAILURE: "an application failure",
    Cause.HOST_DISRUPTION: "a host disruption: a host rebooted under the segment (its container gone)",
}
# When the pods of one attempt disagree, the strongest cause wins: a crash makes its peers exit 43
# (their collectives fail), and a preempted host's peers may do the same before it saves.
# A rebooted host's own pod says more than its peers' exit 43, less than another pod's own crash.
_STRENGTH: dict[str, int] = {
    Cause.PEER_LOST: 0,
    Cause.PREEMPTION: 1,
    Cause.HOST_DISRUPTION: 2,
    Cause.APP_FAILURE: 3,
}


def stronger(a: str | None, b: str | None) -> str | None:
    return max((c for c in (a, b) if c), key=_STRENGTH.__getitem__, default=None)


def pod_cause(v: PodView) -> str | None:
    """What a failed pod says about its attempt's failure. None when it says nothing: not failed;
    failed while being deleted (the restart's doing, not its cause: the controller has usually seen
    the cause before, as a pod fails a second or more before JobSet restarts). A container that
    went away with its host is a host disruption (host_loss_of), deleted or not."""
    if v.phase != PodPhase.FAILED:
        return None
    if v.disruption or v.reason in {"Terminated", "NodeShutdown"}:
        return Cause.PREEMPTION
    if v.host_loss is not None:
        return Cause.HOST_DISRUPTION
    if v.deleting:
        return None
    if v.exit_code == Exit.PREEMPTED:
        return Cause.PREEMPTION
    if v.exit_code == Exit.PEER_LOST:
        return Cause.PEER_LOST
    return Cause.APP_FAILURE


def attempt_causes(pods: Iterable[PodView]) -> dict[int, str]:
    """Per restart attempt that has failed pods in view: the strongest cause they show."""
    out: dict[int, str] = {}
    for v in pods:
        if (cause := pod_cause(v)) is not None:
            out[v.attempt] = stronger(out.get(v.attempt), cause) or cause
    return out


# --- the JobSet --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Failure:
    kind: FailureKind
    reason: str
    message: str


def jobset_phase(
    jobset: dict | None, pods: list[PodView], expected_pods: int
) -> tuple[Phase, Failure | None]:
    if jobset is None:
        return Phase.ABSENT, None
    if jobset["metadata"].get("deletionTimestamp"):
        return Phase.DELETING, None
    if cond := true_condition(jobset, "Completed"):
        return Phase.COMPLETED, None
    if cond := true_condition(jobset, "Failed"):
        reason = cond.get("reason", "")
        message = cond.get("message", "")
        # FailJobSet is only ever the config-error rule's action (render.failure_policies).
        kind = {
            "FailJobSetFailurePolicyAction": FailureKind.CONFIG_ERROR,
            "ReachedMaxRestarts": FailureKind.MAX_RESTARTS,
        }.get(reason, FailureKind.OTHER)
        return Phase.FAILED, Failure(kind=kind, reason=reason, message=message)
    if (jobset.get("spec") or {}).get("suspend") or true_condition(jobset, "Suspended"):
        return Phase.SUSPENDED, None
    attempt = int((jobset.get("status") or {}).get("restarts") or 0)
    current = [p for p in pods if p.attempt == attempt and not p.deleting]
    stale = [p for p in pods if p.attempt < attempt or (p.deleting and p.alive)]
    if stale or any(p.phase == PodPhase.FAILED for p in current):
        return Phase.RESTARTING, None
    if len(current) == expected_pods and all(p.phase == PodPhase.RUNNING for p in current):
        return Phase.RUNNING, None
    return Phase.PENDING, None


@dataclass(frozen=True)
class RunPods:
    """What the run's pods alone say (a node event leaves it as it was)."""

    own: int  # pods of the run, any segment
    seg_pods: tuple[PodView, ...]  # of the segment observed
    others: frozenset[str]  # nodes that live pods of other runs in `pods` are on
    placed: tuple[str, ...]  # nodes of the segment's live pods
    pending: tuple[PodView, ...]
    unsched: tuple[PodView, ...]
    disruptions: tuple[str, ...]
    exit_codes: tuple[int, ...]
    running: int
    causes: dict[int, str]


def disruptions_of(views: Iterable[PodView]) -> tuple[str, ...]:
    """What the pods' own status says disrupted them, one line each (for the ledger and the view)."""
    out = []
    for v in views:
        if v.disruption:
            out.append(f"pod {v.name}: DisruptionTarget {v.disruption}")
        if v.reason in {"Terminated", "NodeShutdown"}:
            out.append(f"pod {v.name}: {v.reason}")
        if v.exit_code == Exit.PEER_LOST:
            out.append(f"pod {v.name}: peer lost (exit {Exit.PEER_LOST})")
        if v.host_loss is not None and v.phase == PodPhase.FAILED:
            out.append(f"pod {v.name}: host disruption ({v.host_loss})")
    return tuple(out)


def departed_disruptions(run: str, segment: int | None, departed: Sequence[dict]) -> tuple[str, ...]:
    """The disruptions of the segment's pods deleted since the last pass, from their last state: a
    pod PodGC fails and deletes at once (DeletionByPodGC) is gone before a pass may see it."""
    views = (pod_view(p) for p in departed if (p["metadata"].get("labels") or {}).get(LABEL_RUN) == run)
    return disruptions_of(v for v in views if v.segment == segment)


def run_pods(
    run: str, segment: int | None, pods: Sequence[dict], *, memo: ByVersion | None = None
) -> RunPods:
    """The pods of `run` as the signals read them. `memo`: the caller's ByVersion(pod_view), which
    spares it the pods that did not change since its last call (the controller's,
    launcher.core.signals.observation.Memos)."""
    view = memo if memo is not None else pod_view
    if memo is not None:
        memo.retain(pods)  # every run's pods: the views of pods deleted since go
    own = [p for p in pods if (p["metadata"].get("labels") or {}).get(LABEL_RUN) == run]
    views = [view(p) for p in own]
    own_names = {p["metadata"]["name"] for p in own}
    others = frozenset(
        p["spec"]["nodeName"]
        for p in pods
        if p["metadata"]["name"] not in own_names
        and (p.get("spec") or {}).get("nodeName")
        and (p.get("status") or {}).get("phase") not in {PodPhase.SUCCEEDED, PodPhase.FAILED}
    )
    seg_pods = tuple(v for v in views if v.segment == segment)
    pending = tuple(v for v in seg_pods if v.alive and not v.deleting and v.node is None)
    return RunPods(
        own=len(own),
        seg_pods=seg_pods,
        others=others,
        placed=tuple({v.node for v in seg_pods if v.node and v.alive}),
        pending=pending,
        unsched=tuple(v for v in pending if v.unschedulable_since is not None),
        disruptions=disruptions_of(seg_pods),
        exit_codes=tuple(v.exit_code for v in seg_pods if v.exit_code not in (None, 0)),
        running=sum(v.phase == PodPhase.RUNNING and not v.deleting for v in seg_pods),
        causes=attempt_causes(seg_pods),
    )
