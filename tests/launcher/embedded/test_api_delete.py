"""Deletion: graceful pod deletion, propagation policies and garbage collection through
ownerReferences, preconditions, finalizers and namespaces."""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from tests.launcher.embedded.conftest import Api, job, jobset, owner_ref, pod

JS = ("jobset.x-k8s.io", "v1alpha2", "default", "jobsets")


def _exists(read, *args: str) -> bool:
    try:
        read(*args)
    except ApiException as e:
        assert e.status == 404
        return False
    return True


def _family(api: Api) -> tuple[dict, dict, list[str]]:
    """A JobSet owning a Job owning two bound pods, as the controllers build them."""
    js = api.custom.create_namespaced_custom_object(*JS, jobset())
    jb = api.client.sanitize_for_serialization(
        api.batch.create_namespaced_job("default", job("train-slice-0", 2, owner=js))
    )
    names = []
    for i in range(2):
        body = pod(f"train-slice-0-{i}", {"job-name": "train-slice-0"}, node=f"n{i}")
        body["metadata"]["ownerReferences"] = [owner_ref(jb)]
        names.append(api.core.create_namespaced_pod("default", body).metadata.name)
    return js, jb, names


def test_graceful_deletion_of_a_bound_pod(api: Api) -> None:
    api.core.create_namespaced_pod("default", pod("p", node="n1", terminationGracePeriodSeconds=45))
    deleted = api.core.delete_namespaced_pod("p", "default")
    # Still there, marked: the kubelet stops the containers, then deletes with grace 0.
    assert deleted.metadata.deletion_timestamp is not None
    assert deleted.metadata.deletion_grace_period_seconds == 45
    assert api.core.read_namespaced_pod("p", "default").metadata.deletion_timestamp is not None
    shorter = api.core.delete_namespaced_pod("p", "default", grace_period_seconds=5)
    assert shorter.metadata.deletion_grace_period_seconds == 5
    api.core.delete_namespaced_pod("p", "default", grace_period_seconds=0)
    assert not _exists(api.core.read_namespaced_pod, "p", "default")


def test_removing_the_last_finalizer_does_not_cut_a_graceful_deletion_short(api: Api) -> None:
    # Upstream deletes during an update only when the grace period is 0: a terminating pod that
    # loses its last finalizer stays until the kubelet's final delete.
    body = pod("p", node="n1")
    body["metadata"]["finalizers"] = ["batch.kubernetes.io/job-tracking"]
    api.core.create_namespaced_pod("default", body)
    api.core.delete_namespaced_pod("p", "default")
    api.core.patch_namespaced_pod("p", "default", {"metadata": {"finalizers": None}})
    assert api.core.read_namespaced_pod("p", "default").metadata.deletion_timestamp is not None
    api.core.delete_namespaced_pod("p", "default", grace_period_seconds=0)
    assert not _exists(api.core.read_namespaced_pod, "p", "default")


def test_unbound_and_terminal_pods_go_at_once(api: Api) -> None:
    api.core.create_namespaced_pod("default", pod("pending"))
    api.core.create_namespaced_pod("default", pod("done", node="n1"))
    api.core.patch_namespaced_pod_status("done", "default", {"status": {"phase": "Succeeded"}})
    api.core.delete_namespaced_pod("pending", "default")
    api.core.delete_namespaced_pod("done", "default")
    assert api.core.list_namespaced_pod("default").items == []


def test_background_propagation_collects_the_whole_tree(api: Api) -> None:
    _, _, pods = _family(api)
    api.custom.delete_namespaced_custom_object(*JS, "train", propagation_policy="Background")
    assert not _exists(api.custom.get_namespaced_custom_object, *JS, "train")
    assert not _exists(api.batch.read_namespaced_job, "train-slice-0", "default")
    # Bound pods are deleted gracefully: still there, with a deletionTimestamp, until the kubelet is done.
    remaining = api.core.list_namespaced_pod("default").items
    assert sorted(p.metadata.name for p in remaining) == pods
    assert all(p.metadata.deletion_timestamp for p in remaining)


