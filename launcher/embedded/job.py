"""The Job controller (batch/v1), the part of it JobSet relies on: Indexed and NonIndexed Jobs,
`podFailurePolicy`, `backoffLimit`, `backoffLimitPerIndex` with `maxFailedIndexes` and the `FailIndex`
action, `suspend`, and the status and conditions the upstream
controller (Kubernetes 1.31+) writes: `FailureTarget` then `Failed` once no pod is left running,
`SuccessCriteriaMet` then `Complete`.

It also does what JobSet's pod webhooks do for exclusive placement, because on a real cluster they
act on the pods this controller creates: the leader pod (completion index 0) gets required pod
affinity to its own Job and anti-affinity to every other Job over the topology key; a follower is
admitted only once its leader is scheduled, with a nodeSelector for the leader's topology domain.

`decide` is pure: (job, pods, terminal pods seen, leader's domain, now) → a Plan; the controller
reads the state, calls it and applies the plan.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from launcher import rfc3339
from launcher.embedded import objects as o
from launcher.embedded.clock import REAL, Clock
from launcher.embedded.defaults import PRIORITY_LABEL
from launcher.embedded.runtime import Batched, Controller, EventRecorder

DEFAULT_BACKOFF_LIMIT = 6
BACKOFF_BASE_S = 10.0
BACKOFF_MAX_S = 360.0
SYNC_BATCH_S = 1.0  # upstream syncJobBatchPeriod
MSG_BACKOFF = "Job has reached the specified backoff limit"
MSG_COMPLETIONS = "Reached expected number of succeeded pods"
MSG_DEADLINE = "Job was active longer than specified deadline"
MSG_MAX_FAILED_INDEXES = "Job has exceeded the specified maximal number of failed indexes"
MSG_FAILED_INDEXES = "Job has failed indexes"
# backoffLimitPerIndex: each index's failures travel on its pods (pkg/controller/job/indexed_job_utils.go).
INDEX_FAILURE_COUNT = "batch.kubernetes.io/job-index-failure-count"
INDEX_IGNORED_FAILURE_COUNT = "batch.kubernetes.io/job-index-ignored-failure-count"
# Upstream's job-tracking finalizer: a pod cannot leave the API before the controller counted it.
TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"


@dataclass
class Plan:
    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    requeue_after: float | None = None


# ---- pure pieces ------------------------------------------------------------------------------


def completion_index(pod: Mapping[str, Any]) -> int | None:
    v = o.annotations(pod).get(o.COMPLETION_INDEX, o.labels(pod).get(o.COMPLETION_INDEX))
    return int(v) if v is not None and str(v).isdigit() else None


def finish_time(pod: Mapping[str, Any]) -> str:
    times = [
        ((cs.get("state") or {}).get("terminated") or {}).get("finishedAt") or ""
        for cs in (pod.get("status") or {}).get("containerStatuses") or []
    ]
    times += [c.get("lastTransitionTime") or "" for c in (pod.get("status") or {}).get("conditions") or []]
    return max(times, default="")


def match_pod_failure_policy(
    policy: Mapping[str, Any] | None, pod: Mapping[str, Any]
) -> tuple[str | None, str | None]:
    """(action, FailJob message) of the first matching rule, as upstream matchPodFailurePolicy.
    (None, None) when nothing matches (the failure counts toward backoffLimit)."""
    if not policy:
        return None, None
    ns, name = o.meta(pod).get("namespace"), o.meta(pod).get("name")
    status = pod.get("status") or {}
    for i, rule in enumerate(policy.get("rules") or []):
        action = rule.get("action")
        req = rule.get("onExitCodes")
        if req is not None:
            for cs in [
                *(status.get("containerStatuses") or []),
                *(status.get("initContainerStatuses") or []),
            ]:
                term = (cs.get("state") or {}).get("terminated")
                if term is None or (req.get("containerName") and req["containerName"] != cs.get("name")):
                    continue
                code = int(term.get("exitCode") or 0)
                if code == 0:
                    continue  # exit code 0 is never a failure to match
                vals = set(req.get("values") or [])
                if (req.get("operator") == "In") == (code in vals) and req.get("operator") in ("In", "NotIn"):
                    msg = (
                        f"Container {cs.get('name')} for pod {ns}/{name} failed with exit code {code} "
                        f"matching {action} rule at index {i}"
                    )
                    return action, msg if action == "FailJob" else None
        elif rule.get("onPodConditions") is not None:
            for c in status.get("conditions") or []:
                for pat in rule["onPodConditions"]:
                    if c.get("type") == pat.get("type") and c.get("status") == (pat.get("status") or "True"):
                        msg = f"Pod {ns}/{name} has condition {c['type']} matching {action} rule at index {i}"
                        return action, msg if action == "FailJob" else None
    return None, None


def past_backoff_limit_on_failure(
    spec: Mapping[str, Any], pods: list[Mapping[str, Any]], backoff_limit: int
) -> bool:
    """restartPolicy OnFailure restarts containers in place, so no pod fails: upstream counts the
    restarts of the running and pending pods against backoffLimit (pastBackoffLimitOnFailure)."""
    if ((spec.get("template") or {}).get("spec") or {}).get("restartPolicy") != "OnFailure":
        return False
    restarts = sum(
        int(cs.get("restartCount") or 0)
        for p in pods
        if o.pod_phase(p) in ("Running", "Pending")
        for cs in [
            *((p.get("status") or {}).get("initContainerStatuses") or []),
            *((p.get("status") or {}).get("containerStatuses") or []),
        ]
    )
    return restarts > 0 if backoff_limit == 0 else restarts >= backoff_limit


def expand_indexes(s: str) -> set[int]:
    """'1,3-5,7' → {1, 3, 4, 5, 7}."""
    out: set[int] = set()
    for part in (p for p in s.split(",") if p):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def exclusive_affinity(job_key: str, topology_key: str, priority: str = "0") -> dict[str, Any]:
    """What JobSet's pod mutating webhook puts on a leader pod for exclusive placement: exclusive
    among Jobs of the same priority (v0.12.0 setExclusiveAffinities, the priority label's term)."""
    return {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchExpressions": [{"key": o.JOB_KEY, "operator": "In", "values": [job_key]}]
                    },
                    "topologyKey": topology_key,
                    "namespaceSelector": {},
                }
            ]
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchExpressions": [
                            {"key": o.JOB_KEY, "operator": "Exists"},
                            {"key": o.JOB_KEY, "operator": "NotIn", "values": [job_key]},
                            {"key": PRIORITY_LABEL, "operator": "In", "values": [priority]},
                        ]
                    },
                    "topologyKey": topology_key,
                    "namespaceSelector": {},
                }
            ]
        },
    }


