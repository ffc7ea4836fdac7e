"""Label and field selectors on list (and pagination), as kubectl and controllers use them."""

from __future__ import annotations

import json

import pytest
from kubernetes.client import ApiException

from launcher.embedded.types.resources import RESOURCES
from tests.launcher.embedded.conftest import Api, pod, start_api, stop_api


@pytest.fixture
def pods(api: Api) -> Api:
    specs = [
        ("a-0", {"app": "trainer", "slice": "0", "tier": "gold"}, "n1"),
        ("a-1", {"app": "trainer", "slice": "1"}, "n2"),
        ("b-0", {"app": "eval", "slice": "0"}, None),
        ("c-0", {}, None),
    ]
    for name, labels, node in specs:
        api.core.create_namespaced_pod("default", pod(name, labels, node))
    api.core.patch_namespaced_pod_status("a-1", "default", {"status": {"phase": "Running"}})
    return api


def _names(api: Api, **kwargs: str) -> list[str]:
    return [p.metadata.name for p in api.core.list_namespaced_pod("default", **kwargs).items]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=trainer", ["a-0", "a-1"]),
        ("app==eval", ["b-0"]),
        ("app!=trainer", ["b-0", "c-0"]),
        ("slice in (1, 2)", ["a-1"]),
        ("slice notin (1)", ["a-0", "b-0", "c-0"]),
        ("tier", ["a-0"]),
        ("!tier", ["a-1", "b-0", "c-0"]),
        ("app in (trainer,eval),slice=0", ["a-0", "b-0"]),
        ("app=trainer,!tier", ["a-1"]),
    ],
)
def test_label_selectors(pods: Api, selector: str, expected: list[str]) -> None:
    assert _names(pods, label_selector=selector) == expected


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("metadata.name=b-0", ["b-0"]),
        ("metadata.name!=b-0", ["a-0", "a-1", "c-0"]),
        ("status.phase=Running", ["a-1"]),
        ("status.phase!=Running", ["a-0", "b-0", "c-0"]),
        ("spec.nodeName=n1", ["a-0"]),
        ("spec.nodeName=", ["b-0", "c-0"]),  # unscheduled pods, as the scheduler lists them
        ("spec.nodeName!=,status.phase==Pending", ["a-0"]),
        ("metadata.namespace=default,metadata.name=c-0", ["c-0"]),
    ],
)
def test_field_selectors(pods: Api, selector: str, expected: list[str]) -> None:
    assert _names(pods, field_selector=selector) == expected


def test_field_and_label_selectors_combine(pods: Api) -> None:
    assert _names(pods, label_selector="app=trainer", field_selector="spec.nodeName=n2") == ["a-1"]


def test_a_node_selector_follows_its_pods_through_moves_deletes_and_a_restart(tmp_path) -> None:
    """`spec.nodeName=X` is answered from an index of pods by node (as kube-apiserver's watch cache
    keeps one): it must follow every write that changes a pod's node, and survive a reload."""
    api = start_api(tmp_path)
    try:
        core = api.core
        for name, node, ns in [
            ("a-0", "n1", "default"),
            ("b-0", "n2", "default"),
            ("x-0", "n1", "kube-system"),
        ]:
            core.create_namespaced_pod(ns, pod(name, {"app": name[0]}, node))
        core.create_namespaced_pod("default", pod("u-0", {"app": "u"}))  # not scheduled yet
        on = lambda node, **kw: sorted(  # noqa: E731
            p.metadata.name
            for p in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}", **kw).items
        )
        assert on("n1") == ["a-0", "x-0"] and on("n2") == ["b-0"] and on("n3") == []
        assert _names(api, field_selector="spec.nodeName=n1") == ["a-0"]  # one namespace
        assert on("n1", label_selector="app=x") == ["x-0"]
        bound = api.store.get(RESOURCES["pods"], "default", "u-0")
        bound["spec"]["nodeName"] = "n2"  # the scheduler binds it
        api.store.update(RESOURCES["pods"], bound)
        assert on("n2") == ["b-0", "u-0"]
        core.delete_namespaced_pod("a-0", "default", grace_period_seconds=0)
        core.create_namespaced_pod("default", pod("a-0", {"app": "a"}, "n2"))  # recreated elsewhere
        assert on("n1") == ["x-0"] and on("n2") == ["a-0", "b-0", "u-0"]
        core.delete_namespaced_pod("b-0", "default", grace_period_seconds=0)  # gone for good
        assert on("n2") == ["a-0", "u-0"]
        api.server.restart(downtime_s=0.1)  # the index is rebuilt from the state dir
        assert on("n1") == ["x-0"] and on("n2") == ["a-0", "u-0"]
        assert _names(api, field_selector="spec.nodeName=") == []
    finally:
        stop_api(api)


def test_event_field_selectors(api: Api) -> None:
    for i, (obj, reason) in enumerate([("p1", "Scheduled"), ("p2", "FailedScheduling"), ("p1", "Started")]):
        api.core.create_namespaced_event(
            "default",
            {
                "metadata": {"name": f"e{i}"},
                "involvedObject": {"kind": "Pod", "name": obj, "namespace": "default"},
                "reason": reason,
                "type": "Normal",
                "source": {"component": "kubelet"},
            },
        )
    by_object = api.core.list_namespaced_event(
        "default", field_selector="involvedObject.name=p1,involvedObject.kind=Pod"
    )
    assert [e.reason for e in by_object.items] == ["Scheduled", "Started"]
    failed = api.core.list_namespaced_event("default", field_selector="reason=FailedScheduling")
    assert [e.involved_object.name for e in failed.items] == ["p2"]
    assert len(api.core.list_namespaced_event("default", field_selector="source=kubelet").items) == 3


def test_bad_selectors_are_400(pods: Api) -> None:
    with pytest.raises(ApiException) as err:
        pods.core.list_namespaced_pod("default", field_selector="spec.image=x")
    assert (
        err.value.status == 400
        and "field label not supported: spec.image" in json.loads(err.value.body)["message"]
    )
    with pytest.raises(ApiException) as err:
        pods.core.list_namespaced_pod("default", label_selector="app in trainer")
    assert err.value.status == 400


def test_custom_resources_support_only_name_and_namespace_fields(api: Api) -> None:
    with pytest.raises(ApiException) as err:
        api.custom.list_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", field_selector="spec.suspend=true"
        )
    assert err.value.status == 400


def test_limit_and_continue_page_through_a_list(pods: Api) -> None:
    first = pods.core.list_namespaced_pod("default", limit=3)
    assert [p.metadata.name for p in first.items] == ["a-0", "a-1", "b-0"]
    assert first.metadata.remaining_item_count == 1 and first.metadata._continue
    second = pods.core.list_namespaced_pod("default", limit=3, _continue=first.metadata._continue)
    assert [p.metadata.name for p in second.items] == ["c-0"] and not second.metadata._continue
