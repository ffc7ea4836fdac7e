"""Persistence to a state directory: objects, uids and the resourceVersion survive a restart of the
store and server, a hard kill loses no acknowledged write, and a torn journal line is harmless."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from kubernetes import watch
from kubernetes.client import ApiException

from launcher.embedded.store.journal import JOURNAL
from launcher.embedded.store.store import Store
from launcher.embedded.types.resources import RESOURCES
from tests.launcher.embedded.conftest import jobset, pod, start_api, stop_api

ROOT = Path(__file__).resolve().parents[3]


def test_objects_and_versions_survive_a_restart(tmp_path: Path) -> None:
    api = start_api(tmp_path)
    api.core.create_namespace({"metadata": {"name": "run"}})
    kept = api.core.create_namespaced_pod("run", pod("kept", {"a": "b"}))
    api.core.create_namespaced_pod("run", pod("gone"))
    api.core.delete_namespaced_pod("gone", "run")
    api.custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "run", "jobsets", jobset())
    api.custom.patch_namespaced_custom_object_status(
        "jobset.x-k8s.io", "v1alpha2", "run", "jobsets", "train", {"status": {"restarts": 2}}
    )
    last_rv = int(api.store.resource_version)
    stop_api(api)

    api = start_api(tmp_path)
    try:
        pods = api.core.list_namespaced_pod("run")
        assert [p.metadata.name for p in pods.items] == ["kept"]
        assert pods.items[0].metadata.uid == kept.metadata.uid
        assert int(pods.metadata.resource_version) == last_rv
        js = api.custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "run", "jobsets", "train")
        assert js["status"] == {"restarts": 2}
        assert [p.metadata.name for p in api.core.list_namespaced_pod("run", label_selector="a=b").items] == [
            "kept"
        ]
        after = api.core.create_namespaced_pod("run", pod("new"))
        assert int(after.metadata.resource_version) == last_rv + 1
        # The watch history did not survive: an older version is Gone.
        with pytest.raises(ApiException) as err:
            list(
                watch.Watch().stream(
                    api.core.list_namespaced_pod, "run", resource_version="3", timeout_seconds=2
                )
            )
        assert err.value.status == 410
    finally:
        stop_api(api)


def test_server_restart_reloads_from_the_state_dir(tmp_path: Path) -> None:
    api = start_api(tmp_path)
    try:
        api.core.create_namespaced_config_map("default", {"metadata": {"name": "c"}, "data": {"k": "v"}})
        # A line written behind the store's back: only a reload from the state dir can see it.
        rv = int(api.store.resource_version) + 1
        meta = f'{{"name":"from-disk","namespace":"default","uid":"u1","resourceVersion":"{rv}"}}'
        with open(tmp_path / JOURNAL, "a", encoding="utf-8") as f:
            f.write(
                f'{{"rv":{rv},"r":"configmaps","o":{{"apiVersion":"v1","kind":"ConfigMap","metadata":{meta}}}}}\n'
            )
        api.server.restart(downtime_s=0.1)
        names = [c.metadata.name for c in api.core.list_namespaced_config_map("default").items]
        assert names == ["c", "from-disk"]
        assert api.store.resource_version == str(rv)
    finally:
        stop_api(api)


_WRITER = textwrap.dedent(
    """
    import sys
    from launcher.embedded.types.resources import RESOURCES
    from launcher.embedded.store.store import Store
    store = Store(sys.argv[1])
    i = 0
    while True:
        store.create(RESOURCES["configmaps"], {"metadata": {"name": f"c{i}"}, "data": {"i": str(i)}})
        print(f"c{i}", flush=True)
        i += 1
    """
)


def test_hard_kill_loses_no_acknowledged_write(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    acknowledged = []
    deadline = time.monotonic() + 30
    assert proc.stdout is not None
    while len(acknowledged) < 200 and time.monotonic() < deadline:
        acknowledged.append(proc.stdout.readline().strip())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(acknowledged) == 200, "the writer did not get going"
    store = Store(tmp_path)
    names = {c["metadata"]["name"] for c in store.list(RESOURCES["configmaps"], "default")[0]}
    assert set(acknowledged) <= names
    assert int(store.resource_version) >= len(names) + 4  # + the four namespaces created at start
    store.close()


def test_a_torn_journal_line_is_ignored(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.create(RESOURCES["configmaps"], {"metadata": {"name": "whole"}})
    rv = store.resource_version
    store.close()
    with open(tmp_path / JOURNAL, "a", encoding="utf-8") as f:
        f.write('{"rv":999,"r":"configmaps","o":{"metadata":{"name":"torn"')  # killed mid-write
    store = Store(tmp_path)
    names = [c["metadata"]["name"] for c in store.list(RESOURCES["configmaps"], "default")[0]]
    assert names == ["whole"] and store.resource_version == rv
    store.close()
