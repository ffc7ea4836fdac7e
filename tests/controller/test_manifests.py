"""The in-cluster controller's manifests: they apply to the embedded cluster, and their RBAC is
least privilege — exactly the (verb, resource) pairs `reslice watch --all` used against the API
server's audit log while it drove a run through a shrink."""

import threading
from pathlib import Path

import yaml
from kubernetes import client, utils

from launcher.embedded.cluster import EmbeddedCluster, NodePoolSpec
from launcher.kube import Kube
from launcher.launch import create_run, prepare
from launcher.record import Policy
from launcher.render import RunSpec
from launcher.watch import watch_all
from tests.controller.harness import wait_for

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests" / "controller"


def kustomize() -> list[dict]:
    """What `kubectl apply -k` would send: the listed resources, in the kustomization's namespace."""
    k = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    docs = [d for name in k["resources"] for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]
    for d in docs:
        if d["kind"] not in {"ClusterRole", "ClusterRoleBinding"}:
            d["metadata"]["namespace"] = k["namespace"]
    return docs


def test_manifests_apply_to_the_embedded_cluster():
    docs = kustomize()
    with EmbeddedCluster(nodepools=[NodePoolSpec("tpu7x-2x2x1", count=1)], mode="simulate") as cluster:
        api = cluster.api_client()
        client.CoreV1Api(api).create_namespace({"metadata": {"name": "reslice"}})
        for doc in docs:
            utils.create_from_dict(api, doc)
        dep = client.AppsV1Api(api).read_namespaced_deployment("reslice-controller", "reslice")
        assert dep.spec.template.spec.service_account_name == "reslice-controller"
        assert dep.spec.template.spec.containers[0].args[:2] == ["watch", "--all"]
        rbac = client.RbacAuthorizationV1Api(api)
        assert rbac.read_namespaced_role("reslice-controller", "reslice").rules
        crb = rbac.read_cluster_role_binding("reslice-controller-nodes")
        assert crb.subjects[0].namespace == "reslice"
    kinds = {d["kind"] for d in docs}
    assert kinds == {
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
    }


def granted() -> tuple[set, set]:
    """(namespaced, cluster-scoped) (verb, group, resource) triples the manifests grant."""
    out: dict[str, set] = {"Role": set(), "ClusterRole": set()}
    for d in kustomize():
        if d["kind"] in out:
            for rule in d["rules"]:
                assert "*" not in rule["verbs"] and "*" not in rule["resources"], "no wildcards"
                out[d["kind"]] |= {
                    (v, g, r) for v in rule["verbs"] for g in rule["apiGroups"] for r in rule["resources"]
                }
    return out["Role"], out["ClusterRole"]


def test_rbac_is_exactly_what_the_controller_uses(tmp_path):
    with EmbeddedCluster(nodepools=[NodePoolSpec("tpu7x-2x2x2", count=2)], mode="simulate") as cluster:
        kube = Kube(cluster.api_client(), "default")
        spec = RunSpec(run="rbac", run_dir=str(tmp_path / "rbac"), global_batch=32, grace_period_s=1)
        rec, _ = prepare(spec, "tpu7x-2x2x2", 2, Policy(unschedulable_grace_s=5))
        create_run(kube, rec)  # the user's identity, not the controller's
        cluster.server.audit.clear()
        stop = threading.Event()
        t = threading.Thread(
            target=watch_all, args=(kube, stop), kwargs={"resync_s": 0.5, "log": lambda _: None}
        )
        t.start()
        try:
            wait_for(lambda: kube.jobsets("rbac"), 30, "segment 0")
            cluster.remove("tpu7x-2x2x2-np-1")
            wait_for(
                lambda: len(kube.get_record("rbac")[0].segments) == 2 and kube.jobsets("rbac"),
                60,
                "the shrink",
            )
        finally:
            stop.set()
            t.join(timeout=30)
        used = set(cluster.server.audit)
    namespaced, cluster_scoped = granted()
    nodes = {u for u in used if u[2] == "nodes"}
    assert nodes == cluster_scoped
    assert used - nodes == namespaced
