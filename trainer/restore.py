"""The restore onto a new mesh: the newest state this run holds, laid out for this incarnation's mesh.

An incarnation's mesh may differ from the one that wrote the state (a world of other slices, another
batch plan): the state is read into ``abstract``, the shardings of this mesh, whatever wrote it.
Where it comes from, newest first:

- memory (``trainer.state.snapshot.Memory``): a step whose snapshots some slice's processes all
  hold in RAM, agreed by every process (``Memory.agreed``), when it is not older than the newest
  committed checkpoint; read from this host's own snapshots, or broadcast from a slice that holds
  one (``StateSource.MEMORY`` / ``PEERS``);
- storage (``trainer.state.checkpoint.Checkpointer.usable_start``): the newest committed
  checkpoint that restores, a foreign one refused (``ConfigError``: exit 2), an unusable one set
  aside;
- nothing: a fresh start (step 0, ``StateSource.FRESH``), which the loop initialises.

Called by ``trainer.loop.run`` between the abstract state and the data pipeline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax

from contract.words import StateSource
from trainer.state import snapshot
from trainer.state.checkpoint import Checkpointer


@dataclass(frozen=True)
class Restored:
    """What ``onto_mesh`` found: its step (0: nothing), its state (None then; arrays that may still
    be arriving otherwise: ``ready``), where it came from, and the seconds it took so far."""

    step: int
    state: Any
    source: StateSource
    seconds: float

    def ready(self) -> tuple[Any, float]:
        """The state on the devices, and the seconds waited for it (Orbax may hand back arrays still
        arriving)."""
        t0 = time.perf_counter()
        state = jax.block_until_ready(self.state)
        return state, time.perf_counter() - t0


def onto_mesh(
    memory: snapshot.Memory,
    ours: list[int],
    ckpt: Checkpointer,
    abstract: Any,
    mesh: Any,
    total_steps: int,
    compatible: Callable[[int, dict[str, Any]], None],
    retrace: Callable[[], Any] | None,
    timeout_s: float,
) -> Restored:
    """The newest state of this run onto `mesh` (as `abstract` lays it out).

    `ours`: the steps some slice's processes all hold in memory (``Memory.held``). `compatible`
    refuses a checkpoint of another run (``Checkpointer.check_compatible`` with this run's
    identity): ``usable_start`` asks it of every step it reads, before restoring it.
    `retrace`: the traced abstract state, when `abstract` came from the compile cache
    (``Checkpointer.usable_start``). `timeout_s`: how long the processes wait for each other to
    agree on a step in memory."""
    t0 = time.perf_counter()
    chosen = memory.agreed(ours, abstract, mesh, timeout_s)
    if chosen is not None and chosen[0] >= (ckpt.latest_step() or 0):
        state = memory.load(chosen, abstract, mesh)
        return Restored(chosen[0], state, memory.source or StateSource.MEMORY, time.perf_counter() - t0)
    step, state = ckpt.usable_start(total_steps, abstract, compatible, retrace)
    return Restored(step, state, StateSource.STORAGE if step else StateSource.FRESH, time.perf_counter() - t0)
