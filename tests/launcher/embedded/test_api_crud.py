"""Create / get / list / update through the official client: status codes, resourceVersion,
generation, defaults, conflicts and the Status bodies of errors."""

from __future__ import annotations

import json
import socket
import struct
import threading
from urllib.parse import urlsplit

import pytest
from kubernetes.client import ApiException

from tests.launcher.embedded.conftest import Api, job, jobset, pod
from tests.support.wait import wait_for


def _status(exc: ApiException) -> dict:
    return json.loads(exc.body)


def test_create_answers_201_with_server_fields(api: Api) -> None:
    created, code, _ = api.core.create_namespaced_pod_with_http_info("default", pod("p1"))
    assert code == 201
    meta = created.metadata
    assert meta.uid and meta.creation_timestamp and meta.generation == 1
    assert int(meta.resource_version) > 0
    # A created pod is Pending whatever the body said, with the API server's defaults.
    assert created.status.phase == "Pending" and created.status.qos_class == "BestEffort"
    assert created.spec.restart_policy == "Always"
    assert created.spec.termination_grace_period_seconds == 30
    assert {t.key for t in created.spec.tolerations} == {
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    }


def test_every_write_bumps_one_global_resource_version(api: Api) -> None:
    a = api.core.create_namespaced_pod("default", pod("a"))
    cm = api.core.create_namespaced_config_map("default", {"metadata": {"name": "c"}, "data": {"k": "v"}})
    b = api.core.create_namespaced_pod("default", pod("b"))
    versions = [
        int(a.metadata.resource_version),
        int(cm.metadata.resource_version),
        int(b.metadata.resource_version),
    ]
    assert versions == sorted(versions) and len(set(versions)) == 3
    listed = api.core.list_namespaced_pod("default")
    assert int(listed.metadata.resource_version) >= versions[-1]
    assert [p.metadata.name for p in listed.items] == ["a", "b"]


def test_get_list_and_404_status(api: Api) -> None:
    api.core.create_namespaced_pod("default", pod("p1"))
    assert api.core.read_namespaced_pod("p1", "default").metadata.name == "p1"
    with pytest.raises(ApiException) as err:
        api.core.read_namespaced_pod("nope", "default")
    status = _status(err.value)
    assert err.value.status == 404
    assert status["kind"] == "Status" and status["reason"] == "NotFound"
    assert status["message"] == 'pods "nope" not found'


def test_create_in_missing_namespace_is_404_and_namespaces_work(api: Api) -> None:
    with pytest.raises(ApiException) as err:
        api.core.create_namespaced_pod("team-a", pod("p1"))
    assert err.value.status == 404 and _status(err.value)["message"] == 'namespaces "team-a" not found'
    api.core.create_namespace({"metadata": {"name": "team-a"}})
    assert api.core.create_namespaced_pod("team-a", pod("p1")).metadata.namespace == "team-a"
    assert api.core.read_namespace("team-a").status.phase == "Active"
    names = {p.metadata.namespace for p in api.core.list_pod_for_all_namespaces().items}
    assert names == {"team-a"}


def test_name_conflict_is_409_already_exists(api: Api) -> None:
    api.core.create_namespaced_pod("default", pod("p1"))
    with pytest.raises(ApiException) as err:
        api.core.create_namespaced_pod("default", pod("p1"))
    assert err.value.status == 409 and _status(err.value)["reason"] == "AlreadyExists"


def test_stale_update_is_409_conflict(api: Api) -> None:
    first = api.core.create_namespaced_config_map("default", {"metadata": {"name": "c"}, "data": {"k": "1"}})
    first.data = {"k": "2"}
    second = api.core.replace_namespaced_config_map("c", "default", first)
    assert second.data == {"k": "2"}
    assert int(second.metadata.resource_version) > int(first.metadata.resource_version)
    first.data = {"k": "3"}  # still carries the old resourceVersion
    with pytest.raises(ApiException) as err:
        api.core.replace_namespaced_config_map("c", "default", first)
    status = _status(err.value)
    assert err.value.status == 409 and status["reason"] == "Conflict"
    assert "the object has been modified" in status["message"]
    assert api.core.read_namespaced_config_map("c", "default").data == {"k": "2"}


def test_generation_counts_spec_changes_only(api: Api) -> None:
    created = api.custom.create_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", jobset()
    )
    assert created["metadata"]["generation"] == 1
    labelled = api.custom.patch_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", "train", {"metadata": {"labels": {"x": "y"}}}
    )
    assert labelled["metadata"]["generation"] == 1
    status = api.custom.patch_namespaced_custom_object_status(
        "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", "train", {"status": {"restarts": 1}}
    )
    assert status["metadata"]["generation"] == 1 and status["status"]["restarts"] == 1
    suspended = api.custom.patch_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", "train", {"spec": {"suspend": True}}
    )
    assert suspended["metadata"]["generation"] == 2


