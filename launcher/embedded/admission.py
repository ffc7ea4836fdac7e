"""JobSet admission: what the API server and the JobSet webhook do to a JobSet before it is stored.

In the order a real cluster applies them:
1. prune fields the CRD schema does not know (structural schema pruning) and drop nulls;
2. apply the schema's `default:` values;
3. on create, the JobSet mutating webhook (`mjobset.kb.io`): it decodes the object into the Go
   JobSet first (controller-runtime answers one it cannot decode, e.g. `replicas: "many"`, with 400),
   then defaults success/startup policy, Indexed completion mode, `enableDNSHostnames`,
   `restartPolicy: OnFailure`, failure-policy rule names;
4. validate against the CRD's `openAPIV3Schema` (jsonschema; a wrong type is a FieldValueTypeInvalid
   cause, as apiextensions-apiserver's kubeOpenAPIResultToFieldErrors writes it) and its CEL rules
   (the immutability transition rules and the startupPolicy/dependsOn exclusion): 422 Invalid;
5. the validating webhook (`vjobset.kb.io`, create and update; reached only by an object the schema
   accepted): it decodes the Go JobSet (400 when it cannot, e.g. an int32 overflow the schema lets
   through), then checks, on create, generated Job and Pod names DNS-1035 and at most 63
   characters, known replicated-job names in the success and failure policies, failure-policy rule
   names matching `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$` and unique; on update,
   `replicatedJobs` immutable except the pod template's labels, annotations, nodeSelector,
   tolerations and schedulingGates while suspended: 422 Invalid.
A webhook's refusal reads `admission webhook "<name>" denied the request: ...`, as the API server
relays it (apiserver admission/plugin/webhook/errors ToStatusErr). A status write's status is
pruned, defaulted and validated against the status schema (steps 1, 2, 4), without webhooks.

The CRD ships with the package (`crds/jobset.x-k8s.io_jobsets.yaml`, upstream's v0.12.0 release file
with a header naming its source and license); every JobSet is validated against it.
"""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

import yaml

from launcher.embedded import jobsettypes
from launcher.embedded.errors import TYPE_INVALID, ApiError, Cause, invalid
from launcher.embedded.gotypes import Mismatch, decode
from launcher.embedded.resources import RESOURCES
from launcher.embedded.validation import Causes, dns1035_label, dns1123_subdomain, label_value_errors

SCHEMA_DIR = Path(__file__).resolve().parent / "crds"
CRD_FILE = "jobset.x-k8s.io_jobsets.yaml"
JOBSET_KIND = "JobSet.jobset.x-k8s.io"
MUTATING_WEBHOOK, VALIDATING_WEBHOOK = "mjobset.kb.io", "vjobset.kb.io"

_FAILURE_REASONS = (
    "BackoffLimitExceeded",
    "DeadlineExceeded",
    "PodFailurePolicy",
    "MaxFailedIndexesExceeded",
)
_MAX_INT32 = 2**31 - 1
_HTTP_PATH_FMT = r"[A-Za-z0-9/\-._~%!$&'()*+,;=:]+"  # apimachinery validation's httpPathFmt
_HTTP_PATH = re.compile(_HTTP_PATH_FMT)
_RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
# Pod template fields Kueue may change on a suspended JobSet (the webhook's exception).
_MUTABLE_WHEN_SUSPENDED = ("annotations", "labels")
_MUTABLE_SPEC_WHEN_SUSPENDED = ("nodeSelector", "tolerations", "schedulingGates")


@functools.cache
def crd_schema(schema_dir: Path = SCHEMA_DIR) -> dict[str, Any]:
    path = schema_dir / CRD_FILE
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@functools.cache
def _validator(schema_dir: Path = SCHEMA_DIR, part: str | None = None) -> Any:
    """The schema's validator (of the whole object, or of one top-level `part` of it)."""
    import jsonschema  # a second of import time saved for servers that never see a JobSet

    schema = crd_schema(schema_dir)
    if part is not None:
        schema = (schema.get("properties") or {}).get(part)
    if schema is None:
        return None
    # kube-openapi's type validator takes an integral float for an integer (isFloatInt).
    checker = jsonschema.Draft4Validator.TYPE_CHECKER.redefine(
        "integer",
        lambda _, v: (
            not isinstance(v, bool) and (isinstance(v, int) or (isinstance(v, float) and v.is_integer()))
        ),
    )
    return jsonschema.validators.extend(jsonschema.Draft4Validator, type_checker=checker)(schema)


