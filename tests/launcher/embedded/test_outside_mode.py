"""The embedded cluster in outside mode (docs/embedded.md "Outside mode"), through the official
client over HTTPS: it answers as an ordinary server; the admin's kubeconfig may do everything; a
service account's token is checked as kube-apiserver checks it (its signature, time, audience, and
that its ServiceAccount and pod are still the ones it names: else 401) and RBAC allows what the
stored Roles and bindings say (else 403, in upstream's words); a process pod gets what a node gives
it: the `kubernetes` Service's variables, its projected token volume at the service-account path,
and the cluster's DNS for JobSet pods.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from launcher.adapters.kube import Kube, is_embedded
from launcher.core.errors import UserError
from launcher.core.labels import REPLICATED_JOB
from launcher.embedded.admission.serviceaccount import MOUNT_PATH, TOKEN_EXPIRATION_S
from launcher.embedded.auth.authn import TokenIssuer
from launcher.embedded.auth.pki import Pki
from launcher.embedded.cluster import EmbeddedCluster
from launcher.embedded.kubelet import podenv, volumes
from launcher.embedded.kubelet.dns import ClusterDns
from launcher.embedded.kubelet.podrun import PodRun
from tests.launcher.embedded.cluster_helpers import GROUP, VERSION, rendered
from tests.support.wait import wait_for

NS = "default"


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedCluster]:
    try:
        c = EmbeddedCluster("tpu7x-2x2x1:1", mode="process", outside=True).start()
    except UserError as e:  # a machine without unprivileged user namespaces
        pytest.skip(str(e))
    try:
        c.settle()
        yield c
    finally:
        c.stop()


def pki(c: EmbeddedCluster) -> Pki:
    assert c.pki is not None
    return c.pki


def issuer(c: EmbeddedCluster, **kw: Any) -> TokenIssuer:
    return TokenIssuer(c.store, pki(c).signer(), **kw)


def as_token(c: EmbeddedCluster, token: str | None) -> client.ApiClient:
    """A client of the cluster that trusts its CA and sends `token` (None: nothing, anonymous)."""
    cfg = client.Configuration()
    cfg.host, cfg.ssl_ca_cert = c.url, str(pki(c).ca_file)
    if token is not None:
        cfg.api_key, cfg.api_key_prefix = {"authorization": token}, {"authorization": "Bearer"}
    return client.ApiClient(cfg)


def refused(call: Any, *args: Any, **kwargs: Any) -> tuple[int, str]:
    with pytest.raises(ApiException) as e:
        call(*args, **kwargs)
    return e.value.status, json.loads(e.value.body)["message"]


def unbound_pod(core: client.CoreV1Api, name: str, account: str) -> dict[str, Any]:
    """A pod no node takes (so it never runs, and a delete removes it at once), as stored."""
    body = {
        "metadata": {"name": name},
        "spec": {"serviceAccountName": account, "nodeSelector": {"nowhere": "x"},
                 "containers": [{"name": "c", "image": "example.com/x:1"}]},
    }  # fmt: skip
    return core.api_client.sanitize_for_serialization(core.create_namespaced_pod(NS, body))


def test_it_answers_as_an_ordinary_cluster_reached_by_its_kubeconfig(cluster: EmbeddedCluster) -> None:
    import yaml

    doc = yaml.safe_load(Path(str(cluster.kubeconfig)).read_text())
    server, user = doc["clusters"][0]["cluster"], doc["users"][0]["user"]
    assert server["server"].startswith("https://127.0.0.1:") and user["token"]
    assert base64.b64decode(server["certificate-authority-data"]) == pki(cluster).ca_pem
    api = cluster.api_client()
    assert not is_embedded(api)  # so every `reslice` command takes GKE's path
    assert client.VersionApi(api).get_code().git_version == "v1.31.0"
    assert Kube(api).get("/embedded/v1/info") is None  # 404: what preflight asks the embedded cluster
    # The pods find the API server by the kubernetes Service, at this server's address.
    svc = client.CoreV1Api(api).read_namespaced_service("kubernetes", NS)
    assert (svc.spec.cluster_ip, svc.spec.ports[0].port) == ("127.0.0.1", cluster.server.port)
    # Nobody: the public information, and nothing else.
    anon = as_token(cluster, None)
    assert client.VersionApi(anon).get_code().git_version == "v1.31.0"
    assert refused(client.CoreV1Api(anon).list_namespaced_pod, NS) == (
        403, 'pods is forbidden: User "system:anonymous" cannot list resource "pods" in API group "" in the namespace "default"'
    )  # fmt: skip
    assert refused(client.CoreApi(anon).get_api_versions) == (
        403, 'forbidden: User "system:anonymous" cannot get path "/api/"'
    )  # fmt: skip


def test_a_service_accounts_token_and_what_its_role_allows(cluster: EmbeddedCluster) -> None:
    admin = client.CoreV1Api(cluster.api_client())
    rbac = client.RbacAuthorizationV1Api(cluster.api_client())
    admin.create_namespaced_service_account(NS, {"metadata": {"name": "reader"}})
    for name in ("w", "other"):
        admin.create_namespaced_config_map(NS, {"metadata": {"name": name}, "data": {"k": name}})
    rule = {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "resourceNames": ["w"],
        "verbs": ["get", "list", "watch"],
    }
    rbac.create_namespaced_role(NS, {"metadata": {"name": "reader"}, "rules": [rule]})
    subject = {"kind": "ServiceAccount", "name": "reader", "namespace": NS}
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role"}
    rbac.create_namespaced_role_binding(
        NS, {"metadata": {"name": "reader"}, "roleRef": {**ref, "name": "reader"}, "subjects": [subject]}
    )
    pod = unbound_pod(admin, "reader-pod", "reader")
    token = issuer(cluster).issue(NS, "reader", pod, 600)
    core = client.CoreV1Api(as_token(cluster, token))
    user = 'User "system:serviceaccount:default:reader"'

    assert core.read_namespaced_config_map("w", NS).data == {"k": "w"}
    # list and watch name it through the field selector, which resourceNames then allows.
    assert [
        c.metadata.name for c in core.list_namespaced_config_map(NS, field_selector="metadata.name=w").items
    ] == ["w"]
    stream = core.list_namespaced_config_map(
        NS, field_selector="metadata.name=w", watch=True, timeout_seconds=1, _preload_content=False
    )
    assert b'"ADDED"' in stream.read()
    assert refused(core.read_namespaced_config_map, "other", NS) == (
        403, f'configmaps "other" is forbidden: {user} cannot get resource "configmaps" in API group "" in the namespace "default"'
    )  # fmt: skip
    assert refused(core.list_namespaced_config_map, NS) == (
        403, f'configmaps is forbidden: {user} cannot list resource "configmaps" in API group "" in the namespace "default"'
    )  # fmt: skip
    status, message = refused(core.create_namespaced_config_map, NS, {"metadata": {"name": "new"}})
    assert status == 403 and f'{user} cannot create resource "configmaps"' in message
    status, message = refused(core.list_node)
    assert status == 403 and 'cannot list resource "nodes" in API group "" at the cluster scope' in message

    # A binding that names a Role that is not there: the refusal says so, as upstream's.
    rbac.create_namespaced_role_binding(
        NS, {"metadata": {"name": "dangling"}, "roleRef": {**ref, "name": "gone"}, "subjects": [subject]}
    )
    assert refused(core.read_namespaced_config_map, "other", NS)[1].endswith(
        ': RBAC: role.rbac.authorization.k8s.io "gone" not found'
    )
    # A ClusterRole bound to the group of every service account: nodes, cluster-wide.
    rbac.create_cluster_role(
        {
            "metadata": {"name": "nodes"},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}],
        }
    )
    rbac.create_cluster_role_binding({
        "metadata": {"name": "nodes"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "nodes"},
        "subjects": [{"kind": "Group", "name": "system:serviceaccounts", "apiGroup": "rbac.authorization.k8s.io"}],
    })  # fmt: skip
    assert core.list_node().items


def test_tokens_the_server_does_not_take_are_401(cluster: EmbeddedCluster) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    from launcher.embedded.auth.tokens import Signer

    admin = client.CoreV1Api(cluster.api_client())
    admin.create_namespaced_service_account(NS, {"metadata": {"name": "t"}})
    pod = unbound_pod(admin, "t-pod", "t")

    def answer(token: str) -> tuple[int, str]:
        """The API's status for a list of pods with `token`, and its message."""
        try:
            client.CoreV1Api(as_token(cluster, token)).list_namespaced_pod(NS)
        except ApiException as e:
            return e.status, json.loads(e.body)["message"]
        return 200, ""

    good = issuer(cluster).issue(NS, "t", pod, 600)
    assert answer(good)[0] == 403  # who it is, and not allowed to list pods
    # Expired more than the leeway (60 s) ago; not signed by this cluster; its payload changed.
    expired = issuer(cluster, clock=lambda: time.time() - 1000).issue(NS, "t", pod, 600)
    forged = TokenIssuer(cluster.store, Signer(ec.generate_private_key(ec.SECP256R1()))).issue(
        NS, "t", pod, 600
    )
    head, body, sig = good.split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=="))
    claims["sub"] = "system:serviceaccount:default:admin"
    tampered = ".".join(
        [head, base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode(), sig]
    )
    for bad in (expired, forged, tampered, "not-a-token"):
        assert answer(bad) == (401, "Unauthorized")
    # What the token is bound to goes: its pod, or its ServiceAccount (made anew: another UID).
    admin.delete_namespaced_pod("t-pod", NS)
    stale = issuer(cluster).issue(NS, "t", unbound_pod(admin, "t-pod2", "t"), 600)
    assert answer(stale)[0] == 403
    admin.delete_namespaced_service_account("t", NS)
    admin.create_namespaced_service_account(NS, {"metadata": {"name": "t"}})
    assert answer(good) == answer(stale) == (401, "Unauthorized")


