"""Where the embedded cluster used to differ from upstream Kubernetes and JobSet v0.12, through the
official client: containers restarted in place (restartPolicy OnFailure and Always) with the
kubelet's crash back-off, podFailurePolicy's Ignore action, a custom resource's own validation
before its validating webhook, the JobSet webhook's failure reasons and managedBy on update, the
DefaultFailurePolicy event, and which kinds' DELETE answers with the object. The upstream source of
each is in docs/embedded.md ("Fidelity: restarts in place, Ignore, validation order")."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiException

from launcher.embedded.kubelet.podrun import CRASH_BACKOFF_S
from tests.launcher.embedded.cluster_helpers import PodRecorder, condition, rendered, running
from tests.launcher.embedded.conftest import Api, jobset
from tests.support.wait import wait_for

JS = ("jobset.x-k8s.io", "v1alpha2", "default", "jobsets")
TPU_TOLERATION = {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}


def _job(name: str, restart_policy: str, command: list[str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            **spec,
            "template": {
                "spec": {
                    "restartPolicy": restart_policy,
                    "tolerations": [TPU_TOLERATION],
                    "containers": [{"name": "c", "image": "python:3.11", "command": command}],
                }
            },
        },
    }


def _t(stamp: dt.datetime) -> float:
    return stamp.timestamp()


# ---- the kubelet: restarts in place ------------------------------------------------------------------


def test_an_on_failure_job_whose_container_fails_twice_then_succeeds(tmp_path: Path) -> None:
    """The container restarts in the same pod: at once after the first exit, after the crash back-off
    (10 s: the embedded kubelet runs on wall-clock time, unscaled) after the second; the Job counts
    no failed pod and completes."""
    count = tmp_path / "count"
    script = (
        "import pathlib, sys\n"
        f"p = pathlib.Path({str(count)!r})\n"
        "n = int(p.read_text()) if p.exists() else 0\n"
        "p.write_text(str(n + 1))\n"
        "sys.exit(0 if n >= 2 else 3)\n"
    )
    with running("tpu7x-2x2x1:1") as kube:
        recorder = PodRecorder(kube)
        kube.batch.create_namespaced_job("default", _job("twice", "OnFailure", ["python3", "-c", script]))
        read = lambda: kube.batch.read_namespaced_job("twice", "default")  # noqa: E731
        wait_for(lambda: read().status.succeeded == 1, timeout=CRASH_BACKOFF_S + 20, what="succeeded")
        kube.cluster.settle()
        job = read().status
        [pod] = kube.pods("job-name=twice")
        recorder.close()
    assert (job.succeeded, job.failed) == (1, None)  # failed: 0, left out as upstream leaves it
    assert [c.type for c in job.conditions if c.status == "True"] == ["SuccessCriteriaMet", "Complete"]
    [cs] = pod.status.container_statuses
    assert pod.status.phase == "Succeeded" and cs.restart_count == 2 and count.read_text() == "3"
    # The three runs of the container (each its own process, so its own containerID), from the
    # states the watch delivered: each lastState is the run before the current one.
    runs = {
        t.container_id: (_t(t.started_at), _t(t.finished_at), t.exit_code)
        for _, p in recorder.states(pod.metadata.name)
        for s in p.status.container_statuses or []
        for t in (s.last_state.terminated if s.last_state else None, s.state.terminated)
        if t is not None
    }
    (start1, end1, code1), (start2, end2, code2), (start3, _, code3) = sorted(runs.values())
    assert (code1, code2, code3) == (3, 3, 0)
    # The first restart does not wait (bounds leave room for a loaded machine's process start).
    assert start2 - end1 < CRASH_BACKOFF_S / 2
    # Then the back-off, counted from the exit (times to the second: at least 10 s apart).
    assert CRASH_BACKOFF_S <= start3 - end2 < CRASH_BACKOFF_S * 1.5
    assert start1 <= end1 <= start2 <= end2 < start3
    backoff = [
        s.state.waiting
        for _, p in recorder.states(pod.metadata.name)
        for s in p.status.container_statuses or []
        if s.state.waiting
    ]
    assert backoff and {w.reason for w in backoff} == {"CrashLoopBackOff"}
    assert backoff[0].message.startswith(f"back-off {int(CRASH_BACKOFF_S)}s restarting failed container=c")


def test_an_always_pod_restarts_in_place_on_any_exit() -> None:
    """restartPolicy Always (a bare pod's default): an exit 0 restarts the container too."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web"},
        "spec": {
            "tolerations": [TPU_TOLERATION],
            "containers": [{"name": "c", "image": "python:3.11", "command": ["python3", "-c", "pass"]}],
        },
    }
    with running("tpu7x-2x2x1:1") as kube:
        kube.core.create_namespaced_pod("default", body)
        pod = wait_for(
            lambda: (
                (p := kube.core.read_namespaced_pod("web", "default")).status.container_statuses
                and p.status.container_statuses[0].restart_count >= 1
                and p
            ),
            what="restarted",
        )
        assert pod.spec.restart_policy == "Always" and pod.status.phase == "Running"
        [cs] = pod.status.container_statuses
        assert cs.last_state.terminated.exit_code == 0 and cs.last_state.terminated.reason == "Completed"
        kube.core.delete_namespaced_pod("web", "default", grace_period_seconds=0)


