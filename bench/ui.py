"""`reslice ui` at scale: 50 runs of 20 segments each (2 slices and 1, alternating, 20 steps a
segment, an evaluation every 10 steps) as run records in the embedded cluster (simulate mode) and
local run directories; how long the runs page takes.

    .venv/bin/python -m bench.ui [--runs 50] [--segments 20] [--rounds 5] [--no-browser] [--json]

- api_s: GET /api/runs (every record listed, every run directory read, every report built, as
  `status` builds one), the median of --rounds requests.
- page_s: headless Chromium (Debian's, through selenium and /usr/bin/chromedriver) loads the runs
  page until its table has a row per run: navigation start to the last row in the DOM, the median
  of --rounds loads. Skipped with one line where Chromium is not installed, or with --no-browser.
- run_page_s: GET /api/run/NAME of one run of --segments segments.
- loop_s: bench/machine.py's reference loop, the machine's speed at the time.

Not a test: a timed test would fail on a busy machine. docs/measurements.md has the figures.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

from bench import machine
from bench._cli import Parser
from launcher.adapters.kube import Kube
from launcher.adapters.preset_files import make_shape
from launcher.core.plan import Plan
from launcher.core.record import RunRecord, new_segment
from launcher.core.spec import RunSpec
from launcher.core.words import EndKind, RunState
from launcher.embedded.cluster import EmbeddedCluster
from launcher.ui.server import UiServer

PRESET = "tpu7x-2x2x2"
GLOBAL_BATCH = 32
STEPS_PER_SEGMENT = 20


def history(run: str, run_dir: Path, segments: int, t0: float) -> RunRecord:
    """A record of `segments` segments (2 slices, then 1, then 2, ...) and its run directory: the
    metrics of 20 steps a segment (evaluations every 10 steps) and a ledger line per decision.
    The last segment is live."""
    rec = RunRecord(spec=RunSpec(run=run, run_dir=str(run_dir), global_batch=GLOBAL_BATCH), preset=PRESET,
                    slices=2, created_at=t0, state=RunState.RUNNING, reason="training")  # fmt: skip
    (run_dir / "metrics").mkdir(parents=True, exist_ok=True)
    ledger, t = [], t0
    for k in range(segments):
        slices = 2 if k % 2 == 0 else 1
        plan = Plan(16 * slices, GLOBAL_BATCH // (16 * slices), 1)
        seg = new_segment(rec, make_shape(PRESET, slices), plan, t, "launch" if k == 0 else "shrink", None)
        lines = []
        for i in range(STEPS_PER_SEGMENT):
            step = k * STEPS_PER_SEGMENT + i + 1
            m = {"step": step, "segment": k, "time": t + 5 + i, "learning/loss": 6.0 / (1 + step / 50),
                 "perf/step_time_seconds": 0.9, "perf/tokens_per_sec": 1e5}  # fmt: skip
            if step % 10 == 0:
                m["eval/valid/loss"] = m["learning/loss"] + 0.1
            lines.append(json.dumps(m))
        (run_dir / "metrics" / f"seg{k:03d}.jsonl").write_text("\n".join(lines) + "\n")
        end = t + 5 + STEPS_PER_SEGMENT + 2
        if k < segments - 1:
            seg = replace(seg, ended_at=end, end_kind=EndKind.CAPACITY_LOST, end_reason="capacity lost")
            ledger.append({"time": end, "kind": "observe", "disruptions": [f"node pool {PRESET}-np-1 gone"]})
            ledger.append(
                {"time": end, "kind": "act", "action": "start-segment", "reason": f"segment {k + 1}"}
            )
        rec = rec.with_segment(seg)
        t = end
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in ledger))
    return rec


def _get(url: str) -> float:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as r:
        r.read()
    return time.perf_counter() - start


def browser_page_s(url: str, runs: int, rounds: int, profile: Path) -> float | None:
    """Median seconds from navigation start to a table row per run, in headless Chromium."""
    try:
        from tests.support.browser import BrowserUnavailable, chromium
    except ImportError:
        return None
    try:
        driver = chromium(profile)
    except BrowserUnavailable as e:
        print(f"bench.ui: no browser: {e}", file=sys.stderr)
        return None
    times = []
    try:
        for _ in range(rounds):
            driver.get(url)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                got = driver.execute_script(
                    "const n = document.querySelectorAll('#runs-table tbody tr').length;"
                    "return n >= arguments[0] ? performance.now() : null;",
                    runs,
                )
                if got is not None:
                    times.append(got / 1000)
                    break
                time.sleep(0.01)
    finally:
        driver.quit()
    return statistics.median(times) if times else None


def main() -> None:
    ap = Parser(prog="python -m bench.ui", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--segments", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-browser", action="store_true", help="Time the JSON endpoint only.")
    ap.add_argument("--json", action="store_true", help="Print one JSON object last.")
    args = ap.parse_args()
    ap.at_least(args, 1, "runs", "segments", "rounds")
    loop = machine.loop_s()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedCluster(f"{PRESET}:2", mode="simulate") as cluster:
        kube = Kube(cluster.api_client(), "default")
        t0 = time.time() - 3600
        for i in range(args.runs):
            kube.create_record(history(f"run-{i:03d}", Path(tmp) / f"run-{i:03d}", args.segments, t0 + i))
        server = UiServer(lambda: kube).start()
        try:
            _get(server.url + "api/runs")  # warm: the first request connects
            api = statistics.median(_get(server.url + "api/runs") for _ in range(args.rounds))
            one = statistics.median(_get(server.url + "api/run/run-000") for _ in range(args.rounds))
            page = (
                None
                if args.no_browser
                else browser_page_s(server.url, args.runs, args.rounds, Path(tmp) / "chromium")
            )
        finally:
            server.stop()
    out = {"runs": args.runs, "segments": args.segments, "api_s": round(api, 3), "run_page_s": round(one, 3),
           "page_s": None if page is None else round(page, 3), "loop_s": round(loop, 3)}  # fmt: skip
    print(
        f"{args.runs} runs x {args.segments} segments: GET /api/runs {api:.3f} s, one run's page data {one:.3f} s"
    )
    if page is not None:
        print(f"the runs page in headless Chromium: {page:.3f} s from navigation to the last row")
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
