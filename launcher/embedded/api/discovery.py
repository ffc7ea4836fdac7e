"""Discovery documents (`/version`, `/api`, `/apis`, resource lists) and server-side Tables.

kubectl asks for aggregated discovery first and falls back to these legacy documents when the
answer is plain JSON, so only the legacy form is served. `kubectl get` asks for a
`meta.k8s.io/v1 Table`; the columns here are the upstream printers' (pods: NAME READY STATUS
RESTARTS AGE ...; JobSets: the CRD's additionalPrinterColumns).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from launcher.core import rfc3339
from launcher.embedded.types.resources import GROUPS, VERBS, Resource

KUBE_VERSION = {
    "major": "1",
    "minor": "31",
    # The suffix says "the embedded cluster" to `reslice` (launcher/adapters/kube.py is_embedded), which
    # then takes its local defaults; an outside-mode cluster answers ORDINARY_VERSION instead.
    "gitVersion": "v1.31.0-reslice-embedded",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2024-08-13T00:00:00Z",
    "goVersion": "go1.22.5",
    "compiler": "gc",
    "platform": "linux/amd64",
}
# What an ordinary server of the same release answers (docs/embedded.md "Outside mode").
ORDINARY_VERSION = {**KUBE_VERSION, "gitVersion": "v1.31.0"}


def _group_version(group: str, version: str) -> dict[str, str]:
    return {"groupVersion": f"{group}/{version}" if group else version, "version": version}


def api_versions(address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}],
    }


def api_group(group: str) -> dict[str, Any]:
    versions = [_group_version(group, v) for v in GROUPS[group]]
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": versions,
        "preferredVersion": versions[0],
    }


def api_group_list() -> dict[str, Any]:
    groups = [api_group(g) for g in GROUPS if g]
    for g in groups:
        del g["kind"], g["apiVersion"]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def _resource_entry(res: Resource) -> dict[str, Any]:
    verbs = [v for v in VERBS if not (res.plural == "namespaces" and v == "deletecollection")]
    entry: dict[str, Any] = {
        "name": res.plural,
        "singularName": res.singular,
        "namespaced": res.namespaced,
        "kind": res.kind,
        "verbs": verbs,
    }
    if res.short_names:
        entry["shortNames"] = list(res.short_names)
    if res.categories:
        entry["categories"] = list(res.categories)
    return entry


def resource_list(group: str, version: str) -> dict[str, Any]:
    resources = []
    for res in GROUPS[group][version].values():
        resources.append(_resource_entry(res))
        for sub in res.subresources:
            verbs = {"log": ["get"], "eviction": ["create"]}.get(sub, ["get", "patch", "update"])
            entry = {
                "name": f"{res.plural}/{sub}",
                "singularName": "",
                "namespaced": res.namespaced,
                "kind": "Eviction" if sub == "eviction" else res.kind,
                "verbs": verbs,
            }
            if sub == "eviction":
                entry.update(group="policy", version="v1")
            resources.append(entry)
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }


# ---- OpenAPI ----------------------------------------------------------------------------------------
# kubectl validates manifests client-side with the server's OpenAPI v2 document before create/apply
# and refuses when it cannot download one. An empty document (no definitions) makes it skip that
# validation, as it does for kinds it has no schema for; this server validates on write anyway.
# kubectl asks for the gnostic protobuf form; a hand-encoded minimal `openapi_v2.Document`:
# swagger (field 1) "2.0", info (2) {title (1), version (2)}, paths (8) {}.


def _pb_field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (all lengths here are < 128: one-byte varints)."""
    return bytes([number << 3 | 2, len(payload)]) + payload


OPENAPI_V2_PROTOBUF = (
    _pb_field(1, b"2.0")
    + _pb_field(2, _pb_field(1, b"Kubernetes") + _pb_field(2, KUBE_VERSION["gitVersion"].encode()))
    + _pb_field(8, b"")
)
OPENAPI_V2_PROTOBUF_TYPE = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
OPENAPI_V2_JSON = {
    "swagger": "2.0",
    "info": {"title": "Kubernetes", "version": KUBE_VERSION["gitVersion"]},
    "paths": {},
    "definitions": {},
}


# ---- tables -----------------------------------------------------------------------------------------


def _parse_time(ts: str | None) -> float | None:
    try:
        return rfc3339.seconds(ts)
    except ValueError:  # a table shows what it can of an object written elsewhere
        return None


def human_duration(seconds: float) -> str:
    """apimachinery's duration.HumanDuration, the AGE column's format."""
    s = int(max(seconds, 0))
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    d = h // 24
    if d < 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    return f"{d}d" if d < 365 * 2 else f"{d // 365}y"


def _age(obj: dict[str, Any], now: float) -> str:
    created = _parse_time(obj["metadata"].get("creationTimestamp"))
    return "<unknown>" if created is None else human_duration(now - created)


def _pod_status(pod: dict[str, Any]) -> str:
    status = pod.get("status") or {}
    reason = status.get("reason") or status.get("phase") or "Unknown"
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        if (w := state.get("waiting")) and w.get("reason"):
            reason = w["reason"]
        elif (t := state.get("terminated")) is not None:
            reason = t.get("reason") or (
                f"Signal:{t['signal']}" if t.get("signal") else f"ExitCode:{t.get('exitCode', 0)}"
            )
    if pod["metadata"].get("deletionTimestamp"):
        reason = "Terminating"
    return reason


