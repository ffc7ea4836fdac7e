"""Session-wide settings shared by every test.

JAX runs on simulated CPU devices. The persistent compilation cache is shared by every trainer
subprocess (they inherit the environment), so a model shape compiled once is loaded from disk by
every later trainer instead of recompiled: that is most of what keeps the end-to-end tests inside
the CI budget on two cores. The test process compiles its own programs at -O0
(``_compile_here_at_o0``): its entries are its own.
"""

import json
import os
import resource
import time
from pathlib import Path

import pytest

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

# Per test file, its worker-seconds and its CPU seconds (the worker's own and its reaped
# children's: trainers, the cluster's processes) in the last whole-suite run that passed, written by
# that run (pytest_sessionfinish below). The workers take whole files in this order
# (`--no-loadscope-reorder`), each the next one as it frees up.
DURATIONS = ROOT / "tests" / "durations.json"
# A file that used less than this many cores over its time mostly waits (on a cluster's grace
# periods, a late peer, a timeout). The three workers share two cores: a file that works gets about
# two thirds of one, and two files waiting at once leave the third alone on both cores, half of
# them idle (docs/measurements.md, "The test suite").
WAITS_BELOW = 1 / 3
# Containers under podman run outside the worker's process tree: their CPU is not counted, so the
# image files' figures say they wait while their containers train. They count as working.
WORK_OUTSIDE_THE_TREE = ("tests/images/",)
WORKERS = 3  # dev.py's `-n`
# The model's in-process files: the same CPU-bound work in every run (no subprocess, no waiting), so
# their CPU seconds say how fast the machine is in that run; a whole run's summary prints them beside
# the machine's busy CPU, which moves with the hour by up to half again (docs/measurements.md).
YARDSTICK = tuple(f"tests/trainer/test_{name}.py" for name in ("recipe", "attention", "step", "moe"))


def _durations() -> dict[str, tuple[float, float]]:
    """file -> (seconds, CPU seconds); a figure of one number (the older form) is both."""
    try:
        raw = json.loads(DURATIONS.read_text())
        return {
            name: (float(v), float(v)) if isinstance(v, int | float) else (float(v[0]), float(v[1]))
            for name, v in raw.items()
        }
    except (OSError, ValueError, AttributeError, TypeError, IndexError):
        return {}


def waits(name: str, secs: float, cpu: float) -> bool:
    """Whether a file of these figures mostly waits (WAITS_BELOW, WORK_OUTSIDE_THE_TREE)."""
    return cpu < WAITS_BELOW * secs and not name.startswith(WORK_OUTSIDE_THE_TREE)


def next_file(
    left: list[str],
    running: list[str | None],
    figures: dict[str, tuple[float, float]],
    workers: int = WORKERS,
) -> str:
    """The file a worker takes next, of `left` (in `schedule`'s order), while the other workers run
    `running` (None: nothing): the first of one kind, a waiting file (`waits`) while fewer workers
    wait than the waiting files' share of the seconds left asks for, else a working one; never a
    last worker waiting beside others that wait while work is left. A file without figures works."""

    def waiting(name: str | None) -> bool:
        return name in figures and waits(name, *figures[name])

    secs = {n: figures.get(n, (0.0, 0.0))[0] for n in left}
    share = workers * sum(secs[n] for n in left if waiting(n)) / (sum(secs.values()) or 1.0)
    waiting_now = sum(waiting(n) for n in running)
    work_left = not all(waiting(n) for n in left)
    want_wait = not work_left or (waiting_now + 1 <= share + 0.5 and waiting_now + 1 < workers)
    return next((n for n in left if waiting(n) == want_wait), left[0])


