import json
import re
from dataclasses import replace

import pytest

from launcher.adapters.preset_files import load_presets, make_shape
from launcher.core.errors import UserError
from launcher.core.presets import LABEL_PLACEMENT, RESOURCE_TPU, Shape
from launcher.core.render import name_error, render_jobset
from launcher.core.spec import RESERVED_PORTS, RunSpec
from tests.support.schemas import jobset_errors, validate_job_template

PRESETS = sorted(load_presets())


def spec_for(shape: Shape, **kw) -> RunSpec:
    return RunSpec(run="llm", run_dir="gs://bucket/runs/llm", global_batch=shape.devices * 2, **kw)


def pod_template(js: dict) -> dict:
    return js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]


def env_of(js: dict) -> dict:
    return {
        e["name"]: e.get("value", e.get("valueFrom"))
        for e in pod_template(js)["spec"]["containers"][0]["env"]
    }


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("slices", [1, 2, 4])
def test_every_preset_renders_a_valid_jobset(preset, slices):
    if slices > 1 and load_presets()[preset].hosts == 1:
        # GKE: "Multislice only supports multi-host TPU slice node pools".
        with pytest.raises(UserError, match="multislice needs multi-host slices"):
            make_shape(preset, slices)
        with pytest.raises(UserError, match="multislice needs multi-host slices"):
            shape = Shape(load_presets()[preset], slices)
            render_jobset(spec_for(shape), shape)
        return
    shape = make_shape(preset, slices)
    js = render_jobset(spec_for(shape, queue="q", priority_class="high"), shape, segment=3)
    assert jobset_errors(js) == []
    validate_job_template(js)
    rjob = js["spec"]["replicatedJobs"][0]
    job = rjob["template"]["spec"]
    assert rjob["replicas"] == slices
    assert job["parallelism"] == job["completions"] == shape.preset.hosts
    assert job["completionMode"] == "Indexed" and job["backoffLimit"] == 0
    pod = pod_template(js)["spec"]
    chips = pod["containers"][0]["resources"]
    assert (
        chips["requests"][RESOURCE_TPU] == chips["limits"][RESOURCE_TPU] == str(shape.preset.chips_per_host)
    )
    assert pod["nodeSelector"] == shape.preset.node_selector()
    assert LABEL_PLACEMENT not in pod["nodeSelector"]  # no preset names one; only --placement-policy
    assert pod["nodeSelector"]["node.kubernetes.io/instance-type"] == shape.preset.machine_type
    requests = chips["requests"]
    assert float(requests["cpu"]) >= 1 and requests["memory"].endswith("Gi")  # Burstable, not BestEffort
    port = pod["containers"][0]["ports"][0]["containerPort"]
    assert port not in RESERVED_PORTS and env_of(js)["RESLICE_COORDINATOR"].endswith(f":{port}")
    assert pod["terminationGracePeriodSeconds"] == (15 if shape.preset.spot else 120)
    assert pod["restartPolicy"] == "Never" and pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["priorityClassName"] == "high"
    assert {"key": RESOURCE_TPU, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert ("cloud.google.com/gke-spot" in pod["nodeSelector"]) is shape.preset.spot
    assert any(t.get("key") == "cloud.google.com/gke-spot" for t in pod["tolerations"]) is shape.preset.spot
    assert js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "q"
    assert all(r["name"] for r in js["spec"]["failurePolicy"]["rules"])


def test_gke_essentials():
    shape = make_shape("tpu7x-4x4x4", 2)
    js = render_jobset(spec_for(shape, grace_period_s=300), shape, segment=1)
    assert js["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    assert js["metadata"]["name"] == "llm-1"
    assert js["metadata"]["annotations"]["alpha.jobset.sigs.k8s.io/exclusive-topology"] == (
        "cloud.google.com/gke-nodepool"
    )
    assert js["spec"]["network"]["enableDNSHostnames"] is True
    assert js["spec"]["failurePolicy"]["restartStrategy"] == "BlockingRecreate"
    assert js["spec"]["ttlSecondsAfterFinished"] > 0
    tmpl = pod_template(js)
    pod = tmpl["spec"]
    assert pod["terminationGracePeriodSeconds"] == 300
    assert LABEL_PLACEMENT not in pod["nodeSelector"]
    shm = {v["name"]: v for v in pod["volumes"]}["dshm"]
    assert shm["emptyDir"]["medium"] == "Memory"
    assert pod["containers"][0]["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]
    for labels in (js["metadata"]["labels"], tmpl["metadata"]["labels"]):
        assert labels["reslice.dev/run"] == "llm" and labels["reslice.dev/segment"] == "1"


def test_a_one_slice_segment_on_a_named_pool_selects_it_without_exclusive_placement():
    shape = make_shape("tpu7x-4x4x4", 1)
    js = render_jobset(spec_for(shape), shape, segment=2, pool="tpu-pool-b")
    assert jobset_errors(js) == []
    assert "alpha.jobset.sigs.k8s.io/exclusive-topology" not in js["metadata"]["annotations"]
    selector = pod_template(js)["spec"]["nodeSelector"]
    assert selector == {**shape.preset.node_selector(), "cloud.google.com/gke-nodepool": "tpu-pool-b"}
    two = make_shape("tpu7x-4x4x4", 2)
    with pytest.raises(ValueError, match="2 slices cannot name one node pool"):
        render_jobset(spec_for(two), two, pool="tpu-pool-b")


def test_contract_environment():
    shape = make_shape("tpu7x-4x4x4", 2)
    spec = spec_for(shape, overrides=("train.steps=100", "moe.ragged_buffer_factor=1.25"), config="small")
    env = env_of(render_jobset(spec, shape, segment=2))
    assert env["RESLICE_RUN"] == "llm" and env["RESLICE_SEGMENT"] == "2"
    assert env["RESLICE_RUN_DIR"] == "gs://bucket/runs/llm"
    gb, b, a = (int(env[k]) for k in ("RESLICE_GLOBAL_BATCH", "RESLICE_MICRO_BATCH", "RESLICE_GRAD_ACCUM"))
    assert shape.devices * b * a == gb == 512
    assert env["RESLICE_NUM_SLICES"] == "2" and env["RESLICE_CONFIG"] == "small"
    assert json.loads(env["RESLICE_SET"]) == ["train.steps=100", "moe.ragged_buffer_factor=1.25"]
    assert env["RESLICE_COORDINATOR"] == "llm-2-slice-0-0.llm-2:8490"
    assert env["RESLICE_NUM_PROCESSES"] == "32" and env["RESLICE_HOSTS_PER_SLICE"] == "16"
    assert (
        env["RESLICE_SLICE_INDEX"]["fieldRef"]["fieldPath"]
        == "metadata.labels['jobset.sigs.k8s.io/job-index']"
    )
    assert "restart-attempt" in env["RESLICE_RESTART_ATTEMPT"]["fieldRef"]["fieldPath"]
    assert float(env["RESLICE_PEAK_TFLOPS"]) == pytest.approx(2307 / 2)
    assert env["RESLICE_INIT_TIMEOUT_S"] == "900"  # not JAX's 300 s: see docs/contract.md
    assert "RESLICE_HEARTBEAT_TIMEOUT_S" not in env  # JAX's default unless asked
    assert env["MEGASCALE_NUM_SLICES"] == "2"
    assert env["MEGASCALE_COORDINATOR_ADDRESS"] == "llm-2-slice-0-0.llm-2"
    assert "job-index" in env["MEGASCALE_SLICE_ID"]["fieldRef"]["fieldPath"]
    single = make_shape("tpu7x-4x4x4", 1)
    assert not any(k.startswith("MEGASCALE_") for k in env_of(render_jobset(spec_for(single), single)))


@pytest.mark.parametrize("preset,devices", [("tpu7x-8x8x48", 24576), ("v4-8x8x48", 12288)])
def test_3072_pods_of_jobset_validates(preset, devices):
    shape = make_shape(preset, 4)
    assert shape.devices == devices
    js = render_jobset(RunSpec(run="big", run_dir="gs://b/big", global_batch=devices), shape)
    rjob = js["spec"]["replicatedJobs"][0]
    assert (rjob["replicas"], rjob["template"]["spec"]["parallelism"]) == (4, 768)
    assert jobset_errors(js) == []
    validate_job_template(js)


def test_placement_policy_only_when_named():
    shape = make_shape("tpu7x-4x4x4", 2)
    named = spec_for(shape, placement_policies=(("tpu7x-4x4x4", "my-ironwood-policy"),))
    pod = pod_template(render_jobset(named, shape))["spec"]
    assert pod["nodeSelector"][LABEL_PLACEMENT] == "my-ironwood-policy"
    # The policy belongs to the node pools of one preset: a fallback shape does not select it.
    fallback = make_shape("tpu7x-2x4x4", 2)
    assert LABEL_PLACEMENT not in pod_template(render_jobset(named, fallback))["spec"]["nodeSelector"]


@pytest.mark.parametrize("port", [8476, 8482, 8470, 8431, 8080, 80])
def test_coordinator_ports_tpu_hosts_use_are_refused(port):
    shape = make_shape("tpu7x-4x4x4", 1)
    with pytest.raises(UserError, match="coordinator port"):
        render_jobset(spec_for(shape, coordinator_port=port), shape)


def test_requests_follow_the_machine_type_and_can_be_set():
    shape = make_shape("tpu7x-4x4x4", 1)
    res = pod_template(render_jobset(spec_for(shape), shape))["spec"]["containers"][0]["resources"]
    assert res["requests"] == {RESOURCE_TPU: "4", "cpu": "56", "memory": "240Gi"}
    assert "cpu" not in res["limits"] and "memory" not in res["limits"]
    mine = spec_for(shape, cpu_request="100", memory_request="500Gi")
    res = pod_template(render_jobset(mine, shape))["spec"]["containers"][0]["resources"]
    assert (res["requests"]["cpu"], res["requests"]["memory"]) == ("100", "500Gi")


# --- the failure policy, read back from the rendered rules -------------------------------------
# A small model of upstream semantics: the Job's podFailurePolicy turns a pod failure into a Job
# failure (reason, message); the JobSet's rules (first match wins; no match = RestartJobSet) turn
# that into an action.


def job_failure(js: dict, *, exit_code: int | None = None, disruption: bool = False) -> tuple[str, str]:
    rules = js["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]["rules"]
    for i, rule in enumerate(rules):
        if disruption and any(c["type"] == "DisruptionTarget" for c in rule.get("onPodConditions", [])):
            return (
                "PodFailurePolicy",
                f"Pod default/p has condition DisruptionTarget matching FailJob rule at index {i}",
            )
        on = rule.get("onExitCodes")
        if exit_code is not None and on and on.get("containerName", "trainer") == "trainer":
            hit = (exit_code in on["values"]) == (on["operator"] == "In")
            if hit and rule["action"] == "FailJob":
                return (
                    "PodFailurePolicy",
                    f"Container trainer for pod default/p failed with exit code {exit_code} "
                    f"matching FailJob rule at index {i}",
                )
    return "BackoffLimitExceeded", "Job has reached the specified backoff limit"


def jobset_action(js: dict, reason: str, message: str) -> tuple[str, str]:
    for rule in js["spec"]["failurePolicy"]["rules"]:
        reasons = rule.get("onJobFailureReasons") or []
        patterns = rule.get("onJobFailureMessagePatterns") or []
        if (not reasons or reason in reasons) and (
            not patterns or any(re.search(p, message) for p in patterns)
        ):
            return rule["action"], rule["name"]
    return "RestartJobSet", "(default)"


@pytest.mark.parametrize(
    "cause,expected",
    [
        ({"disruption": True}, "RestartJobSetAndIgnoreMaxRestarts"),
        ({"disruption": True, "exit_code": 143}, "RestartJobSetAndIgnoreMaxRestarts"),
        ({"exit_code": 42}, "RestartJobSetAndIgnoreMaxRestarts"),
        ({"exit_code": 43}, "RestartJobSetAndIgnoreMaxRestarts"),  # a peer lost: a disruption
        ({"exit_code": 2}, "FailJobSet"),
        ({"exit_code": 1}, "RestartJobSet"),
        ({"exit_code": 137}, "RestartJobSet"),
        ({"exit_code": 20}, "RestartJobSet"),
        ({"exit_code": 142}, "RestartJobSet"),
    ],
)
def test_failure_policy_tells_causes_apart(cause, expected):
    shape = make_shape("tpu7x-2x2x2", 2)
    js = render_jobset(spec_for(shape), shape)
    action, rule = jobset_action(js, *job_failure(js, **cause))
    assert action == expected, rule
    assert js["spec"]["failurePolicy"]["maxRestarts"] > 0


@pytest.mark.parametrize(
    "name,shape_args,fragment",
    [
        ("LLM", ("tpu7x-2x2x1", 1), "DNS-1035"),
        ("1llm", ("tpu7x-2x2x1", 1), "DNS-1035"),
        ("llm-", ("tpu7x-2x2x1", 1), "DNS-1035"),
        ("llm_run", ("tpu7x-2x2x1", 1), "DNS-1035"),
        ("a" * 48 + "-0", ("tpu7x-8x8x48", 4), "too long"),
    ],
)
def test_bad_names_are_refused(name, shape_args, fragment):
    assert fragment in name_error(name, make_shape(*shape_args))


def test_name_length_limit_is_exact():
    shape = make_shape("tpu7x-8x8x48", 4)
    # <js>-slice-3-767-xxxxx must be <= 63: 63 - len("-slice-3-767") - 6 = 45.
    assert name_error("a" * 45, shape) is None
    assert "use at most 45 characters" in name_error("a" * 46, shape)


def test_infeasible_batch_is_refused():
    shape = make_shape("tpu7x-4x4x4", 1)
    with pytest.raises(UserError, match="not divisible by 128 devices"):
        render_jobset(RunSpec(run="llm", run_dir="/r", global_batch=100), shape)


def test_rule_names_pass_the_jobset_webhook():
    # The JobSet webhook (not the CRD schema) rejects rule names outside this pattern.
    webhook = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    shape = make_shape("tpu7x-2x2x1", 1)
    rules = render_jobset(spec_for(shape), shape)["spec"]["failurePolicy"]["rules"]
    assert all(webhook.match(r["name"]) for r in rules), [r["name"] for r in rules]


def test_short_notice_capacity_checkpoints_more_often():
    """Spot pods get 15 s between SIGTERM and SIGKILL: an emergency save that takes longer cannot
    finish there, so segments on spot capacity checkpoint every `short_notice_interval` steps."""
    spot, on_demand = make_shape("v6e-4x4", 1), make_shape("v5p-4x4x4", 1)
    assert spot.preset.spot and not on_demand.preset.spot
    spec = RunSpec(
        run="llm", run_dir="gs://b/llm", global_batch=128, overrides=("checkpoint.interval=100",),
        save_seconds=40, short_notice_interval=10,
    )  # fmt: skip
    assert json.loads(env_of(render_jobset(spec, spot))["RESLICE_SET"]) == [
        "checkpoint.interval=100",
        "checkpoint.interval=10",  # later wins (docs/contract.md)
    ]
    assert json.loads(env_of(render_jobset(spec, on_demand))["RESLICE_SET"]) == ["checkpoint.interval=100"]
    fits = replace(spec, save_seconds=10)
    assert json.loads(env_of(render_jobset(fits, spot))["RESLICE_SET"]) == ["checkpoint.interval=100"]
    # A grace period shorter than the notice is what the pod gets.
    short_grace = replace(spec, grace_period_s=30)
    assert "checkpoint.interval=10" in json.loads(
        env_of(render_jobset(short_grace, on_demand))["RESLICE_SET"]
    )


@pytest.mark.parametrize(
    ("slices", "preferred", "want"),
    [
        (
            4,
            False,
            {"kueue.x-k8s.io/podset-slice-required-topology": "L", "kueue.x-k8s.io/podset-slice-size": "16"},
        ),
        (1, False, {"kueue.x-k8s.io/podset-required-topology": "L"}),
        (4, True, {"kueue.x-k8s.io/podset-preferred-topology": "L"}),
    ],
)
def test_a_queued_jobset_is_created_suspended_and_asks_kueue_for_each_slice_in_one_domain(
    slices, preferred, want
) -> None:
    """Kueue's webhook creates a queued JobSet suspended (kueue jobframework/defaults.go); its TAS
    annotations sit on the pod template, per slice of `hosts` pods when a JobSet has several."""
    shape = make_shape("tpu7x-4x4x4", slices)
    js = render_jobset(spec_for(shape, queue="q", tas_topology="L", tas_preferred=preferred), shape)
    assert js["spec"]["suspend"] is True
    assert pod_template(js)["metadata"]["annotations"] == want
    assert jobset_errors(js) == []
    plain = render_jobset(spec_for(shape), shape)
    assert "suspend" not in plain["spec"] and "annotations" not in pod_template(plain)["metadata"]
