"""pods/log: content from the kubelet's log source, `tailLines`, `follow` streaming, container
selection, with the client calls reslice and kubectl make."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from kubernetes import watch
from kubernetes.client import ApiException

from tests.embedded.conftest import Api, pod


class FakeKubeletLogs:
    """A growing log per container, as the kubelet half keeps them (files appended to)."""

    def __init__(self) -> None:
        self.logs: dict[tuple[str, str, str], bytearray] = {}
        self.done = threading.Event()

    def write(self, ns: str, name: str, container: str, data: bytes) -> None:
        self.logs.setdefault((ns, name, container), bytearray()).extend(data)

    def __call__(self, ns: str, name: str, container: str, follow: bool) -> Iterator[bytes]:
        log = self.logs.setdefault((ns, name, container), bytearray())
        sent = 0
        while True:
            if sent < len(log):
                chunk = bytes(log[sent:])
                sent += len(chunk)
                yield chunk
            elif not follow or self.done.is_set():
                return
            else:
                time.sleep(0.02)


@pytest.fixture
def logs(api: Api) -> FakeKubeletLogs:
    source = FakeKubeletLogs()
    api.server.set_log_source(source)
    return source


def test_log_and_tail_lines(api: Api, logs: FakeKubeletLogs) -> None:
    api.core.create_namespaced_pod("default", pod("p", node="n1"))
    logs.write("default", "p", "main", b"step 1\nstep 2\nstep 3\n")
    assert api.core.read_namespaced_pod_log("p", "default") == "step 1\nstep 2\nstep 3\n"
    assert api.core.read_namespaced_pod_log("p", "default", tail_lines=2) == "step 2\nstep 3\n"
    assert api.core.read_namespaced_pod_log("p", "default", limit_bytes=4) == "step"


def test_follow_streams_lines_as_they_are_written(api: Api, logs: FakeKubeletLogs) -> None:
    api.core.create_namespaced_pod("default", pod("p", node="n1"))
    logs.write("default", "p", "main", b"old 1\nold 2\nold 3\n")

    def trainer() -> None:
        for i in range(3):
            time.sleep(0.1)
            logs.write("default", "p", "main", f"new {i}\n".encode())
        logs.done.set()

    threading.Thread(target=trainer, daemon=True).start()
    started = time.monotonic()
    lines, first_new_at = [], None
    for line in watch.Watch().stream(
        api.core.read_namespaced_pod_log, "p", "default", follow=True, tail_lines=1
    ):
        lines.append(line)
        if line == "new 0":
            first_new_at = time.monotonic() - started
    assert lines == ["old 3", "new 0", "new 1", "new 2"]
    assert first_new_at is not None and first_new_at < 0.3  # streamed, not collected at the end


def test_container_must_be_named_when_there_are_several(api: Api, logs: FakeKubeletLogs) -> None:
    body = pod("p", node="n1")
    body["spec"]["containers"].append({"name": "sidecar", "image": "log:1"})
    api.core.create_namespaced_pod("default", body)
    logs.write("default", "p", "sidecar", b"from the sidecar\n")
    with pytest.raises(ApiException) as err:
        api.core.read_namespaced_pod_log("p", "default")
    assert err.value.status == 400
    assert "a container name must be specified for pod p, choose one of: [main sidecar]" in err.value.body
    assert api.core.read_namespaced_pod_log("p", "default", container="sidecar") == "from the sidecar\n"
    with pytest.raises(ApiException) as err:
        api.core.read_namespaced_pod_log("p", "default", container="nope")
    assert err.value.status == 400
    with pytest.raises(ApiException) as err:
        api.core.read_namespaced_pod_log("missing", "default")
    assert err.value.status == 404
