"""The `pods/eviction` subresource (policy/v1 Eviction), how `kubectl drain` and GKE's node
upgrades remove pods: PodDisruptionBudgets are honoured, and the pod gets `DisruptionTarget` with
reason `EvictionByEvictionAPI` before it is deleted (gracefully, with the Eviction's
deleteOptions).

As kubernetes `pkg/registry/core/pod/storage/eviction.go`: a pod that is Pending, terminal or
already terminating is deleted without consulting budgets (`canIgnorePDB`); more than one budget
over a pod is a 500; a budget with no disruption left is a 429 TooManyRequests with a
`DisruptionBudget` cause; an allowed eviction spends one disruption (`status.disruptedPods`).

Budgets are computed from the pods at the time of the call (the disruption controller's work,
done synchronously): healthy pods are Running, Ready and not terminating; the expected count for
a percentage or `maxUnavailable` is the number of pods the selector matches (upstream takes it
from the pods' scalable controller, which a Job is not: there such a budget allows nothing).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from launcher.core import rfc3339
from launcher.embedded.types import objects
from launcher.embedded.types.errors import ApiError, bad_request

EVICTION_MESSAGE = "Eviction API: evicting"
PDB_VIOLATION = "Cannot evict pod as it would violate the pod's disruption budget."
MULTIPLE_PDBS = (
    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
)


def _healthy(pod: Mapping[str, Any]) -> bool:
    return objects.pod_phase(pod) == "Running" and objects.pod_ready(pod) and not objects.pod_deleting(pod)


def budget(pdb: Mapping[str, Any], pods: list[Mapping[str, Any]]) -> tuple[int, int]:
    """(desired healthy, currently healthy) for a PodDisruptionBudget over `pods` (its matches)."""
    spec = pdb.get("spec") or {}
    expected = len([p for p in pods if not objects.pod_terminal(p)])
    healthy = sum(1 for p in pods if _healthy(p))

    def amount(v: Any) -> int:
        if isinstance(v, str) and v.endswith("%"):
            return math.ceil(int(v[:-1]) * expected / 100)
        return int(v)

    if spec.get("minAvailable") is not None:
        desired = amount(spec["minAvailable"])
    elif spec.get("maxUnavailable") is not None:
        desired = max(0, expected - amount(spec["maxUnavailable"]))
    else:
        desired = expected
    return desired, healthy


def matching(pdbs: list[Mapping[str, Any]], pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Budgets whose selector matches the pod (an empty selector matches every pod, as in policy/v1)."""
    return [
        p
        for p in pdbs
        if objects.match_label_selector(objects.labels(pod), (p.get("spec") or {}).get("selector") or {})
    ]


def can_ignore_budgets(pod: Mapping[str, Any]) -> bool:
    return objects.pod_phase(pod) in ("Pending", "Succeeded", "Failed") or objects.pod_deleting(pod)


def evict(store: Any, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """POST .../pods/NAME/eviction: the Status the API server answers (201), or raises ApiError."""
    from launcher.embedded.store.store import RESOURCES

    pods_res, pdb_res = RESOURCES["pods"], RESOURCES["poddisruptionbudgets"]
    meta = body.get("metadata") or {}
    if body.get("kind") not in (None, "Eviction"):
        raise bad_request(f"unexpected kind {body.get('kind')!r}: expected Eviction")
    if meta.get("name") not in (None, name):
        raise bad_request("name in URL does not match name in Eviction object")
    opts = body.get("deleteOptions") or {}
    pod = store.get(pods_res, namespace, name)
    if not can_ignore_budgets(pod):
        pdbs, _ = store.list(pdb_res, namespace)
        hits = matching(pdbs, pod)
        if len(hits) > 1:
            raise ApiError(500, "InternalError", MULTIPLE_PDBS)
        if hits:
            pdb = hits[0]
            sel = (pdb.get("spec") or {}).get("selector") or {}
            all_pods, _ = store.list(pods_res, namespace)
            desired, healthy = budget(
                pdb, [p for p in all_pods if objects.match_label_selector(objects.labels(p), sel)]
            )
            if healthy - desired <= 0:
                pname = objects.meta(pdb)["name"]
                raise ApiError(
                    429,
                    "TooManyRequests",
                    PDB_VIOLATION,
                    details={
                        "causes": [
                            {
                                "reason": "DisruptionBudget",
                                "message": f"The disruption budget {pname} needs {desired} healthy pods "
                                f"and has {healthy} currently",
                            }
                        ]
                    },
                )
            st = dict(pdb.get("status") or {})
            st.update(
                disruptionsAllowed=healthy - desired - 1,
                currentHealthy=healthy,
                desiredHealthy=desired,
                expectedPods=len(
                    [p for p in all_pods if objects.match_label_selector(objects.labels(p), sel)]
                ),
                disruptedPods={**(st.get("disruptedPods") or {}), name: rfc3339.stamp()},
                observedGeneration=objects.meta(pdb).get("generation", 1),
            )
            pdb = dict(pdb)
            pdb["status"] = st
            store.update(pdb_res, pdb, subresource="status")
        if not objects.pod_terminal(pod):
            cur = store.get(pods_res, namespace, name)
            conds = cur.setdefault("status", {}).setdefault("conditions", [])
            objects.set_condition(
                conds,
                "DisruptionTarget",
                "True",
                "EvictionByEvictionAPI",
                EVICTION_MESSAGE,
                probe_fields=True,
            )
            store.update(pods_res, cur, subresource="status")
    store.delete(
        pods_res,
        namespace,
        name,
        grace_period_seconds=opts.get("gracePeriodSeconds"),
        preconditions=opts.get("preconditions"),
    )
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