def test_status_subresource_separates_spec_and_status(api: Api) -> None:
    api.custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "default", "jobsets", jobset())
    # The main resource ignores status; the status subresource ignores everything else.
    body = api.custom.get_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", "train"
    )
    body["status"] = {"restarts": 5}
    body["spec"]["suspend"] = True
    after_main = api.custom.replace_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", "train", body
    )
    assert after_main["spec"]["suspend"] is True and "status" not in after_main
    after_main["status"] = {"restarts": 5}
    after_main["spec"]["suspend"] = False
    after_status = api.custom.replace_namespaced_custom_object_status(
        "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", "train", after_main
    )
    assert after_status["status"] == {"restarts": 5} and after_status["spec"]["suspend"] is True
    pod_status = api.core.create_namespaced_pod("default", pod("p", node="n1"))
    pod_status.status.phase = "Running"
    assert api.core.replace_namespaced_pod_status("p", "default", pod_status).status.phase == "Running"
    pod_status.status.phase = "Failed"
    pod_status.metadata.resource_version = None
    assert api.core.replace_namespaced_pod("p", "default", pod_status).status.phase == "Running"


def test_noop_update_commits_nothing(api: Api) -> None:
    cm = api.core.create_namespaced_config_map("default", {"metadata": {"name": "c"}, "data": {"k": "v"}})
    again = api.core.replace_namespaced_config_map("c", "default", cm)
    assert again.metadata.resource_version == cm.metadata.resource_version


def test_job_gets_generated_selector_and_template_labels(api: Api) -> None:
    created = api.batch.create_namespaced_job("default", job("trainer-0", completions=4))
    uid = created.metadata.uid
    assert created.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": uid}
    labels = created.spec.template.metadata.labels
    assert labels["batch.kubernetes.io/job-name"] == "trainer-0" and labels["controller-uid"] == uid
    assert created.spec.backoff_limit == 6 and created.spec.completion_mode == "Indexed"


def test_invalid_objects_are_422(api: Api) -> None:
    bad_job = job("j")
    bad_job["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    with pytest.raises(ApiException) as err:
        api.batch.create_namespaced_job("default", bad_job)
    assert err.value.status == 422
    assert 'spec.template.spec.restartPolicy: Unsupported value: "Always"' in _status(err.value)["message"]
    with pytest.raises(ApiException) as err:
        api.core.create_namespaced_pod("default", pod("Bad_Name"))
    assert err.value.status == 422 and _status(err.value)["details"]["causes"][0]["field"] == "metadata.name"
    with pytest.raises(ApiException) as err:
        api.core.create_namespaced_pod("default", pod("p", labels={"run": "x" * 64}))
    assert err.value.status == 422 and "must be no more than 63 characters" in _status(err.value)["message"]


def test_generate_name(api: Api) -> None:
    body = pod("")
    body["metadata"] = {"generateName": "worker-"}
    created = api.core.create_namespaced_pod("default", body)
    suffix = created.metadata.name.removeprefix("worker-")
    assert len(suffix) == 5 and set(suffix) <= set("bcdfghjklmnpqrstvwxz2456789")


def test_nodes_events_leases(api: Api) -> None:
    node = api.core.create_node(
        {"metadata": {"name": "n1", "labels": {"pool": "a"}}, "status": {"capacity": {"google.com/tpu": "4"}}}
    )
    assert node.metadata.namespace is None and node.status.capacity == {"google.com/tpu": "4"}
    event = {
        "metadata": {"name": "p1.1"},
        "involvedObject": {"kind": "Pod", "name": "p1", "namespace": "default"},
        "reason": "FailedScheduling",
        "message": "0/1 nodes are available",
        "type": "Warning",
    }
    assert api.core.create_namespaced_event("default", event).reason == "FailedScheduling"
    lease = {"metadata": {"name": "leader"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}
    created = api.coordination.create_namespaced_lease("default", lease)
    created.spec.holder_identity = "b"
    assert api.coordination.replace_namespaced_lease("leader", "default", created).spec.holder_identity == "b"
    created.spec.holder_identity = "c"  # a second writer with the old version loses the election
    with pytest.raises(ApiException) as err:
        api.coordination.replace_namespaced_lease("leader", "default", created)
    assert err.value.status == 409


def test_a_client_hanging_up_is_not_reported_as_a_server_error(api: Api, capfd) -> None:
    """A keep-alive connection reset between requests (a controller stopping its watches) is
    normal: no traceback on the server's stderr, and the server keeps answering."""
    url = urlsplit(api.server.url)
    before = set(threading.enumerate())
    with socket.create_connection((url.hostname, url.port)) as s:
        s.sendall(b"GET /api HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        handler = set(threading.enumerate()) - before  # the server's thread for this connection
        assert handler
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
    # The server reports a handler's error in that thread before it ends: once it has ended,
    # whatever it had to say about the reset is on stderr.
    wait_for(lambda: not any(t.is_alive() for t in handler), 10, "the connection's handler to end")
    assert api.core.list_namespace().items is not None
    assert "Traceback" not in capfd.readouterr().err