@functools.cache
def _immutable_paths(schema_dir: Path = SCHEMA_DIR) -> tuple[tuple[str, ...], ...]:
    """Paths carrying the CEL transition rule `self == oldSelf`; "*" stands for list items."""
    found: list[tuple[str, ...]] = []

    def walk(node: dict[str, Any], path: tuple[str, ...]) -> None:
        if any(v.get("rule") == "self == oldSelf" for v in node.get("x-kubernetes-validations") or []):
            found.append(path)
        for key, sub in (node.get("properties") or {}).items():
            walk(sub, (*path, key))
        if isinstance(node.get("items"), dict):
            walk(node["items"], (*path, "*"))

    walk(crd_schema(schema_dir), ())
    return tuple(found)


# ---- steps 1 and 2: pruning, nulls, schema defaults ------------------------------------------------


def drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_nulls(v) for v in value if v is not None]
    return value


def prune_and_default(value: Any, schema: dict[str, Any], top: bool = False) -> Any:
    """Unknown fields dropped and `default:` values filled in, as for a structural schema."""
    if isinstance(value, dict):
        props = schema.get("properties")
        additional = schema.get("additionalProperties")
        out = {}
        for key, sub in value.items():
            if top and key in ("apiVersion", "kind", "metadata"):
                out[key] = sub
            elif props is not None and key in props:
                out[key] = prune_and_default(sub, props[key])
            elif isinstance(additional, dict):
                out[key] = prune_and_default(sub, additional)
            elif schema.get("x-kubernetes-preserve-unknown-fields") or (
                props is None and additional is not False
            ):
                out[key] = sub
        for key, sub in (props or {}).items():
            if key not in out and "default" in sub:
                out[key] = prune_and_default(copy.deepcopy(sub["default"]), sub)
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune_and_default(v, schema["items"]) for v in value]
    return value


# ---- step 3: the mutating webhook -------------------------------------------------------------------


def webhook_defaults(js: dict[str, Any]) -> None:
    spec = js.setdefault("spec", {})
    spec.setdefault("successPolicy", {"operator": "All"})
    spec.setdefault("startupPolicy", {"startupPolicyOrder": "AnyOrder"})
    network = spec.setdefault("network", {})
    network.setdefault("enableDNSHostnames", True)
    network.setdefault("publishNotReadyAddresses", True)
    for rjob in spec.get("replicatedJobs") or []:
        job_spec = rjob.setdefault("template", {}).setdefault("spec", {})
        job_spec.setdefault("completionMode", "Indexed")
        pod_spec = job_spec.setdefault("template", {}).setdefault("spec", {})
        if not pod_spec.get("restartPolicy"):
            pod_spec["restartPolicy"] = "OnFailure"
    if (policy := spec.get("failurePolicy")) is not None:
        policy.setdefault("restartStrategy", "Recreate")
        for i, rule in enumerate(policy.get("rules") or []):
            if not rule.get("name"):
                rule["name"] = f"failurePolicyRule{i}"


# ---- step 4: validation -----------------------------------------------------------------------------


