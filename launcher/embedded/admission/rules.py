"""The built-in kinds' own validation, run on every write after names, labels and metadata.

Upstream's rules (kubernetes pkg/apis/core/validation: validateContainerCommon, ValidateEnv,
validateEnvFrom; pkg/apis/batch/validation: ValidateJobSpec) for what the embedded kubelet,
scheduler and Job controller index without a fallback: container names and images, env var names
and their sources, the Job's counts, completion mode and restart policy. Beyond upstream: status
conditions need a `type` (every component looks conditions up by it; upstream's Go types always
serialize one, here a writer must).

Objects arrive decoded (`decoding` ran first), so every value has its Go type.
"""

from __future__ import annotations

import re
from typing import Any

from launcher.embedded.admission.validation import Causes, dns1123_label, labels, object_meta
from launcher.embedded.types.errors import invalid
from launcher.embedded.types.gotypes import go_equal, parse_quantity
from launcher.embedded.types.resources import Resource

_RESTART_POLICIES = ("Always", "OnFailure", "Never")
# validEnvDownwardAPIFieldPathExpressions, plus the subscripted label and annotation paths.
_ENV_FIELD_PATHS = (
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
)
_SUBSCRIPTED = re.compile(r"^metadata\.(labels|annotations)\['.+'\]$")
_ONE_OF_ENV = "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`"
_ONE_OF_ENV_FROM = "must specify one of: `configMapRef` or `secretRef`"
_AT_A_TIME = "may not have more than one field specified at a time"


def pod_spec(spec: dict[str, Any], path: str) -> Causes:
    causes: Causes = []
    if not spec.get("containers"):
        causes.append((f"{path}.containers", "Required value"))
    names: set[str] = set()
    for key in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(key) or []):
            causes += _container(c, f"{path}.{key}[{i}]", names)
    policy = spec.get("restartPolicy")
    if policy is not None and policy not in _RESTART_POLICIES:
        allowed = ", ".join(f'"{p}"' for p in _RESTART_POLICIES)
        causes.append(
            (f"{path}.restartPolicy", f'Unsupported value: "{policy}": supported values: {allowed}')
        )
    return causes


def _container(c: dict[str, Any], path: str, names: set[str]) -> Causes:
    causes: Causes = []
    name = c.get("name") or ""
    if not name:
        causes.append((f"{path}.name", "Required value"))
    elif name in names:
        causes.append((f"{path}.name", f'Duplicate value: "{name}"'))
    else:
        causes += [(f"{path}.name", f'Invalid value: "{name}": {m}') for m in dns1123_label(name)]
    names.add(name)
    if not c.get("image"):
        causes.append((f"{path}.image", "Required value"))
    for i, env in enumerate(c.get("env") or []):
        causes += _env(env, f"{path}.env[{i}]")
    for i, src in enumerate(c.get("envFrom") or []):
        causes += _env_from(src, f"{path}.envFrom[{i}]")
    return causes


