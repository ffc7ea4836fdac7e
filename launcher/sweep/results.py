"""The results of a ragged-buffer sweep: per-factor aggregation of the trainer's own metrics, the
recommendation, and their presentation (rich table, CSV, PNG). Pure but for `plot_sweep`, which
writes its PNG; `launcher/sweep/driver.py` runs the sweep, `launcher/sweep/files.py` reads and writes its files;
both call this, as `reslice sweep-report` does (`launcher/cli/commands/sweeping.py`).
"""

from __future__ import annotations

import csv
import io
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from rich.console import JustifyMethod
from rich.table import Table

from launcher.core.words import DropUnit, RunState, TrainerProfile
from launcher.sweep.spec import FACTOR_KEY, SweepSpec, factor_label, is_dropless, sort_key

# --- aggregation (pure) --------------------------------------------------------------------------


@dataclass(frozen=True)
class FactorResult:
    """One factor's numbers, aggregated over the measured steps (those after the warm-up)."""

    factor: float
    run: str
    state: str
    reason: str = ""
    steps: int = 0  # the run's configured steps
    measured_steps: int = 0
    buffer_rows: int | None = None  # moe/buffer_rows of the last measured step
    dropped_rows: int = 0  # Σ moe/dropped_rows over the measured steps
    total_rows: int = 0  # Σ moe/total_rows
    dropped_fraction: float | None = None  # dropped_rows / total_rows
    worst_layer: int | None = None
    worst_layer_dropped_fraction: float | None = None  # per layer Σ dropped / Σ total, the largest
    max_load_mean: float | None = None  # moe/max_load_over_balanced, mean over measured steps
    max_load_max: float | None = None
    step_time_median_s: float | None = None
    step_time_mean_s: float | None = None
    tokens_per_sec: float | None = None  # median of perf/tokens_per_sec
    loss_final: float | None = None  # learning/loss of the last step
    loss_mean: float | None = None
    # MaxText (`--trainer maxtext`) counts no rows: it logs, per step and MoE layer, the smallest
    # factor that would not have dropped (REQUIRED_RBF). There `dropped_rows`/`total_rows` count
    # (step, layer) pairs whose buffer overflowed / all of them: `drop_unit` says which.
    drop_unit: str = DropUnit.ROWS
    required_factor_max: float | None = None  # MaxText: the largest REQUIRED_RBF over measured steps

    @property
    def dropless(self) -> bool:
        return is_dropless(self.factor)

    @property
    def measured(self) -> bool:
        return self.measured_steps > 0 and self.dropped_fraction is not None

    @property
    def label(self) -> str:
        return factor_label(self.factor)


def kept_records(files: Sequence[Sequence[dict]]) -> dict[int, tuple[dict, bool]]:
    """step -> (the computation the run kept: the last one, whether it was its trainer's first step).

    ``files`` holds one list per metrics file, i.e. per trainer incarnation. A step recomputed after
    a resume counts once. The first step of each incarnation includes start-up and compilation (the
    trainer times it from the loop's start), so it never counts as a step time.
    """
    tagged = []
    for recs in files:
        ordered = sorted(recs, key=lambda r: (r.get("time", 0.0), r.get("step", 0)))
        tagged += [(r, i == 0) for i, r in enumerate(ordered)]
    tagged.sort(key=lambda t: (t[0].get("time", 0.0), t[0].get("step", 0)))
    kept: dict[int, tuple[dict, bool]] = {}
    for rec, first in tagged:
        kept[int(rec["step"])] = (rec, first)
    return kept


