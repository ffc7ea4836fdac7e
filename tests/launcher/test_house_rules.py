"""The house rules the import contracts cannot state (docs/design.md "Layers"): over every module of
launcher/, trainer/ and contract/, no class name defined in two modules (the words both sides of the
launcher/trainer boundary speak are contract/'s, defined once), one StateSource, each exit code
defined once, no one-letter module alias, no preset loading in the core, no number with a unit in a
comment or docstring (a figure goes stale there: it belongs in docs/measurements.md), no function
longer than a reader takes in at one sitting (but the embedded cluster's transcriptions of
upstream), "hbm" and never "memory" for the step's HBM (memory is the RAM snapshots'), and over
bench/ too, no domain word compared as a string literal. Source text only: nothing is imported."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections import defaultdict
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# contract/: the words the launcher and the trainer share (docs/contract.md), which both import.
PACKAGES = ("launcher", "trainer", "contract")
MODULES = sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
# The measurements: held to the rule on domain words too (they compare what the launcher records).
BENCH = sorted((ROOT / "bench").rglob("*.py"))
# The MaxText entrypoint: it exits with the contract's codes too.
MAXTEXT_ENTRY = sorted((ROOT / "maxtext_entry").rglob("*.py"))
# The core of docs/design.md "Layers" (the folder launcher/core/): handed a presets.Catalog, never
# reading presets/ itself.
CORE = sorted((ROOT / "launcher" / "core").rglob("*.py"))
# Where the shared words are defined, once.
STATE_SOURCE_HOME = "contract/words.py"
EXITS_HOME = "contract/exits.py"


@cache
def parsed() -> dict[str, ast.Module]:
    return {str(p.relative_to(ROOT)): ast.parse(p.read_text()) for p in MODULES + BENCH + MAXTEXT_ENTRY}


def _classes(trees: dict[str, ast.Module] | None = None) -> dict[str, dict[str, ast.ClassDef]]:
    """Every class of launcher/, trainer/ and contract/ (or of `trees`), by name, then by the module
    that defines it."""
    where: dict[str, dict[str, ast.ClassDef]] = defaultdict(dict)
    for path, tree in (parsed() if trees is None else trees).items():
        if path.startswith(tuple(f"{p}/" for p in PACKAGES)):
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    where[node.name][path] = node
    return where


def _twice(trees: dict[str, ast.Module] | None = None) -> dict[str, list[str]]:
    return {name: sorted(paths) for name, paths in _classes(trees).items() if len(paths) > 1}


def test_no_class_name_is_defined_in_two_modules() -> None:
    """One concept, one class: a word both sides of the launcher/trainer boundary speak is
    contract/'s, which both import, never a copy on each side."""
    where = _classes()
    assert len(where) > 100 and any(p.startswith("contract/") for c in where.values() for p in c)
    assert _twice() == {}
    # The rule can fail: a copy of RestartMode on the trainer's side, as there once was.
    copy = ast.parse("from enum import StrEnum\nclass RestartMode(StrEnum):\n    RECREATE = 'recreate'\n")
    assert _twice({**parsed(), "trainer/elastic/world.py": copy}) == {
        "RestartMode": ["contract/words.py", "trainer/elastic/world.py"]
    }


def _members(node: ast.ClassDef) -> dict[str, object]:
    return {
        stmt.targets[0].id: stmt.value.value
        for stmt in node.body
        if isinstance(stmt, ast.Assign)
        and isinstance(stmt.targets[0], ast.Name)
        and isinstance(stmt.value, ast.Constant)
    }


def _state_sources(trees: dict[str, ast.Module]) -> list[str]:
    """The modules that define an enum of where a state came from: a class named StateSource, or
    any StrEnum with a member spelled as one of StateSource's values."""
    home = _classes(trees)["StateSource"][STATE_SOURCE_HOME]
    values = {v for k, v in _members(home).items()}
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and (
                node.name == "StateSource"
                or (
                    any(ast.unparse(b) == "StrEnum" for b in node.bases)
                    and values & set(_members(node).values())
                )
            ):
                found.append(f"{path}:{node.name}")
    return sorted(found)


