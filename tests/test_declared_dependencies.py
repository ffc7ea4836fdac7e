"""Every third-party package the trainer or the launcher imports itself is named in the pyproject
extra that its image installs (`trainer`: docker/Dockerfile; `controller`, `plots` and `ui`: the
controller image and a workstation), not only pulled in by another package: a library that drops a dependency
would otherwise break the image at the next lock."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = {"contract", "launcher", "trainer", "maxtext_entry", "bench", "tests"}


def imported_modules(package: Path, skip: str | None = None) -> set[str]:
    """The absolute third-party imports anywhere in ``package`` (function-level ones too), as the
    longest name each could be: `from a.b import c` gives `a.b.c` (c may be a module)."""
    found = set()
    for path in package.rglob("*.py"):
        if skip and skip in path.relative_to(package).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            found |= {n for n in names if n.split(".")[0] not in OURS | set(sys.stdlib_module_names)}
    return found


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@cache
def owners() -> dict[str, str]:
    """Module name -> the distribution that installs it, from the installed files' records (by
    file, not by top-level name: `google` is a namespace a dozen distributions share; and without
    importing anything)."""
    out = {}
    for dist in md.distributions():
        name = normalized(dist.metadata["Name"])
        for f in dist.files or ():
            if ".." in f.parts or f.suffix not in (".py", ".so"):
                continue
            parts = [*f.parts[:-1], f.name.split(".")[0]]
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = name
    return out


def distribution(name: str) -> str:
    """The distribution of the longest prefix of ``name`` that is an installed module."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if (dist := owners().get(".".join(parts[:n]))) is not None:
            return dist
    raise AssertionError(f"{name} is not installed")


def declared(extra: str, extras: dict[str, list[str]]) -> set[str]:
    """The distributions an extra names, through `reslice[other]` references."""
    out = set()
    for req in extras[extra]:
        name = normalized(re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0])
        if name == "reslice":
            for inner in re.search(r"\[(.*)\]", req).group(1).split(","):
                out |= declared(inner.strip(), extras)
        else:
            out.add(name)
    return out


@pytest.mark.parametrize(
    ("package", "skip", "extras"),
    [
        ("trainer", None, ("trainer",)),
        # launcher.embedded is the development extra's; plots are imported only when drawing, the web
        # stack (the `ui` extra) only by `reslice ui` and `demo --ui`.
        ("launcher", "embedded", ("controller", "plots", "ui")),
    ],
)
def test_what_a_package_imports_its_extra_declares(package, skip, extras):
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = set().union(*(declared(e, table) for e in extras))
    used = {m: distribution(m) for m in sorted(imported_modules(ROOT / package, skip))}
    assert used, "no third-party import found: the scan is broken"
    assert {m: d for m, d in used.items() if d not in names} == {}


def test_the_scan_sees_an_undeclared_import(tmp_path):
    """The check can fail: a module importing a package the extra lacks is reported."""
    (tmp_path / "mod.py").write_text("def f():\n    from rich.table import Table\n")
    used = {m: distribution(m) for m in imported_modules(tmp_path)}
    table = {"x": ["pyyaml"]}
    assert {m: d for m, d in used.items() if d not in declared("x", table)} == {"rich.table.Table": "rich"}
