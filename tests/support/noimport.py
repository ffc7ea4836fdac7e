"""Run a module as `python -m` would, with some packages unimportable, and log every attempt to
import one — even an attempt the code catches — so that a test can assert there was none.

    python -m tests.support.noimport LOG PKG[,PKG...] MODULE [ARGS...]

A PKG is a package and its submodules (`jax`, `launcher.embedded`); `?PKG` is unimportable too but
its attempts are not logged: a package a dependency tries and copes without (the kubernetes client
tries `kubernetes_validate`). What the slim controller image lacks (the trainer extra, the plots,
the embedded cluster) is blocked this way to check that `reslice watch --all` never needs it.
"""

from __future__ import annotations

import atexit
import importlib.abc
import runpy
import sys
from pathlib import Path


class Blocker(importlib.abc.MetaPathFinder):
    def __init__(self, blocked: set[str], log: Path, quiet: frozenset[str] = frozenset()) -> None:
        self.blocked = blocked
        self.quiet = quiet
        self.log = log

    def _matches(self, name: str, packages: set[str] | frozenset[str]) -> bool:
        return any(name == p or name.startswith(p + ".") for p in packages)

    def record(self, line: str) -> None:
        with self.log.open("a") as f:
            f.write(line + "\n")

    def find_spec(self, name: str, path=None, target=None):
        if self._matches(name, self.quiet):
            raise ModuleNotFoundError(
                f"No module named {name!r} (blocked by tests.support.noimport)", name=name
            )
        if self._matches(name, self.blocked):
            self.record(f"import {name}")
            raise ModuleNotFoundError(
                f"No module named {name!r} (blocked by tests.support.noimport)", name=name
            )
        return None

    def check_loaded(self) -> None:
        """Anything blocked that got in anyway (imported before the blocker, or by a loader that
        bypasses sys.meta_path)."""
        for name in sorted(sys.modules):
            if self._matches(name, self.blocked | self.quiet):
                self.record(f"loaded {name}")


def main() -> None:
    log, blocked, module, *args = sys.argv[1:]
    names = blocked.split(",")
    quiet = frozenset(n[1:] for n in names if n.startswith("?"))
    blocker = Blocker({n for n in names if not n.startswith("?")}, Path(log), quiet)
    blocker.log.touch()
    blocker.check_loaded()
    sys.meta_path.insert(0, blocker)
    atexit.register(blocker.check_loaded)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
