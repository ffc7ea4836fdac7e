"""Offline validation of rendered objects: the JobSet CRD schema and the core Kubernetes schemas."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

SHARED = Path(__file__).resolve().parents[3] / "shared"
CRD = SHARED / "schemas" / "jobset.x-k8s.io_jobsets.yaml"
K8S_VERSION = "1.33.0"


@cache
def jobset_schema() -> dict:
    crd = yaml.safe_load(CRD.read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


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
