"""The ragged-buffer sweep: one ordinary reslice run per MoE receive-buffer factor, side by side.

The buffer factor f sizes each expert shard's all-to-all receive buffer at
``int(local_tokens · top_k · f)`` rows (docs/platform.md §6, ``trainer/model/moe.py``); f ≤ 0 is dropless. A sweep
launches one run per factor — same config, overrides, seed, data, shape and global batch; only
``moe.ragged_buffer_factor`` differs — and reads back what the trainer measured: its ``moe/*``
metrics (rows dropped and routed, largest load over balanced, buffer rows), step time, tokens/s and
loss. Nothing here recomputes drops from loads: the trainer counts them where they happen.

Layout: ``<sweep_dir>/<sweep>-f<slug>/`` is each run's ordinary run directory; ``sweep.json``,
``sweep.csv`` and ``sweep.png`` lie beside them. Each run is an ordinary run (record, controller,
ledger), so preemption handling applies to sweeps too; but a sweep measures every factor on the one
shape it names, so a run the controller puts on another shape (capacity lost, it shrank) is stopped
at once and reported as not measured (`sweep.spec.off_shape`).

This module is the driver, called by `reslice sweep` (`launcher/cli/commands/sweeping.py`): it plans
every run (:func:`plan_sweep`) and runs what is missing under one controller (:func:`run_sweep`).
The pure parts (factors, names, the spec, :func:`next_action`) are in `launcher/sweep/spec.py`; the
aggregation, the recommendation and their presentation in `launcher/sweep/results.py`; the sweep
directory's and the runs' files in `launcher/sweep/files.py`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from launcher.adapters.kube import Kube
from launcher.adapters.rundir import RunDir
from launcher.controller.launch import create_run, prepare, stop_run
from launcher.controller.loop import Controller, PassResult
from launcher.core.errors import UserError
from launcher.core.labels import LABEL_RUN
from launcher.core.record import Knobs, RunRecord
from launcher.core.spec import RunSpec, grace_period
from launcher.core.words import LedgerKind, RunState
from launcher.report.view import Throttle, live_view
from launcher.sweep.files import SWEEP_JSON, read_incarnations, result_of, write_outputs
from launcher.sweep.results import FactorResult, Recommendation, ms, pct
from launcher.sweep.spec import (
    ATTACH,
    DONE,
    LAUNCH,
    MISSING,
    RELAUNCH,
    SweepSpec,
    next_action,
    off_shape,
    run_name,
)


@dataclass(frozen=True)
class FactorRun:
    factor: float
    record: RunRecord  # the record a launch writes

    @property
    def run(self) -> str:
        return self.record.name


def plan_sweep(
    sweep: SweepSpec, template: RunSpec, knobs: Knobs, factors: Sequence[float] | None = None
) -> list[FactorRun]:
    """Every run of the sweep (or those of `factors`), each planned and checked as `reslice launch`
    would, before anything is created; and the sweep directory must not hold a different sweep.
    `template` supplies what is not the sweep's business (image, namespace, grace period...)."""
    stored = RunDir(sweep.sweep_dir).read_text(SWEEP_JSON)
    if stored is not None:
        try:
            old = SweepSpec.from_dict(json.loads(stored)["spec"])
        except (ValueError, KeyError, TypeError) as e:
            raise UserError(
                f"{sweep.sweep_dir}/{SWEEP_JSON} is not a sweep file ({e}); choose another --sweep-dir"
            ) from None
        if old.name != sweep.name or old.identity() != sweep.identity():
            diff = {k: v for k, v in old.identity().items() if sweep.identity()[k] != v}
            if old.name != sweep.name:
                diff["name"] = old.name
            raise UserError(
                f"{sweep.sweep_dir} holds sweep {old.name!r} with different settings "
                f"({', '.join(f'{k}={v}' for k, v in diff.items())}); choose another --name or --sweep-dir"
            )
    out = []
    for f in sweep.factors if factors is None else factors:
        spec = replace(
            template,
            run=run_name(sweep.name, f),
            run_dir=sweep.run_dir(f),
            global_batch=sweep.global_batch,
            config=sweep.config,
            overrides=sweep.run_overrides(f),
        )
        rec, _ = prepare(spec, sweep.preset, sweep.slices, knobs)
        out.append(FactorRun(f, rec))
    return out


# --- the driver ----------------------------------------------------------------------------------


