"""The trainer's exit codes (trainer/exits.py) are the contract's: the launcher's failure policy and
the MaxText entrypoint keep copies of their own (neither may import the trainer), and
docs/contract.md's table names each."""

from __future__ import annotations

import re

from launcher.core import exits as launcher_exits
from maxtext_entry import outcome
from tests.trainer.runs import ROOT
from trainer.exits import Exit


def test_the_copies_have_the_trainers_numbers() -> None:
    launcher = (launcher_exits.EXIT_CONFIG, launcher_exits.EXIT_PREEMPTED, launcher_exits.EXIT_PEER_LOST)
    assert launcher == (Exit.CONFIG, Exit.PREEMPTED, Exit.PEER_LOST)
    maxtext = (
        outcome.EXIT_FINISHED, outcome.EXIT_CRASH, outcome.EXIT_CONFIG, outcome.EXIT_PREEMPTED,
        outcome.EXIT_PEER_LOST, outcome.EXIT_TERM_UNSAVED,
    )  # fmt: skip
    assert maxtext == tuple(Exit)


def test_the_contracts_table_names_every_code_but_the_failure() -> None:
    text = (ROOT / "docs" / "contract.md").read_text()
    table = text[text.index("## Exit codes") :].split("\n\n")[1]
    rows = {int(m) for m in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)}
    assert rows == {int(code) for code in Exit if code is not Exit.FAILED}  # 1 is the table's "other"
