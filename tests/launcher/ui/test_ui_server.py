"""`reslice ui` without a browser: the token off the loopback address (401), what a page says
when the cluster or a run directory cannot be read (and that the server stays up), a port in use,
and the data the runs and run pages are drawn from, over the history bench/ui.py builds."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from bench.ui import history
from launcher.cli.commands.ui import NO_UI
from launcher.core.errors import UserError
from launcher.core.words import RunState
from launcher.ui.server import COOKIE, UiServer, bind
from tests.conftest import ROOT


class FakeKube:
    """What launcher/ui/sources.py asks of launcher.adapters.kube.Kube."""

    namespace = "default"

    def __init__(self, records) -> None:
        self._records = {r.name: r for r in records}

    def records(self):
        return list(self._records.values())

    def get_record(self, run):
        return (self._records[run], "1") if run in self._records else None

    def pods(self, selector):
        return [{"metadata": {"name": "p-0", "creationTimestamp": "2026-01-01T00:00:00Z"},
                 "spec": {"nodeName": "n-0"}, "status": {"phase": "Running"}}]  # fmt: skip


def _get(url: str, headers: dict | None = None) -> tuple[int, str, dict]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


@pytest.fixture
def runs(tmp_path: Path):
    # Started minutes ago: the last segment is live, so the run's wall time runs until now.
    t0 = time.time() - 300
    return [history(f"run-{i}", tmp_path / f"run-{i}", segments=3, t0=t0 + i) for i in range(2)]


def test_bound_beyond_loopback_every_request_needs_the_token(runs) -> None:
    server = UiServer(lambda: FakeKube(runs), host="0.0.0.0", port=0).start()
    try:
        assert server.token and f"?token={server.token}" in server.url
        base = f"http://127.0.0.1:{server.port}/"
        for path in ("", "api/runs", "run/run-0", "static/plotly.min.js", f"?token={server.token}x"):
            assert _get(base + path)[0] == 401, path
        assert _get(base + "api/runs", {"Authorization": "Bearer nope"})[0] == 401
        code, _, headers = _get(f"{base}?token={server.token}")
        assert code == 200 and f"{COOKIE}={server.token}" in headers["set-cookie"]
        assert _get(base + "api/runs", {"Cookie": f"{COOKIE}={server.token}"})[0] == 200
        assert _get(base + "api/runs", {"Authorization": f"Bearer {server.token}"})[0] == 200
    finally:
        server.stop()


def test_loopback_serves_without_a_token_and_the_chart_library_from_its_package(runs) -> None:
    server = UiServer(lambda: FakeKube(runs)).start()
    try:
        assert server.token is None and server.host == "127.0.0.1"
        code, body, headers = _get(server.url + "static/plotly.min.js")
        assert code == 200 and "javascript" in headers["content-type"] and len(body) > 1_000_000
        code, body, _ = _get(server.url + "run/run-0")
        assert code == 200 and "static/plotly.min.js" in body and "runPage(" in body
        assert "plotly.min.js" not in _get(server.url)[1]  # the runs page draws no chart
    finally:
        server.stop()


def test_the_pages_data(runs) -> None:
    server = UiServer(lambda: FakeKube(runs)).start()
    try:
        listing = json.loads(_get(server.url + "api/runs")[1])
        assert [r["run"] for r in listing["runs"]] == ["run-1", "run-0"]  # newest first
        row = listing["runs"][1]
        assert (row["state"], row["shape"], row["segments"], row["step"]) == (
            RunState.RUNNING,
            "tpu7x-2x2x2 x2",
            3,
            60,
        )
        assert row["restarts"] == {"capacity_lost": 2} and 0 < row["goodput"] < 1 and row["error"] is None
        page = json.loads(_get(server.url + "api/run/run-0")[1])
        assert [s["shape"] for s in page["segments"]] == [
            "tpu7x-2x2x2 x2",
            "tpu7x-2x2x2 x1",
            "tpu7x-2x2x2 x2",
        ]
        assert [(s["micro_batch"], s["grad_accum"], s["steps"]) for s in page["segments"]] == [
            (1, 1, [1, 20]), (2, 1, [21, 40]), (1, 1, [41, 60])]  # fmt: skip
        assert [len(s["loss"]) for s in page["loss"]] == [20, 20, 20]
        assert [len(s["eval"]["valid"]) for s in page["loss"]] == [2, 2, 2]
        assert [e["kind"] for e in page["timeline"]] == ["disruption", "act"] * 2  # seen, then decided
        assert page["world"]["pods"][0]["node"] == "n-0" and page["world"]["shape"] == "tpu7x-2x2x2 x2"
        assert sum(b["seconds"] for b in page["badput"]) == pytest.approx(page["wall_s"], abs=0.01)
    finally:
        server.stop()


def test_an_unreachable_cluster_and_an_unreadable_run_directory_are_said_on_the_page(runs, tmp_path) -> None:
    def nowhere():
        raise UserError("no cluster configured: set KUBECONFIG")

    server = UiServer(nowhere).start()
    try:
        for _ in range(2):  # and the server is still up
            code, body, _ = _get(server.url + "api/runs")
            assert (code, json.loads(body)) == (503, {"error": "no cluster configured: set KUBECONFIG"})
    finally:
        server.stop()
    (Path(runs[0].spec.run_dir) / "events.jsonl").unlink()
    (Path(runs[0].spec.run_dir) / "events.jsonl").mkdir()  # a run directory that cannot be read
    server = UiServer(lambda: FakeKube(runs)).start()
    try:
        listing = json.loads(_get(server.url + "api/runs")[1])
        broken = next(r for r in listing["runs"] if r["run"] == "run-0")
        assert "run directory" in broken["error"] and broken["state"] == RunState.RUNNING
        code, body, _ = _get(server.url + "api/run/run-0")
        assert code == 503 and "Is a directory" in json.loads(body)["error"]
        assert _get(server.url + "api/run/run-1")[0] == 200
        code, body, _ = _get(server.url + "api/run/nosuch")
        assert code == 503 and "no run named 'nosuch'" in json.loads(body)["error"]
    finally:
        server.stop()


def test_a_port_in_use_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        with pytest.raises(UserError, match=r"cannot serve on 127\.0\.0\.1:\d+: Address already in use"):
            bind("127.0.0.1", taken.getsockname()[1])


def test_a_sweeps_page_data(tmp_path) -> None:
    """A sweep stored as `reslice sweep` stores it (launcher/sweep/files.write_outputs): listed on
    the runs page, its rows in sweep-report's order with the recommended factor marked; a name that
    is not a sweep, or would leave the sweeps directory, is a message."""
    from launcher.sweep.files import write_outputs
    from launcher.sweep.results import FactorResult
    from launcher.sweep.spec import make_sweep, run_name

    spec = make_sweep(name="moe", preset="tpu7x-2x2x1", slices=None, config="tiny", factors="1,2,-1", steps=20,
                      sweep_dir=str(tmp_path / "sweeps" / "moe"))  # fmt: skip
    results = [FactorResult(factor=f, run=run_name("moe", f), state=RunState.FINISHED, measured_steps=10,
                            dropped_fraction=d, step_time_median_s=ms / 1e3)
               for f, d, ms in ((-1.0, 0.0, 30), (1.0, 0.1, 20), (2.0, 0.0, 22))]  # fmt: skip
    write_outputs(spec, results)
    server = UiServer(lambda: FakeKube([]), sweeps=tmp_path / "sweeps").start()
    try:
        assert json.loads(_get(server.url + "api/runs")[1])["sweeps"] == ["moe"]
        page = json.loads(_get(server.url + "api/sweep/moe")[1])
        assert [(r["label"], r["recommended"]) for r in page["rows"]] == [
            ("1", False),
            ("2", True),
            ("dropless", False),
        ]
        assert page["recommendation"]["factor"] == 2.0
        assert "sweepPage(" in _get(server.url + "sweep/moe")[1]
        for name in ("nosuch", "..", ".hidden"):
            code, body, _ = _get(server.url + f"api/sweep/{name}")
            assert code in (404, 503) and (code == 404 or "error" in json.loads(body)), name
    finally:
        server.stop()


def test_the_command_says_where_it_serves_and_stays_up_without_a_cluster(tmp_path) -> None:
    """`reslice ui --port 0` with a kubeconfig that is not there: one line saying so at start, the
    address, the page's data saying so too; Ctrl-C ends it without a traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", "ui", "--port", "0", "--kubeconfig", str(tmp_path / "missing.yaml")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        first, second = proc.stdout.readline(), proc.stdout.readline()
        assert first.startswith("reslice ui: kubeconfig ") and first.strip().endswith(
            "until the cluster answers)"
        )
        url = re.search(r"at (http://127\.0\.0\.1:\d+/)$", second.strip()).group(1)
        code, body, _ = _get(url + "api/runs")
        assert code == 503 and "does not exist" in json.loads(body)["error"], body
        assert _get(url)[0] == 200
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
    assert (proc.returncode, "Traceback" in out) == (130, False), out  # 130: Ctrl-C, as every command