def test_one_state_source_and_it_has_fresh() -> None:
    """Where a state came from is one enum, contract/'s StateSource, and a fresh start is one of its
    members (not a string each reader invents)."""
    assert _state_sources(parsed()) == [f"{STATE_SOURCE_HOME}:StateSource"]
    assert _members(_classes()["StateSource"][STATE_SOURCE_HOME]).get("FRESH") == "fresh"
    # The rule can fail: the trainer's own enum of the same values, under another name.
    copy = ast.parse("from enum import StrEnum\nclass Source(StrEnum):\n    PEERS = 'peers'\n")
    assert _state_sources({**parsed(), "trainer/state/snapshot.py": copy}) == [
        f"{STATE_SOURCE_HOME}:StateSource",
        "trainer/state/snapshot.py:Source",
    ]


def _exit_constants(trees: dict[str, ast.Module]) -> list[str]:
    """Every integer constant (a module's, or a class body's: an enum member) that spells one of the
    contract's exit codes: any named EXIT_* with a code's number, and any at all with a number only
    an exit code has (42, 43, 143: not 0, 1 or 2, which count many other things)."""
    home = _classes(trees)["Exit"][EXITS_HOME]
    codes = set(_members(home).values())
    telling = {c for c in codes if isinstance(c, int) and c > 2}
    found = []
    for path, tree in trees.items():
        scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))]
        for scope in scopes:
            for stmt in scope.body:
                target, value = None, None
                if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
                    target, value = stmt.targets[0].id, stmt.value
                elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    target, value = stmt.target.id, stmt.value
                if target is None or not isinstance(value, ast.Constant) or type(value.value) is not int:
                    continue
                if value.value in telling or (target.upper().startswith("EXIT_") and value.value in codes):
                    found.append(f"{path}:{stmt.lineno}: {target} = {value.value}")
    return found


def test_each_exit_code_is_defined_once() -> None:
    """The trainer's exit codes are contract/exits.py's `Exit`, which the trainer, the launcher's
    failure policy and the MaxText entrypoint import: no module spells one of them again."""
    found = _exit_constants(parsed())
    assert found and all(f.startswith(EXITS_HOME) for f in found), found
    assert not [f for f in found if not f.startswith(EXITS_HOME)]
    # The rule can fail: a copy of a code in the launcher, as launcher/core/exits.py once held.
    copy = ast.parse("EXIT_CONFIG = 2\nPREEMPTED = 42\n")
    assert _exit_constants({**parsed(), "launcher/core/exits.py": copy})[-2:] == [
        "launcher/core/exits.py:1: EXIT_CONFIG = 2",
        "launcher/core/exits.py:2: PREEMPTED = 42",
    ]


def _is_project_module(module: str, name: str) -> bool:
    base = ROOT.joinpath(*module.split("."), name)
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def test_no_module_has_a_one_letter_alias() -> None:
    """`import x as P` or `from launcher import policy as P` (P stays PartitionSpec's, as in JAX)."""
    found = []
    for path, tree in parsed().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [f"{path}: {a.name} as {a.asname}" for a in node.names if len(a.asname or "") == 1]
            elif isinstance(node, ast.ImportFrom) and node.module:
                found += [
                    f"{path}: {node.module}.{a.name} as {a.asname}"
                    for a in node.names
                    if len(a.asname or "") == 1 and _is_project_module(node.module, a.name)
                ]
    assert found == []


def test_the_core_loads_no_presets() -> None:
    assert len(CORE) > 10  # the glob sees the core
    loading = re.compile(r"load_preset|load_catalog|RESLICE_PRESETS_DIR|presets_dir")
    hits = [
        f"{m.relative_to(ROOT)}:{i}: {line.strip()}"
        for m in CORE
        for i, line in enumerate(m.read_text().splitlines(), 1)
        if loading.search(line)
    ]
    assert hits == []


def _held(path: str) -> bool:
    """Whether the rule on domain words holds in `path`: launcher/, trainer/, contract/ and bench/,
    but launcher/embedded, which speaks Kubernetes' words."""
    return path.startswith(("launcher/", "trainer/", "contract/", "bench/")) and not path.startswith(
        "launcher/embedded/"
    )