def exclusive_topology(job: Mapping[str, Any]) -> str | None:
    ann = o.annotations(job.get("spec", {}).get("template", {}))
    if o.EXCLUSIVE_KEY in ann and o.NODE_SELECTOR_STRATEGY not in ann:
        return ann[o.EXCLUSIVE_KEY]
    return None


def _ann_count(pod: Mapping[str, Any], key: str) -> int:
    """An index failure count annotation; 0 when missing or not an int32 (parseInt32 upstream)."""
    v = str(o.annotations(pod).get(key, ""))
    return int(v) if v.isdigit() and int(v) <= 2**31 - 1 else 0


def index_failure_counts(
    replaced: Mapping[str, Any] | None, action: str | None, policy: Mapping[str, Any] | None
) -> dict[str, str]:
    """The failure-count annotations of the pod replacing `replaced` (getNewIndexFailureCounts): its
    counts, plus one failure, or one ignored failure when the pod failure policy ignored it."""
    if replaced is None:
        return {INDEX_FAILURE_COUNT: "0"}
    failures = _ann_count(replaced, INDEX_FAILURE_COUNT)
    ignored = _ann_count(replaced, INDEX_IGNORED_FAILURE_COUNT)
    if policy and action == "Ignore":
        ignored += 1
    else:
        failures += 1
    out = {INDEX_FAILURE_COUNT: str(failures)}
    if ignored:
        out[INDEX_IGNORED_FAILURE_COUNT] = str(ignored)
    return out


