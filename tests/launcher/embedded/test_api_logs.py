"""pods/log: content from the kubelet's log source, `tailLines`, `follow` streaming, container
selection, with the client calls reslice and kubectl make."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from kubernetes import watch
from kubernetes.client import ApiException

from tests.launcher.embedded.conftest import Api, pod


class FakeKubeletLogs:
    """A growing log per container, as the kubelet half keeps them (files appended to)."""

    def __init__(self) -> None:
        self.logs: dict[tuple[str, str, str], bytearray] = {}
        self.done = False
        self.changed = threading.Condition()  # a write, or the end: what a following reader waits on

    def write(self, ns: str, name: str, container: str, data: bytes) -> None:
        with self.changed:
            self.logs.setdefault((ns, name, container), bytearray()).extend(data)
            self.changed.notify_all()

    def finish(self) -> None:
        with self.changed:
            self.done = True
            self.changed.notify_all()

    def __call__(self, ns: str, name: str, container: str, follow: bool) -> Iterator[bytes]:
        with self.changed:
            log = self.logs.setdefault((ns, name, container), bytearray())
        sent = 0
        while True:
            with self.changed:
                # 30 s: a safety net for a test that never finishes its log.
                self.changed.wait_for(lambda sent=sent: sent < len(log) or not follow or self.done, 30)
                chunk = bytes(log[sent:])
            if chunk:
                sent += len(chunk)
                yield chunk
            elif not follow or self.done:
                return


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

    # Lockstep with the reader: each line is written once the reader has the one before, so a
    # stream collected at the end (or one that missed lines written while it was open) fails.
    had = {line: threading.Event() for line in ("old 3", "new 0")}
    handshakes: list[bool] = []

    def trainer() -> None:
        for i, after in enumerate(("old 3", "new 0", "new 0")):
            if i < 2:
                handshakes.append(had[after].wait(10))  # 10 s: only a broken stream waits that long
            logs.write("default", "p", "main", f"new {i}\n".encode())
        logs.finish()

    threading.Thread(target=trainer, daemon=True).start()
    lines = []
    for line in watch.Watch().stream(
        api.core.read_namespaced_pod_log, "p", "default", follow=True, tail_lines=1
    ):
        lines.append(line)
        if line in had:
            had[line].set()
    assert lines == ["old 3", "new 0", "new 1", "new 2"]
    assert handshakes == [True, True]  # streamed as written, not collected at the end


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
