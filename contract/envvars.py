"""The names of the environment variables of docs/contract.md: those the launcher's renderer sets in
a pod (literal or by the downward API) and the trainer reads, and those an in-place pod's supervisor
sets in its trainer children. A name, never a value: what each means is the contract's tables."""

from __future__ import annotations

# The run and its segment (docs/contract.md "Environment").
RUN = "RESLICE_RUN"
SEGMENT = "RESLICE_SEGMENT"
RUN_DIR = "RESLICE_RUN_DIR"
CONFIG = "RESLICE_CONFIG"
SET = "RESLICE_SET"  # a JSON list of "key=value" overrides
# The batch plan.
GLOBAL_BATCH = "RESLICE_GLOBAL_BATCH"
MICRO_BATCH = "RESLICE_MICRO_BATCH"
GRAD_ACCUM = "RESLICE_GRAD_ACCUM"
# The process group: process id = SLICE_INDEX × HOSTS_PER_SLICE + JOB_COMPLETION_INDEX.
NUM_SLICES = "RESLICE_NUM_SLICES"
NUM_PROCESSES = "RESLICE_NUM_PROCESSES"
HOSTS_PER_SLICE = "RESLICE_HOSTS_PER_SLICE"
COORDINATOR = "RESLICE_COORDINATOR"
SLICE_INDEX = "RESLICE_SLICE_INDEX"  # downward API: the jobset.sigs.k8s.io/job-index label
JOB_COMPLETION_INDEX = "JOB_COMPLETION_INDEX"  # Kubernetes' own: the pod's index in its slice
RESTART_ATTEMPT = "RESLICE_RESTART_ATTEMPT"  # downward API: JobSet's restart attempt of the slice
# The accelerator and JAX's process group.
PEAK_TFLOPS = "RESLICE_PEAK_TFLOPS"
HEARTBEAT_TIMEOUT_S = "RESLICE_HEARTBEAT_TIMEOUT_S"
INIT_TIMEOUT_S = "RESLICE_INIT_TIMEOUT_S"
REJOIN_TIMEOUT_S = "RESLICE_REJOIN_TIMEOUT_S"
# Multislice (JAX's and libtpu's own names).
MEGASCALE_COORDINATOR_ADDRESS = "MEGASCALE_COORDINATOR_ADDRESS"
MEGASCALE_NUM_SLICES = "MEGASCALE_NUM_SLICES"
MEGASCALE_SLICE_ID = "MEGASCALE_SLICE_ID"
MEGASCALE_PORT = "MEGASCALE_PORT"
MEGASCALE = (MEGASCALE_COORDINATOR_ADDRESS, MEGASCALE_NUM_SLICES, MEGASCALE_SLICE_ID, MEGASCALE_PORT)

# An in-place pod (docs/contract.md "The pod's environment").
RESTART_MODE = "RESLICE_RESTART_MODE"  # a words.RestartMode
SLICE_ID = "RESLICE_SLICE_ID"
MEMORY_ROOT = "RESLICE_MEMORY_ROOT"
WORLD_CONFIGMAP = "RESLICE_WORLD_CONFIGMAP"
WORLD_NAMESPACE = "RESLICE_WORLD_NAMESPACE"
WORLD_API = "RESLICE_WORLD_API"
WORLD_FILE = "RESLICE_WORLD_FILE"
WORLD_ENV_ALLOW = "RESLICE_WORLD_ENV_ALLOW"
PEER_LOST_WAIT_S = "RESLICE_PEER_LOST_WAIT_S"
PEER_LOST_MAX_WAIT_S = "RESLICE_PEER_LOST_MAX_WAIT_S"
CHIP_WAIT_S = "RESLICE_CHIP_WAIT_S"
LIBTPU_LOCKFILE = "RESLICE_LIBTPU_LOCKFILE"

# What an in-place pod's supervisor adds for each trainer child (docs/contract.md "The child's
# environment").
WORLD_EPOCH = "RESLICE_WORLD_EPOCH"
MEMORY_DIR = "RESLICE_MEMORY_DIR"  # the child's directory of the pod's RAM, for its snapshots
# Which of its pod's trainer children this one is: 0 for the pod's first, 1 for the next, and so on
# (absent: 0). A later child's start-up is timed from its fork and it rejoins within
# REJOIN_TIMEOUT_S.
INCARNATION = "RESLICE_INCARNATION"