@pytest.mark.parametrize("command", [("ui",), ("demo", "--ui")])
def test_without_the_web_stack_the_commands_say_so(tmp_path, command) -> None:
    """An install without the `ui` extra (the controller image's): `reslice ui` and `demo --ui` are
    one line and exit 2, before any cluster starts."""
    log, workdir = tmp_path / "imports.log", tmp_path / "demo"
    argv = ("launcher", *command, *(("--workdir", str(workdir)) if "demo" in command else ()))
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.noimport", str(log), "starlette,uvicorn,plotly", *argv],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.splitlines() == [f"reslice: error: {NO_UI}"]
    assert log.read_text().splitlines() == ["import uvicorn"]
    assert not workdir.exists()


def test_a_malformed_metrics_line_is_a_line_on_the_page(runs) -> None:
    """Data the page cannot be built from: 500 with one line, and the server still answers."""
    metrics = Path(runs[0].spec.run_dir) / "metrics" / "seg000.jsonl"
    metrics.write_text(
        metrics.read_text() + '{"step": 99, "segment": "not a number", "learning/loss": 1.0}\n'
    )
    server = UiServer(lambda: FakeKube(runs)).start()
    try:
        code, body, _ = _get(server.url + "api/run/run-0")
        assert code == 500 and json.loads(body)["error"].startswith(
            "this page could not be built: ValueError"
        )
        assert _get(server.url + "api/run/run-1")[0] == 200
    finally:
        server.stop()
