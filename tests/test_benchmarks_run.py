"""Every benchmark imports and takes the flags its docstring's usage line shows (a flag dropped
from its parser but not from its docs). Each one's `main()` also runs, in its smallest form, in
tests/test_benchmarks_main.py.

One fresh interpreter runs every ``bench.<name>.main`` with ``--help``: importing them here would
apply their environment to this process (bench/__init__.py sets JAX's, bench.accelerator its own
XLA flags)."""

from __future__ import annotations

import json
import pkgutil
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

HELPERS = {"machine"}  # bench/machine.py: the reference loop the others print, no main
BENCHES = sorted(
    m.name
    for m in pkgutil.iter_modules([str(ROOT / "bench")])
    if not m.name.startswith("_") and m.name not in HELPERS
)

_PROBE = r"""
import contextlib, importlib, io, json, sys
out = {}
for name in sys.argv[1:]:
    mod = importlib.import_module(f"bench.{name}")
    sys.argv = [f"python -m bench.{name}", "--help"]
    text, code = io.StringIO(), "returned"
    with contextlib.redirect_stdout(text):
        try:
            mod.main()
        except SystemExit as e:
            code = e.code
    out[name] = {"doc": mod.__doc__ or "", "help": text.getvalue(), "code": code}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def helps() -> dict[str, dict]:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, *BENCHES], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("name", BENCHES)
def test_a_benchmark_takes_the_flags_its_usage_line_shows(helps: dict[str, dict], name: str) -> None:
    got = helps[name]
    assert got["code"] == 0, f"bench.{name} --help did not exit 0 (it ran?): {got['code']!r}"
    usage = next((line for line in got["doc"].splitlines() if f"-m bench.{name}" in line), None)
    assert usage is not None, f"bench.{name}'s docstring has no usage line"
    flags = set(re.findall(r"--[a-z][a-z-]*", usage))
    assert flags, usage
    assert sorted(f for f in flags if f not in got["help"]) == [], got["help"]
