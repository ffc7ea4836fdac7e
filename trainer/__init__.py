"""reslice trainer: ``python -m trainer``. See docs/contract.md and the module docstrings.

Module map: ``config`` (named configs, overrides, contract env) -> ``distributed`` (process group)
-> ``mesh`` (data × expert) -> ``model`` / ``moe`` (flax nnx decoder, expert-parallel MoE) ->
``data`` (Grain, step-indexed order) -> ``step`` (jitted train step) -> ``checkpoint`` (Orbax) ->
``metrics`` (run directory) -> ``loop`` (the training loop) <- ``__main__`` (entry, exit codes).
"""

from __future__ import annotations

import signal
from typing import Any


class Preemption:
    """Remembers a SIGTERM; the loop acts on it at a step boundary.

    Lives here, free of heavy imports, so that ``__main__`` can install it before importing JAX:
    a SIGTERM during start-up must not kill the process with a non-contract exit code.
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        print("trainer: SIGTERM: finishing the step in flight, then checkpoint and exit 42", flush=True)

    def restore(self) -> None:
        signal.signal(signal.SIGTERM, self._previous)
