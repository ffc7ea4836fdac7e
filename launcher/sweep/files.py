"""The files of a ragged-buffer sweep: each run's metrics (read back from its run directory) and
the sweep directory's `sweep.json`, `sweep.csv` and `sweep.png`. Called by `launcher/sweep/driver.py` (the
driver) and `reslice sweep-report` (`launcher/cli/commands/sweeping.py`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from launcher.adapters.rundir import RunDir, read_jsonl
from launcher.core.errors import UserError
from launcher.sweep.results import (
    FactorResult,
    Recommendation,
    aggregate,
    ordered,
    plot_sweep,
    recommend,
    to_csv,
)
from launcher.sweep.spec import SweepSpec, run_name

SWEEP_JSON, SWEEP_CSV, SWEEP_PNG = "sweep.json", "sweep.csv", "sweep.png"
FORMAT_VERSION = 1


# --- I/O: reading runs ---------------------------------------------------------------------------


def read_incarnations(rundir: RunDir) -> list[list[dict]]:
    """The metrics lines of each metrics file (one file per trainer incarnation)."""
    files = []
    for name in rundir.list_dir("metrics"):
        if not name.endswith(".jsonl"):
            continue
        files.append(read_jsonl(rundir.read_text(f"metrics/{name}")))
    return files


def result_of(sweep: SweepSpec, factor: float, state: str, reason: str) -> FactorResult:
    files = read_incarnations(RunDir(sweep.run_dir(factor)))
    return aggregate(
        factor,
        run_name(sweep.name, factor),
        files,
        warmup=sweep.warmup,
        steps=sweep.steps,
        state=state,
        reason=reason,
        trainer=sweep.trainer,
    )


# --- I/O: the sweep directory --------------------------------------------------------------------


def plot_path(sweep: SweepSpec) -> Path:
    """Beside the runs when the sweep directory is local; in ./reslice-sweep-<name>/ for gs://."""
    rd = RunDir(sweep.sweep_dir)
    return (rd.root if rd.root is not None else Path(f"reslice-sweep-{sweep.name}")) / SWEEP_PNG


def write_outputs(sweep: SweepSpec, results: Sequence[FactorResult]) -> tuple[Recommendation, list[str]]:
    """sweep.json, sweep.csv and sweep.png; returns the recommendation and where they went."""
    rec = recommend(results, sweep.max_drop, sweep.factor_key)
    rd = RunDir(sweep.sweep_dir)
    doc = {
        "version": FORMAT_VERSION,
        "sweep": sweep.name,
        "written_at": time.time(),
        "spec": sweep.to_dict(),
        "results": [asdict(r) for r in ordered(results)],
        "recommendation": asdict(rec),
    }
    rd.write_text(SWEEP_JSON, json.dumps(doc, indent=2) + "\n")
    rd.write_text(SWEEP_CSV, to_csv(results))
    png = plot_path(sweep)
    plot_sweep(sweep, results, rec, png)
    return rec, [f"{rd.url}/{SWEEP_JSON}", f"{rd.url}/{SWEEP_CSV}", str(png)]


def load_sweep(sweep_dir: str) -> tuple[SweepSpec, list[FactorResult], Recommendation]:
    text = RunDir(sweep_dir).read_text(SWEEP_JSON)
    if text is None:
        raise UserError(f"no sweep results at {sweep_dir.rstrip('/')}/{SWEEP_JSON} (see `reslice sweep`)")
    try:
        doc = json.loads(text)
        spec = SweepSpec.from_dict(doc["spec"])
        results = [FactorResult(**r) for r in doc["results"]]
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{sweep_dir}/{SWEEP_JSON} is not a sweep file: {e}") from None
    return spec, results, recommend(results, spec.max_drop, spec.factor_key)
