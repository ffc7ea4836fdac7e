"""The times on `reslice ui`'s run page, read in headless Chromium (tests/support/browser.py) over the
history bench/ui.py builds: written as the command line writes them (launcher/report/view.py
`_clock`: 24-hour HH:MM:SS in the local time zone), never the browser's own 12-hour "7:48:34 PM".
Run in a zone other than UTC, with a half hour in its offset, so that the page's zone is seen to be
the command line's and not UTC."""

from __future__ import annotations

import json
import re
import time

import pytest

from launcher.report.view import _clock
from launcher.ui.server import UiServer
from tests.launcher.ui.test_ui_server import FakeKube, _get, runs  # noqa: F401  (runs: the fixture)
from tests.support.browser import BrowserUnavailable, chromium
from tests.support.wait import wait_for

ZONE = "Asia/Kolkata"  # UTC+05:30 all year: no daylight saving to straddle


@pytest.fixture
def zone(monkeypatch):
    """This process's local time zone, and so the browser's it starts (TZ), is ZONE."""
    monkeypatch.setenv("TZ", ZONE)
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _column(driver, table: str, column: int) -> list[str]:
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0] + ' tbody tr')].map(r => r.cells[arguments[1]].textContent);",
        f"#{table}",
        column,
    )


def test_the_run_page_writes_times_as_the_command_line_does(zone, runs, tmp_path) -> None:  # noqa: F811
    assert _clock(0.001) == "05:30:00"  # the command line's zone is ZONE
    try:
        driver = chromium(tmp_path / "chromium")
    except BrowserUnavailable as e:
        pytest.skip(str(e))
    server = UiServer(lambda: FakeKube(runs)).start()
    try:
        driver.get(f"{server.url}run/run-0")
        wait_for(lambda: _column(driver, "timeline-table", 0), 30, "the timeline on the page")
        page = json.loads(_get(server.url + "api/run/run-0")[1])
        starts = [_clock(s["start"]) for s in page["segments"]]
        ends = ["-" if s["live"] else _clock(s["end"]) for s in page["segments"]]
        assert len(starts) == 3 and all(re.fullmatch(r"\d\d:\d\d:\d\d", t) for t in starts), starts
        assert _column(driver, "segments-table", 5) == starts
        assert _column(driver, "segments-table", 6) == ends
        assert _column(driver, "timeline-table", 0) == [_clock(e["time"]) for e in page["timeline"]]
        assert _column(driver, "pods-table", 3) == ["05:30:00"]  # created 2026-01-01T00:00:00Z
        updated = driver.find_element("id", "updated").text
        assert re.fullmatch(r"· updated \d\d:\d\d:\d\d", updated), updated
    finally:
        driver.quit()
        server.stop()
