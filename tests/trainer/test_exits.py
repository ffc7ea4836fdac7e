"""The exit codes (contract/exits.py, which the trainer, the launcher's failure policy and the
MaxText entrypoint all import): docs/contract.md's table names each. That no other module defines
one of its numbers again is tests/launcher/test_house_rules.py's."""

from __future__ import annotations

import re

from contract.exits import Exit
from tests.trainer.runs import ROOT


def test_the_contracts_table_names_every_code_but_the_failure() -> None:
    text = (ROOT / "docs" / "contract.md").read_text()
    table = text[text.index("## Exit codes") :].split("\n\n")[1]
    rows = {int(m) for m in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)}
    assert rows == {int(code) for code in Exit if code is not Exit.FAILED}  # 1 is the table's "other"
