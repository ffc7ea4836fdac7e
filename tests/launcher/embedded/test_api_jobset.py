"""JobSet admission over HTTP: the CRD schema the package ships, the webhook's defaults and
checks, and immutability, each answered as a real cluster would (422 Invalid with its causes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from kubernetes.client import ApiException

from launcher.embedded.admission.crdschema import CRD_FILE, SCHEMA_DIR
from tests.launcher.embedded.conftest import Api, jobset

JS = ("jobset.x-k8s.io", "v1alpha2", "default", "jobsets")
EXAMPLES = Path(__file__).resolve().parents[3] / "manifests" / "examples"


def _create(api: Api, body: dict) -> dict:
    return api.custom.create_namespaced_custom_object(*JS, body)


def _invalid(api: Api, body: dict) -> dict:
    with pytest.raises(ApiException) as err:
        _create(api, body)
    assert err.value.status == 422
    status = json.loads(err.value.body)
    assert status["reason"] == "Invalid"
    return status


def test_the_shipped_crd_names_its_upstream_release_and_license() -> None:
    text = (SCHEMA_DIR / CRD_FILE).read_text()
    header = text.split("\n---\n", 1)[0]
    assert "kubernetes-sigs/jobset release v0.12.0" in header and "Apache License 2.0" in header
    crd = yaml.safe_load(text)
    assert crd["metadata"]["name"] == "jobsets.jobset.x-k8s.io"
    assert [v["name"] for v in crd["spec"]["versions"]] == ["v1alpha2"]


def test_a_jobset_the_schema_rejects_is_refused(api: Api) -> None:
    """Schema validation always runs (it used to be skipped silently when the CRD file was not found). The
    v0.12.0 CRD has no enum on the Job template's completionMode: restartStrategy's is its own."""
    body = jobset()
    body["spec"]["failurePolicy"]["restartStrategy"] = "Sometimes"
    status = _invalid(api, body)
    assert [c["field"] for c in status["details"]["causes"]] == ["spec.failurePolicy.restartStrategy"]


def test_valid_jobset_is_created_with_webhook_and_schema_defaults(api: Api) -> None:
    created = _create(api, jobset())
    spec = created["spec"]
    assert spec["successPolicy"] == {"operator": "All"}
    assert spec["startupPolicy"] == {"startupPolicyOrder": "AnyOrder"}
    assert spec["network"] == {"enableDNSHostnames": True, "publishNotReadyAddresses": True}
    assert spec["failurePolicy"]["restartStrategy"] == "Recreate"  # schema default
    rjob = spec["replicatedJobs"][0]
    assert rjob["groupName"] == "default" and rjob["template"]["spec"]["completionMode"] == "Indexed"
    # nulls dropped, as the API server does before validating
    assert "args" not in rjob["template"]["spec"]["template"]["spec"]["containers"][0]
    assert "status" not in created


def test_rendered_example_jobsets_pass_admission(api: Api) -> None:
    """The golden JobSets the renderer writes pass the admission a GKE cluster runs (CRD schema
    and JobSet webhook: e.g. failure-policy rule names must match ^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$)."""
    jobsets = [
        (path.name, doc)
        for path in sorted(EXAMPLES.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == "JobSet"
    ]
    assert jobsets, f"no example JobSets under {EXAMPLES}"
    for i, (name, doc) in enumerate(jobsets):
        doc["metadata"]["name"] = f"example-{i}"
        try:
            _create(api, doc)
        except ApiException as e:
            pytest.fail(f"{name}: {json.loads(e.body)['message']}")


def test_schema_violations_are_422_with_field_causes(api: Api) -> None:
    body = jobset()
    body["spec"]["ttlSecondsAfterFinished"] = -1  # the CRD's minimum (replicas has none in v0.12.0)
    body["spec"]["failurePolicy"]["rules"][0]["action"] = "Explode"
    del body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["name"]
    causes = {c["field"]: c["message"] for c in _invalid(api, body)["details"]["causes"]}
    assert "should be greater than or equal to 0" in causes["spec.ttlSecondsAfterFinished"]
    assert causes["spec.failurePolicy.rules[0].action"].startswith('Unsupported value: "Explode"')
    assert causes["spec.replicatedJobs[0].template.spec.template.spec.containers[0].name"] == "Required value"


def test_generated_pod_names_over_63_characters_are_refused(api: Api) -> None:
    # 768 hosts x 4 slices: `<js>-slice-3-767-abcde` must fit in 63, which leaves 45 for the name.
    ok, too_long = "a" * 45, "a" * 46
    assert _create(api, {**jobset(ok, replicas=4, hosts=768)})["metadata"]["name"] == ok
    status = _invalid(api, jobset(too_long, replicas=4, hosts=768))
    assert "pod names generated for this JobSet will exceed 63 characters" in status["message"]


def test_jobset_names_must_start_with_a_letter(api: Api) -> None:
    status = _invalid(api, jobset("1-run"))
    assert "a DNS-1035 label must consist of lower case alphanumeric characters" in status["message"]


def test_failure_policy_rule_names_and_targets_are_checked(api: Api) -> None:
    body = jobset()
    rules = body["spec"]["failurePolicy"]["rules"]
    rules.append({"name": "app-failure", "action": "RestartJobSet", "targetReplicatedJobs": ["nope"]})
    rules.append({"name": "preempted", "action": "FailJobSet", "onJobFailureReasons": ["Bogus"]})
    message = _invalid(api, body)["message"]
    assert "invalid failure policy rule name 'app-failure'" in message
    assert "invalid replicatedJob name 'nope' in failure policy" in message
    assert "invalid job failure reason 'Bogus'" in message
    assert (
        "rule names are not unique, rules with indices [0, 2] all have the same name 'preempted'" in message
    )


def test_unknown_fields_are_pruned(api: Api) -> None:
    body = jobset()
    body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0][
        "imagePolicy"
    ] = "x"
    body["spec"]["notAField"] = 1
    created = _create(api, body)
    assert "notAField" not in created["spec"]
    assert (
        "imagePolicy"
        not in created["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    )


def test_replicas_are_immutable_and_policies_too(api: Api) -> None:
    _create(api, jobset())
    with pytest.raises(ApiException) as err:
        api.custom.patch_namespaced_custom_object(
            *JS, "train", [{"op": "replace", "path": "/spec/replicatedJobs/0/replicas", "value": 1}],
            _content_type="application/json-patch+json",
        )  # fmt: skip
    assert (
        err.value.status == 422
        and "spec.replicatedJobs: Invalid value" in json.loads(err.value.body)["message"]
    )
    with pytest.raises(ApiException) as err:
        api.custom.patch_namespaced_custom_object(
            *JS, "train", {"spec": {"failurePolicy": {"maxRestarts": 9}}}
        )
    assert (
        err.value.status == 422
        and "spec.failurePolicy: Invalid value" in json.loads(err.value.body)["message"]
    )


def test_suspended_jobset_may_change_pod_scheduling_fields(api: Api) -> None:
    """The webhook's exception for Kueue: nodeSelector/tolerations/labels while suspended."""
    _create(api, jobset())
    selector = {"cloud.google.com/gke-nodepool": "np-1"}
    patch = [
        {"op": "add", "path": "/spec/suspend", "value": True},
        {
            "op": "add",
            "path": "/spec/replicatedJobs/0/template/spec/template/spec/nodeSelector",
            "value": selector,
        },
    ]
    patched = api.custom.patch_namespaced_custom_object(
        *JS, "train", patch, _content_type="application/json-patch+json"
    )
    assert (
        patched["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["nodeSelector"]
        == selector
    )
