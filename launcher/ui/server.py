"""The web server of `reslice ui`: Starlette routes over launcher/ui/sources.Sources, served by
uvicorn on a socket bound here first (so that a port in use is one line and exit 2, not a traceback
from inside the server). Read-only: GET only. Off the loopback address every request needs the
access token (a `token` query parameter once, then the cookie it sets; or `Authorization: Bearer`).
Called by `launcher.cli.commands.ui` (`reslice ui`), `launcher.cli.demo` (`reslice demo --ui`) and
bench/ui.py."""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import signal
import socket
import threading
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from launcher.adapters.kube import Kube
from launcher.core.errors import UserError
from launcher.ui.pages import run_html, runs_html, sweep_html
from launcher.ui.sources import Sources, Unavailable, one_line

COOKIE = "reslice_ui_token"
LOOPBACK = "127.0.0.1"


def plotly_js() -> bytes | None:
    """plotly.js as the `plotly` package ships it (its package data): no CDN, clusters are often
    offline. None where the package has no copy."""
    try:
        return (resources.files("plotly") / "package_data" / "plotly.min.js").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError):
        return None


def answer(page: Callable[[], dict]) -> Response:
    """A page's data, or its one line: 503 for what could not be read (Unavailable), 500 for data
    the page could not be built from (a malformed record or metrics line). Never a traceback: the
    page shows the line and keeps polling."""
    try:
        return JSONResponse(page())
    except Unavailable as e:
        return JSONResponse({"error": str(e)}, status_code=503)
    except Exception as e:
        return JSONResponse({"error": f"this page could not be built: {one_line(e)}"}, status_code=500)


def build_app(sources: Sources) -> Starlette:
    js = plotly_js()

    def runs_page(request: Request) -> Response:
        return HTMLResponse(runs_html())

    def run_view(request: Request) -> Response:
        return HTMLResponse(run_html(request.path_params["name"]))

    # Sync endpoints: Starlette runs them in its thread pool, where the blocking reads belong.
    def api_runs(request: Request) -> Response:
        return answer(sources.runs)

    def api_run(request: Request) -> Response:
        return answer(lambda: sources.run(request.path_params["name"]))

    def sweep_view(request: Request) -> Response:
        return HTMLResponse(sweep_html(request.path_params["name"]))

    def api_sweep(request: Request) -> Response:
        return answer(lambda: sources.sweep(request.path_params["name"]))

    def plotly(request: Request) -> Response:
        if js is None:  # the page still shows its tables; the charts say nothing
            return PlainTextResponse("// the plotly package ships no plotly.min.js here", status_code=404)
        headers = {"Cache-Control": "max-age=86400"}
        return Response(js, media_type="application/javascript", headers=headers)

    return Starlette(
        routes=[
            Route("/", runs_page),
            Route("/run/{name}", run_view),
            Route("/api/runs", api_runs),
            Route("/api/run/{name}", api_run),
            Route("/sweep/{name}", sweep_view),
            Route("/api/sweep/{name}", api_sweep),
            Route("/static/plotly.min.js", plotly),
        ]
    )


class TokenGate:
    """ASGI middleware: 401 for any request without the token. Constant-time comparison."""

    def __init__(self, app, token: str) -> None:
        self.app, self.token = app, token

    def _given(self, scope) -> str | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        auth = headers.get("authorization", "")
        if auth.startswith("Bearer "):
            return auth[len("Bearer ") :]
        query = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token")
        if query:
            return query[0]
        for part in headers.get("cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE:
                return value
        return None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = self._given(scope)
        if given is None or not hmac.compare_digest(given.encode(), self.token.encode()):
            return await PlainTextResponse("401: this reslice ui needs its access token", 401)(
                scope, receive, send
            )

        async def with_cookie(message) -> None:
            # The token given once in the address rides on a cookie from then on: the page's own
            # requests (its script, plotly.js) carry it without putting it in every URL.
            if message["type"] == "http.response.start":
                cookie = f"{COOKIE}={self.token}; Path=/; HttpOnly; SameSite=Strict"
                message = {
                    **message,
                    "headers": [*message.get("headers", []), (b"set-cookie", cookie.encode())],
                }
            await send(message)

        return await self.app(scope, receive, with_cookie)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or UserError with one line (a port in use, an address
    this machine does not have or cannot resolve)."""
    if not 0 <= port <= 65535:
        raise UserError(f"--port must be between 0 and 65535, got {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise UserError(f"--host {host!r}: cannot resolve it ({e.strerror or e})") from e
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise UserError(f"cannot serve on {host}:{port}: {e.strerror or e}") from e
    return sock


class _UvicornServer(uvicorn.Server):
    """uvicorn's server, remembering the signal that stopped it."""

    signalled: int | None = None

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.signalled = sig
        super().handle_exit(sig, frame)


class UiServer:
    """`reslice ui` on a bound socket: `serve()` in the foreground, or `start()` in a thread (the
    demo, the tests, the benchmark) and `stop()`."""

    def __init__(
        self, connect: Callable[[], Kube], host: str = LOOPBACK, port: int = 0, sweeps: Path | None = None
    ) -> None:
        self.sock = bind(host, port)
        self.host = host
        self.port = self.sock.getsockname()[1]
        # Only the loopback address goes without a token: anything else is reachable by others.
        self.token = None if is_loopback(host) else secrets.token_urlsafe(18)
        app = build_app(Sources(connect, sweeps))
        config = uvicorn.Config(
            TokenGate(app, self.token) if self.token else app, log_level="warning", access_log=False
        )
        self.server = _UvicornServer(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/" + (f"?token={self.token}" if self.token else "")

    def serve(self) -> None:
        self.server.run(sockets=[self.sock])
        # uvicorn shuts down on a SIGINT, then raises it again for the caller; that raise can land
        # inside asyncio's own SIGINT handling and be lost, and the command then exited 0 instead of
        # Ctrl-C's 130 (once in a whole suite). Say it here instead.
        if self.server.signalled == signal.SIGINT:
            raise KeyboardInterrupt

    def start(self) -> UiServer:
        self._thread = threading.Thread(target=self.serve, name="reslice-ui", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.sock.close()
