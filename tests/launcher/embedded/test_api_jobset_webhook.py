"""The JobSet validating webhook with v0.12.0's default feature gates, over HTTP: feature-gated
failure-policy actions and strategies, managedBy, replicas x parallelism, dependsOn references and
the coordinator, each a 422 Invalid with upstream's message; and batch/v1 validation of the
per-index Job fields those failure policies act on."""

from __future__ import annotations

import json

import pytest
from kubernetes.client import ApiException

from tests.launcher.embedded.conftest import Api, jobset

JS = ("jobset.x-k8s.io", "v1alpha2", "default", "jobsets")


def _message(api: Api, body: dict) -> str:
    with pytest.raises(ApiException) as err:
        api.custom.create_namespaced_custom_object(*JS, body)
    assert err.value.status == 422
    status = json.loads(err.value.body)
    assert status["reason"] == "Invalid" and status["details"]["kind"] == "JobSet"
    return status["message"]


def test_feature_gated_actions_and_strategies_are_refused(api: Api) -> None:
    body = jobset()
    body["spec"]["failurePolicy"]["restartStrategy"] = "InPlaceRestart"
    assert "InPlaceRestart restart strategy cannot be set when InPlaceRestart feature gate is disabled" in (
        _message(api, body)
    )
    body = jobset()
    body["spec"]["failurePolicy"]["rules"].append({"name": "one", "action": "RestartJob"})
    msg = _message(api, body)
    assert (
        "RestartJob and RestartJobAndIgnoreMaxRestarts failure policy actions are not allowed when "
        "RestartJob feature gate is disabled"
    ) in msg
    assert api.custom.list_namespaced_custom_object(*JS[:3], "jobsets")["items"] == []


def test_managed_by_must_be_a_short_domain_prefixed_path(api: Api) -> None:
    for bad, words in (
        ("kueue", 'Invalid value: "kueue": must be a domain-prefixed path (such as "acme.io/foo")'),
        ("Kueue.X/mk", 'spec.managedBy: Invalid value: "Kueue.X": a lowercase RFC 1123 subdomain'),
        ("kueue.x-k8s.io/" + "m" * 60, "spec.managedBy: Too long: may not be more than 63 bytes"),
    ):
        body = jobset()
        body["spec"]["managedBy"] = bad
        assert words in _message(api, body), bad
    body = jobset("mk")
    body["spec"]["managedBy"] = "kueue.x-k8s.io/multikueue"
    assert (
        api.custom.create_namespaced_custom_object(*JS, body)["spec"]["managedBy"]
        == body["spec"]["managedBy"]
    )


def test_depends_on_and_the_product_of_replicas_and_parallelism(api: Api) -> None:
    body = jobset()
    rj = body["spec"]["replicatedJobs"]
    rj.append(json.loads(json.dumps(rj[0])) | {"name": "b", "dependsOn": [{"name": "c", "status": "Ready"}]})
    rj.append(json.loads(json.dumps(rj[0])) | {"name": "c"})
    assert "replicatedJob: b cannot depend on replicatedJob: c" in _message(api, body)
    body = jobset(replicas=2**16, hosts=2**15)
    body["metadata"]["name"] = "p"
    assert (
        "the product of replicas and parallelism must not exceed 2147483647 for replicatedJob 'slice'"
        in _message(api, body)
    )


def test_the_coordinator_must_name_a_pod_that_exists_and_fit_a_label(api: Api) -> None:
    for coord, words in (
        ({"replicatedJob": "nope"}, "coordinator replicatedJob nope does not exist"),
        (
            {"replicatedJob": "slice", "jobIndex": 2},
            "coordinator job index 2 is invalid for replicatedJob slice",
        ),
        (
            {"replicatedJob": "slice", "jobIndex": 1, "podIndex": 2},
            "coordinator pod index 2 is invalid for replicatedJob slice job index 1",
        ),
    ):
        body = jobset()
        body["spec"]["coordinator"] = coord
        assert words in _message(api, body), coord
    body = jobset("a" * 40)
    body["spec"]["coordinator"] = {"replicatedJob": "slice"}
    body["spec"]["network"] = {"subdomain": "s" * 20}
    assert 'for coordinator label "jobset.sigs.k8s.io/coordinator"' in _message(api, body)
    body = jobset("ok")
    body["spec"]["coordinator"] = {"replicatedJob": "slice", "jobIndex": 1, "podIndex": 1}
    assert api.custom.create_namespaced_custom_object(*JS, body)["spec"]["coordinator"]["podIndex"] == 1


def test_per_index_job_fields_need_an_indexed_job_and_each_other(api: Api) -> None:
    """batch/v1 validation (not the webhook): the per-index fields are refused where they cannot act."""
    from tests.launcher.embedded.conftest import job

    def causes(**spec) -> list[tuple[str, str]]:
        body = job("j", 2)
        body["spec"] |= spec
        with pytest.raises(ApiException) as err:
            api.batch.create_namespaced_job("default", body)
        assert err.value.status == 422
        return [(c["field"], c["message"]) for c in json.loads(err.value.body)["details"]["causes"]]

    assert causes(completionMode="NonIndexed", backoffLimitPerIndex=1) == [
        ("spec.backoffLimitPerIndex", "Invalid value: 1: requires indexed completion mode")
    ]
    assert ("spec.backoffLimitPerIndex", "Required value: when maxFailedIndexes is specified") in causes(
        completionMode="Indexed", maxFailedIndexes=1
    )
    assert causes(completionMode="Indexed", backoffLimitPerIndex=0, maxFailedIndexes=3) == [
        ("spec.maxFailedIndexes", "Invalid value: 3: must be less than or equal to completions")
    ]
    rules = [{"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [1]}}]
    assert (
        "spec.podFailurePolicy.rules[0].action",
        'Invalid value: "FailIndex": requires the backoffLimitPerIndex to be set',
    ) in causes(completionMode="Indexed", podFailurePolicy={"rules": rules})
    assert api.batch.list_namespaced_job("default").items == []