def test_foreground_propagation_waits_for_blocking_dependents(api: Api) -> None:
    _, _, pods = _family(api)
    body = client.V1DeleteOptions(propagation_policy="Foreground")
    api.custom.delete_namespaced_custom_object(*JS, "train", body=body)
    js = api.custom.get_namespaced_custom_object(*JS, "train")
    assert js["metadata"]["deletionTimestamp"] and js["metadata"]["finalizers"] == ["foregroundDeletion"]
    jb = api.batch.read_namespaced_job("train-slice-0", "default")
    assert jb.metadata.finalizers == ["foregroundDeletion"]
    for name in pods[:-1]:
        api.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
    assert _exists(api.custom.get_namespaced_custom_object, *JS, "train")
    api.core.delete_namespaced_pod(pods[-1], "default", grace_period_seconds=0)  # the last one
    assert not _exists(api.batch.read_namespaced_job, "train-slice-0", "default")
    assert not _exists(api.custom.get_namespaced_custom_object, *JS, "train")


def test_orphan_propagation_strips_owner_references(api: Api) -> None:
    _, _, pods = _family(api)
    api.batch.delete_namespaced_job("train-slice-0", "default", propagation_policy="Orphan")
    left = api.core.list_namespaced_pod("default").items
    assert [p.metadata.name for p in left] == pods
    assert all(not p.metadata.owner_references and not p.metadata.deletion_timestamp for p in left)


def test_batch_v1_jobs_orphan_pods_by_default(api: Api) -> None:
    """Upstream keeps the batch/v1 default of orphaning for back compatibility: a Job deleted
    without a propagationPolicy leaves its pods running."""
    _, _, pods = _family(api)
    answer = api.batch.delete_namespaced_job("train-slice-0", "default")
    # The API server answers with the Job carrying the GC's orphan finalizer (pending, so no Status).
    assert answer["kind"] == "Job" and answer["metadata"]["finalizers"] == ["orphan"]
    assert answer["metadata"]["deletionTimestamp"]
    assert not _exists(api.batch.read_namespaced_job, "train-slice-0", "default")
    assert [p.metadata.name for p in api.core.list_namespaced_pod("default").items] == pods


def test_dependent_with_another_live_owner_survives(api: Api) -> None:
    a = api.client.sanitize_for_serialization(
        api.core.create_namespaced_config_map("default", {"metadata": {"name": "a"}})
    )
    b = api.client.sanitize_for_serialization(
        api.core.create_namespaced_config_map("default", {"metadata": {"name": "b"}})
    )
    # At most one owner may be the controller (ValidateOwnerReferences upstream).
    dep = {
        "metadata": {"name": "dep", "ownerReferences": [owner_ref(a), {**owner_ref(b), "controller": False}]}
    }
    api.core.create_namespaced_config_map("default", dep)
    api.core.delete_namespaced_config_map("a", "default")
    refs = api.core.read_namespaced_config_map("dep", "default").metadata.owner_references
    assert [r.name for r in refs] == ["b"]
    api.core.delete_namespaced_config_map("b", "default")
    assert not _exists(api.core.read_namespaced_config_map, "dep", "default")


def test_preconditions(api: Api) -> None:
    cm = api.core.create_namespaced_config_map("default", {"metadata": {"name": "c"}})
    body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="not-the-uid"))
    with pytest.raises(ApiException) as err:
        api.core.delete_namespaced_config_map("c", "default", body=body)
    assert err.value.status == 409 and "Precondition failed: UID" in json.loads(err.value.body)["message"]
    body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=cm.metadata.uid))
    api.core.delete_namespaced_config_map("c", "default", body=body)
    assert not _exists(api.core.read_namespaced_config_map, "c", "default")


