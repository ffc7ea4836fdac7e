"""`reslice preflight` and the checks `launch` makes before it creates anything.

Pure tables for the check functions (nodes are the embedded cluster's GKE-labelled node objects),
then the command itself through the official client against the embedded cluster, where the write
probe is a real pod running `python -m trainer --probe-write` as a local process.
"""

from __future__ import annotations

import copy
import json
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from kubernetes import client

from launcher.adapters.kube import Kube, record_name
from launcher.adapters.preset_files import load_preset, make_shape
from launcher.core.capacity import checks
from launcher.core.capacity.checks import FAIL, OK, SKIP, WARN, ClusterFacts, Request
from launcher.core.capacity.pools import create_command, pools_for
from launcher.core.capacity.quota import shortfalls
from launcher.core.labels import LABEL_RUN
from launcher.core.presets import LABEL_PLACEMENT, Shape
from launcher.core.render import placement, render_jobset
from launcher.core.spec import RunSpec
from launcher.embedded.cluster import EmbeddedCluster
from launcher.embedded.nodes import FakeNodePool, node_object
from launcher.preflight.probe import LABEL_PROBE, Outcome, probe_check, probe_pod
from tests.maxtext.fake_package import fake_package
from tests.support.cli import run_cli
from tests.support.fake_gcs import fake_gcs

P1 = load_preset("tpu7x-2x2x1")  # one host per slice
P2 = load_preset("tpu7x-2x2x2")  # two hosts per slice


def nodes(preset, *pools: str, spot: bool = False) -> list[dict]:
    out = []
    for name in pools:
        pool = FakeNodePool(name=name, shape=preset, spot=spot, simulate=False)
        out += [node_object(pool, i) for i in range(preset.hosts)]
    return out


def spec(**kw) -> RunSpec:
    return RunSpec(**{"run": "r", "run_dir": "gs://b/r", "global_batch": 16, **kw})


def req(preset_name: str, slices: int, **kw) -> Request:
    return Request(spec(**kw), (make_shape(preset_name, slices),))


def taint(node: dict, key: str, value: str = "x", effect: str = "NoSchedule") -> dict:
    node = copy.deepcopy(node)
    node["spec"]["taints"].append({"key": key, "value": value, "effect": effect})
    return node


def not_ready(node: dict) -> dict:
    node = copy.deepcopy(node)
    for c in node["status"]["conditions"]:
        if c["type"] == "Ready":
            c["status"] = "False"
    return node


def allocatable(node: dict, **values: str) -> dict:
    node = copy.deepcopy(node)
    node["status"]["allocatable"].update(values)
    return node


def pools(preset, nodes_: list[dict], slices: int = 1, **kw):
    """pools_for as the checks call it: the run's tolerations and one trainer pod's cpu/memory."""
    s = spec(**kw)
    return pools_for(
        preset, nodes_, placement(s, preset)["tolerations"], checks.host_requests(s, Shape(preset, slices))
    )


# --- node pools ------------------------------------------------------------------------------------

TOLERATIONS = placement(spec(), P1)["tolerations"]
GOOD = nodes(P2, "a", "b")  # two 2-host pools: a multislice of 2 needs multi-host slices (GKE)
A0, A1, B0, B1 = GOOD
ONE = nodes(P1, "s")  # a single-host pool
POOL_CASES = [
    ("two pools fit x2", GOOD, 2, OK, ["2 fit: a, b"]),
    ("one short", nodes(P2, "a"), 2, FAIL, ["needs 2 node pools of tpu7x-2x2x2 (2 nodes each), 1 fit: a", "create 1 more"]),
    ("foreign taint", [A0, A1, B0, taint(B1, "dedicated", "other")], 2, FAIL,
     ["b: taint dedicated=other:NoSchedule not tolerated", "create 1 more"]),
    ("PreferNoSchedule does not block", [A0, A1, B0, taint(B1, "soft", effect="PreferNoSchedule")], 2, OK, []),
    ("the TPU taint is tolerated", ONE, 1, OK, ["1 fit: s"], P1),
    ("NotReady", [A0, A1, B0, not_ready(B1)], 2, FAIL, ["b: gke-reslice-b-", "NotReady", "wait for the unhealthy"]),
    ("impending termination", [A0, A1, B0, taint(B1, "cloud.google.com/impending-node-termination")], 2,
     FAIL, ["tainted cloud.google.com/impending-node-termination"]),
    ("other topology only", GOOD, 1, FAIL, ["needs 1 node pool of tpu7x-2x2x1 (1 node each), 0 fit"], P1),
    ("a pool missing a host", nodes(P2, "big")[:1], 1, FAIL, ["big: 1 node(s), a slice has 2"]),
    ("a node lacks the labels", [nodes(P2, "big")[0], nodes(P1, "big")[0]], 1, FAIL,
     ["big: 1 of its 2 nodes lack the labels"]),
    # tpu7x-standard-4t: the pods request a quarter of 224 vCPUs and 960 GiB (Preset.requests()).
    ("request above allocatable", [A0, allocatable(A1, cpu="50"), B0, B1], 2, FAIL,
     ["1 fit: b; a: the pods request cpu 56, its nodes have 50 allocatable", "request at most the nodes' allocatable"]),
    ("memory at allocatable fits", [allocatable(n, memory="240Gi") for n in GOOD], 2, OK, ["2 fit: a, b"]),
    ("memory below", [allocatable(n, memory="239Gi") for n in GOOD], 1, FAIL,
     ["the pods request memory 240Gi, its nodes have 239Gi allocatable"]),
    # Every form the API server accepts (kubernetes.utils.parse_quantity): exponents, P and E.
    ("cpu as an exponent", [A0, allocatable(A1, cpu="5e1"), B0, B1], 2, FAIL,
     ["1 fit: b; a: the pods request cpu 56, its nodes have 5e1 allocatable"]),
    ("memory in P and E", [allocatable(A0, memory="1Pi"), allocatable(A1, memory="1E"), B0, B1], 2, OK, ["2 fit: a, b"]),
]  # fmt: skip


