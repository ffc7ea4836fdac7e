"""Every benchmark's `main()` runs here, in its smallest form: a helper renamed under a benchmark,
or a call left behind by a signature change, fails the suite instead of the next person who needs
its figures. Options a benchmark cannot run with (zero of what it measures, one slice where it
loses one, a mesh the devices cannot hold) are one line and exit 2, at once.

Benchmarks run in fresh interpreters, several in one (bench/__init__.py and bench.accelerator set
the process's environment at import; each group shares its imports): the embedded-cluster ones,
then the JAX ones, then the options each refuses. Each `main()` is called as `python -m bench.X
ARGS` would call it; what it printed and its exit code come back as JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.test_benchmarks_run import BENCHES

_RUN = r"""
import contextlib, importlib, io, json, sys, time, traceback

results = []
for name, argv in json.loads(sys.argv[1]):
    mod = importlib.import_module(f"bench.{name}")
    sys.argv = [f"python -m bench.{name}", *argv]
    out, err = io.StringIO(), io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            got = mod.main()
            code = got if isinstance(got, int) else 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if isinstance(e.code, str):
                err.write(e.code + "\n")
        except BaseException:
            code = "raised"
            err.write(traceback.format_exc())
    results.append({"name": name, "argv": argv, "code": code, "out": out.getvalue(),
                    "err": err.getvalue(), "seconds": round(time.monotonic() - t0, 1)})
