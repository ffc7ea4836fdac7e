"""The controller's health endpoints: the liveness and readiness verdicts (table-driven), the HTTP
server answering the kubelet's probes, and the CLI refusing a bad --health-port."""

import socket
import urllib.error
import urllib.request

import pytest

from launcher.controller.health import HealthServer, LoopState, liveness, readiness, stall_after
from launcher.core.errors import UserError
from tests.support.cli import run_cli

STALL = 30.0
SYNCED = LoopState(started_at=0.0, turned_at=100.0, pass_ok=True, error=None, unsynced=())


def state(**kw) -> LoopState:
    return LoopState(**{**SYNCED.__dict__, **kw})


@pytest.mark.parametrize(
    ("st", "now", "alive", "ready"),
    [
        (SYNCED, 101.0, None, None),
        (SYNCED, 130.0, None, None),  # exactly at the limit: still alive
        (SYNCED, 131.0, "for 31 s", "for 31 s"),  # the loop is stuck
        # A failing pass (API down) still turns the loop: alive, not ready.
        (state(pass_ok=False, error="MaxRetryError: refused"), 101.0, None, "failed: MaxRetryError: refused"),
        (state(unsynced=("nodes", "events")), 101.0, None, "not listed yet: nodes, events"),
        # Before the first pass: alive during the start-up grace, never ready.
        (state(turned_at=None), 10.0, None, "no reconcile pass has ended yet"),
        (state(turned_at=None), 31.0, "since start", "since start"),
    ],
)
def test_verdicts(st, now, alive, ready):
    for verdict, expected in ((liveness(st, now, STALL), alive), (readiness(st, now, STALL), ready)):
        if expected is None:
            assert verdict is None
        else:
            assert verdict is not None and expected in verdict


def test_stall_limit_scales_with_resync_but_has_a_floor():
    assert stall_after(1.0) == 30.0
    assert stall_after(10.0) == 60.0


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_server_answers_the_probes_from_the_current_state():
    now = {"t": 101.0}
    current = {"s": SYNCED}
    server = HealthServer(0, lambda: current["s"], STALL, host="127.0.0.1", clock=lambda: now["t"]).start()
    try:
        assert _get(server.port, "/healthz") == (200, "ok\n")
        assert _get(server.port, "/readyz") == (200, "ok\n")
        current["s"] = state(pass_ok=False, error="ApiException: 500")
        assert _get(server.port, "/healthz") == (200, "ok\n")
        code, body = _get(server.port, "/readyz")
        assert code == 503 and "ApiException: 500" in body
        now["t"] = 200.0
        code, body = _get(server.port, "/healthz?verbose")
        assert code == 503 and "no reconcile pass has ended for 100 s" in body
        assert _get(server.port, "/metrics")[0] == 404
    finally:
        server.stop()


def test_cli_refuses_a_bad_health_port_before_connecting(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))  # connecting would fail differently
    code, _, err = run_cli(capsys, "watch", "--all", "--health-port", "70000")
    assert (
        code == 2
        and err.strip() == "reslice: error: --health-port must be a TCP port (0-65535, 0 = off), not 70000"
    )
    code, _, err = run_cli(capsys, "watch", "some-run", "--health-port", "8081")
    assert code == 2 and "use it with --all" in err


def test_a_port_in_use_is_one_clear_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UserError, match=f"cannot serve health endpoints on port {port}"):
            HealthServer(port, lambda: SYNCED, STALL, host="127.0.0.1")