@pytest.mark.parametrize("case", POOL_CASES, ids=[c[0] for c in POOL_CASES])
def test_node_pool_rung(case) -> None:
    _, nodes_, slices, status, needles, *preset = case
    preset = preset[0] if preset else P2
    row = checks.check_rung(make_shape(preset.name, slices), *pools(preset, nodes_, slices), first=True)
    assert row.status == status, row
    for needle in needles:
        assert needle in row.found + " | " + row.fix, row


def test_a_request_above_allocatable_asks_for_a_smaller_request_not_more_pools() -> None:
    small = [allocatable(n, cpu="50") for n in GOOD]
    shape = make_shape("tpu7x-2x2x2", 2)
    row = checks.check_rung(shape, *pools(P2, small, 2), first=True)
    assert row.status == FAIL and "create" not in row.fix and "--cpu-request" in row.fix, row
    assert checks.rung_exists(shape, *pools(P2, small, 2)).status == FAIL  # launch refuses: no wait fixes it
    # The run's own request decides: the same nodes fit a run that asks for less.
    assert checks.check_rung(shape, *pools(P2, small, 2, cpu_request="48"), first=True).status == OK


def test_a_smaller_rung_that_does_not_fit_is_a_warning_and_unhealthy_pools_do_not_block_launch() -> None:
    unhealthy = pools(P2, [not_ready(n) for n in GOOD], 2)
    shape = make_shape("tpu7x-2x2x2", 2)
    assert checks.check_rung(shape, *unhealthy, first=False).status == WARN
    assert checks.check_rung(shape, *unhealthy, first=True).status == FAIL
    assert checks.rung_exists(shape, *unhealthy).status == OK  # they exist: the controller's business
    assert checks.rung_exists(shape, *pools(P2, GOOD[:2], 2)).status == FAIL


def test_shapes_the_run_never_takes_are_shown_as_not_needed() -> None:
    from launcher.preflight.gate import ladder

    # No global batch: every shape GKE can run is checked; 2 x tpu7x-2x2x1 is no GKE shape.
    shapes, skipped = ladder(make_shape("tpu7x-2x2x2", 2), None, 16, None)
    assert [s.label for s in shapes] == ["tpu7x-2x2x2 x2", "tpu7x-2x2x2 x1", "tpu7x-2x2x1 x1"]
    assert [(s.label, why) for s, why in skipped] == [
        ("tpu7x-2x2x1 x2", "GKE multislice needs multi-host slices, and tpu7x-2x2x1 is one host")
    ]
    # A global batch the devices cannot divide: 48 on 32 devices is no shape of the run either.
    shapes, skipped = ladder(make_shape("tpu7x-2x2x2", 3), 48, 16, None)
    assert [s.label for s in shapes] == ["tpu7x-2x2x2 x3", "tpu7x-2x2x2 x1", "tpu7x-2x2x1 x1"]
    assert [(s.label, why) for s, why in skipped] == [
        ("tpu7x-2x2x2 x2", "global batch 48 is not divisible by 32 devices"),
        ("tpu7x-2x2x1 x3", "GKE multislice needs multi-host slices, and tpu7x-2x2x1 is one host"),
        ("tpu7x-2x2x1 x2", "GKE multislice needs multi-host slices, and tpu7x-2x2x1 is one host"),
    ]
    facts = ClusterFacts(jobset_resources=("jobsets",), namespace={}, nodes=tuple(nodes(P2, "a", "b", "c")))
    rows = {c.name: c for c in checks.run_checks(facts, Request(spec(global_batch=48), shapes, skipped))}
    assert rows["node pools for tpu7x-2x2x2 x3"].status == OK
    assert rows["node pools for tpu7x-2x2x1 x1"].status == WARN  # a shape of the run: no pool of it
    row = rows["node pools for tpu7x-2x2x1 x2"]
    assert row.status == SKIP and row.found.startswith("none needed: the run never takes this shape (GKE")
    assert rows["node pools for tpu7x-2x2x2 x2"].found.endswith(
        "(global batch 48 is not divisible by 32 devices)"
    )


def test_the_trainer_config_shapes_the_ladder_as_in_plan() -> None:
    from launcher.controller.launch import model_parallel, resolve_trainer_config
    from launcher.core.errors import UserError
    from launcher.preflight.gate import ladder

    # 8 sequences on 32 devices: no plan; with mesh.tensor=4 a data-parallel rank is 4 devices.
    shape = make_shape("tpu7x-2x2x2", 2)
    with pytest.raises(UserError, match="not divisible by 32 devices"):
        ladder(shape, 8, 16, None)
    sets = ("mesh.tensor=4",)
    tiny = resolve_trainer_config("tiny", sets, strict=False)
    shapes, skipped = ladder(shape, 8, 16, None, model_parallel(tiny, sets), tiny)
    assert [s.label for s in shapes] == ["tpu7x-2x2x2 x2", "tpu7x-2x2x2 x1", "tpu7x-2x2x1 x1"]
    # A 7B at global batch 64 does not fit one v6e-2x4 (32 GiB of HBM a chip): a shape it never takes.
    olmo = resolve_trainer_config("olmo-7b", (), strict=False)
    shapes, skipped = ladder(make_shape("v6e-4x4", 2), 64, 16, None, 1, olmo)
    assert [s.label for s in shapes] == ["v6e-4x4 x2", "v6e-4x4 x1", "v6e-2x4 x2"]
    assert [(s.label, why) for s, why in skipped] == [
        ("v6e-2x4 x1", "needs ~49.0 GiB per device (estimate), more than its 32 GiB of HBM")
    ]
    shapes, skipped = ladder(make_shape("v6e-4x4", 2), 64, 16, None)  # no config: no estimate
    assert "v6e-2x4 x1" in [s.label for s in shapes] and skipped == ()