def _domain_words() -> dict[str, str]:
    """Every value of a StrEnum defined in launcher/, trainer/ or contract/ (launcher.core.words,
    contract.words and the rest), by value: the enum member that spells it."""
    words = {}
    for path, tree in parsed().items():
        if not _held(path) or path.startswith("bench/"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(ast.unparse(b) == "StrEnum" for b in node.bases):
                for stmt in node.body:
                    if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant):
                        # The launcher's spelling first (its paths sort first): the enums it records.
                        words.setdefault(stmt.value.value, f"{node.name}.{stmt.targets[0].id}")
    return words


def test_no_domain_word_is_compared_as_a_literal() -> None:
    """A run state, action, phase, cause, end kind or ledger kind is compared through its StrEnum,
    never as a string literal (`==`, `!=`, `in`, `not in`, `match`), outside the enums' definitions:
    in the launcher, the trainer and bench/."""
    words = _domain_words()
    assert {"Running", "running", "end-segment", "capacity-lost", "peer-lost", "in-place"} <= words.keys()
    assert any(p.startswith("bench/") for p in parsed()) and any(p.startswith("trainer/") for p in parsed())
    found = []
    for path, tree in parsed().items():
        if not _held(path):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
            elif isinstance(node, ast.MatchValue):
                operands = [node.value]
            else:
                continue
            for operand in operands:
                literals = operand.elts if isinstance(operand, ast.Set | ast.Tuple | ast.List) else [operand]
                found += [
                    f"{path}:{node.lineno}: {lit.value!r} (use {words[lit.value]})"
                    for lit in literals
                    if isinstance(lit, ast.Constant) and isinstance(lit.value, str) and lit.value in words
                ]
    assert found == []


# A number with a unit: seconds, minutes, CPU seconds, a percentage, a size (a range such as
# "9-12 CPU s" counts once). Units spelled out ("seconds") count too; a bare number does not.
FIGURE = re.compile(
    r"(?<![\w.])\d+(?:[.,]\d+)*(?:\s?[-–]\s?\d+(?:[.,]\d+)*)?\s?"
    r"(?:CPU\s+s\b|CPU\s+seconds?\b|seconds?\b|minutes?\b|min\b|ms\b|s\b|%|[KMGT]i?B\b)"
)
# The exceptions, by module and figure as written, each with why the figure belongs beside the code.
FIGURES_ALLOWED = {
    ("trainer/telemetry/startup.py", "1 s"): "the resolution of /proc/stat's btime (whole seconds): a "
    "fact of the format the function corrects for, not a measurement",
}


