"""The trainer's exit codes (docs/contract.md "Exit codes"): one place for every module that exits,
and for the launcher's failure policy that acts on the numbers (the JobSet's failure-policy rules,
launcher/core/render.py; the pods' causes, launcher/core/signals/pods.py), so a value never changes.
``python -m trainer.tokenize`` uses the same ones for its own ends. Imports nothing.
"""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    """What a trainer process (or its supervisor) exits with. An ``int``: ``os._exit``, ``sys.exit``
    and f-strings take it as its number."""

    # The configured steps trained and the final checkpoint committed; for the one-shot commands
    # (``--check``, ``--probe-write``, ``--hbm``, ``trainer.tokenize``): their work done.
    FINISHED = 0
    # Anything else that went wrong: a genuine bug, a storage failure. Restarted, and counted.
    FAILED = 1
    # A configuration error or bad input (one line on stderr): never retried, the JobSet fails at once.
    CONFIG = 2
    # A SIGTERM, and the step in flight committed (or nothing trained yet): no work lost.
    PREEMPTED = 42
    # A peer is lost: a host of the segment died under this process; nothing saved.
    PEER_LOST = 43
    # A SIGTERM, but no step finished for ``train.stall_timeout_s`` after it: nothing saved. The
    # same number a process that SIGTERM's default disposition killed reports (128 + SIGTERM).
    STALLED = 143