def test_a_pool_that_lacks_one_selected_label_is_named_as_a_near_miss() -> None:
    spot = replace(P2, spot=True)  # selects cloud.google.com/gke-spot=true (and tolerates its taint)
    found, near = pools(spot, GOOD)
    assert found == [] and near == [
        "a: no label cloud.google.com/gke-spot=true",
        "b: no label cloud.google.com/gke-spot=true",
    ]
    spot_nodes = [taint(n, "cloud.google.com/gke-spot", "true") for n in nodes(P2, "s", spot=True)]
    found, near = pools(spot, spot_nodes)
    assert [p.name for p in found if p.usable] == ["s"] and near == []


def test_a_placement_policy_the_run_names_selects_the_pools_that_carry_it() -> None:
    policy = {"placement_policies": (("tpu7x-2x2x2", "wp-1"),)}
    with_policy = [
        {**n, "metadata": {**n["metadata"], "labels": {**n["metadata"]["labels"], LABEL_PLACEMENT: "wp-1"}}}
        for n in nodes(P2, "c")
    ]
    found, near = checks.pools_of(
        ClusterFacts(nodes=(*GOOD, *with_policy)), spec(**policy), make_shape("tpu7x-2x2x2", 1)
    )
    assert [p.name for p in found] == ["c"]
    assert near == [f"a: no label {LABEL_PLACEMENT}=wp-1", f"b: no label {LABEL_PLACEMENT}=wp-1"]
    # Without --placement-policy no policy is selected: every pool of the shape counts.
    found, _ = checks.pools_of(
        ClusterFacts(nodes=(*GOOD, *with_policy)), spec(), make_shape("tpu7x-2x2x2", 1)
    )
    assert [p.name for p in found] == ["a", "b", "c"]
    facts = ClusterFacts(jobset_resources=("jobsets",), namespace={}, nodes=tuple(GOOD))
    r = req("tpu7x-2x2x2", 1, **policy)
    (row,) = [c for c in checks.run_checks(facts, r) if c.name.startswith("node pools")]
    assert row.status == FAIL and "--placement-policy=wp-1 (topology 2x2x2)" in row.fix, row
    assert [c.name for c in checks.launch_blockers(facts, r)] == ["node pools for tpu7x-2x2x2 x1"]


def test_the_shape_fix_names_the_gcloud_flags_of_the_preset() -> None:
    row = checks.check_rung(make_shape("tpu7x-2x2x2", 2), *pools(P2, []), first=True)
    assert "create 2 more node pool(s)" in row.fix
    # Multi-host Ironwood: a workload policy instead of --tpu-topology; 2 nodes; storage-full scope.
    assert "--placement-policy=WORKLOAD_POLICY (topology 2x2x2)" in row.fix and "--num-nodes=2" in row.fix
    assert "--scopes=storage-full" in row.fix and "--tpu-topology" not in row.fix
    row = checks.check_rung(make_shape("tpu7x-2x2x1", 1), *pools(P1, []), first=True)
    assert "--tpu-topology=2x2x1" in row.fix and "--placement-policy" not in row.fix  # single-host Ironwood
    v6e = load_preset("v6e-2x4")
    row = checks.check_rung(make_shape("v6e-2x4", 1), *pools(v6e, []), first=True)
    assert "--tpu-topology=2x4" in row.fix and "--machine-type=ct6e-standard-4t" in row.fix
    assert "--placement-policy" not in row.fix
    assert "--tpu-topology=2x4 --placement-policy=cp " in create_command(replace(v6e, placement_policy="cp"))


# --- JobSet, Kueue, namespace, priority class, service account ------------------------------------


def deployment(image: str, available: int = 1) -> dict:
    return {
        "metadata": {"name": "jobset-controller-manager", "namespace": "jobset-system"},
        "spec": {"template": {"spec": {"containers": [{"name": "manager", "image": image}]}}},
        "status": {"availableReplicas": available},
    }


