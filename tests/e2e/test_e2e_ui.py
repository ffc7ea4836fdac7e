"""`reslice ui` in a real browser, end to end: headless Chromium (tests/support/browser.py) reads
the rendered pages of a run on the embedded cluster while the real controller shrinks it (a node
pool removed) and grows it back (the pool restored) — the run of tests/e2e/test_e2e_elastic.py,
with a local run directory. From the DOM: the runs list, the segments table as `status --json` has
them, the loss chart drawn with the run's points, and the page updating by itself (no reload) as
each new segment starts.

RESLICE_UI_SCREENSHOT=docs/ui-run.png writes the run page's screenshot for docs/ui.md at the end
(headless Chromium's own --screenshot)."""

from __future__ import annotations

import os
import subprocess

import pytest

from contract.words import STATE_SOURCE
from launcher.adapters.kube import Kube
from launcher.core.accounting import LOSS
from launcher.core.record import Knobs
from launcher.core.words import RunState
from launcher.report.io import run_report
from launcher.ui.server import UiServer
from tests.e2e.harness import MULTI_HOST, MULTI_HOST_BATCH, Harness, wait_for
from tests.support.browser import FLAGS, BrowserUnavailable, chromium, chromium_binary

pytestmark = pytest.mark.e2e
RUN = "elastic"
STEPS = 25


def _rows(driver, table: str) -> list[list[str]]:
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0] + ' tbody tr')]"
        ".map(r => [...r.cells].map(c => c.textContent));",
        f"#{table}",
    )


def _chart(driver) -> dict:
    """What plotly drew in #loss: its traces' data, and the marker paths in the SVG."""
    return driver.execute_script(
        "const gd = document.getElementById('loss');"
        "return {data: (gd.data || []).map(t => ({name: t.name, x: [...t.x], y: [...t.y]})),"
        "        points: gd.querySelectorAll('.scatterlayer path.point').length};"
    )


def _expected_rows(kube: Kube) -> list[list[str]]:
    """The segments as `status --json` has them (launcher/report/io.run_report, as_dict): index,
    shape, devices, micro-batch × accumulation, steps, where the state came from, why it ended."""
    _, report, _ = run_report(kube, RUN)
    return [
        [str(s["index"]), s["shape"], str(s["devices"]), f"{s['micro_batch']} × {s['grad_accum']}",
         f"{s['steps'][0]}–{s['steps'][1]}" if s["steps"][0] is not None else "-",
         s[STATE_SOURCE] or ("fresh" if s["index"] == 0 else "-"), s["end_reason"] or "live"]
        for s in report.as_dict()["segments"]
    ]  # fmt: skip


def _shown(row: list[str]) -> list[str]:
    """The columns of a rendered segments row that `_expected_rows` has."""
    return [row[0], row[1], row[2], row[3], row[4], row[8], row[11]]


def test_the_run_page_follows_a_shrink_and_a_grow_in_chromium(tmp_path):
    try:
        driver = chromium(tmp_path / "chromium")
    except BrowserUnavailable as e:
        pytest.skip(str(e))
    h = Harness(tmp_path, pools=2, preset=MULTI_HOST)
    server = UiServer(lambda: Kube(h.cluster.api_client(), "default")).start()
    try:
        knobs = Knobs(unschedulable_grace_s=20, grow_window_s=1, app_backoff_s=1)
        h.launch(RUN, slices=2, steps=STEPS, knobs=knobs, global_batch=MULTI_HOST_BATCH)
        h.start_controller(RUN)

        driver.get(server.url)  # the runs list
        wait_for(lambda: [r[0] for r in _rows(driver, "runs-table")] == [RUN], 30, "the run in the runs list")

        driver.get(f"{server.url}run/{RUN}")  # from here on the page is never reloaded
        wait_for(lambda: len(_rows(driver, "segments-table")) == 1, 30, "the first segment's row")
        h.wait_step(RUN, 5, timeout=300)
        h.cluster.remove(h.pool(1))  # capacity gone: the controller shrinks to one slice
        wait_for(lambda: len(_rows(driver, "segments-table")) == 2, 90, "the shrunk segment on the page")
        assert "x1" in _rows(driver, "segments-table")[1][1]
        h.cluster.restore(h.pool(1))
        wait_for(lambda: len(_rows(driver, "segments-table")) == 3, 120, "the grown segment on the page")
        assert "x2" in _rows(driver, "segments-table")[2][1]
        h.wait_state(RUN, {RunState.FINISHED}, timeout=240)
        wait_for(
            lambda: driver.find_element("id", "title").text == f"{RUN}: {RunState.FINISHED}", 30, "finished"
        )

        # The finished run: the page's last poll has everything the run directory has.
        kube = Kube(h.cluster.api_client(), "default")
        expected = _expected_rows(kube)
        wait_for(lambda: [_shown(r) for r in _rows(driver, "segments-table")] == expected, 30, "the rows")
        losses = sorted((m["step"], m[LOSS]) for m in h.rundir(RUN).metrics() if LOSS in m)
        chart = _chart(driver)
        drawn = sorted((x, y) for t in chart["data"] if not t["name"].startswith("eval") for x, y in zip(t["x"], t["y"], strict=True))  # fmt: skip
        assert drawn == losses and len(drawn) >= STEPS  # JSON carries a float exactly
        assert chart["points"] >= len(losses)  # each one drawn as a marker of the SVG
        assert len(_rows(driver, "timeline-table")) >= 2  # the shrink and the grow, with reasons
        timeline = " ".join(" ".join(r) for r in _rows(driver, "timeline-table"))
        assert "shrinking" in timeline and "growing" in timeline, timeline
        if path := os.environ.get("RESLICE_UI_SCREENSHOT"):
            subprocess.run(
                [chromium_binary(), *FLAGS, f"--user-data-dir={tmp_path / 'screenshot'}", "--window-size=1200,1400",
                 "--virtual-time-budget=5000", f"--screenshot={os.path.abspath(path)}", f"{server.url}run/{RUN}"],
                check=True, capture_output=True, timeout=60,
            )  # fmt: skip
    finally:
        driver.quit()
        server.stop()
        h.close()