def aggregate(
    factor: float,
    run: str,
    files: Sequence[Sequence[dict]],
    *,
    warmup: int,
    steps: int,
    state: str = RunState.FINISHED,
    reason: str = "",
    trainer: str = TrainerProfile.RESLICE,
) -> FactorResult:
    """The trainer's own metrics (docs/contract.md), summed or averaged over the steps after
    `warmup`. Drops are the trainer's ``moe/dropped_rows`` over ``moe/total_rows`` (and per layer
    from ``moe/layers``): counted where rows are dropped, never inferred from loads. A MaxText
    sweep (`trainer="maxtext"`) reads MaxText's probes instead (`_maxtext_result`)."""
    kept = kept_records(files)
    measured = [kept[s] for s in sorted(kept) if s > warmup]
    base = FactorResult(factor=factor, run=run, state=state, reason=reason, steps=steps)
    if not measured:
        return replace(base, reason=reason or f"no metrics after step {warmup}")
    recs = [r for r, _ in measured]
    timed = [r for r, first in measured if not first] or recs  # a 1-step incarnation: keep what exists
    if trainer == TrainerProfile.MAXTEXT:
        return _maxtext_result(base, kept, recs, timed, steps)
    dropped = sum(int(r["moe/dropped_rows"]) for r in recs)
    total = sum(int(r["moe/total_rows"]) for r in recs)
    worst, worst_frac = None, None
    n_layers = len(recs[0].get("moe/layers") or [])
    if n_layers and all(len(r.get("moe/layers") or []) == n_layers for r in recs):
        per_layer = []
        for i in range(n_layers):
            d = sum(int(r["moe/layers"][i]["dropped_rows"]) for r in recs)
            t = sum(int(r["moe/layers"][i]["total_rows"]) for r in recs)
            per_layer.append(d / t if t else 0.0)
        worst = max(range(n_layers), key=lambda i: per_layer[i])
        worst_frac = per_layer[worst]
    loads = [float(r["moe/max_load_over_balanced"]) for r in recs]
    step_times = [float(r["perf/step_time_seconds"]) for r in timed]
    last_step = max(kept)
    return replace(
        base,
        measured_steps=len(recs),
        buffer_rows=int(recs[-1]["moe/buffer_rows"]),
        dropped_rows=dropped,
        total_rows=total,
        dropped_fraction=dropped / total if total else None,
        worst_layer=worst,
        worst_layer_dropped_fraction=worst_frac,
        max_load_mean=statistics.fmean(loads),
        max_load_max=max(loads),
        step_time_median_s=statistics.median(step_times),
        step_time_mean_s=statistics.fmean(step_times),
        tokens_per_sec=statistics.median(float(r["perf/tokens_per_sec"]) for r in timed),
        loss_final=float(kept[last_step][0]["learning/loss"]) if last_step >= steps else None,
        loss_mean=statistics.fmean(float(r["learning/loss"]) for r in recs),
    )


def _maxtext_result(
    base: FactorResult, kept: dict[int, tuple[dict, bool]], recs: list[dict], timed: list[dict], steps: int
) -> FactorResult:
    """MaxText's overflow, from its own probes (docs/maxtext.md, The sweep): a (step, MoE layer)
    overflowed when the layer's REQUIRED_RBF — the largest expert shard's load over the balanced
    load, which MaxText's buffer holds `factor` times — exceeds the factor (never when dropless).
    Load over balanced is `learning/moe_max_load_ratio` (max over layers), per step. MaxText logs no
    row counts, so the dropped fraction is of layer-steps, not of rows. A record without the probe
    (MaxText did not log it) makes the run unmeasured rather than counted as dropless."""
    factor = base.factor
    probed = [r for r in recs if r.get("moe/required_buffer_factor_layers")]
    if len(probed) < len(recs):
        return replace(
            base, reason=base.reason or f"{len(recs) - len(probed)} steps without MaxText's REQUIRED_RBF"
        )
    layers = [list(map(float, r["moe/required_buffer_factor_layers"])) for r in recs]
    n = min(len(ls) for ls in layers)
    over = [[not is_dropless(factor) and ls[i] > factor for i in range(n)] for ls in layers]
    per_layer = [sum(o[i] for o in over) / len(over) for i in range(n)]
    worst = max(range(n), key=lambda i: per_layer[i]) if n else None
    loads = [
        float(r["moe/max_load_over_balanced"])
        for r in recs
        if r.get("moe/max_load_over_balanced") is not None
    ]
    loads = loads or [
        max(ls) for ls in layers
    ]  # without moe_log_max_load_ratio: the same ratio, from the probe
    step_times = [float(r["perf/step_time_seconds"]) for r in timed]
    tokens = [float(r["perf/tokens_per_sec"]) for r in timed if r.get("perf/tokens_per_sec") is not None]
    last_step = max(kept)
    dropped, total = sum(map(sum, over)), n * len(over)
    return replace(
        base,
        measured_steps=len(recs),
        dropped_rows=dropped,
        total_rows=total,
        dropped_fraction=dropped / total if total else None,
        worst_layer=worst,
        worst_layer_dropped_fraction=per_layer[worst] if worst is not None else None,
        max_load_mean=statistics.fmean(loads),
        max_load_max=max(loads),
        step_time_median_s=statistics.median(step_times),
        step_time_mean_s=statistics.fmean(step_times),
        tokens_per_sec=statistics.median(tokens) if tokens else None,
        loss_final=float(kept[last_step][0]["learning/loss"]) if last_step >= steps else None,
        loss_mean=statistics.fmean(float(r["learning/loss"]) for r in recs),
        drop_unit=DropUnit.LAYER_STEPS,
        required_factor_max=max(max(ls) for ls in layers),
    )


