"""PATCH in its three formats, as the official client sends them: strategic merge for a dict body
on a built-in kind, JSON patch for a list body, merge patch for custom objects (or on request)."""

from __future__ import annotations

import json

import pytest
from kubernetes.client import ApiException

from tests.launcher.embedded.conftest import Api, jobset, pod

MERGE = "application/merge-patch+json"


def _two_container_pod() -> dict:
    body = pod("p", tolerations=[{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}])
    body["spec"]["containers"] = [
        {
            "name": "main",
            "image": "trainer:1",
            "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
        },
        {"name": "sidecar", "image": "log:1"},
    ]
    return body


def test_strategic_merge_merges_lists_by_their_keys(api: Api) -> None:
    api.core.create_namespaced_pod("default", _two_container_pod())
    patched = api.core.patch_namespaced_pod(
        "p",
        "default",
        {
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "trainer:2",
                        "env": [{"name": "B", "value": "20"}, {"name": "C", "value": "3"}],
                    },
                    {"name": "sidecar", "$patch": "delete"},
                ],
                # tolerations have no patchMergeKey upstream: the list is replaced whole
                "tolerations": [{"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true"}],
            }
        },
    )
    containers = {c.name: c for c in patched.spec.containers}
    assert set(containers) == {"main"}
    assert containers["main"].image == "trainer:2"
    assert [(e.name, e.value) for e in containers["main"].env] == [("A", "1"), ("B", "20"), ("C", "3")]
    assert [t.key for t in patched.spec.tolerations] == ["cloud.google.com/gke-spot"]


def test_strategic_merge_on_status_conditions_by_type(api: Api) -> None:
    api.core.create_namespaced_pod("default", pod("p", node="n1"))
    api.core.patch_namespaced_pod_status(
        "p",
        "default",
        {
            "status": {
                "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Ready", "status": "False"},
                ]
            }
        },
    )
    patched = api.core.patch_namespaced_pod_status(
        "p", "default", {"status": {"conditions": [{"type": "Ready", "status": "True"}], "phase": "Running"}}
    )
    assert {c.type: c.status for c in patched.status.conditions} == {"PodScheduled": "True", "Ready": "True"}
    assert patched.status.phase == "Running"


def test_merge_patch_replaces_lists_and_null_deletes(api: Api) -> None:
    api.core.create_namespaced_pod("default", _two_container_pod())
    patched = api.core.patch_namespaced_pod(
        "p",
        "default",
        {"metadata": {"labels": {"a": "1"}}, "spec": {"tolerations": [{"key": "k", "operator": "Exists"}]}},
        _content_type=MERGE,
    )
    assert patched.metadata.labels == {"a": "1"} and [t.key for t in patched.spec.tolerations] == ["k"]
    removed = api.core.patch_namespaced_pod(
        "p", "default", {"metadata": {"labels": {"a": None}}}, _content_type=MERGE
    )
    assert not removed.metadata.labels


def test_json_patch(api: Api) -> None:
    api.core.create_namespaced_config_map(
        "default", {"metadata": {"name": "c"}, "data": {"a": "1", "b": "2"}}
    )
    patched = api.core.patch_namespaced_config_map(
        "c",
        "default",
        [
            {"op": "test", "path": "/data/a", "value": "1"},
            {"op": "replace", "path": "/data/a", "value": "10"},
            {"op": "remove", "path": "/data/b"},
            {"op": "add", "path": "/metadata/annotations", "value": {"example.com/k": "v"}},
            {"op": "replace", "path": "/metadata/annotations/example.com~1k", "value": "w"},
            {"op": "copy", "from": "/data/a", "path": "/data/c"},
        ],
    )
    assert patched.data == {"a": "10", "c": "10"}
    assert patched.metadata.annotations == {"example.com/k": "w"}
    with pytest.raises(ApiException) as err:
        api.core.patch_namespaced_config_map(
            "c", "default", [{"op": "test", "path": "/data/a", "value": "nope"}]
        )
    assert err.value.status == 422
    assert api.core.read_namespaced_config_map("c", "default").data == {"a": "10", "c": "10"}


def test_custom_objects_take_merge_patch_not_strategic(api: Api) -> None:
    api.custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "default", "jobsets", jobset())
    patched = api.custom.patch_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", "train", {"spec": {"suspend": True}}
    )
    assert patched["spec"]["suspend"] is True
    with pytest.raises(ApiException) as err:
        api.custom.patch_namespaced_custom_object(
            "jobset.x-k8s.io",
            "v1alpha2",
            "default",
            "jobsets",
            "train",
            {"spec": {"suspend": False}},
            _content_type="application/strategic-merge-patch+json",
        )
    assert err.value.status == 415


def test_patch_with_stale_resource_version_is_409(api: Api) -> None:
    cm = api.core.create_namespaced_config_map("default", {"metadata": {"name": "c"}, "data": {"a": "1"}})
    api.core.patch_namespaced_config_map("c", "default", {"data": {"a": "2"}})
    stale = {"metadata": {"resourceVersion": cm.metadata.resource_version}, "data": {"a": "3"}}
    with pytest.raises(ApiException) as err:
        api.core.patch_namespaced_config_map("c", "default", stale)
    assert err.value.status == 409 and json.loads(err.value.body)["reason"] == "Conflict"
