"""The plots of a run's report: loss across segments, and the segments on a time axis with their
badput. Called by launcher/report/io.py (`reslice report`); the accounting they draw is launcher/core/accounting.py.
"""

from __future__ import annotations

from launcher.core.accounting import CATEGORIES, LOSS, RunReport
from launcher.core.words import EndKind

COLOURS = {
    "productive": "#2ca02c",
    "scheduling": "#ff7f0e",
    "startup": "#7f7f7f",
    "compilation": "#8c564b",
    "restore": "#17becf",
    "data_loading": "#bcbd22",
    "recomputed": "#d62728",
    "checkpointing": "#9467bd",
    "evaluation": "#e377c2",
}
LABELS = {"productive": "productive training", **{name: label for name, _, label in CATEGORIES}}


def plot_loss(report: RunReport, metrics: list[dict], path: str) -> None:
    """Loss against step across segments, each segment its own colour, shape changes marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ordered = sorted(metrics, key=lambda m: m.get("time", 0.0))
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    cmap = plt.get_cmap("tab10")
    for k, seg in enumerate(report.segments):
        pts = [
            (m["step"], m[LOSS]) for j, m in enumerate(ordered) if m.get("segment") == seg.index and LOSS in m
        ]
        if not pts:
            continue
        pts.sort()
        ax.plot(*zip(*pts, strict=True), ".-", ms=3, lw=1, color=cmap(k % 10),
                label=f"seg {seg.index}: {seg.shape}, {seg.devices} dev, b={seg.micro_batch}×A={seg.grad_accum}")  # fmt: skip
        if k > 0:
            ax.axvline(pts[0][0], color=cmap(k % 10), ls="--", lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"{report.run}: loss across segments (same global batch)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_timeline(report: RunReport, path: str) -> None:
    """Segments on a time axis, and the badput of each as a stacked bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(9, 5.5), dpi=110, gridspec_kw={"height_ratios": [1, 1.3]}
    )
    t0 = report.segments[0].start if report.segments else 0.0
    for seg in report.segments:
        top.barh(0, seg.end - seg.start, left=seg.start - t0, height=0.5, edgecolor="black",
                 color="#1f77b4" if seg.end_kind != EndKind.CAPACITY_LOST else "#aec7e8")  # fmt: skip
        top.text(
            (seg.start + seg.end) / 2 - t0,
            0,
            f"{seg.index}: {seg.shape}",
            ha="center",
            va="center",
            fontsize=8,
        )
    top.set_yticks([])
    top.set_xlabel("seconds since launch")
    top.set_title(f"{report.run}: segments — goodput {report.badput.goodput:.1%}")
    names = list(COLOURS)
    labels = [f"seg {s.index}" for s in report.segments] + ["run"]
    values = [s.badput for s in report.segments] + [report.badput]
    left = [0.0] * len(values)
    for name in names:
        widths = [getattr(b, name) for b in values]
        bottom.barh(labels, widths, left=left, color=COLOURS[name], label=LABELS[name])
        left = [a + w for a, w in zip(left, widths, strict=True)]
    bottom.set_xlabel("seconds")
    # Below the bars: with eight categories a legend inside covers the longest one.
    bottom.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.22))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