@dataclass(frozen=True)
class Recommendation:
    factor: float | None
    max_drop: float
    dropped_fraction: float | None = None
    step_time_s: float | None = None
    dropless_step_time_s: float | None = None
    saving: float | None = None  # fraction of the dropless step time saved
    message: str = ""


def pct(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f} %"


def ms(seconds: float | None) -> str:
    return "- ms" if seconds is None else f"{seconds * 1e3:.1f} ms"


def _ms_or_nan(r: FactorResult) -> float:
    """A result's median step time in ms for a plot (NaN, a gap, when it has none)."""
    return r.step_time_median_s * 1e3 if r.step_time_median_s is not None else float("nan")


def recommend(results: Sequence[FactorResult], max_drop: float, key: str = FACTOR_KEY) -> Recommendation:
    """The smallest factor whose dropped fraction is at most `max_drop`, with every larger finite
    factor of the sweep also at most `max_drop` (on a non-increasing curve that is simply the
    smallest qualifying factor; on a noisy one it does not pick a factor that a larger one
    contradicts); dropless when none qualifies. Saving = 1 − its step time / dropless step time.
    `key`: the factor's name in the profile's config (`SweepSpec.factor_key`)."""
    done = [r for r in results if r.state == RunState.FINISHED and r.measured]
    finite = sorted((r for r in done if not r.dropless), key=lambda r: r.factor)
    dropless = next((r for r in done if r.dropless), None)
    choice = None
    for r in reversed(finite):
        if r.dropped_fraction is not None and r.dropped_fraction <= max_drop:
            choice = r
        else:
            break
    if not done:
        return Recommendation(None, max_drop, message="no finished run to recommend from")
    if choice is None and dropless is None:
        return Recommendation(
            None,
            max_drop,
            message=f"no finished factor keeps drops ≤ {pct(max_drop, 2)}, and no dropless run finished",
        )
    ref = dropless.step_time_median_s if dropless else None
    if choice is None:
        assert dropless is not None
        return Recommendation(
            dropless.factor, max_drop, 0.0, ref, ref, 0.0,
            f"no finite factor keeps drops ≤ {pct(max_drop, 2)}: use dropless ({key} ≤ 0)",
        )  # fmt: skip
    t = choice.step_time_median_s
    saving = 1 - t / ref if ref and t is not None else None
    what = "of layer-steps overflowed" if choice.drop_unit == DropUnit.LAYER_STEPS else "of rows dropped"
    msg = f"recommended {key}={choice.label}: {pct(choice.dropped_fraction)} {what} (≤ {pct(max_drop, 2)})"
    if saving is not None and t is not None and ref is not None:
        msg += f"; step time {t * 1e3:.1f} ms vs {ref * 1e3:.1f} ms dropless: {pct(saving, 1)} saved"
    else:
        msg += "; no dropless run to compare step time with"
    return Recommendation(choice.factor, max_drop, choice.dropped_fraction, t, ref, saving, msg)


def ordered(results: Sequence[FactorResult]) -> list[FactorResult]:
    return sorted(results, key=lambda r: sort_key(r.factor))


CSV_FIELDS = [f.name for f in fields(FactorResult)]


def to_csv(results: Sequence[FactorResult]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=["label", *CSV_FIELDS], lineterminator="\n")
    w.writeheader()
    for r in ordered(results):
        w.writerow({"label": r.label, **{k: "" if v is None else v for k, v in asdict(r).items()}})
    return buf.getvalue()


