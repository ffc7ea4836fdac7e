"""One reconcile of one Job, decided without I/O: `decide` (job, pods, terminal pods seen, leader's
domain, now) → `JobActions` (pods to create and delete, the new status and conditions, events,
when to look again), with the status and conditions the upstream controller (Kubernetes 1.31+)
writes: `FailureTarget` then `Failed` once no pod is left running, `SuccessCriteriaMet` then
`Complete`; `wire_status` is that status as the API serializes it.

Pure. Called by `job.JobController`, which reads the state and applies the actions.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from launcher.core import rfc3339
from launcher.embedded.controllers.jobfailures import (
    BACKOFF_BASE_S,
    BACKOFF_MAX_S,
    DEFAULT_BACKOFF_LIMIT,
    INDEX_FAILURE_COUNT,
    ann_count,
    expand_indexes,
    index_backoff,
    index_failure_counts,
    last_failed,
    match_pod_failure_policy,
    past_backoff_limit_on_failure,
)
from launcher.embedded.controllers.jobpods import (
    completion_index,
    exclusive_topology,
    finish_time,
    pod_for_index,
)
from launcher.embedded.types import objects

MSG_BACKOFF = "Job has reached the specified backoff limit"
MSG_COMPLETIONS = "Reached expected number of succeeded pods"
MSG_DEADLINE = "Job was active longer than specified deadline"
MSG_MAX_FAILED_INDEXES = "Job has exceeded the specified maximal number of failed indexes"
MSG_FAILED_INDEXES = "Job has failed indexes"


@dataclass
class JobActions:
    """What one reconcile of a Job does: pods to create, pod names to delete, the status, events."""

    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    requeue_after: float | None = None


def _cond_true(conds: list[dict[str, Any]], ctype: str) -> dict[str, Any] | None:
    return next((c for c in conds if c.get("type") == ctype and c.get("status") == "True"), None)


def decide(
    job: Mapping[str, Any],
    pods: list[Mapping[str, Any]],
    terminal: Mapping[str, Mapping[str, Any]],
    leader_domain: str | None,
    now: dt.datetime,
    suspended_out: frozenset[str] | set[str] = frozenset(),
) -> JobActions:
    """One reconcile of one Job. `pods`: its pods in the API now; `terminal`: every pod (by uid) seen
    reach Succeeded/Failed, including ones since removed (the job-tracking finalizer's role);
    `suspended_out`: uids of pods deleted because the Job was suspended, which are no failures
    (a queue suspending a Job to preempt it must not spend its backoffLimit or fail it)."""
    spec = job.get("spec") or {}
    old = job.get("status") or {}
    status = copy.deepcopy(dict(old))
    conds: list[dict[str, Any]] = status.setdefault("conditions", [])
    when = rfc3339.stamp(now)
    todo = JobActions(status=status)
    indexed = spec.get("completionMode") == "Indexed"
    completions = spec.get("completions")
    completions = 1 if completions is None and spec.get("parallelism") is None else completions
    parallelism = int(n) if (n := spec.get("parallelism")) is not None else 1
    policy = spec.get("podFailurePolicy")
    backoff_limit = int(n) if (n := spec.get("backoffLimit")) is not None else DEFAULT_BACKOFF_LIMIT

    finished = dict(terminal)
    for p in pods:
        if objects.pod_terminal(p):
            finished[objects.meta(p)["uid"]] = p
    live = [p for p in pods if not objects.pod_terminal(p)]
    active = [p for p in live if not objects.pod_deleting(p)]
    terminating = [p for p in live if objects.pod_deleting(p)]

    succeeded = [p for p in finished.values() if objects.pod_phase(p) == "Succeeded"]
    suspending = bool(spec.get("suspend"))
    failed_pods = sorted(
        (
            p
            for p in finished.values()
            if objects.pod_phase(p) == "Failed"
            and objects.meta(p).get("uid") not in suspended_out
            and not (suspending and objects.pod_deleting(p))
        ),
        key=lambda p: (finish_time(p), objects.meta(p).get("name", "")),
    )
    per_index = spec.get("backoffLimitPerIndex") if indexed else None
    n_indexes = int(completions or 0)
    failed_indexes = expand_indexes(old.get("failedIndexes") or "") if per_index is not None else set()
    # Classify failures through the pod failure policy (first FailJob wins, Ignore doesn't count).
    failure: tuple[str, str] | None = None
    counted = 0
    actions: dict[str, str | None] = {}
    for p in failed_pods:
        action, msg = match_pod_failure_policy(policy, p)
        actions[objects.meta(p).get("uid", "")] = action
        if action == "Ignore":
            continue
        counted += 1
        if action == "FailJob" and failure is None:
            failure = ("PodFailurePolicy", msg or "")
        ix = completion_index(p)
        # isIndexFailed: FailIndex, or a counted failure of an index already at its limit.
        at_limit = per_index is not None and (
            action == "FailIndex" or ann_count(p, INDEX_FAILURE_COUNT) >= int(per_index)
        )
        if at_limit and ix is not None and ix < n_indexes:
            failed_indexes.add(ix)
    if failure is None and (
        counted > backoff_limit or past_backoff_limit_on_failure(spec, pods, backoff_limit)
    ):
        failure = ("BackoffLimitExceeded", MSG_BACKOFF)
    # activeDeadlineSeconds counts from startTime, which a suspension resets (upstream pastActiveDeadline).
    deadline, started = spec.get("activeDeadlineSeconds"), rfc3339.parse(old.get("startTime"))
    if failure is None and deadline is not None and started is not None and not spec.get("suspend"):
        left = int(deadline) - (now - started).total_seconds()
        if left <= 0:
            failure = ("DeadlineExceeded", MSG_DEADLINE)
        else:
            todo.requeue_after = left

    done_indexes = {completion_index(p) for p in succeeded} - {None} if indexed else set()
    if indexed:  # counted before a controller restart, their pods possibly gone since
        done_indexes |= expand_indexes(old.get("completedIndexes") or "")
    if failure is None and per_index is not None:  # after backoffLimit and the deadline, as upstream
        max_failed = spec.get("maxFailedIndexes")
        if max_failed is not None and len(failed_indexes) > int(max_failed):
            failure = ("MaxFailedIndexesExceeded", MSG_MAX_FAILED_INDEXES)
        elif failed_indexes and len(failed_indexes) + len(done_indexes) >= n_indexes:
            failure = ("FailedIndexes", MSG_FAILED_INDEXES)
    status.update(
        {
            "active": len(active),
            "ready": sum(1 for p in active if objects.pod_ready(p)),
            "failed": max(counted, int(old.get("failed") or 0)),
            "succeeded": max(
                len(done_indexes) if indexed else len(succeeded), int(old.get("succeeded") or 0)
            ),
            "terminating": len(terminating),
            "uncountedTerminatedPods": {},
        }
    )
    if indexed:
        status["completedIndexes"] = objects.compress_indexes(i for i in done_indexes if i is not None)
    if per_index is not None:  # a *string upstream: "" is written, not left out
        status["failedIndexes"] = objects.compress_indexes(failed_indexes)
    if not status["failed"]:
        status.pop("failed")
    if not status["succeeded"] and not indexed:
        status.pop("succeeded")

    if _cond_true(conds, "Failed") or _cond_true(conds, "Complete"):
        todo.delete = [objects.meta(p)["name"] for p in active]
        status["active"] = 0
        return todo

    # Failure: FailureTarget now, Failed once nothing is left running (upstream 1.31+).
    target = _cond_true(conds, "FailureTarget")
    if target is None and failure is not None:
        objects.set_condition(conds, "FailureTarget", "True", failure[0], failure[1], when, probe_fields=True)
        target = _cond_true(conds, "FailureTarget")
    if target is not None:
        todo.delete = [objects.meta(p)["name"] for p in active]
        status["active"] = 0
        if not live:
            objects.set_condition(
                conds, "Failed", "True", target["reason"], target["message"], when, probe_fields=True
            )
            todo.events.append(("Warning", target["reason"], target["message"]))
        return todo

    # Success.
    n_done = len(done_indexes) if indexed else len(succeeded)
    met = _cond_true(conds, "SuccessCriteriaMet")
    if met is None and completions is not None and n_done >= int(completions):
        objects.set_condition(
            conds, "SuccessCriteriaMet", "True", "CompletionsReached", MSG_COMPLETIONS, when, True
        )
        met = _cond_true(conds, "SuccessCriteriaMet")
    if met is not None:
        todo.delete = [objects.meta(p)["name"] for p in active]
        status["active"] = 0
        if not live:
            objects.set_condition(
                conds, "Complete", "True", "CompletionsReached", MSG_COMPLETIONS, when, True
            )
            status["completionTime"] = when
            todo.events.append(("Normal", "Completed", "Job completed"))
        return todo

    # Suspend / resume.
    if spec.get("suspend"):
        todo.delete = [objects.meta(p)["name"] for p in active]
        status["active"] = 0
        status.pop("startTime", None)
        if objects.set_condition(conds, "Suspended", "True", "JobSuspended", "Job suspended", when, True):
            todo.events.append(("Normal", "Suspended", "Job suspended"))
        return todo
    sus = next((c for c in conds if c.get("type") == "Suspended"), None)
    if sus is not None and sus.get("status") == "True":
        objects.set_condition(conds, "Suspended", "False", "JobResumed", "Job resumed", when, True)
        todo.events.append(("Normal", "Resumed", "Job resumed"))
    status.setdefault("startTime", when)

    # Backoff before replacing failed pods: doubling from a base, capped (upstream podBackoff); with
    # backoffLimitPerIndex each index backs off on its own failures instead.
    if counted and per_index is None:
        last = max((finish_time(p) for p in failed_pods), default="")
        delay = min(BACKOFF_BASE_S * 2 ** (counted - 1), BACKOFF_MAX_S)
        lt = rfc3339.parse(last)
        if lt is not None and (now - lt).total_seconds() < delay:
            wait = delay - (now - lt).total_seconds()
            todo.requeue_after = min(wait, todo.requeue_after) if todo.requeue_after is not None else wait
            return todo

    # Replacement waits for the old pod to be terminal when podFailurePolicy is set
    # (podReplacementPolicy: Failed); otherwise a terminating pod is replaced at once.
    blocking = live if (policy or spec.get("podReplacementPolicy") == "Failed") else active
    room = parallelism - len(blocking)
    if indexed:
        busy = {completion_index(p) for p in blocking}
        topo = exclusive_topology(job)
        for i in range(int(completions or 0)):
            if room <= 0:
                break
            if i in done_indexes or i in busy or i in failed_indexes:
                continue
            if topo and i > 0 and leader_domain is None:
                continue  # the webhook rejects followers until the leader is scheduled
            extra = None
            if per_index is not None:
                last_pod = last_failed(failed_pods, i)
                wait = index_backoff(last_pod, now)
                if wait > 0:
                    todo.requeue_after = min(wait, todo.requeue_after or wait)
                    continue
                extra = index_failure_counts(
                    last_pod, actions.get(objects.meta(last_pod or {}).get("uid", "")), policy
                )
            todo.create.append(pod_for_index(job, i, leader_domain, extra))
            room -= 1
    else:
        want = parallelism if completions is None else min(parallelism, int(completions) - len(succeeded))
        for _ in range(max(0, want - len(blocking))):
            todo.create.append(pod_for_index(job, None, None))
    return todo


def wire_status(status: dict[str, Any]) -> dict[str, Any]:
    """JobStatus as the API serializes it: `omitempty` counters and lists left out when zero/empty
    (`ready`, `terminating` and `uncountedTerminatedPods` are pointers, so they stay)."""
    out = dict(status)
    for k in ("active", "succeeded", "failed", "conditions", "completedIndexes"):
        if not out.get(k):
            out.pop(k, None)
    return out
