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


class _SweepRun:
    """One invocation of :func:`run_sweep`: the plans, each run's fate (decided before anything
    acts), the runs in flight under the one controller, and the results so far. Each method is one
    step of the sweep; `drive` is its loop."""

    def __init__(
        self,
        kube: Kube,
        sweep: SweepSpec,
        plans: list[FactorRun],
        *,
        console: Console,
        live: bool,
        stop: threading.Event,
        on_start: Callable[[str, str], None] | None,
        on_result: Callable[[FactorResult], None] | None,
        resync_s: float,
        lease_s: int,
    ) -> None:
        self.kube, self.sweep, self.plans, self.console, self.stop = kube, sweep, plans, console, stop
        self.on_start, self.on_result = on_start, on_result
        self.actions: dict[str, str] = {}
        self.records: dict[str, RunRecord | None] = {}
        self.results: dict[str, FactorResult] = {}
        self.unmeasured: dict[str, str] = {}  # run -> why it left the sweep's shape
        self.queue: list[FactorRun] = []
        self.active: list[FactorRun] = []
        self.controller = Controller(kube, resync_s=resync_s, lease_s=lease_s)
        self.controller.on_pass = self.on_pass
        self.changed = threading.Event()
        self.ctl_stop = threading.Event()
        self.loop = threading.Thread(
            target=self.controller.run_forever,
            args=(lambda: [p.run for p in self.active], self.ctl_stop),
            daemon=True,
        )
        self.display = Live(console=console, refresh_per_second=4, transient=True) if live else None
        self.throttle = Throttle(1.0)

    def decide(self) -> None:
        """Decide every run's fate before acting on any: a foreign run of the same name stops
        everything. Runs finished earlier (or whose metrics are gone) get their result now; the
        rest queue, live runs first: they already hold capacity."""
        for p in self.plans:
            got = self.kube.get_record(p.run)
            rec = got[0] if got else None
            if rec is not None and (
                rec.spec.run_dir != p.record.spec.run_dir or rec.spec.overrides != p.record.spec.overrides
            ):
                raise UserError(
                    f"run {p.run} already exists with other settings (run directory {rec.spec.run_dir}); "
                    "choose another --name"
                )
            rd = RunDir(p.record.spec.run_dir, p.record.spec.trainer)
            has_last = any(r.get("step") == self.sweep.steps for f in read_incarnations(rd) for r in f)
            self.actions[p.run] = next_action(rec, rd.status(), has_last, self.sweep.steps)
            self.records[p.run] = rec
        for p in self.plans:
            if self.actions[p.run] == DONE:
                old = self.records[p.run]
                self.results[p.run] = result_of(
                    self.sweep, p.factor, RunState.FINISHED, old.reason if old else "finished earlier"
                )
            elif self.actions[p.run] == MISSING:
                self.results[p.run] = FactorResult(
                    p.factor,
                    p.run,
                    RunState.FINISHED,
                    f"finished, but its metrics are gone from {p.record.spec.run_dir}",
                )
        done = sum(a == DONE for a in self.actions.values())
        if done:
            self.console.print(
                f"sweep {self.sweep.name}: {done} of {len(self.plans)} runs finished earlier; not rerun"
            )
        self.queue = [p for p in self.plans if self.actions[p.run] == ATTACH] + [
            p for p in self.plans if self.actions[p.run] in {LAUNCH, RELAUNCH}
        ]

    def on_pass(self, result: PassResult) -> None:
        """After each pass has acted: a run the controller put on another shape stops at once,
        before its new segment can train."""
        d = result.decision
        why = off_shape(d.record, self.sweep.preset, self.sweep.slices) if d is not None else None
        if why is not None and result.run not in self.unmeasured:
            self.unmeasured[result.run] = why
            stop_run(self.kube, result.run, why)
        self.changed.set()

    def show(self) -> None:
        if self.display is None or not self.throttle.ready():
            return
        panels: list[Any] = [
            Text(f"sweep {self.sweep.name}: {len(self.results)}/{len(self.plans)} runs done", style="bold")
        ]
        for p in self.active:
            got = self.kube.get_record(p.run)
            if got:
                rd = RunDir(p.record.spec.run_dir, p.record.spec.trainer)
                panels.append(live_view(got[0], rd.latest_metrics(), rd.ledger(), rd.latest_committed_step()))
        self.display.update(Group(*panels))

    def start(self, p: FactorRun) -> None:
        action = self.actions[p.run]
        if action == ATTACH:
            old = self.records[p.run]
            assert old is not None  # ATTACH: a record exists (next_action)
            self.console.print(f"{p.run}: attaching (it was left {old.state} by an interrupted sweep)")
        else:
            self.launch(p)
        self.active.append(p)
        self.controller.wake("sweep")
        if self.on_start:  # (run, ATTACH | LAUNCH | RELAUNCH)
            self.on_start(p.run, action)

    def launch(self, p: FactorRun) -> None:
        """Create the run afresh (LAUNCH, or RELAUNCH: the old record goes, its ledger in the run
        directory stays), once its old JobSets and pods are gone."""
        old = self.records[p.run]
        rd = RunDir(p.record.spec.run_dir, p.record.spec.trainer)
        if old is not None:
            rd.log([{"time": time.time(), "kind": LedgerKind.RELAUNCH, "previous_state": old.state,
                     "previous_reason": old.reason, "reason": f"sweep {self.sweep.name} reruns what is missing"}])  # fmt: skip
            self.kube.delete_record(p.run)
        # Its old pods get their grace period (the preset's notice unless the run names one,
        # as the rendered pods have it), then a minute.
        grace = grace_period(p.record.spec, p.record.requested(self.controller.catalog).preset)
        _clear_leftovers(self.kube, p.run, timeout=grace + 60.0)
        create_run(self.kube, replace(p.record, created_at=time.time()))
        what = f"relaunched (was {old.state}: {old.reason})" if old is not None else "launched"
        self.console.print(f"{p.run}: {what}; run directory {p.record.spec.run_dir}")

    def finish(self, p: FactorRun, rec: RunRecord) -> None:
        self.active.remove(p)
        self.controller.release(p.run)
        if p.run in self.unmeasured:  # its metrics, if any, are not all of the sweep's shape
            r = FactorResult(p.factor, p.run, rec.state, self.unmeasured[p.run])
        else:
            r = result_of(self.sweep, p.factor, rec.state, rec.reason)
        self.results[p.run] = r
        if r.measured:
            self.console.print(
                f"{p.run}: {rec.state}: dropped {pct(r.dropped_fraction)}, step {ms(r.step_time_median_s)}"
            )
        else:
            self.console.print(f"{p.run}: {rec.state}: {rec.reason}")
        write_outputs(self.sweep, [self.results[q.run] for q in self.plans if q.run in self.results])
        if self.on_result:
            self.on_result(r)

    def step(self) -> None:
        """Start what the parallelism allows, wait for the controller (or a second), and finish
        the runs that ended."""
        while self.queue and len(self.active) < self.sweep.max_parallel and not self.stop.is_set():
            self.start(self.queue.pop(0))
        self.changed.wait(1.0)
        self.changed.clear()
        for p in list(self.active):
            got = self.kube.get_record(p.run)
            if got is None:
                raise UserError(f"run {p.run}: its record disappeared (deleted by hand?)")
            if got[0].terminal:
                self.finish(p, got[0])
        self.show()

    def drive(self) -> None:
        """Run the queue to its end, or until `stop` (or Ctrl-C); then stop the controller and
        release the runs still live, so that a rerun takes over at once instead of waiting out the lease."""
        if self.queue:
            self.loop.start()
            if self.display is not None:
                self.display.start()
        try:
            while (self.queue or self.active) and not self.stop.is_set():
                self.step()
        except KeyboardInterrupt:
            self.stop.set()
        finally:
            self.ctl_stop.set()
            if self.loop.is_alive():
                self.loop.join(timeout=10)
            for p in self.active:
                self.controller.release(p.run)
            if self.display is not None:
                self.display.stop()

    def outcome(self) -> SweepOutcome:
        """Every factor's result (those not yet started or still live listed, so that the outputs
        say what is missing), the outputs written."""
        interrupted = [p.run for p in self.active]
        for p in self.plans:
            if p.run not in self.results:
                got = self.kube.get_record(p.run)
                state = got[0].state if got else "NotLaunched"
                self.results[p.run] = FactorResult(
                    p.factor, p.run, state, "interrupted: rerun the sweep to finish it"
                )
        final = [self.results[p.run] for p in self.plans]
        recommendation, outputs = write_outputs(self.sweep, final)
        if interrupted or self.stop.is_set():
            self.console.print(
                f"sweep {self.sweep.name} interrupted; {', '.join(interrupted) or 'no run'} left running in the cluster. "
                "Run the same command again to finish only what is missing."
            )
        return SweepOutcome(final, recommendation, outputs, interrupted)


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
    run = _SweepRun(
        kube,
        sweep,
        plan_sweep(sweep, template, knobs),
        console=console or Console(),
        live=live,
        stop=stop or threading.Event(),
        on_start=on_start,
        on_result=on_result,
        resync_s=resync_s,
        lease_s=lease_s,
    )
    run.decide()
    run.drive()
    return run.outcome()
