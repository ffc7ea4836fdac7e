"""trainer.elastic.world_source's ConfigMap watch against the embedded cluster's API server: how soon a
published world reaches a pod's supervisor, what it asks of the API (the Role's verbs), a 410 after
the server lost its history, and the supervisor following a ConfigMap end to end."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import ssl
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from contract.world import DATA_KEY
from launcher.embedded.cluster import EmbeddedCluster
from launcher.embedded.types.resources import RESOURCES
from tests.support.wait import wait_for
from tests.trainer.test_supervisor_world import Pod, world_doc
from trainer.elastic import world_source

NAME, NS = "llm-world", "default"
UPDATES = 30
WATCHERS = 50


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(nodepools="tpu7x-2x2x2:2", mode="simulate", state_dir=tmp_path / "cluster") as c:
        yield c


def configmap(name: str, epoch: int) -> dict:
    return {"metadata": {"name": name}, "data": {DATA_KEY: json.dumps(world_doc(epoch, ["b"]))}}


class Seen:
    """The documents a source delivered, with the monotonic time each arrived."""

    def __init__(self) -> None:
        self.docs: list[tuple[float, dict]] = []
        self.problems: list[str] = []
        self.cond = threading.Condition()

    def document(self, doc: bytes) -> None:
        with self.cond:
            self.docs.append((time.monotonic(), json.loads(doc)))
            self.cond.notify_all()

    def problem(self, msg: str) -> None:
        self.problems.append(msg)

    def wait_epoch(self, epoch: int, timeout: float = 10.0) -> float:
        """The arrival time of the first document of `epoch`."""
        with self.cond:
            found = self.cond.wait_for(
                lambda: next((t for t, d in self.docs if d["epoch"] == epoch), None), timeout
            )
        assert found, f"epoch {epoch} never arrived: {[d['epoch'] for _, d in self.docs]} {self.problems}"
        return found


def start_source(cluster: EmbeddedCluster) -> tuple[world_source.ConfigMapSource, Seen]:
    src = world_source.from_env(
        {"RESLICE_WORLD_CONFIGMAP": NAME, "RESLICE_WORLD_NAMESPACE": NS, "RESLICE_WORLD_API": cluster.url}
    )
    assert isinstance(src, world_source.ConfigMapSource)
    seen = Seen()
    src.start(seen.document, seen.problem)
    return src, seen


def test_a_published_world_is_seen_well_within_a_second(cluster: EmbeddedCluster) -> None:
    core = client.CoreV1Api(cluster.api_client())
    core.create_namespaced_config_map(NS, configmap(NAME, 0))
    core.create_namespaced_config_map(NS, configmap("another", 100))
    cluster.server.audit.clear()
    src, seen = start_source(cluster)
    try:
        seen.wait_epoch(0)
        # What a Role for it must allow: list and watch of configmaps (resourceNames-limited, with
        # the fieldSelector on the name), nothing else.
        wait_for(lambda: ("watch", "", "configmaps") in cluster.server.audit, 5, "the watch")
        assert cluster.server.audit == {("list", "", "configmaps"), ("watch", "", "configmaps")}
        latencies = []
        for epoch in range(1, UPDATES + 1):
            t0 = time.monotonic()  # before the write: the write's own round trip counts too
            core.patch_namespaced_config_map(NAME, NS, configmap(NAME, epoch))
            core.patch_namespaced_config_map("another", NS, configmap("another", 100 + epoch))
            latencies.append(seen.wait_epoch(epoch) - t0)
        print(
            f"ConfigMap update -> source saw it, {UPDATES} updates: median {statistics.median(latencies):.4f} s,"
            f" max {max(latencies):.4f} s"
        )
        assert max(latencies) < 1.0, latencies
        assert all(d["epoch"] < 100 for _, d in seen.docs)  # the other ConfigMap never reaches it
        assert src.lists == 1 and not seen.problems
    finally:
        src.stop()


def test_fifty_watchers_all_see_each_world_within_a_second(cluster: EmbeddedCluster) -> None:
    """Many pods watch one ConfigMap: every update is fanned out to each of their streams."""
    core = client.CoreV1Api(cluster.api_client())
    core.create_namespaced_config_map(NS, configmap(NAME, 0))
    sources = [start_source(cluster) for _ in range(WATCHERS)]
    try:
        for _, seen in sources:
            seen.wait_epoch(0)
        wait_for(lambda: cluster.server.requests[("watch", "configmaps")] >= WATCHERS, 10, "every watch")
        slowest = []
        for epoch in range(1, 11):
            t0 = time.monotonic()
            core.patch_namespaced_config_map(NAME, NS, configmap(NAME, epoch))
            slowest.append(max(seen.wait_epoch(epoch) for _, seen in sources) - t0)
        print(
            f"{WATCHERS} watchers, 10 updates: the last watcher saw each after median"
            f" {statistics.median(slowest):.4f} s, max {max(slowest):.4f} s"
        )
        assert max(slowest) < 1.0, slowest
    finally:
        for src, _ in sources:
            src.stop()


def test_the_watch_lists_again_after_410_gone(cluster: EmbeddedCluster) -> None:
    core = client.CoreV1Api(cluster.api_client())
    core.create_namespaced_config_map(NS, configmap(NAME, 0))
    src, seen = start_source(cluster)
    try:
        seen.wait_epoch(0)
        wait_for(lambda: ("watch", "", "configmaps") in cluster.server.audit, 5, "the watch")
        cluster.server.stop()  # the watch ends; reconnecting is refused meanwhile
        res = RESOURCES["configmaps"]
        cluster.store.patch(res, NS, NAME, configmap(NAME, 1), "merge")  # published while it was away
        cluster.store.compact()  # and the history is gone: its resourceVersion answers 410
        time.sleep(0.3)
        cluster.server.start()
        seen.wait_epoch(1)  # from the second LIST
        assert src.lists == 2
        assert any("Connection refused" in p or "ConnectionRefused" in p for p in seen.problems), (
            seen.problems
        )
        core.patch_namespaced_config_map(NAME, NS, configmap(NAME, 2))
        seen.wait_epoch(2, timeout=5)
    finally:
        src.stop()


def test_the_supervisor_follows_a_configmap(cluster: EmbeddedCluster, tmp_path: Path) -> None:
    core = client.CoreV1Api(cluster.api_client())
    core.create_namespaced_config_map(NS, configmap(NAME, 0))
    pod = Pod(
        tmp_path,
        extra={
            "RESLICE_WORLD_CONFIGMAP": NAME,
            "RESLICE_WORLD_NAMESPACE": NS,
            "RESLICE_WORLD_API": cluster.url,
        },
    )
    try:
        assert pod.wait_starts(1)[0]["env"]["RESLICE_WORLD_EPOCH"] == "0"
        doc = world_doc(1, ["a", "b"])
        core.patch_namespaced_config_map(NAME, NS, {"data": {DATA_KEY: json.dumps(doc)}})
        second = pod.wait_starts(2)[1]
        assert second["env"]["RESLICE_WORLD_EPOCH"] == "1" and second["env"]["RESLICE_SLICE_INDEX"] == "1"
        core.patch_namespaced_config_map(NAME, NS, {"data": {DATA_KEY: json.dumps(world_doc(2, ["a"]))}})
        assert pod.wait() == 0, pod.output()
        assert "follows the worlds of ConfigMap default/llm-world at http://127.0.0.1:" in pod.output()
    finally:
        pod.kill()


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that is its own CA (the pod's ca.crt), and its key."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp / "ca.crt", tmp / "server.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_file, key_file


class BearerTlsFront:
    """What a real API server adds to the embedded one's plain HTTP: TLS, and a bearer token
    checked on every request (401 otherwise). Everything else is relayed to the embedded server."""

    def __init__(self, upstream: int, cert: Path, key: Path) -> None:
        self.upstream, self.token, self.refused = upstream, "", 0
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        with contextlib.suppress(OSError, ssl.SSLError):
            conn = self.ctx.wrap_socket(raw, server_side=True)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                head += chunk
            lines = head.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
            auth = next(
                (
                    v.strip()
                    for k, _, v in (h.partition(":") for h in lines[1:])
                    if k.lower() == "authorization"
                ),
                "",
            )
            if auth != f"Bearer {self.token}":
                self.refused += 1
                body = b'{"kind":"Status","code":401,"message":"Unauthorized"}'
                conn.sendall(
                    b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
                )
                conn.close()
                return
            up = socket.create_connection(("127.0.0.1", self.upstream))
            up.sendall(head)

            def back() -> None:
                with contextlib.suppress(OSError):
                    while data := up.recv(65536):
                        conn.sendall(data)
                with contextlib.suppress(OSError):
                    conn.close()

            threading.Thread(target=back, daemon=True).start()
            while data := conn.recv(65536):
                up.sendall(data)
            up.close()

    def close(self) -> None:
        self.listener.close()


def test_in_cluster_tls_and_a_rotated_token(cluster: EmbeddedCluster, tmp_path: Path) -> None:
    """As in a pod: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT, the service
    account's CA and namespace, and its token read again at every connection (the kubelet rotates
    it): a stale token is refused (one log line, retries) until the file holds the new one."""
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    cert, key = _self_signed(sa)
    (sa / "namespace").write_text(NS)
    (sa / "token").write_text("old-token")
    front = BearerTlsFront(cluster.server.port, cert, key)
    front.token = "new-token"  # rotated before the pod's supervisor connects
    core = client.CoreV1Api(cluster.api_client())
    core.create_namespaced_config_map(NS, configmap(NAME, 0))
    src = world_source.from_env(
        {
            "RESLICE_WORLD_CONFIGMAP": NAME,
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(front.port),
        },
        sa,
    )
    seen = Seen()
    src.start(seen.document, seen.problem)
    try:
        wait_for(lambda: front.refused >= 2, 10, "the stale token refused")
        assert (
            len(seen.problems) == 1 and "HTTP 401" in seen.problems[0] and "Unauthorized" in seen.problems[0]
        )
        (sa / "token").write_text("new-token\n")
        seen.wait_epoch(0)
        core.patch_namespaced_config_map(NAME, NS, configmap(NAME, 1))
        seen.wait_epoch(1, timeout=5)
    finally:
        src.stop()
        front.close()
