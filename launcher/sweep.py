"""The ragged-buffer sweep: one ordinary reslice run per MoE receive-buffer factor, side by side.

The buffer factor f sizes each expert shard's all-to-all receive buffer at
``int(local_tokens · top_k · f)`` rows (docs/platform.md §6, ``trainer/moe.py``); f ≤ 0 is dropless. A sweep
launches one run per factor — same config, overrides, seed, data, shape and global batch; only
``moe.ragged_buffer_factor`` differs — and reads back what the trainer measured: its ``moe/*``
metrics (rows dropped and routed, largest load over balanced, buffer rows), step time, tokens/s and
loss. Nothing here recomputes drops from loads: the trainer counts them where they happen.

Layout: ``<sweep_dir>/<sweep>-f<slug>/`` is each run's ordinary run directory; ``sweep.json``,
``sweep.csv`` and ``sweep.png`` lie beside them. Each run is an ordinary run (record, controller,
ledger), so preemption and shrink handling apply to sweeps too.

Pure parts (testable without runs): factor parsing and names and :func:`next_action` here; the
aggregation, the recommendation and their presentation in `launcher/sweep_results.py`. I/O is at
the edges: :func:`run_sweep` (the cluster), :func:`read_incarnations`, :func:`write_outputs` and
:func:`load_sweep` (the sweep directory).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from launcher.controller import Controller
from launcher.errors import UserError
from launcher.kube import Kube
from launcher.launch import create_run, prepare
from launcher.presets import make_shape
from launcher.record import FINISHED, Policy, RunRecord
from launcher.render import DNS1035, LABEL_RUN, RunSpec
from launcher.runs import RunDir, read_jsonl
from launcher.sweep_results import (
    FACTOR_KEY,
    FactorResult,
    Recommendation,
    aggregate,
    factor_label,
    is_dropless,
    ordered,
    pct,
    plot_sweep,
    recommend,
    to_csv,
)
from launcher.view import Throttle, live_view

DEFAULT_FACTORS = "1.0,1.0625,1.125,1.25,1.5,2.0,-1"
# The first steps are not what a run settles into: the router is still near its random init, the
# learning rate is still warming up (10 steps in the named configs) and step 1 includes compilation.
DEFAULT_WARMUP = 10
DEFAULT_MAX_DROP = 0.001  # 0.1 % of routed (token, expert) rows
SWEEP_JSON, SWEEP_CSV, SWEEP_PNG = "sweep.json", "sweep.csv", "sweep.png"
# Keys the sweep sets itself: a --set of one of them would silently break the comparison.
RESERVED = {FACTOR_KEY: "--factors", "train.steps": "--steps", "train.global_batch": "--global-batch"}
FORMAT_VERSION = 1

# next_action() outcomes.
DONE = "done"  # finished with results: read them, touch nothing
ATTACH = "attach"  # still live in the cluster (the sweep was interrupted): control it to the end
LAUNCH = "launch"  # never launched (or its record is gone and it never finished)
RELAUNCH = "relaunch"  # Failed or Stopped: launch again under the same name; it resumes its checkpoint
MISSING = "missing"  # Finished, but its results are gone: rerunning would not bring them back


# --- factors and names ---------------------------------------------------------------------------


def factor_slug(factor: float) -> str:
    """DNS-1035-safe and one-to-one over floats: ``1p0625``, ``2``, ``1em05``, ``dropless``."""
    if is_dropless(factor):
        return "dropless"
    text = repr(factor)
    if text.endswith(".0"):
        text = text[:-2]
    return text.replace(".", "p").replace("-", "m").replace("+", "")


def run_name(sweep: str, factor: float) -> str:
    return f"{sweep}-f{factor_slug(factor)}"


def parse_factors(text: str) -> tuple[float, ...]:
    """``"1.0,1.25,-1"`` -> (1.0, 1.25, -1.0). Every mistake is a UserError naming the culprit."""
    items = [t.strip() for t in text.split(",")]
    if not text.strip():
        raise UserError("--factors is empty: give a comma-separated list such as 1.0,1.25,-1")
    out: list[float] = []
    for item in items:
        if not item:
            raise UserError(f"--factors {text!r}: empty item")
        try:
            value = float(item)
        except ValueError:
            raise UserError(f"--factors: {item!r} is not a number") from None
        if not math.isfinite(value):
            raise UserError(f"--factors: {item!r} is not a finite number")
        out.append(value)
    dropless = [f for f in out if is_dropless(f)]
    if len(dropless) > 1:
        raise UserError(
            f"--factors: {len(dropless)} values ≤ 0 ({text}); any value ≤ 0 means dropless: give one"
        )
    seen: set[float] = set()
    for f in out:
        if f in seen:
            raise UserError(f"--factors: {factor_label(f)} is given twice")
        seen.add(f)
    return tuple(out)


# --- the sweep spec ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepSpec:
    name: str
    sweep_dir: str
    preset: str
    slices: int
    config: str
    factors: tuple[float, ...]
    steps: int
    global_batch: int
    overrides: tuple[str, ...] = ()
    warmup: int = DEFAULT_WARMUP
    max_drop: float = DEFAULT_MAX_DROP
    max_parallel: int = 1

    def run_dir(self, factor: float) -> str:
        return f"{self.sweep_dir.rstrip('/')}/{run_name(self.name, factor)}"

    def run_overrides(self, factor: float) -> tuple[str, ...]:
        # The sweep's own keys come last, so they win over anything the config file says.
        return (*self.overrides, f"train.steps={self.steps}", f"{FACTOR_KEY}={factor!r}")

    def identity(self) -> dict[str, Any]:
        """What every run of the sweep must share for the runs to be comparable (and resumable)."""
        return {
            "preset": self.preset,
            "slices": self.slices,
            "config": self.config,
            "steps": self.steps,
            "global_batch": self.global_batch,
            "overrides": list(self.overrides),
        }

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["factors"], d["overrides"] = list(self.factors), list(self.overrides)
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> SweepSpec:
        known = {f.name for f in fields(SweepSpec)}
        d = {k: v for k, v in d.items() if k in known}
        return SweepSpec(**{**d, "factors": tuple(d["factors"]), "overrides": tuple(d.get("overrides", ()))})


def make_sweep(
    *,
    name: str,
    preset: str,
    slices: int | None,
    config: str,
    factors: str,
    steps: int,
    global_batch: int | None = None,
    overrides: Sequence[str] = (),
    warmup: int = DEFAULT_WARMUP,
    max_drop: float = DEFAULT_MAX_DROP,
    max_parallel: int = 1,
    sweep_dir: str | None = None,
) -> SweepSpec:
    """Validate the command line into a SweepSpec (no I/O). Raises UserError on bad input."""
    if not DNS1035.match(name):
        raise UserError(f"--name {name!r} is not a DNS-1035 label (lowercase letters, digits and '-')")
    parsed = parse_factors(factors)
    if steps < 1:
        raise UserError(f"--steps {steps}: must be positive")
    if warmup < 0:
        raise UserError(f"--warmup {warmup}: must be ≥ 0")
    if steps <= warmup:
        raise UserError(f"--steps {steps} ≤ --warmup {warmup}: no step would be measured")
    if not 0 <= max_drop < 1:
        raise UserError(f"--max-drop {max_drop}: a fraction in [0, 1) (0.001 = 0.1 %)")
    if max_parallel < 1:
        raise UserError(f"--max-parallel {max_parallel}: must be ≥ 1")
    for kv in overrides:
        key = kv.split("=", 1)[0].strip()
        if key in RESERVED:
            raise UserError(f"--set {kv!r}: the sweep sets {key} itself (use {RESERVED[key]})")
    shape = make_shape(preset, slices)
    # Two sequences per device: the smallest batch that gives every device more than one sequence.
    gb = global_batch if global_batch is not None else 2 * shape.devices
    return SweepSpec(
        name=name,
        sweep_dir=default_sweep_dir(name, sweep_dir),
        preset=shape.preset.name,
        slices=shape.slices,
        config=config,
        factors=parsed,
        steps=steps,
        global_batch=gb,
        overrides=tuple(overrides),
        warmup=warmup,
        max_drop=max_drop,
        max_parallel=max_parallel,
    )


@dataclass(frozen=True)
class FactorRun:
    factor: float
    record: RunRecord  # the record a launch writes

    @property
    def run(self) -> str:
        return self.record.name


def plan_sweep(sweep: SweepSpec, template: RunSpec, policy: Policy) -> list[FactorRun]:
    """Every run of the sweep, each planned and checked as `reslice launch` would, before anything
    is created; and the sweep directory must not hold a different sweep. `template` supplies what is
    not the sweep's business (image, namespace, grace period...)."""
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
    for f in sweep.factors:
        spec = replace(
            template,
            run=run_name(sweep.name, f),
            run_dir=sweep.run_dir(f),
            global_batch=sweep.global_batch,
            config=sweep.config,
            overrides=sweep.run_overrides(f),
        )
        rec, _ = prepare(spec, sweep.preset, sweep.slices, policy)
        out.append(FactorRun(f, rec))
    return out