DNS_SCRIPT = """
import json, os, socket
sa = "{mount}"
out = {{k: v for k, v in os.environ.items() if k.startswith("KUBERNETES_")}}
out["files"] = {{f: open(os.path.join(sa, f)).read() for f in ("token", "ca.crt", "namespace")}}
out["resolved"] = socket.gethostbyname("{host}")
print("RESULT " + json.dumps(out), flush=True)
"""


def test_a_process_pod_gets_what_a_node_gives_it(cluster: EmbeddedCluster) -> None:
    # The JobSet's pod, by the name its headless Service gives it: <jobset>-<rjob>-0-0.<jobset>.
    host = f"nodegives-0-{REPLICATED_JOB}-0-0.nodegives-0"
    js = rendered("nodegives", DNS_SCRIPT.format(mount=MOUNT_PATH, host=host), preset="tpu7x-2x2x1", slices=1)
    client.CustomObjectsApi(cluster.api_client()).create_namespaced_custom_object(
        GROUP, VERSION, NS, "jobsets", js
    )
    core = client.CoreV1Api(cluster.api_client())

    def result() -> tuple[Any, dict[str, Any]] | None:
        for p in core.list_namespaced_pod(
            NS, label_selector="jobset.sigs.k8s.io/jobset-name=nodegives-0"
        ).items:
            log = core.read_namespaced_pod_log(p.metadata.name, NS)
            for line in log.splitlines():
                if line.startswith("RESULT "):
                    return p, json.loads(line[len("RESULT ") :])
        return None

    pod, got = wait_for(result, 60, "the pod's report")
    port = str(cluster.server.port)
    assert got["KUBERNETES_SERVICE_HOST"] == "127.0.0.1" and got["KUBERNETES_SERVICE_PORT"] == port
    assert (
        got["KUBERNETES_SERVICE_PORT_HTTPS"] == port and got["KUBERNETES_PORT"] == f"tcp://127.0.0.1:{port}"
    )
    assert got[f"KUBERNETES_PORT_{port}_TCP_ADDR"] == "127.0.0.1"
    files = got["files"]
    assert files["namespace"] == NS and files["ca.crt"].encode() == pki(cluster).ca_pem
    claims = json.loads(base64.urlsafe_b64decode(files["token"].split(".")[1] + "=="))
    assert claims["kubernetes.io"]["pod"] == {"name": pod.metadata.name, "uid": pod.metadata.uid}
    assert claims["exp"] - claims["iat"] == TOKEN_EXPIRATION_S
    # The token the pod read authenticates as its ServiceAccount (which no Role lets read configmaps).
    status, message = refused(
        client.CoreV1Api(as_token(cluster, files["token"])).read_namespaced_config_map, "w", NS
    )
    assert status == 403 and 'User "system:serviceaccount:default:default" cannot get' in message
    # Its own JobSet name resolves, to its own address (what kube-dns answers on GKE).
    assert got["resolved"] == pod.status.pod_ip and pod.status.pod_ip.startswith("127.")


