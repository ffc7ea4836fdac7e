"""Offline validation of rendered objects: the JobSet CRD schema and the core Kubernetes schemas."""

from __future__ import annotations

import jsonschema
import kubernetes_validate

from launcher.embedded.admission.crdschema import crd_schema

K8S_VERSION = "1.33.0"


def jobset_schema() -> dict:
    """The CRD the package ships (the one the embedded API admits JobSets with)."""
    return crd_schema()


def drop_nulls(obj):
    """The API server drops null values before it validates; an offline validator must too."""
    if isinstance(obj, dict):
        return {k: drop_nulls(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [drop_nulls(v) for v in obj]
    return obj


def jobset_errors(jobset: dict) -> list[str]:
    validator = jsonschema.Draft7Validator(jobset_schema())
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(drop_nulls(jobset))
    ]


def validate_job_template(jobset: dict, rjob_index: int = 0) -> None:
    """The replicated job's template as a batch/v1 Job, strict (unknown fields are errors)."""
    rjob = jobset["spec"]["replicatedJobs"][rjob_index]
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"{jobset['metadata']['name']}-{rjob['name']}-0",
            **rjob["template"].get("metadata", {}),
        },
        "spec": rjob["template"]["spec"],
    }
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