# --- resumability (pure) -------------------------------------------------------------------------


def next_action(record: RunRecord | None, status: dict | None, has_last_step: bool, steps: int) -> str:
    """What a (re)run of the sweep does with one of its runs, from its record and run directory.

    The run directory is the truth about results (a cluster may have lost its records); the record
    is the truth about whether a run is still alive. A run that finished is never rerun.
    """
    finished = bool(status) and status.get("state") == "finished" and int(status.get("step", 0)) >= steps
    if record is not None and not record.terminal:
        return ATTACH  # alive, perhaps even done and not yet noticed: let the controller finish it
    if finished and has_last_step:
        return DONE
    if record is None:
        return LAUNCH
    if record.state == FINISHED:
        return MISSING
    return RELAUNCH  # Failed or Stopped: same name, same run directory, resumes its last checkpoint


# --- I/O: reading runs ---------------------------------------------------------------------------


def read_incarnations(rundir: RunDir) -> list[list[dict]]:
    """The metrics records of each metrics file (one file per trainer incarnation)."""
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
    )


# --- I/O: the sweep directory --------------------------------------------------------------------


def plot_path(sweep: SweepSpec) -> Path:
    """Beside the runs when the sweep directory is local; in ./reslice-sweep-<name>/ for gs://."""
    rd = RunDir(sweep.sweep_dir)
    return (rd.root if rd.root is not None else Path(f"reslice-sweep-{sweep.name}")) / SWEEP_PNG