def test_service_variables_as_the_kubelet_makes_them() -> None:
    def svc(ns: str, name: str, ip: str, *ports: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"namespace": ns, "name": name}, "spec": {"clusterIP": ip, "ports": list(ports)}}

    services = [
        svc("default", "kubernetes", "10.0.0.1", {"name": "https", "port": 443, "protocol": "TCP"}),
        svc(
            "team", "my-db", "10.0.0.7", {"port": 5432}, {"name": "metrics", "port": 9100, "protocol": "UDP"}
        ),
        svc("team", "headless", "None", {"port": 80}),
        svc("other", "elsewhere", "10.0.0.9", {"port": 80}),
    ]
    env = podenv.service_env(services, "team", links=True)
    assert env["KUBERNETES_SERVICE_HOST"] == "10.0.0.1" and env["KUBERNETES_PORT_443_TCP_PROTO"] == "tcp"
    assert env["MY_DB_SERVICE_PORT"] == "5432" and env["MY_DB_SERVICE_PORT_METRICS"] == "9100"
    assert env["MY_DB_PORT"] == "tcp://10.0.0.7:5432" and env["MY_DB_PORT_9100_UDP"] == "udp://10.0.0.7:9100"
    assert not any(k.startswith(("HEADLESS_", "ELSEWHERE_")) for k in env)
    # enableServiceLinks: false keeps only the API server's.
    assert {k.split("_")[0] for k in podenv.service_env(services, "team", links=False)} == {"KUBERNETES"}
    # A container's own variable wins, and $(VAR) may name a Service's.
    pod = {"metadata": {"namespace": "team"}}
    container = {
        "env": [
            {"name": "KUBERNETES_SERVICE_PORT", "value": "1"},
            {"name": "URL", "value": "db:$(MY_DB_SERVICE_PORT)"},
        ]
    }
    got = podenv.container_env(pod, container, {}, lambda *_: None, services=env)
    assert (got["KUBERNETES_SERVICE_PORT"], got["URL"], got["KUBERNETES_SERVICE_HOST"]) == (
        "1",
        "db:5432",
        "10.0.0.1",
    )


