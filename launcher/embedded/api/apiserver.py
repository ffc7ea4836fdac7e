"""ApiServer: the Kubernetes REST API over HTTP/1.1 on loopback, in front of a Store.

Standard library only (`ThreadingHTTPServer`, one thread per connection, keep-alive). Serves what
the official python client and kubectl use: discovery, the REST verbs on every resource of
`resources.RESOURCES` (status subresources, `pods/log`), watch streams (chunked, one JSON event per
line, BOOKMARKs, `timeoutSeconds`, a 410 `ERROR` event for an expired resourceVersion, as the real
server sends it), `meta.k8s.io/v1` Tables for kubectl, and `Status` bodies for errors. JobSet
admission (CRD schema and webhook checks) is installed on the store.

This module is the HTTP/1.1 server (listener, connections, framing, restart); each request is a
`rest.ApiRequest` (routing and verbs), whose watch and log streams are `streams.py`'s. Started by
`launcher/embedded/cluster.py` and the embedded API tests.
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import socket
import ssl
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from launcher.embedded.admission import admission
from launcher.embedded.api import discovery
from launcher.embedded.api.rest import ApiRequest
from launcher.embedded.auth.identity import Attributes, User
from launcher.embedded.store.store import Store
from launcher.embedded.types.errors import ApiError, bad_request

if TYPE_CHECKING:  # outside mode's (cryptography): imported by the cluster that makes them
    from launcher.embedded.auth.authn import Authenticator
    from launcher.embedded.auth.rbac import Authorizer

log = logging.getLogger(__name__)

RouteHandler = Callable[[str, str, dict[str, str], bytes | None], tuple[int, dict[str, Any]]]
LogSource = Callable[[str, str, str, bool], Iterator[bytes]]
_HANDSHAKE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Security:
    """What an outside-mode server adds (docs/embedded.md "Outside mode"): TLS on its listener,
    who each request is (`Authorization: Bearer`), and RBAC for everyone but the admin."""

    tls: ssl.SSLContext
    authenticator: Authenticator
    authorizer: Authorizer


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], api: ApiServer) -> None:
        self.api = api
        super().__init__(address, _Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, addr = super().get_request()
        if self.api.security is not None:
            # The handshake happens on the connection's own thread (_Handler.setup), not here,
            # where one slow client would hold up every other's accept.
            conn = self.api.security.tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        return conn, addr

    def handle_error(self, request, client_address) -> None:
        # A client that hangs up (a watch closed at shutdown), or one that never finished its TLS
        # handshake, is normal; anything else is a bug.
        if not isinstance(sys.exc_info()[1], ConnectionError | ssl.SSLError | TimeoutError):
            super().handle_error(request, client_address)


class ApiServer:
    """See docs/embedded.md. `bookmark_interval`: seconds between watch BOOKMARKs; `version`: the
    document GET /version answers (the embedded cluster's, or an ordinary server's); `security`:
    TLS, authentication and RBAC (outside mode), else plain HTTP where every client may do all."""

    def __init__(
        self,
        store: Store,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        bookmark_interval: float | None = None,
        version: dict[str, str] | None = None,
        security: Security | None = None,
    ) -> None:
        self.store = store
        self.version = version or discovery.KUBE_VERSION  # what GET /version answers
        self.security = security
        self.host = host
        self.port = port
        self.bookmark_interval = bookmark_interval
        self._routes: list[tuple[str, str, RouteHandler]] = []
        self._log_source: LogSource | None = None
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        # Bumped by restart/stop: streams opened in an older epoch end.
        self.epoch = 0
        # Every (verb, resource) any client used, as an RBAC rule names them: what a
        # least-privilege Role must allow, measured rather than guessed.
        self.audit: set[tuple[str, str, str]] = set()
        # Requests per (verb, resource), counted as they arrive: what a client costs the server
        # (a controller's idle rate, a pass that must not LIST).
        self.requests: Counter[tuple[str, str]] = Counter()
        self._requests_lock = threading.Lock()
        admission.install(store)

    # ---- lifecycle --------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"{'https' if self.security else 'http'}://{self.host}:{self.port}"

    # ---- who may do what (outside mode) -----------------------------------------------------------

    def identify(self, authorization: str | None) -> User | None:
        """The request's user, or None where nobody is asked (the embedded cluster's own mode);
        raises the 401 for a token the server does not take."""
        if self.security is None:
            return None
        return self.security.authenticator.authenticate(authorization)

    def authorize(self, user: User | None, attrs: Attributes) -> None:
        """Raise the 403 when RBAC does not allow `user` what `attrs` asks."""
        if self.security is not None and user is not None:
            self.security.authorizer.authorize(user, attrs)

    def start(self) -> ApiServer:
        self._httpd = _Server((self.host, self.port), self)
        self.port = self._httpd.server_address[1]
        # A short poll interval: stop() and restart() wait for the serving loop to notice.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.05,), name=f"apiserver:{self.port}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.epoch += 1
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        with self._conns_lock:
            conns, self._conns = list(self._conns), set()
        for conn in conns:
            _shutdown(conn)

    def restart(self, downtime_s: float = 0.5) -> None:
        """Close the listener and every connection (watches end), reload the store from its state
        dir (history compacted: older resourceVersions answer 410), serve again on the same port."""
        self.stop()
        self.store.reload()
        time.sleep(downtime_s)
        self.start()

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- extension points -------------------------------------------------------------------------

    def add_route(self, method: str, prefix: str, handler: RouteHandler) -> None:
        """handler(method, path, query, body) -> (status, json body) for paths under `prefix`."""
        self._routes.append((method.upper(), prefix, handler))

    def set_log_source(self, fn: LogSource) -> None:
        """fn(namespace, pod, container, follow) -> iterator of log bytes (the kubelet's logs)."""
        self._log_source = fn

    # ---- connection tracking (so restart/stop can cut open watches) ------------------------------

    def _track(self, conn: socket.socket) -> None:
        with self._conns_lock:
            self._conns.add(conn)

    def _untrack(self, conn: socket.socket) -> None:
        with self._conns_lock:
            self._conns.discard(conn)


def _shutdown(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "reslice-embedded-apiserver"
    server: _Server

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(_HANDSHAKE_TIMEOUT_S)
            self.request.do_handshake()
            self.request.settimeout(None)
        super().setup()
        # Headers and body go out in separate writes: without NODELAY, Nagle + delayed ACK hold
        # every response back by the peer's delayed-ACK timer.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.api._track(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.api._untrack(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request would drown test output; errors are logged where they happen

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # ---- plumbing ---------------------------------------------------------------------------------

    def _handle(self, method: str) -> None:
        self.streaming = False
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        try:
            body = self._read_body()
            user = self.server.api.identify(self.headers.get("Authorization"))
            ApiRequest(self, method, url.path, query, body, user).dispatch()
        except ApiError as e:
            self._fail(e)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, ssl.SSLEOFError):
            self.close_connection = True  # the client hung up (over TLS: without its close_notify)
        except Exception as e:
            log.exception("%s %s failed", method, self.path)
            self._fail(
                ApiError(
                    500,
                    "InternalError",
                    f"an error on the server has prevented the request from succeeding: {e}",
                )
            )

    def _fail(self, err: ApiError) -> None:
        if self.streaming:
            self.close_connection = True  # headers are gone; all we can do is end the stream
            return
        try:
            self.send_json(err.code, err.status())
        except OSError:
            self.close_connection = True

    def _read_body(self) -> bytes | None:
        try:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                parts = []
                while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                    parts.append(self.rfile.read(size))
                    self.rfile.readline()
                self.rfile.readline()
                return b"".join(parts)
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.close_connection = True  # the framing is lost: the next request cannot be found
            raise bad_request("the request body could not be read") from None
        return self.rfile.read(length) if length > 0 else None

    def send_body(self, code: int, data: bytes, content_type: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.wfile.write(data)

    def send_json(self, code: int, body: dict[str, Any] | str) -> None:
        text = body if isinstance(body, str) else json.dumps(body, separators=(",", ":"))
        self.send_body(code, text.encode())

    def start_stream(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.streaming = True

    def chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def end_stream(self) -> None:
        try:
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True

    def peer_closed(self) -> bool:
        """Whether the client hung up (a readable socket with nothing to read)."""
        try:
            if isinstance(self.connection, ssl.SSLSocket) and self.connection.pending():
                return False  # a TLS record already read holds more of the client's bytes
            readable, _, _ = select.select([self.connection], [], [], 0)
            # Peeked below TLS (an SSLSocket takes no flags): the connection's end, not a record.
            return bool(readable) and socket.socket.recv(self.connection, 1, socket.MSG_PEEK) == b""
        except OSError:
            return True
