"""tests/support/once.py: a reference run made once per session however many workers ask."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.support.once import once, session_root


class Factory:
    """What `once` reads of pytest's TempPathFactory: one xdist worker's base temp."""

    def __init__(self, base: Path):
        self.base = base

    def getbasetemp(self) -> Path:
        return self.base


def test_workers_asking_at_once_make_the_value_once_and_all_read_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    workers = [Factory(tmp_path / f"popen-gw{i}") for i in range(3)]
    for w in workers:
        w.base.mkdir()
    made: list[Path] = []

    def make(folder: Path) -> dict:
        made.append(folder)
        time.sleep(0.3)  # the others ask meanwhile
        (folder / "trainer.log").write_text("ran")
        return {"dir": folder, "records": {1: {"learning/loss": 1.5}}}

    got: list[dict] = []
    threads = [threading.Thread(target=lambda w=w: got.append(once(w, "reference", make))) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert made == [tmp_path / "reference"]  # one run, in the folder the workers share
    assert session_root(workers[0]) == tmp_path
    assert got == [{"dir": tmp_path / "reference", "records": {1: {"learning/loss": 1.5}}}] * 3


def test_a_failed_make_leaves_nothing_and_the_next_caller_makes_it(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    factory = Factory(tmp_path)

    def fail(folder: Path) -> int:
        (folder / "checkpoints").mkdir()  # a run that got as far as a checkpoint
        raise RuntimeError("the reference run exited 1")

    with pytest.raises(RuntimeError, match="exited 1"):
        once(factory, "reference", fail)
    assert not (tmp_path / "reference.pickle").exists()
    # The next attempt starts in an empty folder: a run there would resume from what it found.
    assert once(factory, "reference", lambda folder: len(list(folder.iterdir())) + 7) == 7
    assert once(factory, "reference", fail) == 7  # made: never again this session
