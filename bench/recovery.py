"""Recovery breakdown on the embedded cluster with the real trainer and the real controller.

    .venv/bin/python -m bench.recovery [--cycles 3] [--mode both|recreate|in-place] [--json]

Both restart modes by default, one fresh embedded cluster each, and the ratio of their medians of
fault -> first step (in-place / recreate); `--json` prints the medians (`recreate_median_s`,
`inplace_median_s`) and `inplace_over_recreate` as one JSON object on the last line. In place the
breakdown is fault -> the new world recorded -> first step in it (the survivors' pods stay; their
supervisors start the next trainer child), with, from the pods' logs, how late the slowest
survivor saw the world, how long its old trainer took to end after the supervisor's signal
(SIGKILL when the world names the lost slice, else SIGTERM), and the new trainers' start-up from
their fork (the pod's supervisor did the imports once, before its first child); the phase table
follows, as for recreate. "to hand-off" is fault -> the new trainers forked into their world; with both modes the JSON also has its median
(`inplace_handoff_median_s`) and the ratio in place would reach were it zero
(`inplace_startup_over_recreate`: the median of the new trainers' start-up, first step included,
over recreate's median total). Where that is above 0.5 the goal is out of reach on the machine
whatever in place does before its trainers start: recreate's new trainers pay the same. Each fault
comes five steps into a segment (its next checkpoint), as one finds a run in its steady state.

A 2-slice run of the `tiny` MoE config on tpu7x-2x2x2 (GKE multislice needs multi-host slices: 2
hosts of 8 JAX devices per slice, 4 trainer processes) loses one slice (`remove`), the controller
shrinks it to one slice, the slice comes back and the run grows again; repeated. For every shrink it prints, from
the ledger, the run record and the trainer's metrics: fault -> observed -> decided -> old pods gone
-> JobSet submitted -> pods running -> first step on the new shape. The controller-owned part is
what the controller itself spends: noticing the fault, deciding, and submitting once the old pods
are gone (waiting for the trainer to checkpoint and exit is the trainer's; pod start and the first
step are the kubelet's and the trainer's). Goals: controller-owned median <= 1 s, fault -> first step
on the new shape (total) <= 3 s.

"spawned" is from the submit to the start of the last new trainer process and "start-up" from there
to the first step; "trainer cpu %" is the share of the machine's core-seconds from the fault to the
first step that the new trainer processes used (from their start-up lines): near 100 % the total
measures the machine, not waiting. A second table shows, per start-up phase, the median over every
new process of wall and CPU seconds (the line each trainer process prints, trainer/telemetry/startup.py).

The new trainer processes use most of the machine's cores from the fault to the first step, so
the total follows the machine's speed: the reference loop's time is printed beside it. Figures:
docs/measurements.md. The first shrink of a run loads or compiles the one-slice train step
for the first time.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench import machine
from bench._cli import Parser
from contract.words import RestartMode, read_state_source
from launcher.adapters.rundir import RunDir, read_jsonl
from launcher.controller.launch import stop_run
from launcher.core.record import Knobs
from launcher.core.words import Action, LedgerKind, Phase
from tests.e2e.harness import MULTI_HOST, MULTI_HOST_BATCH, Harness, wait_for
from trainer.elastic.follower import world_line
from trainer.telemetry.startup import parse_report

BOTH = "both"  # --mode: every restart mode, recreate first


def first(entries, after: float, pred):
    return next((e["time"] for e in entries if e["time"] >= after and pred(e)), None)


def startup_reports(log_dir: Path, run: str, segment: int) -> list[dict]:
    """The start-up line of every trainer process of a segment (trainer.telemetry.startup), from its pod's log."""
    out = []
    for log in sorted(log_dir.glob(f"*_{run}-{segment}-*/*.log")):
        reports = [r for line in log.read_text(errors="replace").splitlines() if (r := parse_report(line))]
        out += reports[:1]  # a restarted container appends to its log: the first incarnation's
    return out


def first_step(rundir: RunDir, segment: int) -> int | None:
    """The first step `segment` recorded, or None before it has one. The poll reads that segment's
    files only: it shares the 2 cores with the trainers it measures (the record's own time is what
    counts)."""
    prefix = f"{segment:04d}-"
    steps = [
        rec["step"]
        for n in rundir.list_dir("metrics")
        if n.startswith(prefix)
        for rec in read_jsonl(rundir.read_text(f"metrics/{n}"))
    ]
    return min(steps, default=None)