print(json.dumps(results))
"""


def run_benches(cases: list[tuple[str, list[str]]], timeout: float) -> list[dict]:
    proc = subprocess.run(
        [sys.executable, "-c", _RUN, json.dumps(cases)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def ran(r: dict) -> str:
    return (
        f"bench.{r['name']} {' '.join(r['argv'])}: exit {r['code']}\n{r['err'][-3000:]}\n{r['out'][-3000:]}"
    )


# The smallest form of each benchmark that measures something: (module, argv).
CLUSTER = [
    ("tokenize_memory", ["--mb", "0.2", "--vocab", "300"]),
    ("ui", ["--runs", "1", "--segments", "1", "--rounds", "1", "--no-browser", "--json"]),
    ("embedded_scale", ["--slices", "1", "--preset", "tpu7x-2x2x1", "--samples", "1"]),
    ("controller_scale", ["--slices", "2", "--preset", "tpu7x-2x2x2", "--nodes", "0", "--pods", "0",
                          "--events", "0", "--idle-s", "0.5", "--rounds", "1", "--json"]),
    ("reslice_scale", ["--slices", "2", "--preset", "tpu7x-2x2x2", "--watchers", "1", "--json"]),
    ("chaos", ["--seeds", "1", "--faults", "1", "--steps", "8", "--interval", "4", "--shape", "single"]),
    ("recovery", ["--cycles", "1", "--mode", "in-place", "--json"]),
]  # fmt: skip
JAX = [
    # bench.tpu --quick runs bench.accelerator --quick and bench.tpu_handoff (one hand-off) as its
    # children, as on a TPU lease; the JSON it writes is read below.
    ("tpu", ["--quick", "--out", "{tmp}/tpu.json"]),
    # A batch of 8 (one sequence a device), not their 256: the figures mean nothing at this size.
    ("snapshot_cost", ["--steps", "3", "--rounds", "1", "--set", "train.global_batch=8"]),
    ("trainer_overhead", ["--steps", "3", "--rounds", "1", "--set", "train.global_batch=8"]),
]
# bench.scale_cluster is no benchmark: bench.controller_scale and bench.reslice_scale start it.
NOT_RUN_ALONE = {"scale_cluster"}


def test_every_benchmark_is_run_here():
    from bench.tpu import BENCHES as TPU_BENCHES

    by_tpu = {n for n, _, _ in TPU_BENCHES if (ROOT / "bench" / f"{n}.py").exists()}
    assert sorted({n for n, _ in CLUSTER + JAX} | by_tpu | NOT_RUN_ALONE) == BENCHES


def test_the_embedded_cluster_benchmarks_run():
    got = {r["name"]: r for r in run_benches(CLUSTER, timeout=600)}
    for r in got.values():
        assert r["code"] == 0, ran(r)
    assert last_json(got["tokenize_memory"]["out"])["tokens"] > 0
    assert last_json(got["ui"]["out"])["runs"] == 1
    assert "watch latency (patch -> event)" in got["embedded_scale"]["out"]
    scale = last_json(got["controller_scale"]["out"])
    assert scale["pods"] == 4 and scale["decision_latency_s"] > 0, scale
    modes = last_json(got["reslice_scale"]["out"])
    assert modes["in-place"]["pods_created"] == 0 and modes["recreate"]["pods_created"] > 0, modes
    assert "1/1 held" in got["chaos"]["out"] and "steps lost: " in got["chaos"]["out"], ran(got["chaos"])
    assert last_json(got["recovery"]["out"])["inplace_median_s"] > 0


def test_the_jax_benchmarks_run(tmp_path):
    cases = [(n, [a.format(tmp=tmp_path) for a in argv]) for n, argv in JAX]
    got = {r["name"]: r for r in run_benches(cases, timeout=600)}
    for r in got.values():
        assert r["code"] == 0, ran(r)
    tpu = json.loads((tmp_path / "tpu.json").read_text())
    assert tpu["ok"], tpu
    for name, b in tpu["benches"].items():
        assert "skipped" in b or b["exit"] == 0, (name, b)
    handoff = tpu["benches"]["tpu_handoff"]["result"]
    assert handoff["ok"] and handoff["ok_handoffs"] == 1, handoff
    recovery = tpu["benches"]["tpu_recovery"]["result"]
    cases = {c["case"]: c for c in recovery["cases"]}
    assert [cases[c]["from"] for c in ("cold", "storage", "memory")] == ["fresh", "storage", "memory"], cases
    assert cases["floor"]["train_step_from_cache"] and all(c["total_s"] > 0 for c in cases.values()), cases
    acc = tpu["benches"]["accelerator"]["result"]
    # A part that raised is reported and the others go on (on a TPU lease, every figure counts):
    # here none may.
    assert [k for k in acc if k.endswith("_error")] == [], acc
    assert acc["step"]["step_s"] > 0 and acc["moe"].keys() == {"ragged", "dense"} and acc["attention"], acc
    assert "snapshot cost ratio" in got["snapshot_cost"]["out"], ran(got["snapshot_cost"])
    assert "overhead ratio" in got["trainer_overhead"]["out"], ran(got["trainer_overhead"])


# Options each benchmark cannot run with: (module, argv, what the line says). Each is refused
# before anything starts.
REFUSED = [
    ("accelerator", ["--steps", "0"], "--steps 0: nothing to measure"),
    ("accelerator", ["--layers", "-1"], "--layers -1: not a count"),
    ("accelerator", ["--skip", "transports"], "no part transports"),
    ("accelerator", ["--fit", "1.5"], "--fit 1.5: a share of the device's memory"),
    ("chaos", ["--seeds", "0"], "--seeds 0: nothing to measure"),
    ("chaos", ["--faults", "0"], "--faults 0: nothing to measure"),
    ("chaos", ["--steps", "6", "--interval", "5"], "no fault could land"),
    ("chaos", ["--shape", "single", "--restart-mode", "in-place"], "needs a shape of several slices"),
    ("controller_scale", ["--slices", "1"], "needs at least 2"),
    ("controller_scale", ["--preset", "v9-1x1"], "no such preset"),
    ("controller_scale", ["--preset", "tpu7x-2x2x1", "--slices", "2"], "multi-host slices"),
    ("controller_scale", ["--rounds", "0"], "--rounds 0: nothing to measure"),
    ("embedded_scale", ["--samples", "0"], "--samples 0: nothing to measure"),
    ("recovery", ["--cycles", "0"], "--cycles 0: nothing to measure"),
    ("reslice_scale", ["--slices", "1"], "needs at least 2"),
    ("reslice_scale", ["--watchers", "0"], "--watchers 0: nothing to measure"),
    ("reslice_scale", ["--modes", "sideways"], "one or both of"),
    ("scale_cluster", ["--slices", "0", "--info", "x"], "--slices 0: nothing to measure"),
    ("snapshot_cost", ["--rounds", "0"], "--rounds 0: nothing to measure"),
    ("snapshot_cost", ["--steps", "2"], "--steps 2: at least 3"),
    ("tokenize_memory", ["--mb", "0"], "--mb 0.0: nothing to tokenize"),
    ("tokenize_memory", ["--vocab", "100"], "--vocab 100: at least 257"),
    ("tpu_handoff", ["--handoffs", "0"], "--handoffs 0: nothing to measure"),
    ("tpu_recovery", ["--timeout", "0"], "--timeout must be > 0 seconds"),
    ("trainer_overhead", ["--rounds", "0"], "--rounds 0: nothing to measure"),
    ("tpu", ["--timeout", "0"], "--timeout 0.0: no time to run in"),
    ("tpu", ["--out", "/nonexistent/x.json"], "/nonexistent is not a directory"),
    ("ui", ["--runs", "0"], "--runs 0: nothing to measure"),
    ("ui", ["--unknown"], "unrecognized arguments: --unknown"),
]


@pytest.fixture(scope="module")
def refused() -> dict[tuple[str, str], dict]:
    return {(r["name"], " ".join(r["argv"])): r for r in run_benches([(n, a) for n, a, _ in REFUSED], 300)}


@pytest.mark.parametrize(("name", "argv", "says"), REFUSED, ids=[f"{n} {' '.join(a)}" for n, a, _ in REFUSED])
def test_an_option_a_benchmark_cannot_run_with_is_one_line_and_exit_2(refused, name, argv, says):
    r = refused[(name, " ".join(argv))]
    assert r["code"] == 2, ran(r)
    assert r["err"].count("\n") == 1 and r["err"].startswith(f"python -m bench.{name}: "), r["err"]
    assert says in r["err"], r["err"]
    assert r["seconds"] < 10, f"refused only after {r['seconds']} s"  # never a wait first


def test_a_sharded_row_the_devices_cannot_hold_is_refused_before_any_row_runs():
    # Its own interpreter: the device count is fixed by the first JAX import.
    (r,) = run_benches([("trainer_overhead", ["--devices", "1", "--steps", "3", "--rounds", "1"])], 120)
    assert r["code"] == 2, ran(r)
    assert r["err"].count("\n") == 1 and "does not divide the device count (1)" in r["err"], r["err"]
    assert r["out"] == "", r["out"]  # no row measured first
