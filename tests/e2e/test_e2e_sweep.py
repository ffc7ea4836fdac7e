"""A ragged-buffer sweep end to end: real trainer runs on the embedded cluster under the real
controller, interrupted twice and resumed.

The sweep of four factors is run four times over one sweep directory:
1. the first run finishes; the second is killed mid-run once it has a checkpoint: the sweep is
   interrupted (Ctrl-C) and the run stopped (`reslice stop`: the trainer checkpoints and exits 42);
2. relaunches the stopped run, which resumes from its checkpoint, and is interrupted right after
   launching the third;
3. attaches to the third (left live in the cluster) and, allowed two runs at once as on a real
   cluster, launches the last beside it;
4. has nothing left to do.
Finished runs must come through every rerun untouched, and the stored results must be the trainer's
own numbers.
"""

import hashlib
import io
import itertools
import json
import statistics
import threading
from dataclasses import replace

import pytest
from rich.console import Console

from launcher.adapters.rundir import read_jsonl
from launcher.cli.app import main
from launcher.cli.spec_options import for_cluster
from launcher.controller.launch import stop_run
from launcher.core.record import Knobs
from launcher.core.spec import RunSpec
from launcher.core.words import RunState
from launcher.sweep.driver import run_sweep
from launcher.sweep.spec import ATTACH, LAUNCH, RELAUNCH, make_sweep
from tests.e2e.harness import PRESET, Harness, paced, wait_for
from tests.trainer.runs import MODEL

pytestmark = pytest.mark.e2e
FACTORS = "1.0,1.25,1.5,-1"  # each factor is a program to compile: the fewest the scenario needs
# Enough steps after the first checkpoint for `reslice stop` to land mid-run, and for the third
# run to be live when the third invocation attaches to it: paced by the clock
# (train.debug_step_pause_s), not by more steps, so that a fast machine's runs last as long.
STEPS, WARMUP, INTERVAL, PACE_S = 40, 10, 10, 0.1
# One layer (the suite's trainer depth, tests/trainer/runs.py MODEL): the sweep's machinery and its
# numbers are the same per layer, and each factor is a program of its own to compile.


def fingerprint(h: Harness, run: str) -> dict:
    """Everything a rerun could touch of a run: its record, ledger, status and metrics files."""
    rd = h.rundir(run)
    got = h.kube.get_record(run)
    files = {
        n: hashlib.sha256(rd.read_text(f"metrics/{n}").encode()).hexdigest() for n in rd.list_dir("metrics")
    }
    return {
        "record_version": got[1],
        "ledger": rd.read_text("events.jsonl"),
        "status": rd.read_text("status.json"),
        "metrics": files,
        "checkpoints": rd.committed_steps(),
    }


def expected_from_metrics(h: Harness, run: str) -> dict:
    """The aggregates recomputed here, independently, from the run's metrics files."""
    rd = h.rundir(run)
    kept, startup = {}, set()  # step -> its last computation; ids of each trainer's first record
    for name in rd.list_dir("metrics"):  # one file per trainer process (a relaunch adds one)
        lines = read_jsonl(rd.read_text(f"metrics/{name}"))
        startup |= {id(lines[0])} if lines else set()
        for r in lines:
            if r["step"] not in kept or r["time"] > kept[r["step"]]["time"]:
                kept[r["step"]] = r
    recs = [kept[s] for s in sorted(kept)]
    assert [r["step"] for r in recs] == list(range(1, STEPS + 1))
    measured = [r for r in recs if r["step"] > WARMUP]
    layers = len(measured[0]["moe/layers"])
    per_layer = [
        sum(r["moe/layers"][i]["dropped_rows"] for r in measured)
        / sum(r["moe/layers"][i]["total_rows"] for r in measured)
        for i in range(layers)
    ]
    return {
        "dropped_rows": sum(r["moe/dropped_rows"] for r in measured),
        "total_rows": sum(r["moe/total_rows"] for r in measured),
        "worst_layer_dropped_fraction": max(per_layer),
        "max_load_max": max(r["moe/max_load_over_balanced"] for r in measured),
        "buffer_rows": measured[-1]["moe/buffer_rows"],
        # A trainer's first step includes its start-up: never a step time.
        "step_time_median_s": statistics.median(
            r["perf/step_time_seconds"] for r in measured if id(r) not in startup
        ),
        "loss_final": recs[-1]["learning/loss"],
        "measured_steps": STEPS - WARMUP,
    }