# --- presentation --------------------------------------------------------------------------------


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def sweep_table(sweep: SweepSpec, results: Sequence[FactorResult], rec: Recommendation) -> Table:
    maxtext = sweep.trainer == TrainerProfile.MAXTEXT
    table = Table(
        title=f"ragged-buffer sweep {sweep.name}: {'MaxText ' if maxtext else ''}{sweep.config} on {sweep.preset} "
        f"x{sweep.slices}, global batch {sweep.global_batch}, steps {sweep.warmup + 1}–{sweep.steps} measured",
        caption=rec.message,
    )
    cols: list[tuple[str, JustifyMethod]] = [
        ("factor", "left"), ("required f max" if maxtext else "buffer rows", "right"),
        ("overflowed layer-steps" if maxtext else "dropped", "right"), ("worst layer", "right"),
        ("load/bal mean", "right"), ("load/bal max", "right"), ("step ms", "right"),
        ("tokens/s", "right"), ("loss final", "right"), ("loss mean", "right"), ("", "left"),
    ]  # fmt: skip
    for name, justify in cols:
        table.add_column(name, justify=justify)
    for r in ordered(results):
        chosen = rec.factor is not None and r.factor == rec.factor
        note = (
            "◀ recommended" if chosen else ("" if r.state == RunState.FINISHED else f"{r.state}: {r.reason}")
        )
        table.add_row(
            r.label,
            _num(r.required_factor_max, ".4f") if maxtext else _num(r.buffer_rows, "d"),
            pct(r.dropped_fraction),
            pct(r.worst_layer_dropped_fraction),
            _num(r.max_load_mean, ".3f"),
            _num(r.max_load_max, ".3f"),
            _num(r.step_time_median_s and r.step_time_median_s * 1e3, ".1f"),
            _num(r.tokens_per_sec, ",.0f"),
            _num(r.loss_final, ".4f"),
            _num(r.loss_mean, ".4f"),
            note,
            style="bold green" if chosen else ("red" if r.state != RunState.FINISHED else None),
        )
    return table


def plot_sweep(sweep: SweepSpec, results: Sequence[FactorResult], rec: Recommendation, path: Path) -> None:
    """Dropped fraction (total and worst layer) and step time against factor. The x axis is
    categorical — the factors are few and unevenly spaced, and dropless has no number — with
    dropless drawn last as a distinct red diamond and its step time as a dashed reference line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = [r for r in ordered(results) if r.measured]
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), dpi=110, sharex=True)
    xs = list(range(len(rs)))
    finite = [(x, r) for x, r in zip(xs, rs, strict=True) if not r.dropless]
    drop = [(x, r) for x, r in zip(xs, rs, strict=True) if r.dropless]
    if finite:
        fx = [x for x, _ in finite]
        top.plot(fx, [100 * (r.dropped_fraction or 0) for _, r in finite], "o-", label="dropped, all layers")
        top.plot(fx, [100 * (r.worst_layer_dropped_fraction or 0) for _, r in finite], "s--", ms=4,
                 label="dropped, worst layer")  # fmt: skip
        bottom.plot(fx, [_ms_or_nan(r) for _, r in finite], "o-", label="median step time")
    for x, r in drop:
        top.plot([x], [100 * (r.dropped_fraction or 0)], "D", color="tab:red", ms=8, label="dropless")
        bottom.plot([x], [_ms_or_nan(r)], "D", color="tab:red", ms=8, label="dropless")
        bottom.axhline(_ms_or_nan(r), color="tab:red", ls="--", lw=0.8)
    top.axhline(
        100 * sweep.max_drop, color="grey", ls=":", lw=1, label=f"--max-drop {pct(sweep.max_drop, 2)}"
    )
    for x, r in zip(xs, rs, strict=True):
        if rec.factor is not None and r.factor == rec.factor:
            for ax in (top, bottom):
                ax.axvspan(x - 0.3, x + 0.3, color="tab:green", alpha=0.15)
    top.set_ylabel(
        "overflowed layer-steps (%)" if sweep.trainer == TrainerProfile.MAXTEXT else "dropped rows (%)"
    )
    top.set_title(
        f"{sweep.name}: {sweep.config} on {sweep.preset} x{sweep.slices}, steps {sweep.warmup + 1}–{sweep.steps}"
    )
    bottom.set_ylabel("step time (ms)")
    bottom.set_ylim(bottom=0)  # from zero: small step-time differences should look small
    bottom.set_xlabel(f"{sweep.factor_key} (green: recommended)")
    bottom.set_xticks(xs, [r.label for r in rs])
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