# ---- the Job controller: podFailurePolicy Ignore -------------------------------------------------------


@pytest.mark.parametrize(
    "rule, fail",
    [
        pytest.param(
            {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [42]}},
            "exit 42",
            id="on-exit-codes",
        ),
        pytest.param(
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
            "eviction",
            id="on-pod-conditions",
        ),
    ],
)
def test_an_ignored_pod_failure_is_replaced_and_not_counted(rule: dict[str, Any], fail: str) -> None:
    job = _job("ig", "Never", ["sleep", "60"], backoffLimit=0, podFailurePolicy={"rules": [rule]})
    with running("tpu7x-2x2x1:1", mode="simulate") as kube:
        kube.batch.create_namespaced_job("default", job)
        [first] = wait_for(
            lambda: [p for p in kube.pods("job-name=ig") if p.status.phase == "Running"], what="running"
        )
        if fail == "exit 42":
            assert kube.cluster.sim_finish("job-name=ig", 42) == 1
        else:
            name = first.metadata.name
            kube.core.create_namespaced_pod_eviction(
                name, "default", {"metadata": {"name": name, "namespace": "default"}}
            )
        [second] = wait_for(
            lambda: [
                p
                for p in kube.pods("job-name=ig")
                if p.status.phase == "Running" and p.metadata.uid != first.metadata.uid
            ],
            what="a replacement",
        )
        st = kube.batch.read_namespaced_job("ig", "default").status
        assert not st.failed and not st.conditions  # backoffLimit 0 is not spent
        assert second.metadata.name != first.metadata.name
        assert kube.cluster.sim_finish("job-name=ig", 0) == 1
        done = wait_for(
            lambda: (s := kube.batch.read_namespaced_job("ig", "default").status).succeeded and s,
            what="complete",
        )
        assert (done.succeeded, done.failed) == (1, None)
        assert [c.type for c in done.conditions if c.status == "True"] == ["SuccessCriteriaMet", "Complete"]


# ---- the API server: validation order, the JobSet webhook, DELETE's answer ------------------------------


def _refusal(api: Api, body: dict[str, Any]) -> str:
    with pytest.raises(ApiException) as err:
        api.custom.create_namespaced_custom_object(*JS, body)
    assert err.value.status == 422
    return json.loads(err.value.body)["message"]


def test_a_custom_resource_is_validated_before_its_validating_webhook(api: Api) -> None:
    body = jobset()
    body["metadata"]["name"] = "Bad_Name"
    msg = _refusal(api, body)
    # The CRD's own check of metadata.name, not the webhook's of the Job names derived from it.
    assert msg.startswith(
        'JobSet.jobset.x-k8s.io "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name"'
    )
    assert "a lowercase RFC 1123 subdomain" in msg and "admission webhook" not in msg
    assert api.custom.list_namespaced_custom_object(*JS[:3], "jobsets")["items"] == []