def stepped(rundir: RunDir, segment: int) -> bool:
    """Whether `segment` has recorded a step."""
    return first_step(rundir, segment) is not None


def breakdown(
    ledger: list[dict],
    metrics: list[dict],
    rec,
    fault_t: float,
    segment: int,
    reports: list[dict],
    cores: int = os.cpu_count() or 1,
) -> dict[str, float]:
    ledger = sorted(ledger, key=lambda e: e["time"])
    observed = first(
        ledger,
        fault_t,
        lambda e: (
            e.get("kind") == LedgerKind.OBSERVE
            and (e.get("lost_nodepools") or e.get("phase") != Phase.RUNNING)
        ),
    )
    decided = first(ledger, fault_t, lambda e: e.get("action") == Action.END)
    gone = first(ledger, decided, lambda e: e.get("kind") == LedgerKind.OBSERVE and e.get("pods_alive") == 0)
    submitted = first(
        ledger, decided, lambda e: e.get("action") == Action.START_SEGMENT and e.get("segment") == segment
    )
    first_rec = min((m for m in metrics if m["segment"] == segment), key=lambda m: m["time"])
    step = first_rec["time"]
    gone = gone if gone is not None else submitted
    # The last trainer process the kubelet started (its start-up line; the controller's "Running"
    # is only when it looked).
    spawned = max(r["spawned"] for r in reports)
    return {
        "observed": observed - fault_t,
        "decided": decided - observed,
        "old pods gone": gone - decided,
        "submitted": submitted - gone,
        "spawned": spawned - submitted,
        "start-up": step - spawned,
        "controller-owned": (observed - fault_t) + (decided - observed) + (submitted - gone),
        "total": step - fault_t,
        # The machine's share that the new trainer processes used from the fault to the first
        # step (their CPU seconds from their start-up lines over the window's core-seconds): near
        # 100 % the total is the machine's speed, not waiting.
        "trainer cpu %": 100 * sum(r["phases"]["total"]["cpu"] for r in reports) / (cores * (step - fault_t)),
        # Of "first step", what the trainer's first record says it spent (process 0's view):
        # compiling or loading the train step, waiting for the peers at the start barrier.
        "compile": first_rec.get("perf/compile_seconds") or 0.0,
        "cache hits": first_rec.get("perf/compile_cache_hits") or 0,
        "barrier": first_rec.get("perf/start_barrier_seconds") or 0.0,
        **_restored(first_rec),
    }


def _restored(first_rec: dict) -> dict:
    """Where the new segment's state came from, how long its restore took and what it read of the
    run directory's checkpoints (the trainer's first record)."""
    return {
        "restore": first_rec.get("perf/restore_seconds") or 0.0,
        "storage MB": (first_rec.get("restore/storage_bytes") or 0) / 1e6,
        "from": read_state_source(first_rec) or "-",
    }


