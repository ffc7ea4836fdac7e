"""A value made once per test session, whichever of pytest-xdist's workers asks first.

Used by the fixtures of uninterrupted reference runs (tests/trainer/conftest.py,
tests/e2e/harness.py): several files on different workers compare against the same run, and a run is a
trainer process's seconds of CPU on a machine the suite already keeps busy. The first worker to ask
makes the value under a file lock in the session's shared temporary folder (each worker's own is a
subfolder of it); the others wait on the lock, then read what it wrote. A value is written aside and
renamed, so a reader never sees half of one. A `make` that fails leaves no value: the next worker to
ask tries again (and fails alike) in its folder emptied first, so a reference run never resumes
from a failed one's checkpoints.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")


def session_root(factory: pytest.TempPathFactory) -> Path:
    """The folder every worker of this session shares: the base temp's parent under xdist
    (each worker's base is `<session>/popen-gwN`), else the base temp itself."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once(factory: pytest.TempPathFactory, name: str, make: Callable[[Path], T]) -> T:
    """``make(folder)``'s value, made by the first worker to ask for ``name`` this session (in
    ``folder``, a new folder of that name) and read by every later one."""
    root = session_root(factory)
    done = root / f"{name}.pickle"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            folder = root / name
            shutil.rmtree(folder, ignore_errors=True)  # what a failed attempt left
            folder.mkdir()
            value = make(folder)
            aside = root / f"{name}.pickle.partial"
            aside.write_bytes(pickle.dumps(value))
            aside.replace(done)
        return pickle.loads(done.read_bytes())