def _field(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_JSON_TYPES = {str: "string", bool: "boolean", int: "integer", float: "number", list: "array", dict: "object"}


def schema_causes(js: Any, schema_dir: Path = SCHEMA_DIR, part: str | None = None) -> list[Cause]:
    """Schema violations of the object (or of its top-level `part`, when `js` is that part)."""
    validator = _validator(schema_dir, part)
    if validator is None:
        return []
    causes: list[Cause] = []
    for err in sorted(validator.iter_errors(js), key=lambda e: list(map(str, e.absolute_path))):
        field = _field([part, *err.absolute_path] if part else err.absolute_path)
        if err.validator == "type":
            # kube-openapi's InvalidType: the bad value is the JSON type the data has.
            got = _JSON_TYPES.get(type(err.instance), "null")
            expected = (
                err.validator_value if isinstance(err.validator_value, str) else ",".join(err.validator_value)
            )
            msg = f'Invalid value: "{got}": {field} in body must be of type {expected}: "{got}"'
            causes.append((field, msg, TYPE_INVALID))
        elif err.validator == "required":
            missing = err.message.split("'")[1]
            causes.append((f"{field}.{missing}" if field else missing, "Required value"))
        elif err.validator == "enum":
            allowed = ", ".join(f'"{v}"' for v in err.validator_value)
            causes.append((field, f'Unsupported value: "{err.instance}": supported values: {allowed}'))
        else:
            causes.append((field, f"Invalid value: {_short(err.instance)}: {field} in body {_reason(err)}"))
    return causes


def _short(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict | list):
        return f'"{type(value).__name__ if isinstance(value, list) else "object"}"'
    return str(value).lower() if isinstance(value, bool) else str(value)


def _reason(err: Any) -> str:
    words = {
        "type": f"must be of type {err.validator_value}",
        "minimum": f"should be greater than or equal to {err.validator_value}",
        "maximum": f"should be less than or equal to {err.validator_value}",
        "maxItems": f"must have at most {err.validator_value} items",
        "minItems": f"should have at least {err.validator_value} items",
        "maxLength": f"may not be longer than {err.validator_value}",
        "minLength": f"should be at least {err.validator_value} chars long",
        "pattern": f"should match '{err.validator_value}'",
    }
    return words.get(err.validator, err.message)


_JOB_NAME_TOO_LONG = "JobSet name is too long, job names generated for this JobSet will exceed 63 characters"
_POD_NAME_TOO_LONG = "JobSet name is too long, pod names generated for this JobSet will exceed 63 characters"
_SUBDOMAIN_TOO_LONG = ".spec.network.subdomain is too long, must be less than 63 characters"
_GROUP_TOO_LONG = ".spec.replicatedJob[].groupName is too long, must be less than 63 characters"


def _internal(message: str) -> tuple[str, str]:
    """A webhook error without a field: JobSet's toFieldErrorList makes it field.InternalError(nil, err)."""
    return ("<nil>", f"Internal error: {message}")


def _dns1035(value: str, too_long: str) -> list[str]:
    """IsDNS1035Label with the webhook's own words for the length error."""
    return [too_long if m == "must be no more than 63 characters" else m for m in dns1035_label(value)]


def webhook_causes(js: dict[str, Any]) -> Causes:
    """The JobSet validating webhook's ValidateCreate checks (messages as upstream)."""
    name = js["metadata"].get("name", "")
    spec = js.get("spec") or {}
    rjobs = spec.get("replicatedJobs") or []
    causes: Causes = []
    names = [r.get("name", "") for r in rjobs]
    for i, rjob_name in enumerate(names):
        if rjob_name in names[:i]:
            causes.append((f"spec.replicatedJobs[{i}]", f'Duplicate value: {{"name":"{rjob_name}"}}'))
    # Feature gates at their v0.12.0 defaults (pkg/features/features.go): InPlaceRestart and
    # RestartJob are alpha, off.
    if (spec.get("failurePolicy") or {}).get("restartStrategy") == "InPlaceRestart":
        causes.append(
            _internal(
                "InPlaceRestart restart strategy cannot be set when InPlaceRestart feature gate is disabled"
            )
        )
    if rjobs and rjobs[0].get("dependsOn") is not None:
        causes.append(("spec.replicatedJobs[0]", "DependsOn can't be set for the first ReplicatedJob"))
    subdomain = (spec.get("network") or {}).get("subdomain")
    if subdomain:
        for msg in dns1123_subdomain(subdomain) + _dns1035(subdomain, _SUBDOMAIN_TOO_LONG):
            causes.append(("spec.network.subdomain", f'Invalid value: "{subdomain}": {msg}'))
    if spec.get("managedBy") is not None:
        causes += _managed_by_causes(str(spec["managedBy"]))
    for i, rjob in enumerate(rjobs):
        parallelism = ((rjob.get("template") or {}).get("spec") or {}).get("parallelism")
        if int(parallelism if parallelism is not None else 1) * int(rjob.get("replicas", 1)) > _MAX_INT32:
            causes.append(
                _internal(
                    f"the product of replicas and parallelism must not exceed {_MAX_INT32} for "
                    f"replicatedJob '{rjob.get('name', '')}'"
                )
            )
        causes += _name_causes(name, rjob, i)
        for dep in rjob.get("dependsOn") or []:
            if dep.get("name") not in names[: i + 1]:
                causes.append(
                    _internal(
                        f"replicatedJob: {rjob.get('name', '')} cannot depend on replicatedJob: {dep.get('name')}"
                    )
                )
    known = set(names)
    for target in (spec.get("successPolicy") or {}).get("targetReplicatedJobs") or []:
        if target not in known:
            causes.append(
                _internal(f"invalid replicatedJob name '{target}' does not appear in .spec.ReplicatedJobs")
            )
    causes += _failure_policy_causes(spec.get("failurePolicy") or {}, known)
    if spec.get("coordinator") is not None:
        causes += _coordinator_causes(js, rjobs)
    in_order = (spec.get("startupPolicy") or {}).get("startupPolicyOrder") == "InOrder"
    if in_order and any("dependsOn" in r for r in rjobs):
        causes.append(
            ("spec", 'Invalid value: "object": StartupPolicy and DependsOn APIs are mutually exclusive')
        )
    return causes


def _name_causes(js_name: str, rjob: dict[str, Any], i: int) -> Causes:
    """The longest generated Job and Pod names must be DNS-1035 labels of at most 63 characters."""
    field = f"spec.replicatedJobs[{i}]"
    causes: Causes = []
    group = rjob.get("groupName", "default")
    causes += [
        (f"{field}.groupName", f'Invalid value: "{group}": {m}') for m in _dns1035(group, _GROUP_TOO_LONG)
    ]
    replicas = int(rjob.get("replicas", 1))
    job_spec = (rjob.get("template") or {}).get("spec") or {}
    longest_job = f"{js_name}-{rjob.get('name', '')}-{replicas - 1}"
    causes += [
        (f"{field}.name", f'Invalid value: "{longest_job}": {m}')
        for m in _dns1035(longest_job, _JOB_NAME_TOO_LONG)
    ]
    completions = job_spec.get("completions")
    if job_spec.get("completionMode") == "Indexed" and completions is not None:
        longest_pod = f"{longest_job}-{int(completions) - 1}-abcde"
        msgs = _dns1035(longest_pod, _POD_NAME_TOO_LONG)
        causes += [(f"{field}.name", f'Invalid value: "{longest_job}": {m}') for m in msgs]
    return causes


def _managed_by_causes(manager: str) -> Causes:
    """IsDomainPrefixedPath and the 63-byte limit (apimachinery validation, the webhook's managedBy)."""
    field, causes = "spec.managedBy", []
    host, sep, path = manager.partition("/")
    if not manager:
        causes.append((field, "Required value"))
    elif not (sep and host and path):
        causes.append(
            (field, f'Invalid value: "{manager}": must be a domain-prefixed path (such as "acme.io/foo")')
        )
    else:
        causes += [(field, f'Invalid value: "{host}": {m}') for m in dns1123_subdomain(host)]
        if not _HTTP_PATH.fullmatch(path):
            causes.append(
                (
                    field,
                    f"Invalid value: \"{path}\": Invalid path (regex used for validation is '{_HTTP_PATH_FMT}')",
                )
            )
    if len(manager) > 63:
        causes.append((field, "Too long: may not be more than 63 bytes"))
    return causes


def _coordinator_causes(js: dict[str, Any], rjobs: list[dict[str, Any]]) -> Causes:
    """validateCoordinator, then validateCoordinatorLabelValue (both always run upstream)."""
    coord = js["spec"]["coordinator"]
    rname, job_idx, pod_idx = (
        coord.get("replicatedJob", ""),
        int(coord.get("jobIndex", 0)),
        int(coord.get("podIndex", 0)),
    )
    rjob = next((r for r in rjobs if r.get("name") == rname), None)
    job_spec = ((rjob or {}).get("template") or {}).get("spec") or {}
    causes: Causes = []
    if rjob is None:
        causes.append(_internal(f"coordinator replicatedJob {rname} does not exist"))
    elif not 0 <= job_idx < int(rjob.get("replicas", 1)):
        causes.append(_internal(f"coordinator job index {job_idx} is invalid for replicatedJob {rname}"))
    elif job_spec.get("completionMode") != "Indexed" or job_spec.get("completions") is None:
        causes.append(
            _internal(
                "job for coordinator pod must be indexed completion mode, and completions number must be set"
            )
        )
    elif not 0 <= pod_idx < int(job_spec["completions"]):
        causes.append(
            _internal(
                f"coordinator pod index {pod_idx} is invalid for replicatedJob {rname} job index {job_idx}"
            )
        )
    sub = (js["spec"].get("network") or {}).get("subdomain") or js["metadata"].get("name", "")
    value = f"{js['metadata'].get('name', '')}-{rname}-{job_idx}-{pod_idx}.{sub}"
    errs = label_value_errors(value)
    if errs:
        causes.append(
            _internal(
                f'spec will lead to invalid label value "{value}" for coordinator label '
                f'"jobset.sigs.k8s.io/coordinator" (long JobSet / ReplicatedJob / SubDomain name?): '
                + ", ".join(errs)
            )
        )
    return causes


def _failure_policy_causes(policy: dict[str, Any], known: set[str]) -> Causes:
    causes: Causes = []
    if any(
        r.get("action") in ("RestartJob", "RestartJobAndIgnoreMaxRestarts") for r in policy.get("rules") or []
    ):
        # The RestartJob gate is off: upstream returns this error alone for the failure policy.
        return [
            _internal(
                "RestartJob and RestartJobAndIgnoreMaxRestarts failure policy actions are not allowed "
                "when RestartJob feature gate is disabled"
            )
        ]
    by_name: dict[str, list[int]] = {}
    for i, rule in enumerate(policy.get("rules") or []):
        rule_name = rule.get("name", "")
        by_name.setdefault(rule_name, []).append(i)
        if not 1 <= len(rule_name) <= 128:
            causes.append(
                _internal(
                    f"invalid failure policy rule name of length {len(rule_name)}, the rule name must be at "
                    "least 1 characters long and at most 128 characters long"
                )
            )
        if not _RULE_NAME.match(rule_name):
            causes.append(
                _internal(
                    f"invalid failure policy rule name '{rule_name}', a failure policy rule name must start "
                    "with an alphabetic character, optionally followed by a string of alphanumeric "
                    "characters or '_,:', and must end with an alphanumeric character or '_'"
                )
            )
        for target in rule.get("targetReplicatedJobs") or []:
            if target not in known:
                causes.append(
                    _internal(
                        f"invalid replicatedJob name '{target}' in failure policy does not appear in .spec.ReplicatedJobs"
                    )
                )
        for reason in rule.get("onJobFailureReasons") or []:
            if reason not in _FAILURE_REASONS:
                causes.append(
                    _internal(
                        f"invalid job failure reason '{reason}' in failure policy is not a recognized job failure reason"
                    )
                )
    for rule_name, indices in by_name.items():
        if len(indices) > 1:
            causes.append(
                _internal(
                    f"rule names are not unique, rules with indices {indices} all have the same name '{rule_name}'"
                )
            )
    return causes


def _values_at(obj: Any, path: tuple[str, ...], prefix: str = "") -> dict[str, Any]:
    """Values at a schema path; list items keyed by their `name` (the list-map key) or index."""
    if not path:
        return {prefix: obj}
    head, rest = path[0], path[1:]
    out: dict[str, Any] = {}
    if head == "*" and isinstance(obj, list):
        for i, item in enumerate(obj):
            key = item.get("name", i) if isinstance(item, dict) else i
            out.update(_values_at(item, rest, f"{prefix}[{key}]"))
    elif isinstance(obj, dict) and head in obj:
        out.update(_values_at(obj[head], rest, f"{prefix}.{head}" if prefix else head))
    return out


def cel_update_causes(old: dict[str, Any], new: dict[str, Any], schema_dir: Path = SCHEMA_DIR) -> Causes:
    """The CRD's `self == oldSelf` transition rules (checked by the API server with the schema)."""
    causes: Causes = []
    for path in _immutable_paths(schema_dir):
        before, after = _values_at(old, path), _values_at(new, path)
        for field, value in after.items():
            if field in before and before[field] != value:
                causes.append((field, 'Invalid value: "object": Value is immutable'))
    return causes


def webhook_update_causes(old: dict[str, Any], new: dict[str, Any]) -> Causes:
    """The validating webhook's ValidateUpdate: replicated jobs immutable (Kueue's fields aside)."""
    causes: Causes = []
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    old_rjobs = old_spec.get("replicatedJobs") or []
    new_rjobs = new_spec.get("replicatedJobs") or []
    if old_spec.get("suspend") or new_spec.get("suspend"):
        old_rjobs, new_rjobs = _without_kueue_fields(old_rjobs), _without_kueue_fields(new_rjobs)
    if new_rjobs != old_rjobs:
        causes.append(("spec.replicatedJobs", 'Invalid value: "array": field is immutable'))
    return causes


def _without_kueue_fields(rjobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Replicated jobs minus the pod template fields Kueue may change while a JobSet is suspended."""
    out = copy.deepcopy(rjobs)
    for rjob in out:
        tpl = ((rjob.get("template") or {}).get("spec") or {}).get("template") or {}
        for key in _MUTABLE_WHEN_SUSPENDED:
            (tpl.get("metadata") or {}).pop(key, None)
        for key in _MUTABLE_SPEC_WHEN_SUSPENDED:
            (tpl.get("spec") or {}).pop(key, None)
    return out


# ---- the store hook ---------------------------------------------------------------------------------


def _denied(webhook: str, err: ApiError) -> ApiError:
    return ApiError(
        err.code,
        err.reason,
        f'admission webhook "{webhook}" denied the request: {err.message}',
        details=err.details,
    )


def _webhook_decode(webhook: str, js: dict[str, Any]) -> None:
    """controller-runtime decodes the request into the Go JobSet and answers 400 when it cannot."""
    try:
        decode(js, jobsettypes.JOBSET, lenient=True)
    except Mismatch as m:
        raise _denied(webhook, ApiError(400, "", m.message())) from None


def _pruned(js: dict[str, Any], schema_dir: Path) -> dict[str, Any]:
    return prune_and_default(drop_nulls(js), crd_schema(schema_dir), top=True)


def admit_jobset(old: dict[str, Any] | None, new: dict[str, Any], schema_dir: Path = SCHEMA_DIR) -> None:
    """Store validator for jobsets: mutates `new` (pruning, defaults) and raises 400 or 422."""
    cleaned = _pruned(new, schema_dir)
    if old is None:  # the mutating webhook is registered for create only
        _webhook_decode(MUTATING_WEBHOOK, cleaned)
        webhook_defaults(cleaned)
    new.clear()
    new.update(cleaned)
    name = new["metadata"].get("name", "")
    causes = schema_causes(new, schema_dir) + ([] if old is None else cel_update_causes(old, new, schema_dir))
    if causes:
        raise invalid(JOBSET_KIND, name, causes)
    _webhook_decode(VALIDATING_WEBHOOK, new)
    causes = webhook_causes(new) if old is None else webhook_update_causes(old, new)
    if causes:
        raise _denied(VALIDATING_WEBHOOK, invalid(JOBSET_KIND, name, causes))


def admit_jobset_status(
    old: dict[str, Any] | None, new: dict[str, Any], schema_dir: Path = SCHEMA_DIR
) -> None:
    """Store validator for jobsets/status: the schema checks the status (all a status write can
    change; upstream validates the whole object, whose rest is the stored one); no webhook runs."""
    if new.get("status") is None:
        new.pop("status", None)
        return
    new["status"] = prune_and_default(
        drop_nulls(new["status"]), crd_schema(schema_dir)["properties"]["status"]
    )
    if causes := schema_causes(new["status"], schema_dir, "status"):
        raise invalid(JOBSET_KIND, new["metadata"].get("name", ""), causes)


def install(store: Any) -> None:
    """Register JobSet admission on `store` (once)."""
    if not getattr(store, "_jobset_admission", False):
        store.add_validator(RESOURCES["jobsets"], admit_jobset)
        store.add_validator(RESOURCES["jobsets"], admit_jobset_status, status=True)
        store._jobset_admission = True