def write_outputs(sweep: SweepSpec, results: Sequence[FactorResult]) -> tuple[Recommendation, list[str]]:
    """sweep.json, sweep.csv and sweep.png; returns the recommendation and where they went."""
    rec = recommend(results, sweep.max_drop)
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
    return spec, results, recommend(results, spec.max_drop)


def default_sweep_dir(name: str, sweep_dir: str | None) -> str:
    """`--sweep-dir` as given (gs://) or made absolute (local; default ./sweeps/<name>)."""
    if sweep_dir and sweep_dir.startswith("gs://"):
        return sweep_dir.rstrip("/")
    return str(Path(sweep_dir or f"sweeps/{name}").resolve())


# --- the driver ----------------------------------------------------------------------------------


@dataclass
class SweepOutcome:
    results: list[FactorResult]
    recommendation: Recommendation
    outputs: list[str]
    interrupted: list[str]  # runs left live in the cluster (the sweep was stopped)

    @property
    def complete(self) -> bool:
        return not self.interrupted and all(r.state == FINISHED and r.measured for r in self.results)


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
    policy: Policy,
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
    plans = plan_sweep(sweep, template, policy)

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
        rd = RunDir(p.record.spec.run_dir)
        has_last = any(r.get("step") == sweep.steps for f in read_incarnations(rd) for r in f)
        actions[p.run], records[p.run] = next_action(rec, rd.status(), has_last, sweep.steps), rec

    results: dict[str, FactorResult] = {}
    for p in plans:
        if actions[p.run] == DONE:
            old = records[p.run]
            results[p.run] = result_of(sweep, p.factor, FINISHED, old.reason if old else "finished earlier")
        elif actions[p.run] == MISSING:
            results[p.run] = FactorResult(
                p.factor, p.run, FINISHED, f"finished, but its metrics are gone from {p.record.spec.run_dir}"
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
    controller.on_pass = lambda _result: changed.set()
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
                rd = RunDir(p.record.spec.run_dir)
                panels.append(live_view(got[0], rd.latest_metrics(), rd.ledger(), rd.latest_committed_step()))
        display.update(Group(*panels))

    def start(p: FactorRun) -> None:
        action = actions[p.run]
        if action == ATTACH:
            console.print(f"{p.run}: attaching (it was left {records[p.run].state} by an interrupted sweep)")  # type: ignore[union-attr]
        else:
            old = records[p.run]
            rd = RunDir(p.record.spec.run_dir)
            if old is not None:  # RELAUNCH: the old record goes, its ledger in the run directory stays
                rd.log([{"time": time.time(), "kind": "relaunch", "previous_state": old.state,
                         "previous_reason": old.reason, "reason": f"sweep {sweep.name} reruns what is missing"}])  # fmt: skip
                kube.delete_record(p.run)
            _clear_leftovers(kube, p.run, timeout=p.record.spec.grace_period_s + 60.0)
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
        r = result_of(sweep, p.factor, rec.state, rec.reason)
        results[p.run] = r
        if r.measured:
            console.print(
                f"{p.run}: {rec.state}: dropped {pct(r.dropped_fraction)}, step {r.step_time_median_s * 1e3:.1f} ms"
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
    rec, outputs = write_outputs(sweep, final)
    if interrupted or stop.is_set():
        console.print(
            f"sweep {sweep.name} interrupted; {', '.join(interrupted) or 'no run'} left running in the cluster. "
            "Run the same command again to finish only what is missing."
        )
    return SweepOutcome(final, rec, outputs, interrupted)
