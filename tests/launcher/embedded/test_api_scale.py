"""At benchmark size (4 x tpu7x-8x8x48 = 3,072 pods): selector lists stay fast, and a watcher that
stops reading loses its watch instead of slowing the writers (bounded per-watch queues)."""

from __future__ import annotations

import http.client
import json
import time

import pytest

from launcher.embedded.types.resources import RESOURCES
from tests.launcher.embedded.conftest import Api, start_api, stop_api

SLICES, HOSTS = 4, 768


def _pod(slice_idx: int, host: int) -> dict:
    name = f"train-slice-{slice_idx}-{host}-abcde"
    labels = {
        "jobset.sigs.k8s.io/jobset-name": "train",
        "jobset.sigs.k8s.io/job-index": str(slice_idx),
        "batch.kubernetes.io/job-completion-index": str(host),
    }
    env = [{"name": f"RESLICE_{k}", "value": "x" * 24} for k in range(12)]
    spec = {
        "nodeName": f"node-{slice_idx}-{host}",
        "containers": [{"name": "trainer", "image": "trainer:1", "env": env}],
    }
    return {"metadata": {"name": name, "labels": labels}, "spec": spec}


def _create_all(api: Api) -> float:
    """Create the pods in process, as the JobSet/Job controllers do; seconds taken."""
    started = time.perf_counter()
    for s in range(SLICES):
        for h in range(HOSTS):
            api.store.create(RESOURCES["pods"], _pod(s, h))
    return time.perf_counter() - started


@pytest.fixture
def big() -> Api:
    api = start_api(watch_queue=200)
    yield api
    stop_api(api)


def test_lists_over_3072_pods(big: Api) -> None:
    assert _create_all(big) < 20
    big.core.list_namespaced_pod(
        "default", label_selector="warm=up"
    )  # the client's first call builds its models
    started = time.perf_counter()
    one = big.core.list_namespaced_pod(
        "default", label_selector="jobset.sigs.k8s.io/job-index=2,batch.kubernetes.io/job-completion-index=5"
    )
    by_label = time.perf_counter() - started
    assert [p.metadata.name for p in one.items] == ["train-slice-2-5-abcde"]
    started = time.perf_counter()
    by_node = big.core.list_namespaced_pod("default", field_selector="spec.nodeName=node-3-767")
    by_field = time.perf_counter() - started
    assert [p.metadata.name for p in by_node.items] == ["train-slice-3-767-abcde"]
    slice_1 = big.core.list_namespaced_pod(
        "default", label_selector="jobset.sigs.k8s.io/job-index in (1)", limit=1000
    )
    assert len(slice_1.items) == 768 and slice_1.metadata._continue is None
    # Milliseconds in practice; the bounds leave room for a loaded CI machine.
    assert by_label < 0.25 and by_field < 0.5, (by_label, by_field)


def _read_events(resp: http.client.HTTPResponse) -> list[dict]:
    events = []
    while line := resp.readline():
        events.append(json.loads(line))
    return events


def test_a_stalled_watcher_does_not_hold_up_writers(big: Api) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", big.server.port, timeout=10)
    start_rv = big.store.resource_version
    conn.request("GET", f"/api/v1/namespaces/default/pods?watch=true&resourceVersion={start_rv}")
    # The server sends the response's headers once the watch is registered (streams._watch), so
    # from here on the watch exists, and nobody reads it.
    stalled = conn.getresponse()
    assert _create_all(big) < 20  # writers would block here on an unbounded or blocking queue
    # The store dropped the watch once 200 events queued up: the stream ends, short of 3,072 events.
    events = _read_events(stalled)
    assert 0 < len(events) < SLICES * HOSTS
    # The reader resumes from the last version it saw; the history still holds the rest.
    last = events[-1]["object"]["metadata"]["resourceVersion"]
    conn = http.client.HTTPConnection("127.0.0.1", big.server.port, timeout=10)
    conn.request("GET", f"/api/v1/namespaces/default/pods?watch=true&resourceVersion={last}&timeoutSeconds=1")
    rest = _read_events(conn.getresponse())
    names = {e["object"]["metadata"]["name"] for e in events + rest}
    assert len(names) == SLICES * HOSTS
