"""What a person sees: the live view of a run, the status, runs, presets and shrink-ladder tables.
Rich renderables only; called by the command modules (`launcher.cli.commands.*`), `launcher.cli.watch` and
`launcher.report.io`."""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import datetime

from rich.console import Group
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from launcher.core.accounting import CATEGORIES, LOSS, TOKENS, RunReport, first_state_source
from launcher.core.plan import Plan, Rung
from launcher.core.presets import Preset, Shape
from launcher.core.record import RunRecord
from launcher.core.words import LedgerKind, RunState


def _clock(ts: float | None) -> str:
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S") if ts else "-"


def segments_table(rec: RunRecord, report: RunReport | None = None) -> Table:
    table = Table(title=f"segments of {rec.name}", expand=False)
    for col in (
        "#",
        "shape",
        "devices",
        "micro-batch × accum",
        "steps",
        "start",
        "end",
        "goodput",
        "state source",
        "steps lost",
        "ended because",
    ):
        table.add_column(col, overflow="fold")
    by_index = {s.index: s for s in report.segments} if report else {}
    for seg in rec.segments:
        rs = by_index.get(seg.index)
        steps = f"{rs.first_step}–{rs.last_step}" if rs and rs.first_step is not None else "-"
        good = f"{rs.badput.goodput:.0%}" if rs else "-"
        source = (rs.state_source or first_state_source(seg.index) or "-") if rs else "-"
        redone = str(rs.recomputed_steps) if rs else "-"
        why = seg.end_reason or ("live" if seg.live else "")
        table.add_row(
            str(seg.index),
            f"{seg.preset} x{seg.slices}",
            str(seg.devices),
            f"{seg.micro_batch} × {seg.grad_accum}",
            steps,
            _clock(seg.submitted_at),
            _clock(seg.ended_at),
            good,
            source,
            redone,
            why,
        )
    return table


def badput_table(report: RunReport) -> Table:
    b = report.badput
    table = Table(title=f"goodput {b.goodput:.1%} of {b.wall:.0f}s wall time")
    table.add_column("time")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    rows = [("productive training", b.productive)]
    for name, _, label in CATEGORIES:
        rows.append((label, getattr(b, name)))
        if name == "scheduling":  # a part of scheduling, not a category of its own
            rows.append(("  of which waiting for capacity", b.waiting_for_capacity))
    for name, secs in rows:
        table.add_row(name, f"{secs:.1f}", f"{secs / b.wall:.1%}" if b.wall else "-")
    return table


_VIEW_KINDS = {LedgerKind.ACT, LedgerKind.TAKEOVER, LedgerKind.LAUNCH, LedgerKind.CONFLICT}


def live_view(rec: RunRecord, last: dict | None, ledger: list[dict], committed: int | None) -> Panel:
    seg = rec.current
    head = Text()
    styles: dict[str, str] = {RunState.FINISHED: "bold green", RunState.FAILED: "bold red"}
    style = styles.get(rec.state, "bold cyan")
    head.append(f"{rec.name}  ", style="bold")
    head.append(rec.state, style=style)
    if seg is not None:
        head.append(
            f"  segment {seg.index} on {seg.preset} x{seg.slices}: {seg.devices} devices, "
            f"micro-batch {seg.micro_batch} × {seg.grad_accum} accum = global batch {rec.spec.global_batch}"
        )
    last = last or {}
    step = last.get("step", 0)
    total = rec.total_steps or 0
    progress = Table.grid(padding=(0, 2))
    progress.add_row(
        Text(f"step {step}/{total or '?'}"),
        ProgressBar(total=max(total, 1), completed=min(step, total or 1), width=40),
        Text(f"loss {last[LOSS]:.4f}" if LOSS in last else "loss -"),
        Text(f"{last[TOKENS]:,.0f} tokens/s" if TOKENS in last else ""),
        Text(f"committed {committed}" if committed is not None else "no checkpoint yet"),
    )
    # Actions and the disruptions that caused them, interleaved in the order they happened.
    acts = [(e, e.get("reason") or e["kind"], "") for e in ledger if e.get("kind") in _VIEW_KINDS]
    seen: list[tuple[dict, str, str]] = []
    for e in ledger:  # consecutive observations often carry the same disruptions: say them once
        text = "; ".join((e.get("disruptions") or [])[:3])
        if text and (not seen or seen[-1][1] != text):
            seen.append((e, text, "yellow"))
    events = Table.grid(padding=(0, 1))
    for e, text, style in sorted(acts[-8:] + seen[-2:], key=lambda x: x[0].get("time") or 0):
        events.add_row(Text(_clock(e.get("time")), style="dim"), Text(text, style=style))
    return Panel(
        Group(head, progress, Text(rec.reason, style="italic"), events), title="reslice", expand=True
    )


class Throttle:
    """Call at most once per `interval` seconds (refreshing the view re-reads the run directory)."""

    def __init__(self, interval: float) -> None:
        self.interval, self.last = interval, 0.0

    def ready(self) -> bool:
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            return True
        return False


def presets_table(rows: Iterable[Preset]) -> Table:
    """`reslice presets`: one row per preset, per slice."""
    table = Table(title="reslice presets (per slice)")
    for col in ("preset", "accelerator", "topology", "chips", "hosts", "devices", "peak TFLOP/s/chip"):
        table.add_column(col, justify="right" if col in {"chips", "hosts", "devices"} else "left")
    table.add_column("slices", justify="right")
    table.add_column("spot")
    table.add_column("fallbacks")
    for p in rows:
        table.add_row(
            p.name,
            p.accelerator,
            p.topology,
            str(p.chips),
            str(p.hosts),
            str(p.devices),
            f"{p.peak_tflops_per_chip:g}",
            str(p.slices),
            "yes" if p.spot else "",
            ", ".join(p.fallbacks),
        )
    return table


def ladder_table(shape: Shape, global_batch: int, rungs: Iterable[Rung]) -> Table:
    """`reslice plan`: every shape of the shrink ladder with its batch plan, or why it has none."""
    table = Table(title=f"shrink ladder of {shape} at global batch {global_batch}")
    cols = ("preset", "slices", "chips", "hosts", "devices", "dp ranks", "micro-batch", "grad accum")
    for col in cols:
        table.add_column(col, justify="left" if col == "preset" else "right")
    table.add_column("note")
    for r in rungs:
        s = r.shape
        cells = [s.preset.name, str(s.slices), str(s.chips), str(s.hosts), str(s.devices)]
        if isinstance(r.plan, Plan):
            mem = f"~{r.hbm['total'] / 2**30:.1f} GiB/device" if r.hbm else ""
            table.add_row(*cells, str(r.plan.dp_ranks), str(r.plan.micro_batch), str(r.plan.grad_accum), mem)
        else:
            table.add_row(*cells, "-", "-", "-", f"[dim]{r.plan.reason}[/dim]")
    return table


def runs_table(namespace: str, records: Iterable[RunRecord]) -> Table:
    """`reslice runs`: one row per run record of the namespace."""
    table = Table(title=f"runs in {namespace}")
    for col in ("run", "state", "shape now", "requested", "segments", "global batch", "reason"):
        table.add_column(col, overflow="fold")
    for rec in records:
        seg = rec.current
        table.add_row(
            rec.name,
            rec.state,
            f"{seg.preset} x{seg.slices}" if seg else "-",
            f"{rec.preset} x{rec.slices}",
            str(len(rec.segments)),
            str(rec.spec.global_batch),
            rec.reason,
        )
    return table