def _comments(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment block (consecutive `#` lines joined, so that a figure wrapped
    over two lines is seen whole) and every docstring (its lines joined)."""
    blocks: list[tuple[int, list[str]]] = []
    last = -2
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            if blocks and tok.start[0] == last + 1:
                blocks[-1][1].append(text)
            else:
                blocks.append((tok.start[0], [text]))
            last = tok.start[0]
    found = [(line, " ".join(texts)) for line, texts in blocks]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                found.append((node.body[0].lineno, " ".join(doc.split())))
    return found


def test_no_figure_in_a_comment() -> None:
    """No measured figure (a number with a unit: `0.2 s`, `66 %`, `4.8 MB`, `9-12 CPU s`) in a `#`
    comment or a docstring under launcher/ or trainer/: figures go stale in the code, and live in
    docs/measurements.md ("Figures behind the code's constants") with the date and command that
    measured them. A value the code itself holds is named by its constant instead. Docstrings are
    held too: most figures were there."""
    assert (
        FIGURE.search("about 0.2 of 1.2 CPU seconds")
        and FIGURE.search("9-12 CPU s")
        and FIGURE.search("66 %")
    )
    assert not FIGURE.search("exit 43, step 5, 3,072 pods, tpu7x-2x2x2, x1.6, 1e-5")
    found, used = [], set()
    for path in MODULES:
        rel = str(path.relative_to(ROOT))
        for line, text in _comments(path.read_text()):
            for match in FIGURE.finditer(text):
                if (rel, match.group(0)) in FIGURES_ALLOWED:
                    used.add((rel, match.group(0)))
                else:
                    found.append(
                        f"{rel}:{line}: {match.group(0)!r} in ...{text[max(0, match.start() - 50) : match.end() + 20]}..."
                    )
    assert found == []
    assert used == FIGURES_ALLOWED.keys(), "an allowed figure is gone: drop it from FIGURES_ALLOWED"


# The most lines a function may have, from its `def` to its last line (its decorators not counted).
LONGEST_FUNCTION = 100
# Functions over the limit, each with why. launcher/embedded/ is not held at all: its controllers
# transcribe upstream's reconcile functions in upstream's order (docs/design.md "Layers").
LONG_FUNCTIONS_ALLOWED: dict[tuple[str, str], str] = {}


def _functions() -> list[tuple[str, str, int, int]]:
    """(module, name, line, lines) of every function and method of launcher/ and trainer/, nested
    ones too, but launcher/embedded/'s."""
    found = []
    for path, tree in parsed().items():
        if path.startswith(("launcher/", "trainer/")) and not path.startswith("launcher/embedded/"):
            found += [
                (path, node.name, node.lineno, (node.end_lineno or node.lineno) - node.lineno + 1)
                for node in ast.walk(tree)
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            ]
    return found


def test_no_function_is_longer_than_a_sitting() -> None:
    """No function of launcher/ or trainer/ (launcher/embedded/ aside) longer than
    ``LONGEST_FUNCTION`` lines: a longer one is split into named phases or parts."""
    functions = _functions()
    assert len(functions) > 1000 and any(path.startswith("trainer/") for path, *_ in functions)
    long = {
        (path, name): f"{path}:{line}: {name} ({lines} lines)"
        for path, name, line, lines in functions
        if lines > LONGEST_FUNCTION
    }
    assert sorted(v for k, v in long.items() if k not in LONG_FUNCTIONS_ALLOWED) == []
    assert long.keys() >= LONG_FUNCTIONS_ALLOWED.keys(), (
        "an allowed function is short now: drop it from LONG_FUNCTIONS_ALLOWED"
    )


# The one place `--memory` may be written: `python -m trainer --hbm`'s former name, still accepted.
DEPRECATED_HBM_FLAG = ("trainer/__main__.py", 'DEPRECATED_HBM_FLAG = "--memory"')
HBM_MODULES = ("launcher/core/hbm.py", "trainer/hbm.py")


def test_the_hbm_estimate_is_never_called_memory() -> None:
    """The step's HBM (the launcher's estimate, the trainer's compiled figure) is "hbm": its modules
    are imported under their own name, define no name with "memory" in it, and `--memory` is written
    only as `--hbm`'s deprecated alias, not in the code, bench/ or the docs. "Memory" is the RAM
    snapshots' word (``snapshot.Memory``, ``StateSource.MEMORY``)."""
    aliased, named = [], []
    for path, tree in parsed().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                aliased += [
                    f"{path}: {a.name} as {a.asname}" for a in node.names if a.name == "hbm" and a.asname
                ]
            elif isinstance(node, ast.Import):
                aliased += [
                    f"{path}: {a.name} as {a.asname}"
                    for a in node.names
                    if a.name.endswith(".hbm") and a.asname
                ]
            if path in HBM_MODULES and isinstance(node, ast.FunctionDef | ast.ClassDef | ast.Name | ast.arg):
                name = (
                    node.arg
                    if isinstance(node, ast.arg)
                    else node.id
                    if isinstance(node, ast.Name)
                    else node.name
                )
                if "memory" in name.lower():
                    named.append(f"{path}:{node.lineno}: {name}")
    assert aliased == [] and named == []
    flag = re.compile(r"--memory(?![\w-])")
    texts = {
        str(p.relative_to(ROOT)): p.read_text()
        for p in [*MODULES, *BENCH, *ROOT.glob("docs/*.md"), ROOT / "README.md"]
    }
    written = [
        (path, line.strip())
        for path, text in texts.items()
        for line in text.splitlines()
        if flag.search(line)
    ]
    assert written == [DEPRECATED_HBM_FLAG]
    assert not (ROOT / "tests" / "trainer" / "test_memory.py").exists()  # the estimate's tests: test_hbm.py
