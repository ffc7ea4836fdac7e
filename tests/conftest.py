"""Session-wide settings shared by every test.

JAX runs on simulated CPU devices. The persistent compilation cache is shared by every trainer
subprocess (they inherit the environment), so a model shape compiled once is loaded from disk by
every later trainer instead of recompiled: that is most of what keeps the end-to-end tests inside
the CI budget on two cores. The test process compiles its own programs at -O0
(``_compile_here_at_o0``): its entries are its own.
"""

import json
import os
from pathlib import Path

from launcher.embedded.kubelet import podenv

ROOT = Path(__file__).resolve().parent.parent

# Every trainer this process starts runs as the embedded kubelet's processes do (JAX on CPU, the
# same XLA flags): then the trainers load each other's compile cache entries.
os.environ.update(podenv.simulated_host(os.environ))


def _compile_here_at_o0() -> None:
    """This process's own programs compile at -O0, its trainers' at -O1 (SIMULATED_XLA_FLAGS). The
    model's tests compile hundreds of programs here and run each a few times: -O0 compiles them in
    less than half the CPU and runs them about 3 times slower, the right trade for them and the
    wrong one for a trainer's hundreds of steps (docs/measurements.md, "The test suite"). XLA reads
    XLA_FLAGS once per process, at the first compile option it builds: built here under -O0, then
    the variable is set back for the processes this one starts. Both compile caches tell the two
    apart (JAX's key holds the parsed options, and trainer.state.compile_cache.xla_options)."""
    from jax._src.lib import xla_client

    trainers = os.environ["XLA_FLAGS"]
    os.environ["XLA_FLAGS"] = trainers.replace(
        "--xla_backend_optimization_level=1", "--xla_backend_optimization_level=0"
    )
    try:
        xla_client.CompileOptions()
    finally:
        os.environ["XLA_FLAGS"] = trainers


_compile_here_at_o0()
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".cache" / "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# Keep XLA from spawning more compile threads than the two cores CI has.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MAXTEXT_E2E = ROOT / "tests" / "maxtext_e2e"

# Worker-seconds per test file in the last whole-suite run that passed, written by that run
# (pytest_sessionfinish below). The workers take whole files longest first (`--no-loadscope-reorder`):
# the long files start first and the many short ones fill in beside them; xdist's default order (most
# tests first) left the few-test end-to-end files for the end, where their waiting left the cores
# half idle. A new file has no figure yet and runs after the known ones until the next whole run.
DURATIONS = ROOT / "tests" / "durations.json"


def _durations() -> dict[str, float]:
    try:
        return {k: float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    """tests/maxtext_e2e runs real MaxText (.venv-maxtext: 1.1 GB, minutes per run): collected only
    when an argument names it (`python3 dev.py test tests/maxtext_e2e`), never by the default run."""
    if not _inside(collection_path, MAXTEXT_E2E):
        return None
    here = Path(config.invocation_params.dir)
    named = [(here / a.split("::")[0]).resolve() for a in config.args]
    return True if not any(_inside(p, MAXTEXT_E2E) for p in named) else None


def pytest_collection_modifyitems(config, items: list) -> None:
    """The files longest first by the last whole run's figures; files without one after them, as
    collected (the sort is stable)."""
    seconds = _durations()
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], 0.0))


_spent: dict[str, float] = {}


def pytest_runtest_logreport(report) -> None:
    """Every phase of every test, summed by file (under xdist the controller sees every worker's)."""
    name = report.nodeid.split("::")[0]
    _spent[name] = _spent.get(name, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus) -> None:
    """A whole-suite run (no path, -k, -m, --deselect or --lf) that passed rewrites DURATIONS (whole seconds, so that it changes only when
    a file's time does): the order stays current by itself."""
    config = session.config
    whole = [Path(a).resolve() for a in config.args] == [ROOT / "tests"] and not (
        config.option.keyword
        or config.option.markexpr
        or config.option.deselect
        or getattr(config.option, "lf", False)
    )
    if hasattr(config, "workerinput") or not whole or exitstatus != 0 or not _spent:
        return
    ranked = sorted(_spent.items(), key=lambda kv: -kv[1])
    DURATIONS.write_text(json.dumps({name: round(secs) for name, secs in ranked}, indent=0) + "\n")
