"""What a MaxText child's end means, as the contract's exit code: a pure decision over facts the
entrypoint gathers (checkpoints, the signal, the child's exit status and output), since MaxText's
own exit code does not say it — it exits 0 after a preemption stop and after a data-pipeline crash.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.exits import Exit

# Texts of MaxText's output that decide a case (measured, docs/maxtext.md).
STOPPED_BY_SIGTERM = "Training stopped: Job received termination signal (SIGTERM)."
JAX_FATAL = "Terminating process because the JAX distributed service detected fatal errors"
# A configuration MaxText refuses, before any device work: pydantic's validation of MaxTextConfig
# (`pydantic_core._pydantic_core.ValidationError: 2 validation errors for MaxTextConfig` for a bad
# value), or any exception raised in its config module (`ValueError: 'no_such_key' not in ...` from
# `_prepare_for_pydantic`). Counted only when the child failed before its first step.
CONFIG_ERRORS = ("validation errors for MaxTextConfig", "validation error for MaxTextConfig")
CONFIG_MODULE = "/maxtext/configs/pyconfig.py"
SIGABRT = 6


@dataclass(frozen=True)
class Outcome:
    returncode: int  # the child's: negative -N when a signal N ended it (subprocess)
    final_committed: bool  # checkpoints/<steps-1>/commit_success.txt exists: every step is done
    sigterm: bool  # the entrypoint got SIGTERM and forwarded it
    committed_after_signal: bool  # a step committed after the SIGTERM (its emergency save)
    steps_trained: int  # steps this child trained (its metrics records)
    output_tail: str  # the end of the child's stderr and stdout


def config_error(output: str, steps_trained: int) -> bool:
    if steps_trained:
        return False
    return CONFIG_MODULE in output or any(marker in output for marker in CONFIG_ERRORS)


def exit_code(o: Outcome) -> int:
    """The contract's exit code (docs/contract.md, Exit codes) for one child's end."""
    if o.final_committed:
        return Exit.FINISHED  # whatever came after the final commit, no step is left to train
    if o.sigterm:
        # Nothing trained since the latest commit (a signal during start-up), or the emergency save
        # committed: no work lost.
        if o.committed_after_signal or o.steps_trained == 0:
            return Exit.PREEMPTED
        return Exit.STALLED  # SIGTERM, and nothing saved since: the latest committed step stands
    if o.returncode != 0 and config_error(o.output_tail, o.steps_trained):
        return Exit.CONFIG
    if o.returncode == -SIGABRT and JAX_FATAL in o.output_tail:
        return Exit.PEER_LOST  # JAX's fate sharing: a peer died (docs/contract.md, exit 43)
    if o.returncode < 0:
        return 128 - o.returncode
    if o.returncode in (Exit.FINISHED, Exit.CONFIG, Exit.PREEMPTED, Exit.PEER_LOST):
        # 0 without the final step (a data crash, a stop without a signal), or a code that would
        # claim a meaning the child did not have: a crash.
        return Exit.FAILED
    return o.returncode