def test_a_projected_token_is_refreshed_at_four_fifths_of_its_life(tmp_path: Path) -> None:
    issued: list[int] = []
    lock = threading.Lock()

    def issue(ns: str, account: str, pod: Any, expiration: int) -> str:
        with lock:
            issued.append(expiration)
            return f"token-{len(issued)}"

    volume = {
        "name": "v",
        "projected": {"sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 1}}]},
    }
    pod = {"metadata": {"name": "p", "namespace": NS, "uid": "u"}, "spec": {"volumes": [volume]}}
    run = PodRun("u", NS, "p", "node", False)
    access = volumes.PodAccess(issue=issue, dns=ClusterDns(tmp_path / "hosts"))
    made = volumes.project(run, pod, tmp_path, access, lambda *_: None)
    token = made["v"] / "token"
    assert token.read_text() == "token-1"
    wait_for(lambda: token.read_text() == "token-2", 5, "the refreshed token")
    run.done.set()  # the pod ended: no more refreshes
    time.sleep(1.2)
    assert token.read_text() in ("token-2", "token-3") and len(issued) <= 3


def test_outside_mode_says_in_one_line_what_it_cannot_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pods as processes only; and where this machine cannot give a process pod its own mounts
    (no unprivileged user namespaces), it refuses to start instead of running pods without them."""
    with pytest.raises(UserError, match="outside mode runs its pods as processes"):
        EmbeddedCluster("tpu7x-2x2x1:1", outside=True, runtime="podman")
    from launcher.embedded.kubelet import podns

    monkeypatch.setattr(podns, "check", lambda: "unshare(CLONE_NEWUSER|CLONE_NEWNS): Operation not permitted")
    with pytest.raises(UserError, match="cannot give process pods their own mounts here: unshare"):
        EmbeddedCluster("tpu7x-2x2x1:1", outside=True).start()
    EmbeddedCluster("tpu7x-2x2x1:1", mode="simulate", outside=True).start().stop()  # no process: no need