def pod_for_index(
    job: Mapping[str, Any],
    index: int | None,
    leader_domain: str | None,
    extra_annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The pod the Job controller creates for a completion index (None for NonIndexed)."""
    m = o.meta(job)
    tmpl = copy.deepcopy((job.get("spec") or {}).get("template") or {})
    tm = tmpl.get("metadata") or {}
    lbls = dict(tm.get("labels") or {})
    ann = {**(tm.get("annotations") or {}), **(extra_annotations or {})}
    lbls.update(
        {
            o.CONTROLLER_UID: m["uid"],
            o.JOB_NAME: m["name"],
            o.LEGACY_CONTROLLER_UID: m["uid"],
            o.LEGACY_JOB_NAME: m["name"],
        }
    )
    spec = tmpl.get("spec") or {}
    gen = f"{m['name']}-"
    if index is not None:
        lbls[o.COMPLETION_INDEX] = str(index)
        ann[o.COMPLETION_INDEX] = str(index)
        gen = f"{m['name']}-{index}-"
        spec["hostname"] = f"{m['name']}-{index}"
        for c in spec.get("containers") or []:
            env = c.setdefault("env", [])
            if not any(e.get("name") == "JOB_COMPLETION_INDEX" for e in env):
                env.append(
                    {
                        "name": "JOB_COMPLETION_INDEX",
                        "valueFrom": {
                            "fieldRef": {
                                "apiVersion": "v1",
                                "fieldPath": f"metadata.annotations['{o.COMPLETION_INDEX}']",
                            }
                        },
                    }
                )
    topo = exclusive_topology(job)
    if topo and o.JOB_KEY in lbls:
        if index in (0, None):
            # The pod's priority as Priority admission will leave it (no PriorityClass lookup here).
            prio = str(spec.get("priority", 0))
            spec["affinity"] = {
                **(spec.get("affinity") or {}),
                **exclusive_affinity(lbls[o.JOB_KEY], topo, prio),
            }
        elif leader_domain is not None:
            spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), topo: leader_domain}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": gen,
            "namespace": m.get("namespace"),
            "labels": lbls,
            "annotations": ann,
            "ownerReferences": [o.owner_ref(job, "batch/v1", "Job")],
            "finalizers": [TRACKING_FINALIZER],
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def _cond_true(conds: list[dict[str, Any]], ctype: str) -> dict[str, Any] | None:
    return next((c for c in conds if c.get("type") == ctype and c.get("status") == "True"), None)


def decide(
    job: Mapping[str, Any],
    pods: list[Mapping[str, Any]],
    terminal: Mapping[str, Mapping[str, Any]],
    leader_domain: str | None,
    now: dt.datetime,
    suspended_out: frozenset[str] | set[str] = frozenset(),
) -> Plan:
    """One reconcile of one Job. `pods`: its pods in the API now; `terminal`: every pod (by uid) seen
    reach Succeeded/Failed, including ones since removed (the job-tracking finalizer's role);
    `suspended_out`: uids of pods deleted because the Job was suspended, which are no failures
    (a queue suspending a Job to preempt it must not spend its backoffLimit or fail it)."""
    spec = job.get("spec") or {}
    old = job.get("status") or {}
    status = copy.deepcopy(dict(old))
    conds: list[dict[str, Any]] = status.setdefault("conditions", [])
    when = rfc3339.stamp(now)
    plan = Plan(status=status)
    indexed = spec.get("completionMode") == "Indexed"
    completions = spec.get("completions")
    completions = 1 if completions is None and spec.get("parallelism") is None else completions
    parallelism = int(spec.get("parallelism") if spec.get("parallelism") is not None else 1)
    policy = spec.get("podFailurePolicy")
    backoff_limit = int(
        spec.get("backoffLimit") if spec.get("backoffLimit") is not None else DEFAULT_BACKOFF_LIMIT
    )

    finished = dict(terminal)
    for p in pods:
        if o.pod_terminal(p):
            finished[o.meta(p)["uid"]] = p
    live = [p for p in pods if not o.pod_terminal(p)]
    active = [p for p in live if not o.pod_deleting(p)]
    terminating = [p for p in live if o.pod_deleting(p)]

    succeeded = [p for p in finished.values() if o.pod_phase(p) == "Succeeded"]
    suspending = bool(spec.get("suspend"))
    failed_pods = sorted(
        (
            p
            for p in finished.values()
            if o.pod_phase(p) == "Failed"
            and o.meta(p).get("uid") not in suspended_out
            and not (suspending and o.pod_deleting(p))
        ),
        key=lambda p: (finish_time(p), o.meta(p).get("name", "")),
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
        actions[o.meta(p).get("uid", "")] = action
        if action == "Ignore":
            continue
        counted += 1
        if action == "FailJob" and failure is None:
            failure = ("PodFailurePolicy", msg or "")
        ix = completion_index(p)
        # isIndexFailed: FailIndex, or a counted failure of an index already at its limit.
        at_limit = per_index is not None and (
            action == "FailIndex" or _ann_count(p, INDEX_FAILURE_COUNT) >= int(per_index)
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
            plan.requeue_after = left

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
            "ready": sum(1 for p in active if o.pod_ready(p)),
            "failed": max(counted, int(old.get("failed") or 0)),
            "succeeded": max(
                len(done_indexes) if indexed else len(succeeded), int(old.get("succeeded") or 0)
            ),
            "terminating": len(terminating),
            "uncountedTerminatedPods": {},
        }
    )
    if indexed:
        status["completedIndexes"] = o.compress_indexes(i for i in done_indexes if i is not None)
    if per_index is not None:  # a *string upstream: "" is written, not left out
        status["failedIndexes"] = o.compress_indexes(failed_indexes)
    if not status["failed"]:
        status.pop("failed")
    if not status["succeeded"] and not indexed:
        status.pop("succeeded")

    if _cond_true(conds, "Failed") or _cond_true(conds, "Complete"):
        plan.delete = [o.meta(p)["name"] for p in active]
        status["active"] = 0
        return plan

    # Failure: FailureTarget now, Failed once nothing is left running (upstream 1.31+).
    target = _cond_true(conds, "FailureTarget")
    if target is None and failure is not None:
        o.set_condition(conds, "FailureTarget", "True", failure[0], failure[1], when, probe_fields=True)
        target = _cond_true(conds, "FailureTarget")
    if target is not None:
        plan.delete = [o.meta(p)["name"] for p in active]
        status["active"] = 0
        if not live:
            o.set_condition(
                conds, "Failed", "True", target["reason"], target["message"], when, probe_fields=True
            )
            plan.events.append(("Warning", target["reason"], target["message"]))
        return plan

    # Success.
    n_done = len(done_indexes) if indexed else len(succeeded)
    met = _cond_true(conds, "SuccessCriteriaMet")
    if met is None and completions is not None and n_done >= int(completions):
        o.set_condition(
            conds, "SuccessCriteriaMet", "True", "CompletionsReached", MSG_COMPLETIONS, when, True
        )
        met = _cond_true(conds, "SuccessCriteriaMet")
    if met is not None:
        plan.delete = [o.meta(p)["name"] for p in active]
        status["active"] = 0
        if not live:
            o.set_condition(conds, "Complete", "True", "CompletionsReached", MSG_COMPLETIONS, when, True)
            status["completionTime"] = when
            plan.events.append(("Normal", "Completed", "Job completed"))
        return plan

    # Suspend / resume.
    if spec.get("suspend"):
        plan.delete = [o.meta(p)["name"] for p in active]
        status["active"] = 0
        status.pop("startTime", None)
        if o.set_condition(conds, "Suspended", "True", "JobSuspended", "Job suspended", when, True):
            plan.events.append(("Normal", "Suspended", "Job suspended"))
        return plan
    sus = next((c for c in conds if c.get("type") == "Suspended"), None)
    if sus is not None and sus.get("status") == "True":
        o.set_condition(conds, "Suspended", "False", "JobResumed", "Job resumed", when, True)
        plan.events.append(("Normal", "Resumed", "Job resumed"))
    status.setdefault("startTime", when)

    # Backoff before replacing failed pods: 10 s doubling, capped (upstream podBackoff); with
    # backoffLimitPerIndex each index backs off on its own failures instead.
    if counted and per_index is None:
        last = max((finish_time(p) for p in failed_pods), default="")
        delay = min(BACKOFF_BASE_S * 2 ** (counted - 1), BACKOFF_MAX_S)
        lt = rfc3339.parse(last)
        if lt is not None and (now - lt).total_seconds() < delay:
            wait = delay - (now - lt).total_seconds()
            plan.requeue_after = min(wait, plan.requeue_after) if plan.requeue_after is not None else wait
            return plan

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
                last = _last_failed(failed_pods, i)
                wait = _index_backoff(last, now)
                if wait > 0:
                    plan.requeue_after = min(wait, plan.requeue_after or wait)
                    continue
                extra = index_failure_counts(last, actions.get(o.meta(last or {}).get("uid", "")), policy)
            plan.create.append(pod_for_index(job, i, leader_domain, extra))
            room -= 1
    else:
        want = parallelism if completions is None else min(parallelism, int(completions) - len(succeeded))
        for _ in range(max(0, want - len(blocking))):
            plan.create.append(pod_for_index(job, None, None))
    return plan


def _last_failed(failed_pods: list[Mapping[str, Any]], index: int) -> Mapping[str, Any] | None:
    """The index's pod to replace: most failures, then the latest (getPodsWithDelayedDeletionPerIndex)."""
    mine = [p for p in failed_pods if completion_index(p) == index]
    return max(
        mine,
        key=lambda p: (
            _ann_count(p, INDEX_FAILURE_COUNT) + _ann_count(p, INDEX_IGNORED_FAILURE_COUNT),
            finish_time(p),
        ),
        default=None,
    )


def _index_backoff(last: Mapping[str, Any] | None, now: dt.datetime) -> float:
    """Seconds the index still waits: 10 s doubling per failure of the index, capped."""
    if last is None:
        return 0.0
    n = _ann_count(last, INDEX_FAILURE_COUNT) + _ann_count(last, INDEX_IGNORED_FAILURE_COUNT) + 1
    lt = rfc3339.parse(finish_time(last))
    if lt is None:
        return 0.0
    return min(BACKOFF_BASE_S * 2 ** (n - 1), BACKOFF_MAX_S) - (now - lt).total_seconds()


# ---- the controller ---------------------------------------------------------------------------


def wire_status(status: dict[str, Any]) -> dict[str, Any]:
    """JobStatus as the API serializes it: `omitempty` counters and lists left out when zero/empty
    (`ready`, `terminating` and `uncountedTerminatedPods` are pointers, so they stay)."""
    out = dict(status)
    for k in ("active", "succeeded", "failed", "conditions", "completedIndexes"):
        if not out.get(k):
            out.pop(k, None)
    return out


def finished(pod: Mapping[str, Any]) -> bool:
    """A pod whose tracking finalizer may go: terminal, or deleted before it ever ran.

    A running pod keeps it until the kubelet reports the end, even when its Job is being deleted:
    the store removes a pod as soon as its last finalizer goes (upstream waits for the kubelet's
    grace-0 delete when deletionGracePeriodSeconds > 0), so releasing early would end a graceful
    termination at once and break BlockingRecreate.
    """
    return o.pod_terminal(pod) or (o.pod_deleting(pod) and not (pod.get("spec") or {}).get("nodeName"))


def leader_node(pods: list[Mapping[str, Any]]) -> str | None:
    """The node of the Job's leader pod (completion index 0), or None while it is unbound.

    JobSet's pod webhook finds the leader by name and admits followers once it has a nodeName,
    whatever its phase (kubernetes-sigs/jobset v0.12.0, pkg/webhooks/pod_webhook.go): a leader
    that already finished, or is terminating, still places its followers. A live leader wins
    over an old one.
    """
    leaders = [p for p in pods if completion_index(p) == 0 and (p.get("spec") or {}).get("nodeName")]
    live = [p for p in leaders if not o.pod_terminal(p) and not o.pod_deleting(p)]
    chosen = (live or leaders)[:1]
    return chosen[0]["spec"]["nodeName"] if chosen else None


class JobController(Controller):
    name = "job-controller"

    def __init__(self, store: Any, events: Any = None, clock: Clock = REAL) -> None:
        super().__init__(store, events, clock)
        from launcher.embedded.store import RESOURCES

        self.jobs = RESOURCES["jobs"]
        self.pods = RESOURCES["pods"]
        self.nodes = RESOURCES["nodes"]
        self.recorder = EventRecorder(store, "job-controller")
        self._terminal: dict[str, dict[str, dict[str, Any]]] = {}  # job uid → pod uid → pod
        self._job_keys: dict[str, tuple[str, str]] = {}  # job uid → (ns, name)
        self._generations: dict[str, int | None] = {}  # job uid → last generation seen
        self._suspended_out: dict[str, set[str]] = {}  # job uid → pods deleted by its suspension

    def resync(self) -> None:
        jobs, _ = self.store.list(self.jobs)
        for j in jobs:
            self._job_keys[o.meta(j)["uid"]] = o.key_of(j)
            self.enqueue(("job", *o.key_of(j)))

    def keys_for(self, event: str, res: Any, obj: Mapping[str, Any]) -> list[Hashable]:
        # As upstream (syncJobBatchPeriod), pod events and the Job's own status writes are batched:
        # a slice of 768 pods starting up costs a few syncs, not one per pod update, each
        # re-reading every pod. A new Job or a spec change syncs at once.
        if res.plural == "jobs":
            uid = o.meta(obj)["uid"]
            if event == "DELETED":
                self._terminal.pop(uid, None)
                self._job_keys.pop(uid, None)
                self._generations.pop(uid, None)
                self._suspended_out.pop(uid, None)
                # Its pods that already finished may have had their events before the deletion
                # and will get no more: release them now (upstream's orphan-pod cleanup).
                return [("orphans", o.meta(obj).get("namespace"), uid)]
            self._job_keys[uid] = o.key_of(obj)
            generation = o.meta(obj).get("generation")
            status_only = event == "MODIFIED" and self._generations.get(uid) == generation
            self._generations[uid] = generation
            key = ("job", *o.key_of(obj))
            return [Batched(key, SYNC_BATCH_S) if status_only else key]
        if res.plural == "pods" and event != "DELETED":
            owner = o.controller_uid(obj)
            if owner in self._job_keys:
                return [Batched(("job", *self._job_keys[owner]), SYNC_BATCH_S)]
            if TRACKING_FINALIZER in (o.meta(obj).get("finalizers") or []):
                return [("orphan", *o.key_of(obj))]
        return []

    def _leader_domain(self, job: Mapping[str, Any], pods: list[Mapping[str, Any]]) -> str | None:
        topo = exclusive_topology(job)
        node = leader_node(pods) if topo else None
        if node is None:
            return None
        try:
            return o.labels(self.store.get(self.nodes, None, node)).get(topo)
        except Exception:
            return None

    def _release(self, pods: list[Mapping[str, Any]]) -> None:
        """Remove the tracking finalizer (the pod may now leave the API)."""
        for p in pods:
            fins = [f for f in o.meta(p).get("finalizers") or [] if f != TRACKING_FINALIZER]
            ns, name = o.key_of(p)
            try:
                self.store.patch(self.pods, ns, name, {"metadata": {"finalizers": fins}}, "merge")
            except Exception as e:
                if getattr(e, "code", None) != 404:
                    raise

    def reconcile(self, key: Hashable) -> float | None:
        kind, ns, name = key  # type: ignore[misc]
        if kind == "orphan":
            return self._reconcile_orphan(ns, name)
        if kind == "orphans":  # name is the deleted Job's uid
            pods, _ = self.store.list(self.pods, namespace=ns, label_selector=f"{o.CONTROLLER_UID}={name}")
            self._release(
                [p for p in pods if TRACKING_FINALIZER in (o.meta(p).get("finalizers") or []) and finished(p)]
            )
            return None
        try:
            job = self.store.get(self.jobs, ns, name)
        except Exception as e:
            if getattr(e, "code", None) == 404:
                return None
            raise
        uid = o.meta(job)["uid"]
        pods, _ = self.store.list(self.pods, namespace=ns, label_selector=f"{o.CONTROLLER_UID}={uid}")
        pods = [p for p in pods if o.controller_uid(p) == uid]
        tracked = [p for p in pods if TRACKING_FINALIZER in (o.meta(p).get("finalizers") or [])]
        if o.pod_deleting(job):
            self._release([p for p in tracked if finished(p)])  # a Job being deleted lets its pods go
            return None
        ledger = self._terminal.setdefault(uid, {})
        release = [p for p in tracked if finished(p)]
        for p in release:
            if o.pod_terminal(p):
                ledger[o.meta(p)["uid"]] = p
        out = self._suspended_out.setdefault(uid, set())
        out.update(
            o.meta(p)["uid"] for p in pods if (job.get("spec") or {}).get("suspend") and o.pod_deleting(p)
        )
        plan = decide(job, pods, ledger, self._leader_domain(job, pods), o.now(), out)
        if (job.get("spec") or {}).get("suspend"):
            out.update(o.meta(p)["uid"] for p in pods if o.meta(p)["name"] in plan.delete)
        for pname in plan.delete:
            try:
                self.store.delete(self.pods, ns, pname)
                self.recorder.event(job, "Normal", "SuccessfulDelete", f"Deleted pod: {pname}")
            except Exception as e:
                if getattr(e, "code", None) != 404:
                    raise
        for pod in plan.create:
            created = self.store.create(self.pods, pod, ns)
            self.recorder.event(job, "Normal", "SuccessfulCreate", f"Created pod: {o.meta(created)['name']}")
        status = wire_status(plan.status)
        if status != (job.get("status") or {}):
            job = dict(job)
            job["status"] = status
            self.store.update(self.jobs, job, subresource="status")
        self._release(release)
        for etype, reason, msg in plan.events:
            self.recorder.event(job, etype, reason, msg)
        return plan.requeue_after

    def _reconcile_orphan(self, ns: str, name: str) -> float | None:
        try:
            pod = self.store.get(self.pods, ns, name)
        except Exception as e:
            if getattr(e, "code", None) == 404:
                return None
            raise
        owner = o.controller_uid(pod)
        if owner in self._job_keys:
            self.enqueue(("job", *self._job_keys[owner]))
            return None
        if finished(pod):
            self._release([pod])
        return None
