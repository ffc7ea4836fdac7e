"""The suite's scheduling (tests/conftest.py): whole files in `schedule`'s order of the last whole
run's figures (tests/durations.json: seconds and CPU seconds per file), which that run rewrites; a
renamed file drops out of them by itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from tests import conftest
from tests.conftest import (
    CPU_PROPERTY,
    DURATIONS,
    ROOT,
    _durations,
    busy_cpu,
    next_file,
    pytest_collection_modifyitems,
    pytest_runtest_makereport,
    pytest_runtest_setup,
    pytest_xdist_make_scheduler,
    schedule,
    suite_figures,
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


FIGURES = {"w1": (100.0, 90.0), "w2": (80.0, 70.0), "s1": (60.0, 1.0), "s2": (50.0, 1.0)}


@pytest.mark.parametrize(
    ("left", "running", "chosen"),
    [
        # Nobody waits, and the waiting files' share of what is left is near one worker: s1.
        (["w1", "w2", "s1", "s2"], [None, "w1"], "s1"),
        # One worker waits already, and a second would be more than their share: w1.
        (["w1", "w2", "s2"], ["s1", None], "w1"),
        # The waiting files are most of what is left: a second worker waits.
        (["w2", "s2", "s9"], ["s1", None], "s2"),
        # Only waiting files left in the queue: s2, whatever the others run.
        (["s2"], ["s1", "w1"], "s2"),
        # Two workers wait: the third takes work while any is left.
        (["s2", "w2"], ["s1", "s9"], "w2"),
        # A file without figures (new) works: the third worker's beside two waiting ones.
        (["s2", "new"], ["s1", "s9"], "new"),
    ],
    ids=["nobody waits", "one waits", "two may wait", "only waiting left", "two wait", "new file"],
)
def test_the_next_file_keeps_the_waiting_files_to_their_share(left, running, chosen) -> None:
    figures = {**FIGURES, "s9": (40.0, 1.0)}
    assert next_file(left, running, figures) == chosen


class Node:
    """A worker as xdist's scheduler sees it: what it was sent to run."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.append(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def test_each_worker_gets_its_next_file_from_what_the_others_run_then(monkeypatch) -> None:
    """The run's own hand-out (xdist's `loadfile` with `next_file`): whatever the queue's order, a
    worker that asks while another runs a waiting file takes work, not the next waiting file."""
    monkeypatch.setattr("tests.conftest._durations", lambda: dict(FIGURES))
    option = SimpleNamespace(loadscopereorder=False)
    values = {"dist": "loadfile", "tx": ["2*popen"]}
    config = SimpleNamespace(option=option, getvalue=values.__getitem__)
    sched = pytest_xdist_make_scheduler(config, log=None)
    # Two tests a file; the queue s1 s2 w1 w2, which xdist's own hand-out gives out in that order
    # (a: s1, b: s2, both waiting).
    collection = [f"{f}::t{i}" for f in ("s1", "s2", "w1", "w2") for i in (0, 1)]
    a, b = Node("gw0"), Node("gw1")
    for node in (a, b):
        sched.add_node(node)
        sched.add_node_collection(node, collection)
    sched.schedule()
    files = lambda node: [collection[i[0]].split("::")[0] for i in node.sent]  # noqa: E731
    # a asked first: s1 (nobody waits); b beside a waiting file: w1, not s2. Two tests each, so
    # xdist gives each its second file at once: a (beside w1) s2, b (beside s1) w2.
    assert (files(a), files(b)) == (["s1", "s2"], ["w1", "w2"])
    other = SimpleNamespace(option=option, getvalue={"dist": "load"}.__getitem__)
    assert pytest_xdist_make_scheduler(other, log=None) is None  # another --dist: xdist's own


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


def test_the_suite_runs_without_xdist_too() -> None:
    """The scheduler hook is xdist's: without the plugin (`-p no:xdist`) the conftest still loads."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
         "tests/test_suite_order.py::test_the_figures_name_files_that_exist"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_the_machines_busy_cpu_counts_what_this_process_burns() -> None:
    burn_s, tick_s = 0.3, 1 / os.sysconf("SC_CLK_TCK")
    before, own = busy_cpu(), time.process_time()
    while time.process_time() - own < burn_s:
        pass
    after = busy_cpu()
    assert before is not None and after is not None
    # The whole machine's busy CPU holds this process's, to a few of /proc/stat's clock ticks.
    assert after - before >= burn_s - 5 * tick_s


@pytest.mark.parametrize(
    ("busy", "says"),
    [
        (
            936.0,
            "the suite took 493.7 s, the machine's busy CPU 936 s (94.8% of 2 cores), its tests 75 CPU s;",
        ),
        (None, "the suite took 493.7 s, its tests 75 CPU s;"),  # no /proc
    ],
)
def test_the_suites_figures_in_one_line(busy: float | None, says: str) -> None:
    spent = {
        "tests/trainer/test_recipe.py": [30.0, 20.0],
        "tests/trainer/test_moe.py": [5.0, 4.5],
        "tests/e2e/test_e2e_kueue.py": [100.0, 50.5],  # not a yardstick file
    }
    line = suite_figures(493.7, busy, 2, spent)
    assert says in line and "the model's in-process files 24.5 CPU s" in line, line


def test_a_whole_run_ends_with_the_suites_figures_and_a_part_of_it_does_not(monkeypatch) -> None:
    monkeypatch.setattr(conftest, "_started", [])
    monkeypatch.setattr(conftest, "_spent", {"tests/trainer/test_step.py": [9.0, 8.0]})
    options = SimpleNamespace(keyword="", markexpr="", deselect=None, lf=False)
    part = SimpleNamespace(args=[str(ROOT / "tests" / "trainer")], option=options)
    whole = SimpleNamespace(args=[str(ROOT / "tests")], option=options)
    lines: list[str] = []
    reporter = SimpleNamespace(write_line=lines.append)
    conftest.pytest_sessionstart(SimpleNamespace(config=part))
    conftest.pytest_terminal_summary(reporter, 0, part)
    assert lines == []
    conftest.pytest_sessionstart(SimpleNamespace(config=whole))
    conftest.pytest_terminal_summary(reporter, 0, whole)
    (line,) = lines
    assert line.startswith("reslice: the suite took ") and "the model's in-process files 8.0 CPU s" in line