@pytest.mark.parametrize(
    "reason",
    [
        "BackoffLimitExceeded",
        "DeadlineExceeded",
        "FailedIndexes",
        "MaxFailedIndexesExceeded",
        "PodFailurePolicy",
    ],
)
def test_every_job_failure_reason_of_upstream_is_a_valid_on_job_failure_reason(api: Api, reason: str) -> None:
    body = jobset(reason.lower())
    body["spec"]["failurePolicy"]["rules"][0]["onJobFailureReasons"] = [reason]
    created = api.custom.create_namespaced_custom_object(*JS, body)
    assert created["spec"]["failurePolicy"]["rules"][0]["onJobFailureReasons"] == [reason]
    body = jobset("nosuch")
    body["spec"]["failurePolicy"]["rules"][0]["onJobFailureReasons"] = ["NoSuchReason"]
    assert "invalid job failure reason 'NoSuchReason'" in _refusal(api, body)


@pytest.mark.parametrize(
    "before, after, shown",
    [
        ("kueue.x-k8s.io/multikueue", "example.com/other", "example.com/other"),
        (None, "kueue.x-k8s.io/multikueue", "kueue.x-k8s.io/multikueue"),
        ("kueue.x-k8s.io/multikueue", None, "null"),
    ],
)
def test_managed_by_is_immutable(api: Api, before: str | None, after: str | None, shown: str) -> None:
    body = jobset("mb")
    if before is not None:
        body["spec"]["managedBy"] = before
    stored = api.custom.create_namespaced_custom_object(*JS, body)
    stored["spec"].pop("managedBy", None)
    if after is not None:
        stored["spec"]["managedBy"] = after
    with pytest.raises(ApiException) as err:
        api.custom.replace_namespaced_custom_object(*JS, "mb", stored)
    assert err.value.status == 422
    assert (
        f'spec.managedBy: Invalid value: "{shown}": field is immutable'
        in json.loads(err.value.body)["message"]
    )
    assert api.custom.get_namespaced_custom_object(*JS, "mb")["spec"].get("managedBy") == before


@pytest.mark.parametrize(
    "create, delete, kind",
    [
        ("create_namespaced_service", "delete_namespaced_service", "Service"),
        ("create_namespaced_service_account", "delete_namespaced_service_account", "ServiceAccount"),
        ("create_namespaced_config_map", "delete_namespaced_config_map", "Status"),
    ],
)
def test_delete_answers_with_the_object_where_the_registry_returns_it(
    api: Api, create: str, delete: str, kind: str
) -> None:
    body: dict[str, Any] = {"metadata": {"name": "gone"}}
    if kind == "Service":
        body["spec"] = {"ports": [{"port": 80}]}
    getattr(api.core, create)("default", body)
    answer = json.loads(getattr(api.core, delete)("gone", "default", _preload_content=False).data)
    assert answer["kind"] == kind
    assert (answer["metadata"]["name"] if kind != "Status" else answer["details"]["name"]) == "gone"


# ---- the JobSet controller: the DefaultFailurePolicy event -----------------------------------------------


def test_a_failure_no_rule_matches_restarts_with_the_default_failure_policy_event() -> None:
    js = rendered("dfp", "unused", slices=1)
    js["spec"]["failurePolicy"] = {
        "maxRestarts": 3,
        "rules": [{"name": "deadline", "action": "FailJobSet", "onJobFailureReasons": ["DeadlineExceeded"]}],
    }
    with running("tpu7x-2x2x2:1", mode="simulate") as kube:
        kube.create_jobset(js)
        wait_for(lambda: len([p for p in kube.pods() if p.status.phase == "Running"]) == 2, what="running")
        kube.cluster.sim_finish("jobset.sigs.k8s.io/jobset-name=dfp-0", 1)
        status = wait_for(lambda: (s := kube.jobset("dfp-0")["status"]).get("restarts") == 1 and s)
        restarting = condition({"status": status}, "RestartingJobSet")
        assert (restarting["status"], restarting["reason"]) == ("True", "DefaultFailurePolicy")
        msg = "applying RestartJobSet failure policy action (first failed job: dfp-0-slice-0)"
        got = wait_for(
            lambda: (
                {
                    (e.type, e.reason, e.message)
                    for e in kube.events(kind="JobSet")
                    if e.reason in ("RestartJobSetFailurePolicyAction", "DefaultFailurePolicy")
                }
                if len(kube.events("DefaultFailurePolicy", "JobSet")) == 1
                else None
            ),
            what="the events",
        )
        assert got == {
            ("Warning", "RestartJobSetFailurePolicyAction", msg),
            ("Warning", "DefaultFailurePolicy", msg),
        }