def _env(env: dict[str, Any], path: str) -> Causes:
    causes: Causes = [] if env.get("name") else [(f"{path}.name", "Required value")]
    source = env.get("valueFrom")
    if source is None:
        return causes
    path += ".valueFrom"
    given = [k for k in ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef") if k in source]
    if not given:
        return [*causes, (path, f'Invalid value: "": {_ONE_OF_ENV}')]
    if env.get("value"):
        return [*causes, (path, 'Invalid value: "": may not be specified when `value` is not empty')]
    if len(given) > 1:
        return [*causes, (path, f'Invalid value: "": {_AT_A_TIME}')]
    ref, where = source[given[0]], f"{path}.{given[0]}"
    if given[0] == "fieldRef":
        field_path = ref.get("fieldPath") or ""
        if not field_path:
            causes.append((f"{where}.fieldPath", "Required value"))
        elif field_path not in _ENV_FIELD_PATHS and not _SUBSCRIPTED.match(field_path):
            allowed = ", ".join(f'"{p}"' for p in _ENV_FIELD_PATHS)
            causes.append(
                (f"{where}.fieldPath", f'Unsupported value: "{field_path}": supported values: {allowed}')
            )
    elif given[0] == "resourceFieldRef":
        if not ref.get("resource"):
            causes.append((f"{where}.resource", "Required value"))
        divisor = ref.get("divisor")
        if divisor is not None and not (parse_quantity(divisor) or 0) > 0:
            causes.append((f"{where}.divisor", f'Invalid value: "{divisor}": must be greater than zero'))
    else:
        causes += [(f"{where}.{k}", "Required value") for k in ("name", "key") if not ref.get(k)]
    return causes


def _env_from(src: dict[str, Any], path: str) -> Causes:
    given = [k for k in ("configMapRef", "secretRef") if k in src]
    if len(given) != 1:
        return [(path, f'Invalid value: "": {_AT_A_TIME if given else _ONE_OF_ENV_FROM}')]
    if not (src[given[0]] or {}).get("name"):
        return [(f"{path}.{given[0]}.name", "Required value")]
    return []


# ---- kinds ---------------------------------------------------------------------------------------------

_COMPLETION_MODES = ("NonIndexed", "Indexed")


def _nonnegative(spec: dict[str, Any], path: str, *keys: str) -> Causes:
    return [
        (f"{path}.{k}", f"Invalid value: {spec[k]}: must be greater than or equal to 0")
        for k in keys
        if spec.get(k) is not None and spec[k] < 0
    ]


def _per_index(spec: dict[str, Any], mode: str | None) -> Causes:
    """backoffLimitPerIndex, maxFailedIndexes and FailIndex belong together, on Indexed Jobs
    (pkg/apis/batch/validation validateJobSpec, validatePodFailurePolicyRule)."""
    per_index, max_failed = spec.get("backoffLimitPerIndex"), spec.get("maxFailedIndexes")
    causes = _nonnegative(spec, "spec", "backoffLimitPerIndex", "maxFailedIndexes")
    if max_failed is not None and per_index is None:
        causes.append(("spec.backoffLimitPerIndex", "Required value: when maxFailedIndexes is specified"))
    if mode == "Indexed":
        completions = spec.get("completions")
        if max_failed is not None and completions is not None and max_failed > completions:
            causes.append(
                (
                    "spec.maxFailedIndexes",
                    f"Invalid value: {max_failed}: must be less than or equal to completions",
                )
            )
    else:
        causes += [
            (f"spec.{k}", f"Invalid value: {spec[k]}: requires indexed completion mode")
            for k in ("backoffLimitPerIndex", "maxFailedIndexes")
            if spec.get(k) is not None
        ]
    for i, rule in enumerate((spec.get("podFailurePolicy") or {}).get("rules") or []):
        if rule.get("action") == "FailIndex" and per_index is None:
            causes.append(
                (
                    f"spec.podFailurePolicy.rules[{i}].action",
                    'Invalid value: "FailIndex": requires the backoffLimitPerIndex to be set',
                )
            )
    return causes


def _job(obj: dict[str, Any]) -> Causes:
    spec = obj.get("spec") or {}
    template = spec.get("template") or {}
    causes = _nonnegative(spec, "spec", "parallelism", "completions", "backoffLimit", "activeDeadlineSeconds")
    mode = spec.get("completionMode")
    if mode is not None and mode not in _COMPLETION_MODES:
        allowed = ", ".join(f'"{m}"' for m in _COMPLETION_MODES)
        causes.append(("spec.completionMode", f'Unsupported value: "{mode}": supported values: {allowed}'))
    causes += _per_index(spec, mode)
    pod = template.get("spec") or {}
    policy = pod.get("restartPolicy")
    if policy not in ("OnFailure", "Never"):
        causes.append(
            (
                "spec.template.spec.restartPolicy",
                f'Unsupported value: "{policy or ""}": supported values: "OnFailure", "Never"',
            )
        )
    elif spec.get("podFailurePolicy") and policy != "Never":
        causes.append(
            (
                "spec.template.spec.restartPolicy",
                f'Invalid value: "{policy}": only "Never" is supported when podFailurePolicy is specified',
            )
        )
    if mode == "Indexed" and spec.get("completions") is None:
        causes.append(("spec.completions", "Required value: when completion mode is Indexed"))
    causes += labels((template.get("metadata") or {}).get("labels"), "spec.template.labels")
    return causes + pod_spec(pod, "spec.template.spec") + _conditions(obj)


def _pod(obj: dict[str, Any]) -> Causes:
    return pod_spec(obj.get("spec") or {}, "spec") + _conditions(obj)


def _conditions(obj: dict[str, Any]) -> Causes:
    return [
        (f"status.conditions[{i}].type", "Required value")
        for i, c in enumerate((obj.get("status") or {}).get("conditions") or [])
        if not c.get("type")
    ]


def _service(obj: dict[str, Any]) -> Causes:
    """ValidateService's port rule (pkg/apis/core/validation): every port is in 1-65535."""
    causes: Causes = []
    for i, port in enumerate((obj.get("spec") or {}).get("ports") or []):
        value = port.get("port")
        if value is None:
            causes.append((f"spec.ports[{i}].port", "Required value"))
        elif not 1 <= value <= 65535:
            causes.append(
                (f"spec.ports[{i}].port", f"Invalid value: {value}: must be between 1 and 65535, inclusive")
            )
    return causes


_KIND_RULES = {"jobs": _job, "pods": _pod, "nodes": _conditions, "services": _service}


# Pod template fields a suspended Job that never started may change (upstream
# ValidateJobSpecUpdate with JobMutableNodeSchedulingDirectives, GA since 1.27).
_MUTABLE_WHILE_SUSPENDED = ("nodeSelector", "tolerations", "schedulingGates", "affinity")
_IMMUTABLE_JOB_FIELDS = ("selector", "completionMode", "podFailurePolicy", "backoffLimitPerIndex")


def _template_core(template: dict[str, Any]) -> dict[str, Any]:
    spec = {k: v for k, v in (template.get("spec") or {}).items() if k not in _MUTABLE_WHILE_SUSPENDED}
    return {"spec": spec}


def _job_update(old: dict[str, Any], new: dict[str, Any]) -> Causes:
    """ValidateJobSpecUpdate: the template and the fields that shape the pods are immutable; a Job
    that is suspended and has never started may change its pods' scheduling directives, labels
    and annotations (what Kueue writes when it admits a Job)."""
    o_spec, n_spec = old.get("spec") or {}, new.get("spec") or {}
    # Typed comparisons (Semantic.DeepEqual): absent and empty are one value.
    causes: Causes = [
        (f"spec.{k}", f"Invalid value: {_go_value(n_spec.get(k))}: field is immutable")
        for k in _IMMUTABLE_JOB_FIELDS
        if not go_equal(o_spec.get(k), n_spec.get(k))
    ]
    o_t, n_t = o_spec.get("template") or {}, n_spec.get("template") or {}
    if not go_equal(o_t, n_t):
        may = bool(o_spec.get("suspend")) and not (old.get("status") or {}).get("startTime")
        if not may or not go_equal(_template_core(o_t), _template_core(n_t)):
            causes.append(("spec.template", "Invalid value: core.PodTemplateSpec{...}: field is immutable"))
    return causes


def _go_value(v: Any) -> str:
    return '"object"' if isinstance(v, dict) else f'"{v}"' if isinstance(v, str) else str(v)


def check_update(res: Resource, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Raise 422 Invalid when a main-resource update changes what the kind makes immutable."""
    if res.plural == "jobs":
        causes = _job_update(old, new)
        if causes:
            raise invalid(res.qualified_kind, new["metadata"].get("name", ""), causes)


def check(res: Resource, obj: dict[str, Any]) -> None:
    """Raise 422 Invalid when `obj` breaks a rule a real server enforces for every write."""
    causes = object_meta(res, obj)
    if rule := _KIND_RULES.get(res.plural):
        causes += rule(obj)
    if causes:
        raise invalid(res.qualified_kind, obj["metadata"].get("name", ""), causes)