JOBSET_CASES = [
    ("v0.12.0", ClusterFacts(jobset_deployment=deployment("registry.k8s.io/jobset/jobset:v0.12.0")), OK, "v0.12.0"),
    ("v0.12.3 by digest", ClusterFacts(jobset_deployment=deployment("r.io/jobset:v0.12.3@sha256:ab")), OK, "1 available"),
    ("v0.11.1", ClusterFacts(jobset_deployment=deployment("registry.k8s.io/jobset/jobset:v0.11.1")), FAIL, "older than v0.12"),
    ("no tag", ClusterFacts(jobset_deployment=deployment("localhost:5000/jobset")), WARN, "no version in its tag"),
    ("not available", ClusterFacts(jobset_deployment=deployment("r.io/jobset:v0.12.0", 0)), FAIL, "no available replica"),
    ("absent", ClusterFacts(), FAIL, "no Deployment jobset-controller-manager or jobset-controller"),
    ("forbidden", ClusterFacts(forbidden={"jobset_deployment": "GET ...: forbidden"}), WARN, "version not checked"),
    ("embedded", ClusterFacts(embedded={"jobset_version": "v0.12.0"}), OK, "follows v0.12.0"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("facts", "status", "needle"), [c[1:] for c in JOBSET_CASES], ids=[c[0] for c in JOBSET_CASES]
)
def test_jobset_controller_version(facts, status, needle) -> None:
    row = checks.check_jobset_controller(facts)
    assert row.status == status and needle in row.found, row
    assert row.status == OK or "jobset" in row.fix.lower()


def test_jobset_api_must_serve_jobsets() -> None:
    assert checks.check_jobset_api(ClusterFacts(jobset_resources=("jobsets", "jobsets/status"))).status == OK
    row = checks.check_jobset_api(ClusterFacts())
    assert row.status == FAIL and "releases/download/v0.12.0/manifests.yaml" in row.fix


LQ = {"spec": {"clusterQueue": "tpu-cq"}}
INACTIVE = {**LQ, "status": {"conditions": [{"type": "Active", "status": "False", "reason": "ClusterQueueIsInactive",
                                             "message": "Can't submit new workloads to clusterQueue"}]}}  # fmt: skip
QUEUE_CASES = [
    ("no kueue", ClusterFacts(), FAIL, "Kueue is not installed"),
    (
        "no local queue",
        ClusterFacts(kueue_resources=("localqueues",)),
        FAIL,
        "no LocalQueue q in namespace default",
    ),
    (
        "inactive",
        ClusterFacts(kueue_resources=("localqueues",), local_queue=INACTIVE),
        FAIL,
        "is inactive: Can't",
    ),
    (
        "active",
        ClusterFacts(kueue_resources=("localqueues",), local_queue=LQ),
        OK,
        "q -> ClusterQueue tpu-cq",
    ),
]


@pytest.mark.parametrize(
    ("facts", "status", "needle"), [c[1:] for c in QUEUE_CASES], ids=[c[0] for c in QUEUE_CASES]
)
def test_kueue_local_queue(facts, status, needle) -> None:
    row = checks.check_queue(facts, spec(queue="q"))
    assert row.status == status and needle in row.found, row


def test_namespace_priority_class_and_service_account() -> None:
    assert checks.check_namespace(ClusterFacts(), "team").fix.startswith("kubectl create namespace team")
    terminating = ClusterFacts(namespace={"status": {"phase": "Terminating"}})
    assert checks.check_namespace(terminating, "team").status == FAIL
    assert checks.check_priority_class(ClusterFacts(priority_class={"value": 100}), "high").status == OK
    assert "no PriorityClass high" in checks.check_priority_class(ClusterFacts(), "high").found
    row = checks.check_service_account(ClusterFacts(), spec(service_account="trainer"))
    assert row.status == FAIL and row.fix == "kubectl -n default create serviceaccount trainer"


def test_a_local_run_dir_is_only_for_the_embedded_cluster() -> None:
    assert checks.check_run_dir("gs://b/r", embedded=False).status == OK
    assert checks.check_run_dir("/tmp/r", embedded=True).status == OK
    row = checks.check_run_dir("/tmp/r", embedded=False)
    assert row.status == FAIL and "gs://" in row.fix


def test_the_image_must_hold_the_profiles_program() -> None:
    mt = RunSpec(
        run="r", run_dir="gs://b/r", global_batch=8, trainer="maxtext", image="reslice-maxtext:latest"
    )
    assert checks.check_image(mt, embedded=False).status == OK
    assert "python -m maxtext_entry" in checks.check_image(mt, embedded=False).found
    wrong = checks.check_image(
        replace(mt, image="europe-docker.pkg.dev/p/r/reslice-trainer:v3@sha256:ab"), False
    )
    assert wrong.status == FAIL and "is the reslice profile's image" in wrong.found
    assert wrong.fix.startswith("give the maxtext profile's image (--image REGISTRY/reslice-maxtext:TAG")
    ours = RunSpec(run="r", run_dir="gs://b/r", global_batch=8, image="reg/x/reslice-maxtext:1")
    assert checks.check_image(ours, embedded=False).status == FAIL  # reslice's trainer is not in it
    assert checks.check_image(replace(mt, image="my-own-maxtext:2"), embedded=False).status == OK
    assert checks.check_image(replace(mt, image="reslice-trainer:latest"), embedded=True).status == OK
    # The probe runs the profile's own program: the MaxText image has no `trainer` package.
    pod = probe_pod(mt, load_preset("tpu7x-2x2x1"))
    assert pod["spec"]["containers"][0]["command"] == [
        "python",
        "-m",
        "maxtext_entry",
        "--probe-write",
        "gs://b/r",
    ]
    assert pod["spec"]["containers"][0]["image"] == "reslice-maxtext:latest"


# --- resource quota ---------------------------------------------------------------------------------


def quota(hard: dict, used: dict | None = None, scope: dict | None = None) -> dict:
    q = {"metadata": {"name": "q"}, "spec": {"hard": hard}, "status": {"used": used or {}}}
    if scope:
        q["spec"]["scopeSelector"] = {"matchExpressions": [scope]}
    return q


HIGH = {"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}
QUOTA_CASES = [  # tpu7x-2x2x2 x1: 2 pods of 4 chips, 56 cpu and 240Gi each
    ("none", [], {}, OK, "none in default"),
    ("8 chips allowed", [quota({"requests.google.com/tpu": "8"})], {}, OK, "none short"),
    ("hard limit below", [quota({"requests.google.com/tpu": "4"})], {}, FAIL, "requests.google.com/tpu 4 < 8"),
    ("full now", [quota({"requests.google.com/tpu": "16"}, {"requests.google.com/tpu": "12"})], {}, WARN,
     "has 4 of 16 free now"),
    ("pod count", [quota({"pods": "1"})], {}, FAIL, "pods 1 < 2"),
    ("cpu requests counted", [quota({"requests.cpu": "100"})], {}, FAIL, "q: requests.cpu 100 < 112 for tpu7x-2x2x2 x1"),
    ("memory requests fit", [quota({"requests.memory": "480Gi", "memory": "1Ti"})], {}, OK, "none short"),
    ("cpu limits, pods state none", [quota({"limits.cpu": "1000"})], {}, WARN, "limits.cpu, which the trainer pods do not state"),
    ("scientific notation", [quota({"requests.google.com/tpu": "1e3"})], {}, OK, "none short"),
    ("scoped to another priority class", [quota({"requests.google.com/tpu": "0"}, scope=HIGH)], {}, OK, "none short"),
    ("scoped to ours", [quota({"requests.google.com/tpu": "0"}, scope=HIGH)], {"priority_class": "high"}, FAIL,
     "0 < 8"),
]  # fmt: skip


@pytest.mark.parametrize(("quotas", "kw", "status", "needle"), [c[1:] for c in QUOTA_CASES],
                         ids=[c[0] for c in QUOTA_CASES])  # fmt: skip
def test_resource_quota(quotas, kw, status, needle) -> None:
    row = checks.check_quota(tuple(quotas), req("tpu7x-2x2x2", 1, **kw))
    assert row.status == status and needle in row.found, row


# --- launch's free checks ------------------------------------------------------------------------


def test_launch_refuses_only_on_what_no_waiting_fixes() -> None:
    base = ClusterFacts(
        jobset_resources=("jobsets",), namespace={"status": {"phase": "Active"}}, nodes=tuple(GOOD)
    )
    r = req("tpu7x-2x2x2", 2)
    assert checks.launch_blockers(base, r) == []
    assert checks.launch_blockers(replace(base, nodes=tuple(not_ready(n) for n in GOOD)), r) == []
    full = quota({"requests.google.com/tpu": "16"}, {"requests.google.com/tpu": "16"})
    assert checks.launch_blockers(replace(base, quotas=(full,)), r) == []  # full now, large enough
    cases = {
        "JobSet API": replace(base, jobset_resources=None),
        "namespace": replace(base, namespace=None),
        "node pools for tpu7x-2x2x2 x2": replace(base, nodes=tuple(GOOD[:3])),
        "resource quota": replace(base, quotas=(quota({"requests.google.com/tpu": "8"}),)),
    }
    for name, facts in cases.items():
        assert [c.name for c in checks.launch_blockers(facts, r)] == [name]
    small = replace(base, nodes=tuple(allocatable(n, memory="200Gi") for n in GOOD))
    assert [c.name for c in checks.launch_blockers(small, r)] == ["node pools for tpu7x-2x2x2 x2"]
    assert checks.launch_blockers(small, req("tpu7x-2x2x2", 2, memory_request="200Gi")) == []
    assert [c.name for c in checks.launch_blockers(base, req("tpu7x-2x2x2", 2, queue="q"))] == [
        "Kueue LocalQueue"
    ]
    local = Request(replace(r.spec, run_dir="/tmp/r"), r.ladder)
    assert [c.name for c in checks.launch_blockers(base, local)] == ["run directory"]
    assert checks.launch_blockers(replace(base, embedded={}), local) == []


# --- the write probe (pure parts) ---------------------------------------------------------------------


def test_the_probe_pod_is_placed_like_the_trainer_pods_and_is_not_a_run_pod() -> None:
    s = spec(service_account="trainer", priority_class="high", image="img:1")
    shape = make_shape("tpu7x-2x2x2", 1)
    trainer = render_jobset(s, shape)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod = probe_pod(s, shape.preset)
    for key in (
        "nodeSelector",
        "tolerations",
        "hostNetwork",
        "dnsPolicy",
        "serviceAccountName",
        "priorityClassName",
    ):
        assert pod["spec"][key] == trainer[key], key
    (c,) = pod["spec"]["containers"]
    assert c["command"] == ["python", "-m", "trainer", "--probe-write", "gs://b/r"] and c["image"] == "img:1"
    # No chips (it also runs beside a live run), but cpu and memory as the trainers state them: a
    # quota on requests.cpu/memory that admits the trainers admits the probe too.
    assert c["resources"] == {"requests": {"cpu": "100m", "memory": "256Mi"}}
    counted = quota({"requests.cpu": "1", "requests.memory": "1Gi", "requests.google.com/tpu": "0"})
    assert shortfalls((counted,), pod, 1, "the probe") == ([], [])
    assert pod["metadata"]["labels"] == {LABEL_PROBE: "r"} and LABEL_RUN not in pod["metadata"]["labels"]


PROBE_CASES = [
    ("wrote", Outcome("p", "Succeeded", "n", 0, "trainer: wrote and deleted gs://b/r/.x\n"), OK, "wrote and deleted", ""),
    ("forbidden", Outcome("p", "Failed", "n", 2, "trainer: the node pool's service account cannot write gs://b/r"
                          " (403 Forbidden); fix: create the TPU node pools with --scopes=storage-full\n"), FAIL,
     "cannot write gs://b/r (403 Forbidden)", "create the TPU node pools with --scopes=storage-full"),
    ("old image", Outcome("p", "Failed", "n", 2, "trainer: usage error: unrecognized arguments: --probe-write x"),
     FAIL, "no --probe-write", "rebuild and push the image"),
    ("image pull", Outcome("p", "Pending", None, None, "", "ImagePullBackOff: Back-off pulling image", 300), FAIL,
     "did not finish in 300 s: ImagePullBackOff", "check --image"),
    ("unschedulable", Outcome("p", "Pending", None, None, "", "unschedulable: 0/2 nodes are available", 300), FAIL,
     "0/2 nodes", "node pool rows"),
    ("refused", Outcome("p-…", "Refused", waiting='exceeded quota: q'), FAIL, "refused the probe pod: exceeded", ""),
]  # fmt: skip


@pytest.mark.parametrize(("outcome", "status", "found", "fix"), [c[1:] for c in PROBE_CASES],
                         ids=[c[0] for c in PROBE_CASES])  # fmt: skip
def test_probe_row(outcome, status, found, fix) -> None:
    row = probe_check(outcome, "gs://b/r")
    assert row.status == status and found in row.found and fix in row.fix, row


# --- the command, against the embedded cluster ---------------------------------------------------


@pytest.fixture
def cluster_factory(tmp_path: Path):
    started: list[EmbeddedCluster] = []

    def start(nodepools: str) -> EmbeddedCluster:
        (tmp_path / "pods").mkdir(exist_ok=True)
        c = EmbeddedCluster(nodepools=nodepools, mode="process", workdir=tmp_path / "pods").start()
        started.append(c)
        return c

    yield start
    for c in started:
        c.stop()


def preflight(capsys, cluster: EmbeddedCluster, *args: str) -> tuple[int, dict[str, dict]]:
    """Exit code and rows by name of `reslice preflight --json ARGS` against `cluster`."""
    code, out, err = run_cli(capsys, "preflight", "--kubeconfig", str(cluster.kubeconfig), "--json", *args)
    assert err == "", err
    return code, {row["name"]: row for row in json.loads(out)}


def probe_pods(cluster: EmbeddedCluster) -> list:
    return (
        client.CoreV1Api(cluster.api_client())
        .list_namespaced_pod("default", label_selector=LABEL_PROBE)
        .items
    )


def test_passes_on_a_cluster_that_fits_the_run(capsys, cluster_factory, tmp_path: Path) -> None:
    # One pool of the single-host fallback is all it takes: 2 x tpu7x-2x2x1 is no GKE shape.
    cluster = cluster_factory("tpu7x-2x2x2:2,tpu7x-2x2x1:1")
    run_dir = tmp_path / "run"
    args = ["-p", "tpu7x-2x2x2", "-n", "2", "-b", "32", "--run-dir", str(run_dir)]
    code, rows = preflight(capsys, cluster, *args)
    assert code == 0, rows
    # The ladder: x2 and x1 of the preset, then its fallback's one slice; its multislice is not needed.
    assert [n for n in rows if n.startswith("node pools")] == [
        "node pools for tpu7x-2x2x2 x2", "node pools for tpu7x-2x2x2 x1",
        "node pools for tpu7x-2x2x1 x1", "node pools for tpu7x-2x2x1 x2",
    ]  # fmt: skip
    skipped = rows.pop("node pools for tpu7x-2x2x1 x2")
    assert skipped["status"] == SKIP and "GKE multislice needs multi-host slices" in skipped["found"]
    assert {r["status"] for r in rows.values()} == {OK}, rows
    assert rows["node pools for tpu7x-2x2x2 x2"]["found"] == "2 fit: tpu7x-2x2x2-np-0, tpu7x-2x2x2-np-1"
    assert rows["node pools for tpu7x-2x2x1 x1"]["found"] == "1 fit: tpu7x-2x2x1-np-0"
    assert rows["JobSet controller"]["found"] == "embedded cluster: its JobSet controller follows v0.12.0"
    assert "wrote and deleted an object under" in rows["write probe"]["found"]
    assert probe_pods(cluster) == [] and not run_dir.exists()  # the pod, the object, the directory: gone
    code, out, _ = run_cli(capsys, "preflight", "--kubeconfig", str(cluster.kubeconfig), *args)
    assert (
        code == 0
        and "✓" in out
        and "–" in out
        and "✗" not in out
        and out.rstrip().endswith("preflight: ready")
    )
    # The pods' requests must fit the nodes' allocatable (200 cpu here): above it they would stay
    # Pending on every pool, and the probe has nowhere to run.
    code, rows = preflight(capsys, cluster, *args, "--cpu-request", "201")
    x2 = rows["node pools for tpu7x-2x2x2 x2"]
    assert code == 1 and x2["status"] == FAIL, x2
    assert "tpu7x-2x2x2-np-0: the pods request cpu 201, its nodes have 200 allocatable" in x2["found"]
    assert x2["fix"].startswith("request at most the nodes' allocatable (--cpu-request")
    assert rows["write probe"]["found"] == "not run: no usable node pool of tpu7x-2x2x2 to run it on"


def test_fails_naming_the_missing_and_unusable_node_pools(capsys, cluster_factory, tmp_path: Path) -> None:
    cluster = cluster_factory("tpu7x-2x2x2:3")
    core = client.CoreV1Api(cluster.api_client())
    node = core.list_node(label_selector="cloud.google.com/gke-nodepool=tpu7x-2x2x2-np-2").items[1]
    taints = [t.to_dict() for t in node.spec.taints or []] + [
        {"key": "dedicated", "value": "other", "effect": "NoSchedule"}
    ]
    core.patch_node(node.metadata.name, {"spec": {"taints": taints}})
    code, rows = preflight(capsys, cluster, "-p", "tpu7x-2x2x2", "-n", "4", "--run-dir", str(tmp_path / "r"))
    assert code == 1
    x4 = rows["node pools for tpu7x-2x2x2 x4"]
    assert x4["status"] == FAIL and x4["found"] == (
        "needs 4 node pools of tpu7x-2x2x2 (2 nodes each), 2 fit: tpu7x-2x2x2-np-0, tpu7x-2x2x2-np-1; "
        "tpu7x-2x2x2-np-2: taint dedicated=other:NoSchedule not tolerated"
    )
    assert x4["fix"].startswith("create 2 more node pool(s): gcloud container node-pools create NAME")
    assert rows["node pools for tpu7x-2x2x2 x3"]["status"] == WARN  # a smaller rung: a warning
    assert rows["node pools for tpu7x-2x2x2 x2"]["status"] == OK
    assert rows["node pools for tpu7x-2x2x1 x1"]["status"] == WARN  # the fallback's one slice: none here
    assert [r["status"] for n, r in rows.items() if n.startswith("node pools for tpu7x-2x2x1 x")] == [
        WARN, SKIP, SKIP, SKIP,
    ]  # fmt: skip
    assert rows["write probe"]["status"] == OK  # a usable pool to run it on exists
    assert [n for n, r in rows.items() if r["status"] == FAIL] == ["node pools for tpu7x-2x2x2 x4"]


def test_the_write_probe_names_the_fix_for_an_unwritable_run_dir(
    capsys, cluster_factory, tmp_path: Path
) -> None:
    cluster = cluster_factory("tpu7x-2x2x1:1")
    (tmp_path / "file").write_text("not a directory")  # tests run as root: a file in the path stops root
    code, rows = preflight(capsys, cluster, "-p", "tpu7x-2x2x1", "--run-dir", str(tmp_path / "file" / "run"))
    probe = rows["write probe"]
    assert code == 1 and probe["status"] == FAIL, rows
    assert (
        probe["found"].startswith("pod preflight-write-probe-")
        and "exit 2: cannot create run directory" in probe["found"]
    )
    assert probe["fix"] == "choose a --run-dir whose parents are directories"
    assert probe_pods(cluster) == []


def test_the_write_probe_writes_gcs_from_the_pod(capsys, cluster_factory, monkeypatch) -> None:
    with fake_gcs(buckets=["reslice"]) as gcs:
        for k, v in gcs.env.items():
            monkeypatch.setenv(k, v)  # the kubelet's processes inherit this process's environment
        cluster = cluster_factory("tpu7x-2x2x1:1")
        code, rows = preflight(capsys, cluster, "-p", "tpu7x-2x2x1", "--run-dir", "gs://reslice/runs/a")
        assert (
            code == 0
            and "wrote and deleted an object under gs://reslice/runs/a" in rows["write probe"]["found"]
        )
        assert gcs.list_objects("reslice") == []
        code, rows = preflight(capsys, cluster, "-p", "tpu7x-2x2x1", "--run-dir", "gs://no-such-bucket/a")
        probe = rows["write probe"]
        assert code == 1 and "bucket gs://no-such-bucket does not exist" in probe["found"], probe
        assert probe["fix"].startswith("create it (gcloud storage buckets create gs://no-such-bucket")
        with urllib.request.urlopen(f"{gcs.endpoint}/storage/v1/b") as resp:
            assert [b["name"] for b in json.load(resp)["items"]] == ["reslice"]  # the probe created none


def test_the_maxtext_profile_probes_gcs_with_its_entrypoint(
    capsys, cluster_factory, monkeypatch, tmp_path: Path
) -> None:
    """`--trainer maxtext`: the probe pod runs `python -m maxtext_entry --probe-write` (the stand-in
    MaxText on the pods' path, as the image has MaxText), and the image row names the profile's image."""
    path = [str(fake_package(tmp_path)), *filter(None, [__import__("os").environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", ":".join(path))  # the kubelet's processes inherit it
    with fake_gcs(buckets=["reslice"]) as gcs:
        for k, v in gcs.env.items():
            monkeypatch.setenv(k, v)
        cluster = cluster_factory("tpu7x-2x2x1:1")
        args = ["-p", "tpu7x-2x2x1", "--trainer", "maxtext", "--set", "num_experts=4"]
        code, rows = preflight(capsys, cluster, *args, "--run-dir", "gs://reslice/runs/mt")
        assert code == 0, rows
        assert "wrote and deleted an object under gs://reslice/runs/mt" in rows["write probe"]["found"]
        assert rows["trainer image"]["found"].startswith("reslice-maxtext:latest: the embedded cluster")
        assert gcs.list_objects("reslice") == [] and probe_pods(cluster) == []
        code, rows = preflight(capsys, cluster, *args, "--run-dir", "gs://no-such-bucket/a")
        probe = rows["write probe"]
        assert code == 1 and "exit 2: bucket gs://no-such-bucket does not exist" in probe["found"], probe
        assert probe["fix"].startswith("create it (gcloud storage buckets create gs://no-such-bucket")


def test_priority_class_and_quota_through_the_api(capsys, cluster_factory, tmp_path: Path) -> None:
    cluster = cluster_factory("tpu7x-2x2x2:1,tpu7x-2x2x1:1")
    api = cluster.api_client()
    client.CoreV1Api(api).create_namespace({"metadata": {"name": "team"}})
    client.CoreV1Api(api).create_namespaced_resource_quota(
        "team", {"metadata": {"name": "tpu"}, "spec": {"hard": {"requests.google.com/tpu": "4"}}}
    )
    common = ["--run-dir", str(tmp_path / "r"), "--namespace", "team", "--no-probe"]
    code, rows = preflight(capsys, cluster, *common, "-p", "tpu7x-2x2x2", "--priority-class", "high")
    assert code == 1
    assert rows["priority class"]["found"].startswith("no PriorityClass high")
    assert rows["resource quota"]["found"] == "tpu: requests.google.com/tpu 4 < 8 for tpu7x-2x2x2 x1"
    assert rows["write probe"] == {
        "name": "write probe",
        "status": "skip",
        "found": "not run (--no-probe)",
        "fix": "",
    }
    client.SchedulingV1Api(api).create_priority_class({"metadata": {"name": "high"}, "value": 1000})
    code, rows = preflight(capsys, cluster, *common, "-p", "tpu7x-2x2x1", "--priority-class", "high")
    assert code == 0 and rows["priority class"]["found"] == "high (value 1000)", rows
    assert rows["resource quota"]["status"] == OK


def test_placement_policy_selects_the_pools_through_the_api(capsys, cluster_factory, tmp_path: Path) -> None:
    cluster = cluster_factory("tpu7x-2x2x2:2")
    common = ["-p", "tpu7x-2x2x2", "-n", "2", "--run-dir", str(tmp_path / "r"), "--no-probe"]
    code, rows = preflight(capsys, cluster, *common, "--placement-policy", "wp-1")
    x2 = rows["node pools for tpu7x-2x2x2 x2"]
    assert code == 1 and x2["found"].startswith("needs 2 node pools of tpu7x-2x2x2 (2 nodes each), 0 fit"), x2
    assert f"tpu7x-2x2x2-np-1: no label {LABEL_PLACEMENT}=wp-1" in x2["found"]
    assert "--placement-policy=wp-1 (topology 2x2x2)" in x2["fix"]
    core = client.CoreV1Api(cluster.api_client())
    for node in core.list_node(label_selector="cloud.google.com/gke-nodepool").items:
        core.patch_node(node.metadata.name, {"metadata": {"labels": {LABEL_PLACEMENT: "wp-1"}}})
    code, rows = preflight(capsys, cluster, *common, "--placement-policy", "tpu7x-2x2x2=wp-1")
    assert code == 0 and rows["node pools for tpu7x-2x2x2 x2"]["found"].startswith("2 fit"), rows


def test_bad_input_is_exit_2_before_any_cluster_is_asked(capsys, tmp_path: Path) -> None:
    for argv, needle in (
        (["-p", "nope", "--run-dir", "/tmp/r"], "unknown preset 'nope'"),
        (["-p", "tpu7x-2x2x1", "-b", "12", "--run-dir", "/tmp/r"], "not divisible by 8 devices"),
        (["-p", "tpu7x-2x2x1", "--run", "Bad_Name", "--run-dir", "/tmp/r"], "not a DNS-1035 label"),
        # GKE runs no multislice of a single-host preset: with or without a global batch.
        (["-p", "tpu7x-2x2x1", "-n", "2", "--run-dir", "/tmp/r"], "GKE multislice needs multi-host slices"),
        (
            ["-p", "tpu7x-2x2x1", "-n", "2", "-b", "16", "--run-dir", "/tmp/r"],
            "tpu7x-2x2x1 x2: GKE multislice",
        ),
        (
            ["-p", "tpu7x-2x2x2", "--cpu-request", "lots", "--run-dir", "/tmp/r"],
            "--cpu-request 'lots' is not",
        ),
        (
            ["-p", "tpu7x-2x2x2", "--placement-policy", "nope=wp", "--run-dir", "/tmp/r"],
            "unknown preset 'nope'",
        ),
        (
            ["-p", "v6e-2x4", "-b", "64", "--config", "olmo-7b", "--run-dir", "/tmp/r"],
            "v6e-2x4 x1: needs ~49.0 GiB per device (estimate), more than its 32 GiB of HBM",
        ),
        (["-p", "v6e-2x4", "-b", "8", "--set", "mesh.tensor", "--run-dir", "/tmp/r"], "--set 'mesh.tensor'"),
    ):
        code, out, err = run_cli(capsys, "preflight", "--kubeconfig", str(tmp_path / "none"), *argv)
        assert code == 2 and needle in err and err.count("\n") == 1 and out == "", err


# --- launch --------------------------------------------------------------------------------------


def test_launch_refuses_a_cluster_that_cannot_run_it_and_creates_nothing(
    capsys, cluster_factory, tmp_path: Path
) -> None:
    cluster = cluster_factory("tpu7x-2x2x2:1")
    kube = Kube(cluster.api_client())
    run_dir = tmp_path / "r1"
    argv = ["launch", "-p", "tpu7x-2x2x2", "-n", "2", "--run", "r1", "-b", "32", "--run-dir", str(run_dir),
            "--kubeconfig", str(cluster.kubeconfig), "--detach"]  # fmt: skip
    code, out, err = run_cli(capsys, *argv)
    assert code == 1 and err.count("\n") == 1, err
    assert "this cluster cannot run tpu7x-2x2x2 x2: node pools for tpu7x-2x2x2 x2: needs 2" in err
    assert "--no-preflight launches anyway" in err
    assert kube.get_record("r1") is None and not (run_dir / "run.json").exists()
    # A pool that exists but whose nodes cannot hold one pod's request: no waiting fixes it either.
    code, out, err = run_cli(capsys, *argv[:4], "1", *argv[5:], "--memory-request", "900Gi")
    assert code == 1 and "the pods request memory 900Gi, its nodes have 800Gi allocatable" in err, err
    assert kube.get_record("r1") is None and not (run_dir / "run.json").exists()
    code, out, err = run_cli(capsys, *argv, "--no-preflight")
    assert code == 0 and kube.get_record("r1") is not None, out + err
    assert client.CoreV1Api(cluster.api_client()).read_namespaced_config_map(record_name("r1"), "default")
