"""Discovery and kubectl: the documents and Tables kubectl relies on, and kubectl itself listing
JobSets, pods and nodes and showing logs against the embedded server.

kubectl is found by tests.support.kubectl ($KUBECTL, the venv's bin/, apt, PATH). Where none can be
had the kubectl test checks the wire protocol kubectl uses instead.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
import warnings
from pathlib import Path

from kubernetes import client

from tests.launcher.embedded.conftest import Api, jobset, pod
from tests.support.kubectl import find_kubectl, kubectl

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


def test_legacy_discovery_documents(api: Api) -> None:
    assert client.CoreApi(api.client).get_api_versions().versions == ["v1"]
    groups = {
        g.name: g.preferred_version.version for g in client.ApisApi(api.client).get_api_versions().groups
    }
    assert groups == {
        "apps": "v1",
        "batch": "v1",
        "coordination.k8s.io": "v1",
        "jobset.x-k8s.io": "v1alpha2",
        "policy": "v1",
        "rbac.authorization.k8s.io": "v1",
        "scheduling.k8s.io": "v1",
    }
    core = {r.name: r for r in api.core.get_api_resources().resources}
    assert {"pods", "pods/log", "pods/status", "nodes", "events", "configmaps", "namespaces"} <= set(core)
    assert core["pods"].namespaced and not core["nodes"].namespaced and core["pods"].short_names == ["po"]
    assert "watch" in core["pods"].verbs
    ev = core["pods/eviction"]  # what kubectl drain looks for (policy/v1 Eviction)
    assert (ev.group, ev.version, ev.kind, ev.verbs) == ("policy", "v1", "Eviction", ["create"])
    jobsets = client.CustomObjectsApi(api.client).get_api_resources("jobset.x-k8s.io", "v1alpha2")
    assert {r.name for r in jobsets.resources} == {"jobsets", "jobsets/status"}
    assert client.VersionApi(api.client).get_code().major == "1"


def _get(url: str, accept: str = "application/json") -> dict:
    req = urllib.request.Request(url, headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def _seed(api: Api) -> None:
    api.core.create_node(
        {
            "metadata": {"name": "gke-tpu-np-0-a"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
    )
    api.core.create_namespaced_pod("default", pod("train-slice-0-0-x7kq2", node="gke-tpu-np-0-a"))
    api.core.patch_namespaced_pod_status(
        "train-slice-0-0-x7kq2",
        "default",
        {
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {"name": "main", "ready": True, "restartCount": 2, "state": {"running": {}}}
                ],
            }
        },
    )
    api.custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "default", "jobsets", jobset())
    api.server.set_log_source(lambda ns, name, container, follow: iter([b"step 10 loss 2.5\n"]))


def _check_tables(api: Api) -> None:
    """What `kubectl get` asks for and prints: server-side Tables with the upstream columns."""
    pods = _get(f"{api.server.url}/api/v1/namespaces/default/pods", TABLE)
    assert pods["kind"] == "Table"
    assert [c["name"] for c in pods["columnDefinitions"][:5]] == [
        "Name",
        "Ready",
        "Status",
        "Restarts",
        "Age",
    ]
    assert pods["rows"][0]["cells"][:4] == ["train-slice-0-0-x7kq2", "1/1", "Running", 2]
    js = _get(f"{api.server.url}/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets", TABLE)
    assert [c["name"] for c in js["columnDefinitions"]] == [
        "Name",
        "TerminalState",
        "Restarts",
        "Completed",
        "Suspended",
        "Age",
    ]
    nodes = _get(f"{api.server.url}/api/v1/nodes", TABLE)
    assert nodes["rows"][0]["cells"][:2] == ["gke-tpu-np-0-a", "Ready"]
    plain = _get(f"{api.server.url}/api/v1/namespaces/default/pods")
    assert plain["kind"] == "PodList"


def test_kubectl_lists_jobsets_pods_nodes_and_shows_logs(api: Api, tmp_path: Path) -> None:
    from launcher.embedded.api.kubeconfig import write_kubeconfig

    _seed(api)
    _check_tables(api)
    binary = find_kubectl()
    if binary is None:
        warnings.warn(
            "no kubectl and apt cannot reach a mirror: checked kubectl's protocol only", stacklevel=1
        )
        return
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.server.url)
    jobsets = kubectl(binary, kubeconfig, "get", "jobsets")
    assert jobsets.split()[:6] == ["NAME", "TERMINALSTATE", "RESTARTS", "COMPLETED", "SUSPENDED", "AGE"]
    assert "train" in jobsets
    pods = kubectl(binary, kubeconfig, "get", "pods", "-o", "wide").splitlines()
    assert pods[0].split()[:5] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert (
        pods[1].split()[:4] == ["train-slice-0-0-x7kq2", "1/1", "Running", "2"]
        and "gke-tpu-np-0-a" in pods[1]
    )
    nodes = kubectl(binary, kubeconfig, "get", "nodes").splitlines()
    assert nodes[1].split()[:2] == ["gke-tpu-np-0-a", "Ready"]
    assert kubectl(binary, kubeconfig, "logs", "train-slice-0-0-x7kq2") == "step 10 loss 2.5\n"
    as_json = json.loads(kubectl(binary, kubeconfig, "get", "jobset", "train", "-o", "json"))
    assert as_json["spec"]["replicatedJobs"][0]["replicas"] == 2
    kubectl(binary, kubeconfig, "delete", "pod", "train-slice-0-0-x7kq2", "--grace-period=0", "--force")
    assert api.core.list_namespaced_pod("default").items == []


def test_kubectl_applies_manifests(api: Api, tmp_path: Path) -> None:
    """`kubectl apply -f` (client-side validation against the server's OpenAPI, create, then a
    merge patch for the JobSet on the second apply) and a 422 surfacing as kubectl's error."""
    from launcher.embedded.api.kubeconfig import write_kubeconfig

    binary = find_kubectl()
    if binary is None:
        openapi = _get(f"{api.server.url}/openapi/v2")
        assert openapi["swagger"] == "2.0"
        warnings.warn(
            "no kubectl and apt cannot reach a mirror: checked the OpenAPI document only", stacklevel=1
        )
        return
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.server.url)
    manifest = tmp_path / "jobset.yaml"
    body = jobset("applied")
    manifest.write_text(json.dumps(body))
    assert "jobset.jobset.x-k8s.io/applied created" in kubectl(
        binary, kubeconfig, "apply", "-f", str(manifest)
    )
    body["metadata"]["labels"]["stage"] = "two"
    manifest.write_text(json.dumps(body))
    assert "configured" in kubectl(binary, kubeconfig, "apply", "-f", str(manifest))
    applied = api.custom.get_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", "applied"
    )
    assert applied["metadata"]["labels"]["stage"] == "two"
    assert "kubectl.kubernetes.io/last-applied-configuration" in applied["metadata"]["annotations"]
    manifest.write_text(json.dumps(jobset("1-bad-name")))
    refused = subprocess.run(
        [binary, "--kubeconfig", str(kubeconfig), "apply", "-f", str(manifest)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0 and "is invalid" in refused.stderr