def _pod_row(pod: dict[str, Any], now: float) -> list[Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    total = len((pod.get("spec") or {}).get("containers") or [])
    ready = sum(1 for cs in statuses if cs.get("ready"))
    restarts = sum(int(cs.get("restartCount", 0)) for cs in statuses)
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    return [
        pod["metadata"]["name"],
        f"{ready}/{total}",
        _pod_status(pod),
        restarts,
        _age(pod, now),
        status.get("podIP") or "<none>",
        spec.get("nodeName") or "<none>",
        "<none>",
        "<none>",
    ]


def _node_row(node: dict[str, Any], now: float) -> list[Any]:
    conds = {c.get("type"): c.get("status") for c in (node.get("status") or {}).get("conditions") or []}
    ready = {"True": "Ready", "False": "NotReady"}.get(conds.get("Ready", ""), "Unknown")
    if (node.get("spec") or {}).get("unschedulable"):
        ready += ",SchedulingDisabled"
    info = (node.get("status") or {}).get("nodeInfo") or {}
    return [node["metadata"]["name"], ready, "<none>", _age(node, now), info.get("kubeletVersion", "")]


def _job_row(job: dict[str, Any], now: float) -> list[Any]:
    status, spec = job.get("status") or {}, job.get("spec") or {}
    conds = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    state = "Running"
    if conds.get("Complete") == "True":
        state = "Complete"
    elif conds.get("Failed") == "True":
        state = "Failed"
    elif spec.get("suspend"):
        state = "Suspended"
    completions = spec.get("completions")
    done = f"{status.get('succeeded', 0)}/{completions if completions is not None else 1}"
    start, end = _parse_time(status.get("startTime")), _parse_time(status.get("completionTime"))
    duration = human_duration((end or now) - start) if start else ""
    return [job["metadata"]["name"], state, done, duration, _age(job, now)]


def _jobset_row(js: dict[str, Any], now: float) -> list[Any]:
    status, spec = js.get("status") or {}, js.get("spec") or {}
    completed = next(
        (c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Completed"), ""
    )
    restarts = status.get("restarts")
    suspend = spec.get("suspend")
    return [
        js["metadata"]["name"],
        status.get("terminalState", ""),
        "" if restarts is None else str(restarts),
        completed,
        "" if suspend is None else str(suspend).lower(),
        _age(js, now),
    ]


def _event_row(ev: dict[str, Any], now: float) -> list[Any]:
    last = _parse_time(
        ev.get("lastTimestamp") or ev.get("eventTime") or ev["metadata"].get("creationTimestamp")
    )
    obj = ev.get("involvedObject") or {}
    return [
        human_duration(now - last) if last else "<unknown>",
        ev.get("type", ""),
        ev.get("reason", ""),
        f"{(obj.get('kind') or '').lower()}/{obj.get('name', '')}",
        ev.get("message", ""),
    ]


def _name_age_row(obj: dict[str, Any], now: float) -> list[Any]:
    return [obj["metadata"]["name"], _age(obj, now)]


def _namespace_row(ns: dict[str, Any], now: float) -> list[Any]:
    return [ns["metadata"]["name"], (ns.get("status") or {}).get("phase", ""), _age(ns, now)]


def _col(name: str, kind: str = "string", priority: int = 0, fmt: str = "") -> dict[str, Any]:
    return {"name": name, "type": kind, "format": fmt, "description": name, "priority": priority}


_NAME = _col("Name", fmt="name")
_TABLES: dict[str, tuple[list[dict[str, Any]], Callable[[dict[str, Any], float], list[Any]]]] = {
    "pods": (
        [
            _NAME,
            _col("Ready"),
            _col("Status"),
            _col("Restarts", "integer"),
            _col("Age"),
            _col("IP", priority=1),
            _col("Node", priority=1),
            _col("Nominated Node", priority=1),
            _col("Readiness Gates", priority=1),
        ],
        _pod_row,
    ),
    "nodes": ([_NAME, _col("Status"), _col("Roles"), _col("Age"), _col("Version")], _node_row),
    "jobs": ([_NAME, _col("Status"), _col("Completions"), _col("Duration"), _col("Age")], _job_row),
    "jobsets": (
        [_NAME, _col("TerminalState"), _col("Restarts"), _col("Completed"), _col("Suspended"), _col("Age")],
        _jobset_row,
    ),
    "events": (
        [_col("Last Seen"), _col("Type"), _col("Reason"), _col("Object"), _col("Message")],
        _event_row,
    ),
    "namespaces": ([_NAME, _col("Status"), _col("Age")], _namespace_row),
}


def table(res: Resource, objects: list[dict[str, Any]], resource_version: str) -> dict[str, Any]:
    columns, row = _TABLES.get(res.plural, ([_NAME, _col("Age")], _name_age_row))
    now = time.time()
    rows = [
        {
            "cells": row(obj, now),
            "object": {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            },
        }
        for obj in objects
    ]
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": columns,
        "rows": rows,
    }
