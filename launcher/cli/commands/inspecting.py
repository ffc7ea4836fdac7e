"""`reslice status`, `runs`, `stop` and `report`: read a run's record and run directory, or stop it.
Mounted by `launcher.cli.app`; the tables are `launcher.report.view`'s, the plots `launcher.report.io`'s."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from launcher.cli.options import KubeconfigOpt, NamespaceOpt, console, print_json
from launcher.core import inputs
from launcher.report.view import runs_table


def status(
    run: Annotated[str, typer.Argument(help="The run.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    namespace: NamespaceOpt = "default",
    kubeconfig: KubeconfigOpt = None,
) -> None:
    """State, segments, latest committed checkpoint, restarts by cause and goodput of a run."""
    from launcher.cli.connect import connect
    from launcher.report.io import run_report
    from launcher.report.view import badput_table, segments_table

    inputs.namespace(namespace)
    rec, report, rundir = run_report(connect(kubeconfig, namespace).kube, run)
    committed = rundir.latest_committed_step()
    if as_json:
        print_json({**report.as_dict(), "latest_committed_step": committed, "total_steps": rec.total_steps})
        return
    console.print(f"[bold]{run}[/bold]: {rec.state} — {rec.reason}")
    if report.waiting:  # held back now, by capacity or Kueue: the newest decision says why
        console.print(f"waiting ({report.waiting['wait']}): {report.waiting['reason']}")
    checkpoint = (
        f"latest committed checkpoint: step {committed} of {rec.total_steps or '?'}"
        if committed is not None
        else f"no committed checkpoint yet (target step {rec.total_steps or '?'})"
    )
    console.print(
        f"{checkpoint}; "
        f"restarts: {', '.join(f'{k.replace(chr(95), chr(32))} {v}' for k, v in report.restarts.items())}"
    )
    console.print(segments_table(rec, report))
    console.print(badput_table(report))


def runs(namespace: NamespaceOpt = "default", kubeconfig: KubeconfigOpt = None) -> None:
    """List the runs of the namespace."""
    from launcher.cli.connect import connect

    inputs.namespace(namespace)
    console.print(runs_table(namespace, connect(kubeconfig, namespace).kube.records()))


def stop(
    run: Annotated[str, typer.Argument(help="The run.")],
    namespace: NamespaceOpt = "default",
    kubeconfig: KubeconfigOpt = None,
) -> None:
    """Stop a run: delete its JobSet (the trainer checkpoints), keep its record and run directory."""
    from launcher.cli.connect import connect
    from launcher.controller.launch import stop_run

    inputs.namespace(namespace)
    kube = connect(kubeconfig, namespace).kube
    deleted = stop_run(kube, run)
    console.print(
        f"{run}: stopped; deleted {', '.join(deleted) or 'no JobSet'}; record and run directory kept"
    )


def report(
    run: Annotated[str, typer.Argument(help="The run.")],
    out: Annotated[Path | None, typer.Option("--out", help="Directory for the PNGs.")] = None,
    namespace: NamespaceOpt = "default",
    kubeconfig: KubeconfigOpt = None,
) -> None:
    """Write the plots of a run: loss across segments, and the timeline with its badput."""
    from launcher.cli.connect import connect
    from launcher.report.io import write_plots

    inputs.namespace(namespace)
    if out is not None:
        inputs.directory("--out", out)
    for path in write_plots(connect(kubeconfig, namespace).kube, run, out):
        console.print(str(path))