def test_sweep_interrupted_and_resumed_on_the_embedded_cluster(tmp_path, capsys):
    h = Harness(tmp_path, pools=2)  # two slices' worth: the third invocation runs two at once
    sweep = make_sweep(name="rb", preset=PRESET, slices=1, config="tiny", factors=FACTORS, steps=STEPS,
                       warmup=WARMUP, overrides=(*MODEL, f"checkpoint.interval={INTERVAL}", "optim.decay_steps=40", *paced(PACE_S)),
                       sweep_dir=str(tmp_path / "sweeps" / "rb"))  # fmt: skip
    runs = [f"rb-f{s}" for s in ("1", "1p25", "1p5", "dropless")]
    template = for_cluster(
        RunSpec(run="rb", run_dir=sweep.sweep_dir, global_batch=sweep.global_batch), True, 20
    )
    knobs = Knobs(unschedulable_grace_s=20, grow_window_s=4, app_backoff_s=1)
    out = io.StringIO()

    def invoke(stop_after: str | None = None, kill: str | None = None, parallel: int = 1):
        """One `reslice sweep`, interrupted (as by Ctrl-C) right after it starts `stop_after`, or
        once run `kill` has committed a checkpoint — and that run then stopped by hand."""
        stop, started, killers = threading.Event(), [], []

        def kill_after_checkpoint(run: str) -> None:
            wait_for(lambda: h.rundir(run).latest_committed_step(), 120, f"{run}'s first checkpoint", 0.02)
            stop.set()  # first, so that the sweep launches nothing more
            stop_run(h.kube, run)

        def on_start(run: str, action: str) -> None:
            started.append((run, action))
            if run == stop_after:
                stop.set()
            if run == kill:
                killers.append(threading.Thread(target=kill_after_checkpoint, args=(run,), daemon=True))
                killers[-1].start()

        outcome = run_sweep(h.kube, replace(sweep, max_parallel=parallel), template, knobs, console=Console(file=out, width=200), live=False,
                            stop=stop, on_start=on_start, resync_s=1.0, lease_s=4)  # fmt: skip
        for t in killers:
            t.join(timeout=60)
        return outcome, started

    try:
        # 1. The first run finishes; the second is stopped mid-run, and the sweep interrupted.
        outcome, started = invoke(kill=runs[1])
        assert started == [(runs[0], LAUNCH), (runs[1], LAUNCH)]
        states = [r.state for r in outcome.results]
        assert not outcome.complete and states[0] == RunState.FINISHED and states[2:] == ["NotLaunched"] * 2
        assert h.record(runs[1]).state == RunState.STOPPED
        done = {runs[0]: fingerprint(h, runs[0])}

        # 2. The stopped run is relaunched under its name; interrupted again as the third starts.
        outcome, started = invoke(stop_after=runs[2])
        assert started == [(runs[1], RELAUNCH), (runs[2], LAUNCH)]
        assert outcome.interrupted == [runs[2]]
        ledger = h.rundir(runs[1]).ledger()
        assert [e["kind"] for e in ledger].count("launch") == 2
        assert any(e["kind"] == "relaunch" and e["previous_state"] == RunState.STOPPED for e in ledger)
        assert h.record(runs[1]).state == RunState.FINISHED
        # It was stopped mid-run and resumed from its checkpoint: two trainers, the second not from step 1.
        rd = h.rundir(runs[1])
        firsts = sorted(
            min(r["step"] for r in read_jsonl(rd.read_text(f"metrics/{n}"))) for n in rd.list_dir("metrics")
        )
        assert len(firsts) == 2 and firsts[0] == 1 and INTERVAL < firsts[1] < STEPS, firsts

        # 3. The third was left live: attached to, not relaunched; the last one runs beside it.
        outcome, started = invoke(parallel=2)
        assert started == [(runs[2], ATTACH), (runs[3], LAUNCH)]
        launched_last = next(e["time"] for e in h.rundir(runs[3]).ledger() if e["kind"] == "launch")
        assert launched_last < h.record(runs[2]).finished_at, "--max-parallel 2 ran them one after the other"
        assert outcome.complete and outcome.interrupted == []
        assert [e["kind"] for e in h.rundir(runs[2]).ledger()].count("launch") == 1
        assert len(h.record(runs[2]).segments) == 1
        done |= {r: fingerprint(h, r) for r in runs[1:]}

        # 4. Nothing is left: nothing starts, and no run that finished was touched by any rerun.
        final, started = invoke()
        assert started == [] and final.complete
        assert {r: fingerprint(h, r) for r in runs} == done
        expected = {r: expected_from_metrics(h, r) for r in runs}
    finally:
        h.close()

    # Acceptance 1: JSON, CSV, table and plot.
    d = tmp_path / "sweeps" / "rb"
    doc = json.loads((d / "sweep.json").read_text())
    csv_rows = (d / "sweep.csv").read_text().splitlines()
    assert (d / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert [r["run"] for r in doc["results"]] == runs and len(csv_rows) == 1 + len(runs)
    text = out.getvalue()
    assert "not rerun" in text and "attaching" in text and "relaunched (was Stopped" in text
    assert final.results == outcome.results  # the fourth invocation re-read the same numbers

    # Acceptance 2: the stored numbers are the trainer's, and the curve falls to exactly zero.
    for r in doc["results"]:
        exp = expected[r["run"]]
        for key, value in exp.items():
            assert r[key] == value, (r["run"], key, r[key], value)
        assert r["dropped_fraction"] == exp["dropped_rows"] / exp["total_rows"]
    fracs = [r["dropped_fraction"] for r in doc["results"]]
    assert all(a >= b for a, b in itertools.pairwise(fracs)), fracs
    assert doc["results"][-1]["factor"] < 0 and doc["results"][-1]["dropped_rows"] == 0 and fracs[-1] == 0
    # Not trivially flat: the synthetic data's skew makes the small buffers drop, strictly less as they grow.
    assert fracs[0] > 0.02 and all(a > b for a, b in itertools.pairwise(fracs[:3])), fracs
    assert [r["buffer_rows"] for r in doc["results"]] == [128, 160, 192, 512]  # 64 tokens × top-2 × f
    rec = doc["recommendation"]
    assert rec["factor"] == -1.0 and "use dropless" in rec["message"]  # nothing finite stays under 0.1 %

    # `reslice sweep-report` redraws the table and the plot from sweep.json alone.
    (d / "sweep.png").unlink()
    capsys.readouterr()
    main(["sweep-report", "rb", "--sweep-dir", str(d)])  # returns normally on success
    report = capsys.readouterr().out
    assert (d / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    for r in doc["results"]:
        assert f"{100 * r['dropped_fraction']:.3f} %" in report and str(r["buffer_rows"]) in report
    assert "◀ recommended" in report and rec["message"] in " ".join(report.split())
