"""What one pod asks of a node, pure: its resource requests and whether it tolerates a taint.

Quantities are parsed by the official client's `kubernetes.utils.parse_quantity` (decimal and binary
suffixes up to E and Ei, exponents such as `1e3`), not by a pattern of our own. Called by preflight's
pool and quota checks (launcher/core/capacity/pools.py, launcher/core/capacity/quota.py, used by `reslice launch` and
`preflight`) and by the embedded cluster's scheduler and node lifecycle (launcher/embedded/controllers/filters.py,
nodelife.py, podenv.py), which import it from here: the launcher's real-cluster commands need no
part of the embedded cluster.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any


def quantity(value: Any) -> float:
    """A resource.Quantity as a float ('500m' -> 0.5, '8Gi' -> 8589934592, '1e3' -> 1000,
    '2E' -> 2e18); ValueError for what is not one."""
    # Late: importing kubernetes loads kubernetes.client, which the embedded cluster's start-up avoids.
    from kubernetes.utils import parse_quantity

    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"bad quantity {value!r}")
    try:
        parsed = float(parse_quantity(value))
    except ArithmeticError as e:  # decimal.InvalidOperation and friends
        raise ValueError(f"bad quantity {value!r}") from e
    if not math.isfinite(parsed):  # 'NaN', 'Infinity': Decimal takes them, the API server does not
        raise ValueError(f"bad quantity {value!r}")
    return parsed


def pod_requests(pod: Mapping[str, Any]) -> dict[str, float]:
    """Effective requests: per container requests, defaulting to limits (API server defaulting)."""
    req: dict[str, float] = {}
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for k, v in merged.items():
            req[k] = req.get(k, 0.0) + quantity(v)
    return req


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """corev1 Toleration.ToleratesTaint."""
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        op = t.get("operator") or "Equal"
        if not t.get("key"):
            if op == "Exists":
                return True
            continue
        if t.get("key") != taint.get("key"):
            continue
        if op == "Exists" or (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False
