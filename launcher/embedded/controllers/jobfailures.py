"""How the Job controller counts its pods' failures: `podFailurePolicy` rules, `backoffLimit`
(restarts in place included), the pod backoff, and `backoffLimitPerIndex` (each index's failure
counts travel on its pods' annotations, pkg/controller/job/indexed_job_utils.go).

Pure. Called by `jobactions.decide`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from launcher.core import rfc3339
from launcher.embedded.controllers.jobpods import completion_index, finish_time
from launcher.embedded.types import objects

DEFAULT_BACKOFF_LIMIT = 6
BACKOFF_BASE_S = 10.0
BACKOFF_MAX_S = 360.0
# backoffLimitPerIndex: each index's failures travel on its pods (pkg/controller/job/indexed_job_utils.go).
INDEX_FAILURE_COUNT = "batch.kubernetes.io/job-index-failure-count"
INDEX_IGNORED_FAILURE_COUNT = "batch.kubernetes.io/job-index-ignored-failure-count"


def match_pod_failure_policy(
    policy: Mapping[str, Any] | None, pod: Mapping[str, Any]
) -> tuple[str | None, str | None]:
    """(action, FailJob message) of the first matching rule, as upstream matchPodFailurePolicy.
    (None, None) when nothing matches (the failure counts toward backoffLimit)."""
    if not policy:
        return None, None
    ns, name = objects.meta(pod).get("namespace"), objects.meta(pod).get("name")
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
        if objects.pod_phase(p) in ("Running", "Pending")
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


def ann_count(pod: Mapping[str, Any], key: str) -> int:
    """An index failure count annotation; 0 when missing or not an int32 (parseInt32 upstream)."""
    v = str(objects.annotations(pod).get(key, ""))
    return int(v) if v.isdigit() and int(v) <= 2**31 - 1 else 0


def index_failure_counts(
    replaced: Mapping[str, Any] | None, action: str | None, policy: Mapping[str, Any] | None
) -> dict[str, str]:
    """The failure-count annotations of the pod replacing `replaced` (getNewIndexFailureCounts): its
    counts, plus one failure, or one ignored failure when the pod failure policy ignored it."""
    if replaced is None:
        return {INDEX_FAILURE_COUNT: "0"}
    failures = ann_count(replaced, INDEX_FAILURE_COUNT)
    ignored = ann_count(replaced, INDEX_IGNORED_FAILURE_COUNT)
    if policy and action == "Ignore":
        ignored += 1
    else:
        failures += 1
    out = {INDEX_FAILURE_COUNT: str(failures)}
    if ignored:
        out[INDEX_IGNORED_FAILURE_COUNT] = str(ignored)
    return out


def last_failed(failed_pods: list[Mapping[str, Any]], index: int) -> Mapping[str, Any] | None:
    """The index's pod to replace: most failures, then the latest (getPodsWithDelayedDeletionPerIndex)."""
    mine = [p for p in failed_pods if completion_index(p) == index]
    return max(
        mine,
        key=lambda p: (
            ann_count(p, INDEX_FAILURE_COUNT) + ann_count(p, INDEX_IGNORED_FAILURE_COUNT),
            finish_time(p),
        ),
        default=None,
    )


def index_backoff(last: Mapping[str, Any] | None, now: dt.datetime) -> float:
    """Seconds the index still waits: the backoff's base doubling per failure of the index, capped."""
    if last is None:
        return 0.0
    n = ann_count(last, INDEX_FAILURE_COUNT) + ann_count(last, INDEX_IGNORED_FAILURE_COUNT) + 1
    lt = rfc3339.parse(finish_time(last))
    if lt is None:
        return 0.0
    return min(BACKOFF_BASE_S * 2 ** (n - 1), BACKOFF_MAX_S) - (now - lt).total_seconds()
