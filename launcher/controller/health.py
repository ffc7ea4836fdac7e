"""`/healthz` and `/readyz` of `reslice watch --all`, for the kubelet's liveness and readiness probes.

Alive: the reconcile loop is turning — its last pass, whether it succeeded or failed, ended within
`stall_s`. A loop stuck in a call that never returns is worth a restart; an API server that is down
is not (the loop keeps turning and retrying, and a restarted pod would only wait the same way).
Ready: alive, the last pass read the API, and every watch has made its first list.

The verdicts are pure functions of a `LoopState`; the server only asks for one on each request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from launcher.core.errors import UserError

# A pass normally ends within one resync period (plus the pass itself); six
# missed periods, and never under MIN_STALL_S, tells a stuck loop from a slow one.
STALL_PERIODS = 6
MIN_STALL_S = 30.0


def stall_after(resync_s: float) -> float:
    return max(MIN_STALL_S, STALL_PERIODS * resync_s)


@dataclass(frozen=True)
class LoopState:
    """What the reconcile loop reports about itself (times from time.monotonic)."""

    started_at: float
    turned_at: float | None  # when the last pass ended, successful or not; None before the first
    pass_ok: bool  # the last pass read and wrote the API without an error
    error: str | None  # the last pass's error, when it failed
    unsynced: tuple[str, ...]  # watches that have not made their first list yet


def liveness(state: LoopState, now: float, stall_s: float) -> str | None:
    """None when alive, else why not."""
    since = state.turned_at if state.turned_at is not None else state.started_at
    idle = now - since
    if idle <= stall_s:
        return None
    if state.turned_at is None:
        return f"no reconcile pass has ended in the {idle:.0f} s since start (limit {stall_s:g} s)"
    return f"no reconcile pass has ended for {idle:.0f} s (limit {stall_s:g} s)"


def readiness(state: LoopState, now: float, stall_s: float) -> str | None:
    """None when ready, else why not."""
    if (dead := liveness(state, now, stall_s)) is not None:
        return dead
    if state.turned_at is None:
        return "no reconcile pass has ended yet"
    if not state.pass_ok:
        return f"the last reconcile pass failed: {state.error}"
    if state.unsynced:
        return f"watches not listed yet: {', '.join(state.unsynced)}"
    return None


class HealthServer:
    """HTTP on `host:port` (port 0: any free port) answering GET /healthz and /readyz with 200 "ok"
    or 503 and the reason, from `probe()` at the time of the request."""

    def __init__(
        self,
        port: int,
        probe: Callable[[], LoopState],
        stall_s: float,
        *,
        host: str = "0.0.0.0",  # the kubelet probes the pod's IP
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        checks = {"/healthz": liveness, "/readyz": readiness}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                check = checks.get(self.path.split("?", 1)[0])
                if check is None:
                    self._answer(404, "not found: /healthz and /readyz are served")
                    return
                reason = check(probe(), clock(), stall_s)
                self._answer(200 if reason is None else 503, reason or "ok")

            def _answer(self, code: int, text: str) -> None:
                body = (text + "\n").encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # a probe every few seconds would drown the controller's own log

        try:
            self._server = ThreadingHTTPServer((host, port), Handler)
        except OSError as e:
            raise UserError(f"cannot serve health endpoints on port {port}: {e.strerror or e}") from None
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="health", daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for a serve_forever that never started
            self._server.shutdown()
        self._server.server_close()
