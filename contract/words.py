"""The enums both sides of the launcher/trainer boundary speak: their values are what the pods'
environment, the metrics records, status.json and the ledger hold, so a member and its plain string
compare, hash and serialise alike (StrEnum)."""

from __future__ import annotations

from enum import StrEnum


class RestartMode(StrEnum):
    """How a run changes shape (`RunSpec.restart_mode`, `--restart-mode`, the pods'
    `RESLICE_RESTART_MODE`; docs/contract.md "World (in-place restarts)"): recreate every pod in a
    new segment's JobSet, or keep the surviving slices' pods and publish a new world to their
    supervisors. Which rules a run's mode brings is decided once, by launcher/core/policy's
    `rules_for`."""

    RECREATE = "recreate"  # the pod is deleted and a new segment's pod runs one trainer (default)
    IN_PLACE = "in-place"  # the pod stays; its supervisor starts a trainer in each new world


class StateSource(StrEnum):
    """Where a trainer incarnation's state came from (`restore/from` in its first metrics record;
    docs/contract.md)."""

    MEMORY = "memory"  # the surviving processes' own snapshots in RAM
    PEERS = "peers"  # a surviving replica, over the data axis
    STORAGE = "storage"  # the run directory's committed checkpoints