def inplace_logs(log_dir: Path, run: str) -> tuple[list[dict], list[dict]]:
    """From every pod of an in-place run: its trainer children's start-up reports (a child after
    the pod's first times its start-up from its fork), and its supervisor's world lines."""
    reports, worlds = [], []
    for log in sorted(log_dir.glob(f"*_{run}-s*/*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if report := parse_report(line):
                reports.append(report)
            elif world := world_line(line):
                worlds.append(world)
    return reports, worlds


def inplace_breakdown(
    ledger: list[dict],
    metrics: list[dict],
    fault_t: float,
    segment: int,
    started: list[dict],
    worlds: list[dict],
) -> dict[str, float | str]:
    """An in-place shrink: fault -> the controller's new world recorded (it then publishes it and
    deletes only the lost slice's JobSet; the survivors' pods stay) -> every survivor's supervisor
    saw it -> the old trainers ended (after SIGKILL when the world says a slice's hosts are gone,
    else SIGTERM and the save) -> the new trainers' start-up (from their fork) -> first step."""
    ledger = sorted(ledger, key=lambda e: e["time"])
    decided = first(
        ledger, fault_t, lambda e: e.get("action") == Action.NEW_WORLD and e.get("segment") == segment
    )
    first_rec = min((m for m in metrics if m["segment"] == segment), key=lambda m: m["time"])
    step = first_rec["time"]
    mine = [w for w in worlds if w["epoch"] == segment]
    ended = [w["ended"] for w in mine if w["ended"] is not None]
    startup = max((r["phases"]["total"]["wall"] for r in started), default=0.0)
    return {
        "decided": decided - fault_t,
        "seen": max((w["seen"] for w in mine), default=0.0),
        "old trainer ended": max(ended, default=0.0),
        "signal": "/".join(sorted({w["signal"] for w in mine if w["signal"]})) or "-",
        "start-up": startup,
        # Fault -> the new trainers forked into their world: noticing the fault, publishing the world,
        # the supervisors seeing it, the old trainers' end. What follows, the new trainers'
        # start-up and first step, recreate pays too.
        "to hand-off": step - fault_t - startup,
        "world -> first step": step - decided,
        "total": step - fault_t,
        **_restored(first_rec),
    }


def run_mode(mode: str, cycles: int, console: Console) -> tuple[list[dict], dict[int, list[dict]]]:
    """`cycles` shrinks (and grows back) of a 2-slice run restarting by `mode`, on a fresh
    embedded cluster: each shrink's breakdown, and (recreate) the new processes' start-up reports."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        h = Harness(Path(tmp), pools=2, preset=MULTI_HOST)
        try:
            knobs = Knobs(unschedulable_grace_s=20, grow_window_s=1, app_backoff_s=1)
            # Never finishes on its own: the single-slice segments would race to the end.
            h.launch(
                "bench", slices=2, steps=1_000_000, interval=5, knobs=knobs, global_batch=MULTI_HOST_BATCH,
                restart_mode=mode,
            )  # fmt: skip
            h.start_controller("bench", resync_s=5.0)
            wait_for(lambda: h.record("bench").segments, 60, "segment 0")
            rundir = h.rundir("bench")
            for cycle in range(cycles):
                seg = len(h.record("bench").segments) - 1
                # Five steps into the segment (the next checkpoint at or after them): a run in its
                # steady state, as a fault finds it. The record's start_step may not be written yet.
                wait_for(functools.partial(stepped, rundir, seg), 180, f"segment {seg}'s first step")
                start = first_step(rundir, seg)
                assert start is not None  # it stepped (above)
                h.wait_step("bench", start - 1 + 5, timeout=300)
                fault_t = time.time()
                h.cluster.remove(h.pool(1))
                wait_for(functools.partial(stepped, rundir, seg + 1), 180, "first step after the shrink")
                rows.append((fault_t, seg + 1))
                h.cluster.restore(h.pool(1))
                wait_for(
                    functools.partial(lambda s: len(h.record("bench").segments) >= s + 3, seg),
                    180,
                    "the grow back",
                )
                # The grown world trains before the next fault: one in its start-up would measure
                # the loss of a world that never formed.
                grown = len(h.record("bench").segments) - 1
                wait_for(functools.partial(stepped, rundir, grown), 180, "first step after the grow")
                console.log(f"{mode}: cycle {cycle + 1}/{cycles} done")
            stop_run(h.kube, "bench")
            rec, ledger, metrics = h.record("bench"), h.rundir("bench").ledger(), h.rundir("bench").metrics()
            log_dir = h.cluster.kubelet.runtime.log_dir
            if mode == RestartMode.RECREATE:
                reports = {s: startup_reports(log_dir, "bench", s) for _, s in rows}
            else:
                every, worlds = inplace_logs(log_dir, "bench")
        finally:
            h.close()
    if mode == RestartMode.RECREATE:
        return [breakdown(ledger, metrics, rec, t, s, reports[s]) for t, s in rows], reports
    # The start-up reports of each shrink's new trainers: started from the fault to its first step.
    steps = {s: min(m["time"] for m in metrics if m["segment"] == s) for _, s in rows}
    reports = {s: [r for r in every if t <= r["spawned"] <= steps[s]] for (t, s) in rows}
    return [inplace_breakdown(ledger, metrics, t, s, reports[s], worlds) for t, s in rows], reports


def table_of(title: str, results: list[dict]) -> Table:
    table = Table(title=title)
    cols = list(results[0])
    table.add_column("shrink")
    for c in cols:
        table.add_column(c, justify="right")

    def cell(c: str, v: float | str) -> str:
        if isinstance(v, str):
            return v
        return f"{v:.0f}" if c.endswith("%") else f"{v:.2f}"

    def median(c: str) -> str:
        values = [r[c] for r in results]
        return "" if isinstance(values[0], str) else cell(c, statistics.median(values))

    for i, r in enumerate(results):
        table.add_row(str(i + 1), *(cell(c, r[c]) for c in cols))
    table.add_row("median", *(median(c) for c in cols), style="bold")
    return table


def main() -> None:
    ap = Parser(prog="python -m bench.recovery")
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument(
        "--mode",
        choices=[BOTH, *(m.value for m in RestartMode)],
        default=BOTH,
        help="restart modes to measure",
    )
    ap.add_argument("--json", action="store_true", help="last line: the medians as one JSON object")
    args = ap.parse_args()
    ap.at_least(args, 1, "cycles")
    console = Console(width=170)
    loop_before = machine.loop_s()
    modes = [m.value for m in RestartMode] if args.mode == BOTH else [args.mode]
    medians: dict[str, float] = {}
    handoff = startup = 0.0  # in place, medians: fault -> hand-off, the new trainers' start-up
    restores: dict[str, list[float]] = {}  # restore seconds by where the state came from
    for mode in modes:
        results, reports = run_mode(mode, args.cycles, console)
        for r in results:
            restores.setdefault(r["from"], []).append(r["restore"])
        console.print(table_of(f"{mode}: recovery after losing a slice (seconds)", results))
        if reports:
            console.print(phase_table(reports, mode))
        medians[mode] = statistics.median(r["total"] for r in results)
        if mode == RestartMode.IN_PLACE:
            handoff = statistics.median(r["to hand-off"] for r in results)
            startup = statistics.median(r["start-up"] for r in results)
        if mode == RestartMode.RECREATE:
            owned = statistics.median(r["controller-owned"] for r in results)
            console.print(f"recreate: controller-owned median {owned:.2f} s (goal <= 1 s)")
    words = "; ".join(f"{m}: fault -> first step median {v:.2f} s" for m, v in medians.items())
    out: dict[str, float] = {f"{m.replace('-', '')}_median_s": v for m, v in medians.items()}
    if len(medians) == 2:
        out["inplace_over_recreate"] = medians["in-place"] / medians["recreate"]
        words += f"; in-place / recreate = {out['inplace_over_recreate']:.2f} (goal <= 0.5)"
        # The lowest ratio in place could reach on this machine were everything before its new
        # trainers' start free: what remains, their start-up and first step, recreate pays too.
        out["inplace_handoff_median_s"] = handoff
        out["inplace_startup_over_recreate"] = startup / medians["recreate"]
        words += (
            f"; in place's fault -> hand-off median {handoff:.2f} s, its new trainers' start-up alone"
            f" over recreate {out['inplace_startup_over_recreate']:.2f}"
        )
    for source, seconds in sorted(restores.items()):
        out[f"restore_{source}_median_s"] = statistics.median(seconds)
    console.print(
        "restore (the new segment's state on its devices): "
        + ", ".join(
            f"from {k} median {statistics.median(v):.3f} s ({len(v)})" for k, v in sorted(restores.items())
        )
        + (
            f"; memory / storage = {out['restore_memory_median_s'] / out['restore_storage_median_s']:.3f}"
            if "restore_memory_median_s" in out and out.get("restore_storage_median_s")
            else ""
        )
    )
    console.print(
        f"{words}; machine: the reference loop took {loop_before:.3f} s before, {machine.loop_s():.3f} s after"
        " (bench/machine.py)"
    )
    if args.json:
        print(json.dumps(out, sort_keys=True))


def phase_table(reports: dict[int, list[dict]], mode: str) -> Table:
    """Per start-up phase, the median over every process of every shrink: wall and CPU seconds
    (on this machine the new segment's processes start together and share its cores). In place,
    a trainer after the pod's first starts its clock at its fork: its imports were done before."""
    every = [r["phases"] for rs in reports.values() for r in rs]
    table = Table(
        title=f"{mode}: trainer start-up per process after a shrink, median of {len(every)} (seconds)"
    )
    table.add_column("phase")
    table.add_column("wall", justify="right")
    table.add_column("cpu", justify="right")
    for phase in dict.fromkeys(p for ph in every for p in ph):
        got = [ph[phase] for ph in every if phase in ph]
        wall, cpu = (statistics.median(g[k] for g in got) for k in ("wall", "cpu"))
        table.add_row(phase, f"{wall:.2f}", f"{cpu:.2f}", style="bold" if phase == "total" else None)
    return table


if __name__ == "__main__":
    main()
