"""Running the controller: attached to one run with a live view, or over every run (in-cluster)."""

from __future__ import annotations

import threading
import time

from rich.console import Console
from rich.live import Live

from launcher.adapters.kube import Kube
from launcher.adapters.rundir import RunDir
from launcher.controller.health import HealthServer, stall_after
from launcher.controller.loop import Controller, PassResult
from launcher.core.errors import UserError
from launcher.report.view import Throttle, live_view


def watch_run(
    kube: Kube,
    run: str,
    *,
    console: Console | None = None,
    live: bool = True,
    stop: threading.Event | None = None,
    resync_s: float = 5.0,
    lease_s: int = 15,
    own_process: bool = False,
) -> str:
    """Reconcile `run` until it ends (or `stop`), showing it live. Returns the final state.
    `own_process`: this process is the controller alone (Controller.own_process)."""
    got = kube.get_record(run)
    if got is None:
        raise UserError(f"no run named {run!r} in namespace {kube.namespace} (see `reslice runs`)")
    rundir = RunDir(got[0].spec.run_dir, got[0].spec.trainer)
    console = console or Console()
    stop = stop or threading.Event()
    controller = Controller(kube, resync_s=resync_s, lease_s=lease_s, own_process=own_process)
    throttle = Throttle(1.0)
    state = {"rec": got[0]}

    def refresh(result: PassResult | None = None) -> None:
        if result is not None and result.decision is not None:
            state["rec"] = result.decision.record
        if display is not None and (
            throttle.ready() or (result and result.decision and result.decision.acts)
        ):
            display.update(
                live_view(
                    state["rec"], rundir.latest_metrics(), rundir.ledger(), rundir.latest_committed_step()
                )
            )

    display = Live(console=console, refresh_per_second=4, transient=False) if live else None
    controller.on_pass = refresh
    loop = threading.Thread(
        target=controller.run_forever, args=(lambda: [run], stop), kwargs={"until_done": True}, daemon=True
    )
    try:
        if display is not None:
            display.start()
        loop.start()
        while loop.is_alive():
            loop.join(timeout=1.0)
            refresh()
    except KeyboardInterrupt:
        console.print(
            f"detached from {run}: it keeps running in the cluster; `reslice watch {run}` re-attaches"
        )
    finally:
        stop.set()
        loop.join(timeout=10)
        controller.release(run)
        if display is not None:
            refresh()
            display.stop()
    final = kube.get_record(run)
    return final[0].state if final else "unknown"


def watch_all(
    kube: Kube,
    stop: threading.Event,
    *,
    resync_s: float = 10.0,
    lease_s: int = 15,
    log=print,
    health_port: int = 0,
    own_process: bool = False,
) -> None:
    """The in-cluster mode: every non-terminal run of the namespace, each owned through its Lease
    so that two replicas never act on one run at once. With `health_port`, /healthz and /readyz
    are served on it (launcher/controller/health.py) for the kubelet's probes."""

    def report(result: PassResult) -> None:
        d = result.decision
        if d is not None and d.acts:
            log(f"{time.strftime('%H:%M:%S')} {result.run}: {d.action}: {d.reason}")

    controller = Controller(kube, resync_s=resync_s, lease_s=lease_s, on_pass=report, own_process=own_process)
    health = None
    if health_port:
        health = HealthServer(health_port, controller.loop_state, stall_after(resync_s)).start()
    log(
        f"reslice controller {controller.identity} watching namespace {kube.namespace}"
        + (f"; /healthz and /readyz on port {health.port}" if health else "")
    )
    try:
        controller.run_forever(controller.live_runs, stop)
    finally:
        if health is not None:
            health.stop()