def schedule(figures: dict[str, tuple[float, float]], workers: int = WORKERS) -> list[str]:
    """The files in the order the workers take them, each the next one as it frees up: a replay of
    that hand-out on the figures' seconds, each file chosen by `next_file` from the longest first.
    The run itself chooses again as each worker asks (`pytest_xdist_make_scheduler`), from what
    the others run then; this order is its starting point, and the order without xdist."""
    left = sorted(figures, key=lambda n: (-figures[n][0], n))
    busy: list[tuple[float, str]] = []  # (ends at, file) of what the workers run
    order, now = [], 0.0
    while left:
        if len(busy) == workers:  # the next worker to free up
            busy.sort()
            now, _ = busy.pop(0)
        name = next_file(left, [n for _, n in busy], figures, workers)
        left.remove(name)
        order.append(name)
        busy.append((now + figures[name][0], name))
    return order


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # optional: `-p no:xdist` runs without it
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` (dev.py's), each file chosen as a worker asks for its next one, by
    `next_file` from what the others run at that moment: the replay's order drifts from the run's
    as files take longer or shorter than their figures, and two waiting files that a replay kept
    apart could otherwise start together."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    figures = _durations()

    class FilesByKind(LoadFileScheduling):
        def _assign_work_unit(self, node) -> None:
            running = [self._running(n) for n in self.nodes if n is not node]
            chosen = next_file(list(self.workqueue), running, figures, len(self.nodes))
            self.workqueue.move_to_end(chosen, last=False)  # the one xdist's own hand-out takes
            super()._assign_work_unit(node)

        def _running(self, node) -> str | None:
            """The first file of `node`'s with a test still to run."""
            units = self.assigned_work.get(node, {})
            return next((name for name, tests in units.items() if not all(tests.values())), None)

    return FilesByKind(config, log)


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
    """The files in `schedule`'s order of the last whole run's figures; files without one after
    them, as collected (the sort is stable)."""
    rank = {name: i for i, name in enumerate(schedule(_durations()))}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


CPU_PROPERTY = "cpu_s"
_CPU_START = pytest.StashKey[float]()


def _cpu_now() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    item.stash[_CPU_START] = _cpu_now()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """The test's CPU seconds, its fixtures' set-up and tear-down included, ride on its last report
    to the controller (xdist sends `user_properties` with it)."""
    report = yield
    if call.when == "teardown" and _CPU_START in item.stash:
        report.user_properties.append((CPU_PROPERTY, _cpu_now() - item.stash[_CPU_START]))
    return report


_spent: dict[str, list[float]] = {}


def pytest_runtest_logreport(report) -> None:
    """Every phase of every test, summed by file (under xdist the controller sees every worker's):
    its seconds, and its CPU seconds from the last phase's report."""
    spent = _spent.setdefault(report.nodeid.split("::")[0], [0.0, 0.0])
    spent[0] += report.duration
    spent[1] += sum(value for key, value in report.user_properties if key == CPU_PROPERTY)


def _whole_run(config) -> bool:
    """The whole suite (no path, -k, -m, --deselect or --lf), seen from the controller (or the one
    process without xdist)."""
    return (
        not hasattr(config, "workerinput")
        and [Path(a).resolve() for a in config.args] == [ROOT / "tests"]
        and not (
            config.option.keyword
            or config.option.markexpr
            or config.option.deselect
            or getattr(config.option, "lf", False)
        )
    )


def busy_cpu() -> float | None:
    """The machine's busy CPU seconds since its boot (/proc/stat's first line: user, nice, system,
    irq, softirq), or None where there is no /proc."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        ticks = sum(int(fields[i]) for i in (0, 1, 2, 5, 6))
    except (OSError, ValueError, IndexError):
        return None
    return ticks / os.sysconf("SC_CLK_TCK")


def suite_figures(
    wall_s: float, busy_s: float | None, cores: int, spent: dict[str, tuple[float, float] | list[float]]
) -> str:
    """One line for a whole run's end: its seconds, the tests' CPU (`spent`: file -> (seconds, CPU
    seconds)), the machine's busy CPU over the run, and the YARDSTICK files' CPU."""
    tests = sum(cpu for _, cpu in spent.values())
    model = sum(spent[name][1] for name in YARDSTICK if name in spent)
    busy = (
        ""
        if busy_s is None
        else f", the machine's busy CPU {busy_s:.0f} s ({busy_s / (wall_s * cores):.1%} of {cores} cores)"
    )
    return (
        f"reslice: the suite took {wall_s:.1f} s{busy}, its tests {tests:.0f} CPU s; the model's"
        f" in-process files {model:.1f} CPU s (the machine's speed: docs/measurements.md)"
    )


_started: list[tuple[float, float | None]] = []


def pytest_sessionstart(session) -> None:
    if _whole_run(session.config):
        _started.append((time.monotonic(), busy_cpu()))


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not (_started and _spent):
        return
    t0, busy0 = _started[0]
    busy1 = busy_cpu()
    busy = None if busy0 is None or busy1 is None else busy1 - busy0
    terminalreporter.write_line(suite_figures(time.monotonic() - t0, busy, os.cpu_count() or 1, _spent))


def pytest_sessionfinish(session, exitstatus) -> None:
    """A whole-suite run (no path, -k, -m, --deselect or --lf) that passed rewrites DURATIONS (whole
    seconds, so that it changes only when a file's figures do): the order stays current by itself."""
    if not _whole_run(session.config) or exitstatus != 0 or not _spent:
        return
    ranked = sorted(_spent.items(), key=lambda kv: -kv[1][0])
    lines = [f"{json.dumps(name)}: [{round(secs)}, {round(cpu)}]" for name, (secs, cpu) in ranked]
    DURATIONS.write_text("{\n" + ",\n".join(lines) + "\n}\n")
