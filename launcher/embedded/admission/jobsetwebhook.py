"""The JobSet webhooks (kubernetes-sigs/jobset v0.12, pkg/webhooks/jobset_webhook.go): the mutating
webhook's defaults (`mjobset.kb.io`: success/startup policy, Indexed completion mode,
`enableDNSHostnames`, `restartPolicy: OnFailure`, failure-policy rule names) and the validating
webhook's checks (`vjobset.kb.io`: on create, generated Job and Pod names, known replicated-job
names in the policies, rule names, coordinator, managedBy; on update, `replicatedJobs` immutable
except what Kueue changes while suspended, and `managedBy`), as lists of 422 causes.

Pure. Steps 3 and 5 of `admission.py`, which calls it and relays a refusal.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from launcher.embedded.admission.validation import (
    Causes,
    dns1035_label,
    dns1123_subdomain,
    label_value_errors,
)
from launcher.embedded.types.gotypes import go_equal

MUTATING_WEBHOOK, VALIDATING_WEBHOOK = "mjobset.kb.io", "vjobset.kb.io"

_MAX_INT32 = 2**31 - 1
_FAILURE_REASONS = (
    "BackoffLimitExceeded",
    "DeadlineExceeded",
    "FailedIndexes",
    "MaxFailedIndexesExceeded",
    "PodFailurePolicy",
)
_HTTP_PATH_FMT = r"[A-Za-z0-9/\-._~%!$&'()*+,;=:]+"  # apimachinery validation's httpPathFmt
_HTTP_PATH = re.compile(_HTTP_PATH_FMT)
_RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
# Pod template fields Kueue may change on a suspended JobSet (the webhook's exception).
_MUTABLE_WHEN_SUSPENDED = ("annotations", "labels")
_MUTABLE_SPEC_WHEN_SUSPENDED = ("nodeSelector", "tolerations", "schedulingGates")


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


# ---- step 5: the validating webhook -----------------------------------------------------------------

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
    field = "spec.managedBy"
    causes: Causes = []
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


def webhook_update_causes(old: dict[str, Any], new: dict[str, Any]) -> Causes:
    """The validating webhook's ValidateUpdate: replicated jobs immutable (Kueue's fields aside), and
    managedBy (ValidateImmutableField, which prints a nil pointer as null)."""
    causes: Causes = []
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    old_rjobs = old_spec.get("replicatedJobs") or []
    new_rjobs = new_spec.get("replicatedJobs") or []
    if old_spec.get("suspend") or new_spec.get("suspend"):
        old_rjobs, new_rjobs = _without_kueue_fields(old_rjobs), _without_kueue_fields(new_rjobs)
    # Compared as typed Go values (ValidateImmutableField: Semantic.DeepEqual): a pod template
    # created without `metadata` is the one left with `metadata: {}` once its labels are set aside.
    if not go_equal(new_rjobs, old_rjobs):
        causes.append(("spec.replicatedJobs", 'Invalid value: "array": field is immutable'))
    if new_spec.get("managedBy") != old_spec.get("managedBy"):
        shown = "null" if new_spec.get("managedBy") is None else new_spec["managedBy"]
        causes.append(("spec.managedBy", f'Invalid value: "{shown}": field is immutable'))
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
