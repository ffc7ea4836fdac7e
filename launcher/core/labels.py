"""The names and labels of what reslice creates (JobSets, their pods), and the JobSet API's own
label and annotation keys it reads. Imported by the renderer, the signals, the adapters and the
commands: anything that names or selects a run's objects."""

from __future__ import annotations

API_VERSION = "jobset.x-k8s.io/v1alpha2"
REPLICATED_JOB = "slice"
CONTAINER = "trainer"
LABEL_RUN = "reslice.dev/run"
LABEL_SEGMENT = "reslice.dev/segment"
# In-place runs: the stable id of the slice a JobSet and its pods belong to (docs/contract.md).
LABEL_SLICE = "reslice.dev/slice"
LABEL_QUEUE = "kueue.x-k8s.io/queue-name"
# Kueue's topology-aware scheduling, on a pod template (kueue apis/kueue/v1beta2/topology_types.go):
# every pod of the podset in one domain of the level, preferably so, or each slice of
# `podset-slice-size` pods in one.
ANNOTATION_TAS_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
ANNOTATION_TAS_PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
ANNOTATION_TAS_SLICE_REQUIRED = "kueue.x-k8s.io/podset-slice-required-topology"
ANNOTATION_TAS_SLICE_SIZE = "kueue.x-k8s.io/podset-slice-size"
ANNOTATION_EXCLUSIVE = "alpha.jobset.sigs.k8s.io/exclusive-topology"
LABEL_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
LABEL_RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
LABEL_JOBSET_UID = "jobset.sigs.k8s.io/jobset-uid"  # JobSet labels its Jobs' pods with its uid


def jobset_name(run: str, segment: int) -> str:
    return f"{run}-{segment}"


def segment_labels(run: str, segment: int) -> dict[str, str]:
    return {LABEL_RUN: run, LABEL_SEGMENT: str(segment)}


def slice_jobset_name(run: str, slice_id: str) -> str:
    """The JobSet of one slice of an in-place run: it outlives the segments (worlds) it takes part in."""
    return f"{run}-s{slice_id}"


def slice_labels(run: str, slice_id: str) -> dict[str, str]:
    return {LABEL_RUN: run, LABEL_SLICE: slice_id}


def world_configmap_name(run: str) -> str:
    """The ConfigMap that holds an in-place run's world (`world.json`), apart from its record."""
    return f"{run}-world"


def world_access_name(run: str) -> str:
    """The ServiceAccount, Role and RoleBinding that let an in-place run's pods read its world."""
    return f"reslice-{run}-world"
