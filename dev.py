#!/usr/bin/env python3
"""Set up and run reslice from a fresh clone with nothing but Python 3.11 and pip (no make).

    python3 dev.py demo [ARGS]    set up .venv from the lock file, then run the elastic demo
    python3 dev.py test [ARGS]    set up .venv, lint (ruff, import contracts), then run the whole test suite
    python3 dev.py bench [NAME]   set up .venv, then list the benchmarks (or run bench.NAME)
    python3 dev.py lock           regenerate requirements/*.lock after changing pyproject.toml (uv)
    python3 dev.py maxtext        set up .venv-maxtext (Python 3.12) from requirements/maxtext.lock

Set-up runs again only when requirements/dev.lock, requirements/uv.lock or pyproject.toml changed
since the last one.
`dev.py test` sets up .venv-maxtext too, but only when an argument names tests/maxtext_e2e.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / "bin"
STAMP = VENV / ".installed"
LOCK_INPUTS = (ROOT / "requirements" / "dev.lock", ROOT / "requirements" / "uv.lock", ROOT / "pyproject.toml")
# No byte-compiling at install: pip compiles every installed file (41 of the 119 s of a fresh
# set-up here); Python compiles each module the first time something imports it instead, a fraction
# of them. `__main__` lets the venv's processes write those (PYTHONDONTWRITEBYTECODE would make every
# trainer process compile jax from source).
PIP = ("-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile")
# The MaxText trainer profile's venv (docs/maxtext.md): maxtext 0.2.5 needs Python >= 3.12, so it
# has its own lock, compiled from requirements/maxtext.in; the launcher and trainer stay on 3.11.
MAXTEXT_VENV = ROOT / ".venv-maxtext"
MAXTEXT_LOCK = ROOT / "requirements" / "maxtext.lock"
# Tests that run MaxText itself (in .venv-maxtext) live here; tests/maxtext/ needs only .venv.
MAXTEXT_TESTS = "tests/maxtext_e2e"
# (output, extra, platform): the lock files `lock` writes, all for CPython 3.11 on Linux x86-64, one
# per install: dev (tests, the embedded demo: everything), controller (the controller image,
# docker/controller.Dockerfile: the launcher alone), trainer (the trainer image, docker/Dockerfile:
# the trainer and jax[tpu], no launcher).
LOCKS = (
    ("dev.lock", "dev", "x86_64-manylinux_2_28"),
    ("controller.lock", "controller", "x86_64-manylinux_2_28"),
    ("trainer.lock", "tpu", "x86_64-manylinux_2_31"),
)


def python(version: str, why: str) -> str:
    """This interpreter if it is ``version``, else ``python<version>`` on PATH."""
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == version:
        return sys.executable
    found = shutil.which(f"python{version}")
    if found is None:
        sys.exit(f"dev.py: needs Python {version} ({why}); python{version} is not on PATH")
    if subprocess.run([found, "-c", ""], capture_output=True).returncode:
        # A pyenv shim of a version pyenv has installed but not selected fails only when run.
        sys.exit(
            f"dev.py: needs Python {version} ({why}); {found} does not run "
            f"(pyenv: `PYENV_VERSION=<3.11.x>:<{version}.x> python3 dev.py ...`)"
        )
    return found


def python311() -> str:
    """The interpreter the lock files are for."""
    return python("3.11", "the lock files pin wheels for it")


def setup_maxtext(args: list[str] | None = None) -> None:
    """.venv-maxtext from requirements/maxtext.lock (1.1 GB, a few minutes): only for MaxText runs."""
    stamp = MAXTEXT_VENV / ".installed"
    if stamp.exists() and MAXTEXT_LOCK.stat().st_mtime <= stamp.stat().st_mtime:
        return
    stamp.unlink(missing_ok=True)
    _run(python("3.12", "the MaxText profile: maxtext 0.2.5"), "-m", "venv", str(MAXTEXT_VENV))
    _install_lock(str(MAXTEXT_VENV / "bin" / "python"), str(MAXTEXT_LOCK))
    stamp.touch()


def setup() -> None:
    if STAMP.exists() and all(p.stat().st_mtime <= STAMP.stat().st_mtime for p in LOCK_INPUTS):
        return
    STAMP.unlink(missing_ok=True)  # a set-up that fails half-way is redone next time
    _run(python311(), "-m", "venv", str(VENV))
    _install_lock(str(BIN / "python"), "requirements/dev.lock")
    _run(str(BIN / "python"), *PIP, "--no-deps", "-e", ".")
    STAMP.touch()


def _install_lock(python: str, lock: str) -> None:
    """``lock`` into ``python``'s venv, hashes required. With uv (itself pinned by hash,
    requirements/uv.lock, installed by pip): it fetches and unpacks the wheels in parallel, several
    times faster than pip with an empty cache (docs/measurements.md). It trusts the
    system's certificates as pip does (a proxy's CA there; uv's own roots alone fail with
    "UnknownIssuer" unless SSL_CERT_FILE is set). Should uv fail, pip does it."""
    _run(python, *PIP, "--require-hashes", "-r", "requirements/uv.lock")
    uv = str(Path(python).parent / "uv")
    done = subprocess.run(
        [uv, "pip", "install", "-q", "--system-certs", "--python", python, "--require-hashes", "-r", lock],
        cwd=ROOT,
    )
    if done.returncode:
        print(
            f"dev.py: uv could not install {lock} (exit {done.returncode}); pip installs it", file=sys.stderr
        )
        _run(python, *PIP, "--require-hashes", "-r", lock)


def test(args: list[str]) -> None:
    setup()
    if any(MAXTEXT_TESTS in a for a in args):
        setup_maxtext()
    _run(str(BIN / "ruff"), "check", ".")
    _run(str(BIN / "ruff"), "format", "--check", ".")
    _run(str(BIN / "lint-imports"))
    _exec(str(BIN / "pytest"), *_workers(args), *args)


def _workers(args: list[str]) -> list[str]:
    """Three pytest workers on the two cores, whole files each: most of an end-to-end test's wall
    time is waiting (on the cluster, the controller, a peer's grace period), so a third file beside
    two others fills the cores (the suite's pytest phase is shorter: docs/measurements.md);
    whole files keep a module's reference run computed once. Files go out in collection order, the
    longest first (tests/conftest.py, LONGEST_FIRST). ``-n 0`` (or any -n) overrides."""
    if any(a == "-n" or a.startswith(("-n", "--numprocesses")) for a in args):
        return []
    return ["-n", "3", "--dist", "loadfile", "--no-loadscope-reorder"]


def demo(args: list[str]) -> None:
    setup()
    _exec(str(BIN / "reslice"), "demo", *args)


def bench(args: list[str]) -> None:
    setup()
    module = f"bench.{args[0]}" if args else "bench"
    _exec(str(BIN / "python"), "-m", module, *args[1:])


def lock(args: list[str]) -> None:
    uv = shutil.which("uv") or sys.exit("dev.py lock: needs uv (pip install uv)")
    # uv itself, for set-up (`_install_lock`): every wheel of the pinned version hashed.
    cmd = [uv, "pip", "compile", "requirements/uv.in", "--generate-hashes", "--no-header"]
    _run(*cmd, "-o", "requirements/uv.lock")
    for out, extra, platform in LOCKS:
        cmd = [uv, "pip", "compile", "pyproject.toml", "--python-version", "3.11"]
        cmd += ["--python-platform", platform, "--generate-hashes", "--no-header"]
        cmd += ["--annotation-style", "line", "-o", f"requirements/{out}"]
        _run(*cmd, *(["--extra", extra] if extra else []))
    # MaxText: .venv-maxtext's lock (CPU), then the image's, at its versions plus libtpu.
    for name, platform in (("maxtext", "x86_64-manylinux_2_28"), ("maxtext-tpu", "x86_64-manylinux_2_31")):
        cmd = [uv, "pip", "compile", f"requirements/{name}.in", "--python-version", "3.12"]
        cmd += ["--python-platform", platform, "--generate-hashes", "--no-header"]
        _run(*cmd, "--annotation-style", "line", "-o", f"requirements/{name}.lock")


def _run(*cmd: str) -> None:
    done = subprocess.run(cmd, cwd=ROOT)
    if done.returncode:
        sys.exit(done.returncode)


def _exec(*cmd: str) -> None:
    os.chdir(ROOT)
    os.execv(cmd[0], list(cmd))


COMMANDS = {"test": test, "demo": demo, "bench": bench, "lock": lock, "maxtext": setup_maxtext}

if __name__ == "__main__":
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # see PIP
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2)
    COMMANDS[sys.argv[1]](sys.argv[2:])
