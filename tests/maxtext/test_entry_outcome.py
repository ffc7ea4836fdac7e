"""The entrypoint's decision (maxtext_entry/outcome.py): MaxText's end as the contract's exit code,
from the checkpoints, the signal and the output, not from MaxText's exit code alone."""

from __future__ import annotations

import pytest

from maxtext_entry.outcome import STOPPED_BY_SIGTERM, Outcome, exit_code

NO_STEP_CONFIG = (
    'File "/venv/lib/python3.12/site-packages/maxtext/configs/pyconfig.py", line 271, in _prepare_for_pydantic\n'
    "ValueError: 'no_such_key' not in 'emb_dim', 'mlp_dim'\n"
)
BAD_VALUE = "pydantic_core._pydantic_core.ValidationError: 2 validation errors for MaxTextConfig\n"
FATAL = "F1202 client.cc:101] Terminating process because the JAX distributed service detected fatal errors\n"
CRASH = "Traceback (most recent call last):\nValueError: grain worker died\n"


def _o(rc=0, final=False, term=False, after=False, trained=5, out="") -> Outcome:
    return Outcome(rc, final, term, after, trained, out)


@pytest.mark.parametrize(
    ("outcome", "code", "why"),
    [
        (_o(final=True), 0, "the final step is committed"),
        (_o(rc=1, final=True), 0, "a failure after the final commit leaves nothing to train"),
        (_o(rc=0), 1, "MaxText's exit 0 without the final step: a data crash"),
        (_o(rc=0, out=CRASH), 1, "the same, with its traceback"),
        (_o(term=True, after=True, out=STOPPED_BY_SIGTERM), 42, "SIGTERM and its emergency save committed"),
        (_o(rc=0, term=True, after=True), 42, "MaxText exits 0 after a preemption stop"),
        (
            _o(rc=-15, term=True, trained=0),
            42,
            "SIGTERM during start-up: nothing trained since the last commit",
        ),
        (_o(rc=0, term=True, after=False), 143, "SIGTERM with steps trained and nothing saved"),
        (_o(rc=-9, term=True, after=False), 143, "killed before the save committed"),
        (_o(term=True, final=True), 0, "the preemption save was the final step"),
        (_o(rc=1, trained=0, out=NO_STEP_CONFIG), 2, "an unknown key, refused by MaxText's config module"),
        (_o(rc=1, trained=0, out=BAD_VALUE), 2, "a value pydantic refuses"),
        (
            _o(rc=1, trained=3, out=NO_STEP_CONFIG),
            1,
            "a config text after steps trained is not a config error",
        ),
        (_o(rc=1, trained=0, out=CRASH), 1, "a crash before the first step, not in the config"),
        (_o(rc=-6, out=FATAL), 43, "JAX's fate sharing: a peer is lost"),
        (_o(rc=-6, out=CRASH), 134, "SIGABRT for another reason: 128 + 6"),
        (_o(rc=-11), 139, "a segfault"),
        (_o(rc=2), 1, "a child's 2 is not the entrypoint's configuration error"),
        (_o(rc=42), 1, "nor is a child's 42 a preemption"),
        (_o(rc=3), 3, "any other code is passed on"),
    ],
)
def test_exit_code(outcome: Outcome, code: int, why: str) -> None:
    assert exit_code(outcome) == code, why
