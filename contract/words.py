"""The enums both sides of the launcher/trainer boundary speak: their values are what the pods'
environment, the metrics records, status.json and the ledger hold, so a member and its plain string
compare, hash and serialise alike (StrEnum)."""

from __future__ import annotations

from collections.abc import Mapping
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
    """Where a trainer incarnation's state came from: the `state_source` of its first metrics
    record, of status.json's `restored`, of the ledger's restore line, of a segment in the report
    and the web page (docs/contract.md)."""

    FRESH = "fresh"  # nothing restored: the run's initial state, step 0
    MEMORY = "memory"  # the surviving processes' own snapshots in RAM
    PEERS = "peers"  # a surviving replica, over the data axis
    STORAGE = "storage"  # the run directory's committed checkpoints


# The one key of a StateSource wherever it is written: the metrics record (the first of each
# incarnation), status.json's `restored`, the ledger's `restore` line, the report's and the web
# page's segments.
STATE_SOURCE = "state_source"
# Then what writers before it wrote instead, read still: the metrics record's `restore/from`,
# status.json's `restored.from` and the ledger's `from`, each None for a fresh start.
STATE_SOURCE_KEYS = (STATE_SOURCE, "restore/from", "from")


def read_state_source(record: Mapping[str, object]) -> StateSource | None:
    """The StateSource a metrics record, status.json's `restored` or a ledger line says, under the
    first of STATE_SOURCE_KEYS it has (an older writer's None: FRESH). None: it has none of them, or
    a value this version does not know."""
    for key in STATE_SOURCE_KEYS:
        if key in record:
            value = record[key]
            try:
                return StateSource.FRESH if value is None else StateSource(str(value))
            except ValueError:
                return None
    return None
