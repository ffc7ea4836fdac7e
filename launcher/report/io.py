"""The report's I/O: reads a run back (its record from the cluster, its metrics and ledger from the
run directory), builds its report (launcher/core/accounting.py, pure), writes its plots
(launcher/report/plots.py) and prints its summary. Called by `reslice status`, `report`, `launch`
and `demo` (launcher/cli/commands/inspecting.py and launching.py, launcher/cli/demo.py)."""

from __future__ import annotations

import time
from pathlib import Path

from launcher.adapters.kube import Kube
from launcher.adapters.rundir import RunDir
from launcher.core.accounting import RunReport, build_report
from launcher.core.errors import UserError
from launcher.core.record import RunRecord
from launcher.report.plots import plot_loss, plot_timeline


def run_report(kube: Kube, run: str) -> tuple[RunRecord, RunReport, RunDir]:
    got = kube.get_record(run)
    if got is None:
        raise UserError(f"no run named {run!r} in namespace {kube.namespace} (see `reslice runs`)")
    rec = got[0]
    rundir = RunDir(rec.spec.run_dir, rec.spec.trainer)
    return rec, build_report(rec, rundir.metrics(), rundir.ledger(), time.time()), rundir


def write_plots(kube: Kube, run: str, out: Path | None = None) -> list[Path]:
    """loss.png and timeline.png, in `out` (default: the run directory's report/ when local)."""
    _, report, rundir = run_report(kube, run)
    if out is None:
        out = (rundir.root / "report") if rundir.root is not None else Path(f"reslice-report-{run}")
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "loss.png", out / "timeline.png"]
    plot_loss(report, rundir.metrics(), str(paths[0]))
    plot_timeline(report, str(paths[1]))
    return paths


def summarize(kube: Kube, run: str, console) -> list[Path]:
    """Print the segment table and the goodput of a run, and write its plots."""
    from launcher.report.view import badput_table, segments_table

    rec, report, _ = run_report(kube, run)
    console.print(segments_table(rec, report))
    console.print(badput_table(report))
    paths = write_plots(kube, run)
    console.print(f"{run}: {rec.state} — {rec.reason}. Plots: {', '.join(map(str, paths))}")
    return paths