def test_finalizers_hold_an_object_until_removed(api: Api) -> None:
    api.core.create_namespaced_config_map(
        "default", {"metadata": {"name": "c", "finalizers": ["example.com/hold"]}}
    )
    api.core.delete_namespaced_config_map("c", "default")
    assert api.core.read_namespaced_config_map("c", "default").metadata.deletion_timestamp is not None
    api.core.patch_namespaced_config_map(
        "c", "default", {"metadata": {"finalizers": None}}, _content_type="application/merge-patch+json"
    )
    assert not _exists(api.core.read_namespaced_config_map, "c", "default")


def test_namespace_deletion_takes_its_contents(api: Api) -> None:
    api.core.create_namespace({"metadata": {"name": "run-1"}})
    api.core.create_namespaced_pod("run-1", pod("bound", node="n1"))
    api.core.create_namespaced_config_map("run-1", {"metadata": {"name": "c"}})
    api.core.delete_namespace("run-1")
    assert api.core.read_namespace("run-1").status.phase == "Terminating"  # a bound pod is terminating
    with pytest.raises(ApiException) as err:
        api.core.create_namespaced_config_map("run-1", {"metadata": {"name": "late"}})
    assert err.value.status == 403
    api.core.delete_namespaced_pod("bound", "run-1", grace_period_seconds=0)
    assert not _exists(api.core.read_namespace, "run-1")
    with pytest.raises(ApiException) as err:
        api.core.delete_namespace("default")
    assert err.value.status == 403


def test_delete_collection_by_selector(api: Api) -> None:
    for name, labels in (("a", {"run": "1"}), ("b", {"run": "1"}), ("c", {"run": "2"})):
        api.core.create_namespaced_pod("default", pod(name, labels))
    api.core.delete_collection_namespaced_pod("default", label_selector="run=1")
    assert [p.metadata.name for p in api.core.list_namespaced_pod("default").items] == ["c"]


def test_dependents_of_an_owner_already_gone_are_collected(api: Api) -> None:
    # A controller acting on a stale read creates a child for an owner deleted meanwhile: the
    # garbage collector removes it rather than leaving an orphan forever.
    owner = api.core.create_namespaced_config_map("default", {"metadata": {"name": "owner"}})
    api.core.delete_namespaced_config_map("owner", "default")
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    body = pod("late")
    body["metadata"]["ownerReferences"] = [ref]
    api.core.create_namespaced_pod("default", body)
    assert not _exists(api.core.read_namespaced_pod, "late", "default")


def test_delete_answers_with_the_object_or_a_status_as_kube_apiserver(api: Api) -> None:
    # A JobSet removed at once: a Status naming it (the CRD store has no ReturnDeletedObject).
    js = api.custom.create_namespaced_custom_object(*JS, jobset("gone"))
    gone = api.custom.delete_namespaced_custom_object(*JS, "gone")
    assert gone["kind"] == "Status" and gone["status"] == "Success"
    assert gone["details"] == {
        "name": "gone",
        "group": "jobset.x-k8s.io",
        "kind": "jobsets",
        "uid": js["metadata"]["uid"],
    }
    # One kept by the foreground finalizer: the object, marked.
    api.custom.create_namespaced_custom_object(*JS, jobset("kept"))
    body = client.V1DeleteOptions(propagation_policy="Foreground")
    kept = api.custom.delete_namespaced_custom_object(*JS, "kept", body=body)
    assert kept["kind"] == "JobSet" and kept["metadata"]["deletionTimestamp"]
    # ServiceAccounts set ReturnDeletedObject; ConfigMaps do not.
    api.core.create_namespaced_service_account("default", {"metadata": {"name": "sa"}})
    sa = api.core.delete_namespaced_service_account("sa", "default")
    assert sa.kind == "ServiceAccount" and sa.metadata.name == "sa"
    api.core.create_namespaced_config_map("default", {"metadata": {"name": "cm"}})
    status = api.core.delete_namespaced_config_map("cm", "default")
    assert status["kind"] == "Status" and status["details"]["kind"] == "configmaps"
