"""The suite's scheduling (tests/conftest.py): whole files in `schedule`'s order of the last whole
run's figures (tests/durations.json: seconds and CPU seconds per file), which that run rewrites; a
renamed file drops out of them by itself."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import (
    CPU_PROPERTY,
    DURATIONS,
    ROOT,
    _durations,
    pytest_collection_modifyitems,
    pytest_runtest_makereport,
    pytest_runtest_setup,
    schedule,
)


class Item:
    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid


def test_the_figures_name_files_that_exist() -> None:
    figures = json.loads(DURATIONS.read_text())
    assert figures and [name for name in figures if not (ROOT / name).is_file()] == []


def test_the_figures_are_seconds_and_cpu_seconds_and_the_older_form_still_reads(
    tmp_path, monkeypatch
) -> None:
    raw = json.loads(DURATIONS.read_text())
    assert all(isinstance(v, list) and len(v) == 2 and v[1] >= 0 for v in raw.values()), raw
    older = tmp_path / "durations.json"
    older.write_text('{"tests/a.py": 30, "tests/b.py": [20, 3]}')
    monkeypatch.setattr("tests.conftest.DURATIONS", older)
    assert _durations() == {"tests/a.py": (30.0, 30.0), "tests/b.py": (20.0, 3.0)}
    older.write_text("{not json")
    assert _durations() == {}


@pytest.mark.parametrize(
    ("figures", "order"),
    [
        # Every file works: longest first.
        ({"w1": (100, 150), "w2": (50, 60), "w3": (10, 9)}, ["w1", "w2", "w3"]),
        # Waiting files (under a third of a core) take one worker while their share of the seconds
        # left is under one and a half: s1 first, s2 once s1 is over (at 40 s, before w3 at 100 s).
        (
            {"w1": (100, 150), "w2": (100, 100), "w3": (100, 120), "s1": (40, 4), "s2": (40, 12)},
            ["s1", "w1", "w2", "s2", "w3"],
        ),
        # More waiting seconds: two waiting files at once beside a working one, never three.
        (
            {"w1": (100, 90), "w2": (100, 90), "s1": (50, 1), "s2": (50, 1), "s3": (50, 1)},
            ["s1", "w1", "s2", "w2", "s3"],
        ),
        # Mostly waiting: the third worker still takes the work while any is left.
        ({"w1": (10, 9), "s1": (50, 1), "s2": (50, 1), "s3": (50, 1)}, ["s1", "s2", "w1", "s3"]),
        # Only waiting files: longest first.
        ({"s1": (10, 1), "s2": (30, 2)}, ["s2", "s1"]),
        # An image file's containers run outside the worker's process tree: it works whatever its
        # figures say, so it is the third worker's beside two waiting files (as a waiting file, s3
        # would come first: longer).
        (
            {"s1": (100, 1), "s2": (100, 1), "tests/images/i": (30, 0), "s3": (40, 1)},
            ["s1", "s2", "tests/images/i", "s3"],
        ),
    ],
    ids=["all work", "mixed", "two waiting at most", "work while any is left", "all wait", "images work"],
)
def test_the_schedule_spreads_the_waiting_files_over_the_working_ones(figures, order) -> None:
    assert schedule({k: (float(a), float(b)) for k, (a, b) in figures.items()}) == order


def test_files_run_in_schedule_order_and_unknown_files_after_in_collection_order() -> None:
    figures = _durations()
    first, *_, last = schedule(figures)
    items = [Item("tests/new_a.py::t"), Item(f"{last}::t"), Item("tests/new_b.py::t"), Item(f"{first}::t")]
    pytest_collection_modifyitems(None, items)
    order = [i.nodeid.split("::")[0] for i in items]
    assert order[0] == first
    assert order.index("tests/new_a.py") < order.index("tests/new_b.py")  # stable: as collected
    assert order.index(last) < order.index("tests/new_a.py")  # a known file before those without a figure


class Call:
    def __init__(self, when: str) -> None:
        self.when = when


class Report:
    def __init__(self) -> None:
        self.user_properties: list = []


def _report(item: Item, when: str) -> Report:
    """The conftest's makereport wrapper around a report, as pluggy drives it."""
    hook = pytest_runtest_makereport(item, Call(when))
    next(hook)
    with pytest.raises(StopIteration) as done:
        hook.send(Report())
    return done.value.value


def test_a_test_reports_its_cpu_seconds_with_its_teardown_its_children_counted() -> None:
    item = Item("tests/x.py::t")
    item.stash = pytest.Stash()
    pytest_runtest_setup(item)
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)
    assert _report(item, "call").user_properties == []  # once per test, with its last phase
    burnt = dict(_report(item, "teardown").user_properties)[CPU_PROPERTY]
    assert burnt > 0.1, burnt
    pytest_runtest_setup(item)  # a test that only waits
    assert dict(_report(item, "teardown").user_properties)[CPU_PROPERTY] < 0.05
