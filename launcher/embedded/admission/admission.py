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

The CRD's checks (steps 1, 2, 4) are `crdschema.py`, the webhooks' (3, 5) `jobsetwebhook.py`; this
module runs them in order as the store's validator for jobsets (`install`, called by
`apiserver.ApiServer`). The CRD ships with the package (`crds/jobset.x-k8s.io_jobsets.yaml`,
upstream's v0.12.0 release file with a header naming its source and license); every JobSet is
validated against it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.embedded.admission.crdschema import (
    SCHEMA_DIR,
    cel_update_causes,
    crd_schema,
    drop_nulls,
    prune_and_default,
    schema_causes,
)
from launcher.embedded.admission.jobsetwebhook import (
    MUTATING_WEBHOOK,
    VALIDATING_WEBHOOK,
    webhook_causes,
    webhook_defaults,
    webhook_update_causes,
)
from launcher.embedded.types import jobsettypes
from launcher.embedded.types.errors import ApiError, invalid
from launcher.embedded.types.gotypes import Mismatch, decode
from launcher.embedded.types.resources import RESOURCES

JOBSET_KIND = "JobSet.jobset.x-k8s.io"


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
