"""Multi-process setup from the contract environment (docs/contract.md).

``RESLICE_COORDINATOR`` set: ``jax.distributed.initialize(coordinator, RESLICE_NUM_PROCESSES,
process_id)`` with process id = slice index × hosts per slice + completion index. Absent: a single
process, unless this is a multi-host Cloud TPU slice (``TPU_WORKER_HOSTNAMES`` lists several hosts
or ``MEGASCALE_NUM_SLICES`` > 1), where JAX's own cluster detection is used.

The heartbeat timeout decides how fast the survivors of a dead process give up (the launcher then
restarts the whole set): ``RESLICE_HEARTBEAT_TIMEOUT_S``, default JAX's 100 s. The initialization
timeout is how long the first process waits for the last one to join: ``RESLICE_INIT_TIMEOUT_S``,
default 900 s (JAX's 300 s is short for hundreds of hosts whose pods start minutes apart; see
docs/contract.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import jax

from trainer.config import ConfigError


@dataclass(frozen=True)
class Identity:
    process_id: int = 0
    num_processes: int = 1
    coordinator: str | None = None


def _int(env: Mapping[str, str], key: str, default: int) -> int:
    raw = env.get(key, "")
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not an integer") from None


def identity(env: Mapping[str, str]) -> Identity:
    coordinator = env.get("RESLICE_COORDINATOR") or None
    num = _int(env, "RESLICE_NUM_PROCESSES", 1)
    pid = _int(env, "RESLICE_SLICE_INDEX", 0) * _int(env, "RESLICE_HOSTS_PER_SLICE", 1) + _int(
        env, "JOB_COMPLETION_INDEX", 0
    )
    if num < 1 or not 0 <= pid < num:
        raise ConfigError(f"process id {pid} is outside [0, RESLICE_NUM_PROCESSES={num})")
    if num > 1 and coordinator is None:
        raise ConfigError(f"RESLICE_NUM_PROCESSES={num} needs RESLICE_COORDINATOR")
    return Identity(pid, num, coordinator)


def _tpu_multihost(env: Mapping[str, str]) -> bool:
    hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]
    return len(hosts) > 1 or _int(env, "MEGASCALE_NUM_SLICES", 1) > 1


_joined = False
INIT_TIMEOUT_S = 900


def joined() -> bool:
    """Whether this process joined a multi-process group (its exit then involves the peers)."""
    return _joined


def initialize(env: Mapping[str, str]) -> Identity:
    """Join the process group (before anything touches the JAX backend)."""
    global _joined
    ident = identity(env)
    heartbeat = _int(env, "RESLICE_HEARTBEAT_TIMEOUT_S", 100)
    init_timeout = _int(env, "RESLICE_INIT_TIMEOUT_S", INIT_TIMEOUT_S)
    if init_timeout < 1 or heartbeat < 1:
        raise ConfigError("RESLICE_INIT_TIMEOUT_S and RESLICE_HEARTBEAT_TIMEOUT_S must be >= 1 second")
    # JAX's preemption service would install its own SIGTERM handler over ours (trainer.Preemption):
    # the loop agrees on the stopping step through the step's own outputs instead.
    jax.config.update("jax_enable_preemption_service", False)
    if ident.coordinator is not None and ident.num_processes > 1:
        jax.distributed.initialize(
            ident.coordinator,
            ident.num_processes,
            ident.process_id,
            initialization_timeout=init_timeout,
            heartbeat_timeout_seconds=heartbeat,
        )
        _joined = True
    elif _tpu_multihost(env):
        jax.distributed.initialize(initialization_timeout=init_timeout, heartbeat_timeout_seconds=heartbeat)
        _joined = True
        ident = Identity(jax.process_index(), jax.process_count(), None)
    return ident
