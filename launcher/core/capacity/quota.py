"""ResourceQuota arithmetic for a shape's pods, as the quota admission plugin counts them. Pure.

A quota counts a pod when its `scopes` and `scopeSelector` hold for it; a pod adds its requests
(`requests.<resource>`, and `cpu`/`memory`), its limits (`limits.<resource>`) and one `pods`. An
extended resource such as `google.com/tpu` can only be quota'd as `requests.google.com/tpu`. A quota
on cpu or memory makes the API server refuse pods that state none, unless a LimitRange gives
defaults (Kubernetes "Resource Quotas" concept page).
"""

from __future__ import annotations

from launcher.core.podfit import pod_requests, quantity

# ResourceQuota keys a pod must state a value for, or quota admission refuses it.
# Kubernetes' compute resources of a pod (not reslice's words: "memory" is also a StateSource).
HOST_RESOURCES = ("cpu", "memory")
COMPUTE_KEYS = {"cpu", "memory", "requests.cpu", "requests.memory", "limits.cpu", "limits.memory"}


def pod_usage(pod: dict) -> dict[str, float]:
    """What one pod counts against a ResourceQuota, by quota key."""
    usage = {"pods": 1.0, "count/pods": 1.0}
    for r, v in pod_requests(pod).items():
        usage[f"requests.{r}"] = v
        if r in HOST_RESOURCES:
            usage[r] = v
    for c in pod["spec"]["containers"]:
        for r, v in ((c.get("resources") or {}).get("limits") or {}).items():
            usage[f"limits.{r}"] = usage.get(f"limits.{r}", 0.0) + quantity(v)
    return usage


def _scope_holds(scope: str, operator: str, values: list[str], pod: dict) -> bool:
    spec = pod["spec"]
    if scope == "PriorityClass":
        pc = spec.get("priorityClassName")
        return {
            "In": pc in values,
            "NotIn": pc not in values,
            "Exists": pc is not None,
            "DoesNotExist": pc is None,
        }.get(operator, True)
    best_effort = not any(k in COMPUTE_KEYS for k in pod_usage(pod))  # QoS looks at cpu/memory only
    holds = {
        "BestEffort": best_effort,
        "NotBestEffort": not best_effort,
        "Terminating": "activeDeadlineSeconds" in spec,
        "NotTerminating": "activeDeadlineSeconds" not in spec,
    }.get(scope, True)  # a scope not modelled here: assume the quota counts the pods
    return not holds if operator == "DoesNotExist" else holds


def quota_applies(quota: dict, pod: dict) -> bool:
    """Whether the quota counts this pod (its `scopes` and `scopeSelector` terms, ANDed)."""
    spec = quota.get("spec") or {}
    terms: list[tuple[str, str, list[str]]] = [(s, "Exists", []) for s in spec.get("scopes") or []]
    for e in (spec.get("scopeSelector") or {}).get("matchExpressions") or []:
        terms.append((e.get("scopeName", ""), e.get("operator", "Exists"), e.get("values") or []))
    return all(_scope_holds(s, op, vals, pod) for s, op, vals in terms)


def shortfalls(quotas: tuple[dict, ...], pod: dict, count: int, what: str) -> tuple[list[str], list[str]]:
    """(hard limits `count` such pods exceed, and what is short only now or cannot be told).

    `used` comes from the quota's status (the quota controller's); without one nothing counts as used.
    """
    usage = {k: v * count for k, v in pod_usage(pod).items()}
    over, short = [], []
    for quota in (q for q in quotas if quota_applies(q, pod)):
        name = quota["metadata"]["name"]
        used = (quota.get("status") or {}).get("used") or {}
        for key, hard in ((quota.get("spec") or {}).get("hard") or {}).items():
            if key in COMPUTE_KEYS and key not in usage:
                short.append(
                    f"{name} limits {key}, which the trainer pods do not state: the API server refuses"
                    " them unless a LimitRange gives defaults"
                )
                continue
            need = usage.get(key, 0.0)
            try:
                free = quantity(hard) - quantity(used.get(key, 0))
            except (
                ValueError
            ):  # a quantity the API would have refused (objects read from elsewhere): say so, do not guess
                short.append(f"{name}: cannot read {key} {hard!r}; check it allows {need:g} for {what}")
                continue
            if need > quantity(hard):
                over.append(f"{name}: {key} {hard} < {need:g} for {what}")
            elif need > free:
                short.append(f"{name}: {key} has {free:g} of {hard} free now, {what} needs {need:g}")
    return over, short
