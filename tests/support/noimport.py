"""Run a module as `python -m` would, with some top-level packages unimportable, and log every
attempt to import one — even an attempt the code catches — so that a test can assert there was none.

    python -m tests.support.noimport LOG PKG[,PKG...] MODULE [ARGS...]

What the slim controller image lacks (the trainer extra) is blocked this way to check that
`reslice watch --all` never needs it.
"""

from __future__ import annotations

import atexit
import importlib.abc
import runpy
import sys
from pathlib import Path


class Blocker(importlib.abc.MetaPathFinder):
    def __init__(self, blocked: set[str], log: Path) -> None:
        self.blocked = blocked
        self.log = log

    def record(self, line: str) -> None:
        with self.log.open("a") as f:
            f.write(line + "\n")

    def find_spec(self, name: str, path=None, target=None):
        if name.partition(".")[0] in self.blocked:
            self.record(f"import {name}")
            raise ModuleNotFoundError(
                f"No module named {name!r} (blocked by tests.support.noimport)", name=name
            )
        return None

    def check_loaded(self) -> None:
        """Anything blocked that got in anyway (imported before the blocker, or by a loader that
        bypasses sys.meta_path)."""
        for name in sorted(sys.modules):
            if name.partition(".")[0] in self.blocked:
                self.record(f"loaded {name}")


def main() -> None:
    log, blocked, module, *args = sys.argv[1:]
    blocker = Blocker(set(blocked.split(",")), Path(log))
    blocker.log.touch()
    blocker.check_loaded()
    sys.meta_path.insert(0, blocker)
    atexit.register(blocker.check_loaded)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
