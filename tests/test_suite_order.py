"""The suite's scheduling (tests/conftest.py): files longest first by the last whole run's figures
(tests/durations.json), which that run rewrites; a renamed file drops out of them by itself."""

from __future__ import annotations

import json

from tests.conftest import DURATIONS, ROOT, pytest_collection_modifyitems


class Item:
    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid


def test_the_figures_name_files_that_exist() -> None:
    figures = json.loads(DURATIONS.read_text())
    assert figures and [name for name in figures if not (ROOT / name).is_file()] == []


def test_files_run_longest_first_and_unknown_files_after_in_collection_order() -> None:
    figures = json.loads(DURATIONS.read_text())
    longest, *_, shortest = sorted(figures, key=lambda n: -figures[n])
    items = [
        Item("tests/new_a.py::t"),
        Item(f"{shortest}::t"),
        Item("tests/new_b.py::t"),
        Item(f"{longest}::t"),
    ]
    pytest_collection_modifyitems(None, items)
    order = [i.nodeid.split("::")[0] for i in items]
    assert order[0] == longest
    assert order.index("tests/new_a.py") < order.index("tests/new_b.py")  # stable: as collected
    if figures[shortest]:  # a known file, however short, before the files without a figure
        assert order.index(shortest) < order.index("tests/new_a.py")