@dataclass
class SweepOutcome:
    results: list[FactorResult]
    recommendation: Recommendation
    outputs: list[str]
    interrupted: list[str]  # runs left live in the cluster (the sweep was stopped)

    @property
    def complete(self) -> bool:
        return not self.interrupted and all(r.state == RunState.FINISHED and r.measured for r in self.results)


def _clear_leftovers(kube: Kube, run: str, timeout: float) -> None:
    """Delete the run's JobSets and wait for its pods to go: a relaunch reuses JobSet name
    `<run>-0`, and the controller must not mistake an old JobSet or pod for the new segment's."""
    for js in kube.jobsets(run):
        kube.delete_jobset(js["metadata"]["name"])
    deadline = time.monotonic() + timeout
    while kube.jobsets(run) or kube.pods(f"{LABEL_RUN}={run}"):
        if time.monotonic() > deadline:
            raise UserError(f"run {run}: its old JobSet or pods are still there after {timeout:.0f}s")
        time.sleep(0.2)


def run_sweep(
    kube: Kube,
    sweep: SweepSpec,
    template: RunSpec,
    knobs: Knobs,
    *,
    console: Console | None = None,
    live: bool = True,
    stop: threading.Event | None = None,
    on_start: Callable[[str, str], None] | None = None,
    on_result: Callable[[FactorResult], None] | None = None,
    resync_s: float = 5.0,
    lease_s: int = 15,
) -> SweepOutcome:
    """Run what is missing of the sweep, up to `sweep.max_parallel` runs at once, under one
    controller; write sweep.json/csv/png after every run that ends. `stop` (or Ctrl-C) detaches:
    live runs keep going in the cluster and the next invocation attaches to them."""
    console = console or Console()
    stop = stop or threading.Event()
    plans = plan_sweep(sweep, template, knobs)

    # Decide every run's fate before acting on any: a foreign run of the same name stops everything.
    actions: dict[str, str] = {}
    records: dict[str, RunRecord | None] = {}
    for p in plans:
        got = kube.get_record(p.run)
        rec = got[0] if got else None
        if rec is not None and (
            rec.spec.run_dir != p.record.spec.run_dir or rec.spec.overrides != p.record.spec.overrides
        ):
            raise UserError(
                f"run {p.run} already exists with other settings (run directory {rec.spec.run_dir}); "
                "choose another --name"
            )
        rd = RunDir(p.record.spec.run_dir, p.record.spec.trainer)
        has_last = any(r.get("step") == sweep.steps for f in read_incarnations(rd) for r in f)
        actions[p.run], records[p.run] = next_action(rec, rd.status(), has_last, sweep.steps), rec

    results: dict[str, FactorResult] = {}
    for p in plans:
        if actions[p.run] == DONE:
            old = records[p.run]
            results[p.run] = result_of(
                sweep, p.factor, RunState.FINISHED, old.reason if old else "finished earlier"
            )
        elif actions[p.run] == MISSING:
            results[p.run] = FactorResult(
                p.factor,
                p.run,
                RunState.FINISHED,
                f"finished, but its metrics are gone from {p.record.spec.run_dir}",
            )
    done = sum(a == DONE for a in actions.values())
    if done:
        console.print(f"sweep {sweep.name}: {done} of {len(plans)} runs finished earlier; not rerun")

    # Live runs first: they already hold capacity.
    queue = [p for p in plans if actions[p.run] == ATTACH] + [
        p for p in plans if actions[p.run] in {LAUNCH, RELAUNCH}
    ]
    active: list[FactorRun] = []
    controller = Controller(kube, resync_s=resync_s, lease_s=lease_s)
    changed = threading.Event()
    unmeasured: dict[str, str] = {}  # run -> why it left the sweep's shape

    def on_pass(result: PassResult) -> None:
        """After each pass has acted: a run the controller put on another shape stops at once,
        before its new segment can train."""
        d = result.decision
        why = off_shape(d.record, sweep.preset, sweep.slices) if d is not None else None
        if why is not None and result.run not in unmeasured:
            unmeasured[result.run] = why
            stop_run(kube, result.run, why)
        changed.set()

    controller.on_pass = on_pass
    ctl_stop = threading.Event()
    loop = threading.Thread(
        target=controller.run_forever, args=(lambda: [p.run for p in active], ctl_stop), daemon=True
    )
    display = Live(console=console, refresh_per_second=4, transient=True) if live else None
    throttle = Throttle(1.0)

    def show() -> None:
        if display is None or not throttle.ready():
            return
        panels: list[Any] = [Text(f"sweep {sweep.name}: {len(results)}/{len(plans)} runs done", style="bold")]
        for p in active:
            got = kube.get_record(p.run)
            if got:
                rd = RunDir(p.record.spec.run_dir, p.record.spec.trainer)
                panels.append(live_view(got[0], rd.latest_metrics(), rd.ledger(), rd.latest_committed_step()))
        display.update(Group(*panels))

    def start(p: FactorRun) -> None:
        action = actions[p.run]
        if action == ATTACH:
            console.print(f"{p.run}: attaching (it was left {records[p.run].state} by an interrupted sweep)")  # type: ignore[union-attr]  # ATTACH: a record exists (next_action)
        else:
            old = records[p.run]
            rd = RunDir(p.record.spec.run_dir, p.record.spec.trainer)
            if old is not None:  # RELAUNCH: the old record goes, its ledger in the run directory stays
                rd.log([{"time": time.time(), "kind": LedgerKind.RELAUNCH, "previous_state": old.state,
                         "previous_reason": old.reason, "reason": f"sweep {sweep.name} reruns what is missing"}])  # fmt: skip
                kube.delete_record(p.run)
            # Its old pods get their grace period (the preset's notice unless the run names one,
            # as the rendered pods have it), then a minute.
            grace = grace_period(p.record.spec, p.record.requested(controller.catalog).preset)
            _clear_leftovers(kube, p.run, timeout=grace + 60.0)
            create_run(kube, replace(p.record, created_at=time.time()))
            what = f"relaunched (was {old.state}: {old.reason})" if old is not None else "launched"
            console.print(f"{p.run}: {what}; run directory {p.record.spec.run_dir}")
        active.append(p)
        controller.wake("sweep")
        if on_start:  # (run, ATTACH | LAUNCH | RELAUNCH)
            on_start(p.run, action)

    def finish(p: FactorRun, rec: RunRecord) -> None:
        active.remove(p)
        controller.release(p.run)
        if p.run in unmeasured:  # its metrics, if any, are not all of the sweep's shape
            r = FactorResult(p.factor, p.run, rec.state, unmeasured[p.run])
        else:
            r = result_of(sweep, p.factor, rec.state, rec.reason)
        results[p.run] = r
        if r.measured:
            console.print(
                f"{p.run}: {rec.state}: dropped {pct(r.dropped_fraction)}, step {ms(r.step_time_median_s)}"
            )
        else:
            console.print(f"{p.run}: {rec.state}: {rec.reason}")
        write_outputs(sweep, [results[q.run] for q in plans if q.run in results])
        if on_result:
            on_result(r)

    if queue:
        loop.start()
        if display is not None:
            display.start()
    try:
        while (queue or active) and not stop.is_set():
            while queue and len(active) < sweep.max_parallel and not stop.is_set():
                start(queue.pop(0))
            changed.wait(1.0)
            changed.clear()
            for p in list(active):
                got = kube.get_record(p.run)
                if got is None:
                    raise UserError(f"run {p.run}: its record disappeared (deleted by hand?)")
                if got[0].terminal:
                    finish(p, got[0])
            show()
    except KeyboardInterrupt:
        stop.set()
    finally:
        ctl_stop.set()
        if loop.is_alive():
            loop.join(timeout=10)
        for p in active:
            controller.release(p.run)  # a rerun takes over at once instead of waiting out the lease
        if display is not None:
            display.stop()
    interrupted = [p.run for p in active]
    for p in plans:  # not yet started or still live: listed, so the outputs say what is missing
        if p.run not in results:
            got = kube.get_record(p.run)
            state = got[0].state if got else "NotLaunched"
            results[p.run] = FactorResult(p.factor, p.run, state, "interrupted: rerun the sweep to finish it")
    final = [results[p.run] for p in plans]
    recommendation, outputs = write_outputs(sweep, final)
    if interrupted or stop.is_set():
        console.print(
            f"sweep {sweep.name} interrupted; {', '.join(interrupted) or 'no run'} left running in the cluster. "
            "Run the same command again to finish only what is missing."
        )
    return SweepOutcome(final, recommendation, outputs, interrupted)
