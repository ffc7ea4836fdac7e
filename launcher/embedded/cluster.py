"""EmbeddedCluster: the store, the API server and the cluster's components, wired and started.

    with EmbeddedCluster(nodepools=[NodePoolSpec("tpu7x-2x2x2", count=2)]) as cluster:
        client = cluster.api_client()          # the official kubernetes client, over HTTP
        cluster.preempt("tpu7x-2x2x2-np-0", grace_s=5)

Components (each its own thread, all reacting to store events): the JobSet controller, the Job
controller, the scheduler and the kubelet of every node. Faults and test helpers are methods here;
`reslice cluster ...` reaches a cluster running in another process through the extra HTTP routes
under /embedded/v1/ (see `handle_route`). Started by `python -m launcher.embedded` (what
`reslice cluster up` runs, and `reslice launch`/`sweep` when no cluster is configured:
`launcher/cli/connect.py`), by `reslice demo` (`launcher/cli/demo.py`) and by the tests.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.core.errors import UserError
from launcher.core.words import PodRuntime
from launcher.embedded import faults, nodes
from launcher.embedded.admission.defaults import DEFAULT_TOLERATION_S
from launcher.embedded.api.apiserver import Security
from launcher.embedded.api.kubeconfig import Credentials
from launcher.embedded.controllers.job import JobController
from launcher.embedded.controllers.jobset import EMULATED_VERSION, JobSetController, installed_deployment
from launcher.embedded.controllers.nodelife import NODE_MONITOR_GRACE_S, NodeLifecycle
from launcher.embedded.controllers.runtime import EventRecorder, Hub
from launcher.embedded.controllers.scheduler import Scheduler
from launcher.embedded.controllers.serviceaccounts import NamespaceAccess
from launcher.embedded.kubelet import podns
from launcher.embedded.kubelet.dns import ClusterDns
from launcher.embedded.kubelet.kubelet import Kubelet
from launcher.embedded.kubelet.podman import podman_unavailable
from launcher.embedded.kubelet.volumes import PodAccess
from launcher.embedded.nodes import FakeNodePool, NodePoolSpec
from launcher.embedded.types import objects
from launcher.embedded.types.errors import ApiError

if TYPE_CHECKING:
    from launcher.embedded.auth.pki import Pki

__all__ = ["EmbeddedCluster", "NodePoolSpec", "runtime_unavailable"]

# Two slices of the smallest multi-host tpu7x preset: GKE runs multislice only on multi-host slice
# node pools, so this is the smallest cluster a 2-slice run (and losing one slice of it) fits.
DEFAULT_NODEPOOLS = "tpu7x-2x2x2:2"
ROUTE = "/embedded/v1/"


class EmbeddedCluster:
    def __init__(
        self,
        nodepools: list[NodePoolSpec] | tuple[NodePoolSpec, ...] | str | None = None,
        mode: str = "process",
        state_dir: Path | str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        sim_duration_s: float | None = None,
        sim_term_exit_code: int = 143,
        workdir: Path | None = None,
        node_monitor_grace_s: float = NODE_MONITOR_GRACE_S,
        default_toleration_s: int = DEFAULT_TOLERATION_S,
        runtime: str = PodRuntime.PROCESS,
        shared: tuple[Path, ...] | list[Path] = (),
        log_dir: Path | None = None,
        outside: bool = False,
    ) -> None:
        """`runtime`: how the kubelet runs the pods of non-simulated node pools (PodRuntime);
        `shared`: host folders the podman runtime mounts into every container at their own paths
        (where local run directories are); `log_dir`: where the pods' logs are written and left
        after `stop` (a test's own folder, to read after a failure), else in the cluster's
        folder; `outside`: serve as an ordinary cluster would (docs/embedded.md "Outside mode"),
        so that `reslice` takes the path it takes on GKE."""
        if mode not in ("process", "simulate"):
            raise UserError(f"mode must be 'process' or 'simulate', got {mode!r}")
        if runtime not in tuple(PodRuntime):
            raise UserError(f"runtime must be {' or '.join(PodRuntime)}, got {runtime!r}")
        if outside and runtime != PodRuntime.PROCESS:
            raise UserError("outside mode runs its pods as processes: --runtime process")
        nodepools = nodepools or DEFAULT_NODEPOOLS
        specs = nodes.parse_nodepools(nodepools) if isinstance(nodepools, str) else list(nodepools)
        self.mode = mode
        self.runtime = PodRuntime(runtime)
        self.shared = tuple(Path(p) for p in shared)
        self.pools: dict[str, FakeNodePool] = {
            p.name: p for p in nodes.expand_pools(specs, mode == "simulate")
        }
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self.host, self.port = host, port
        self.sim_duration_s = sim_duration_s
        self.sim_term_exit_code = sim_term_exit_code
        self.workdir = workdir
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.outside = outside
        self.node_monitor_grace_s = node_monitor_grace_s
        self.default_toleration_s = default_toleration_s
        self._tmp: str | None = None
        self._gone: set[str] = set()
        self._node_pool: dict[str, str] = {n: p.name for p in self.pools.values() for n in p.node_names}
        self.store: Any = None
        self.server: Any = None
        self.kubeconfig: Path | None = None
        # Outside mode's (start): the cluster's keys, what the server requires, the admin's credentials.
        self.pki: Pki | None = None
        self._security: Security | None = None
        self.credentials: Credentials | None = None
        self._components: list[Any] = []
        self._started = False

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> EmbeddedCluster:
        from launcher.embedded.api import discovery, kubeconfig
        from launcher.embedded.api.apiserver import ApiServer
        from launcher.embedded.store.store import RESOURCES, Store

        self.res = RESOURCES
        if self.outside and any(not p.simulate for p in self.pools.values()) and (why := podns.check()):
            raise UserError(f"outside mode cannot give process pods their own mounts here: {why}")
        if self.state_dir is not None:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            base = self.state_dir
            self._load_gone()
        else:
            self._tmp = tempfile.mkdtemp(prefix="reslice-cluster-")
            base = Path(self._tmp)
        self.store = Store(base / "store" if self.state_dir is not None else None)
        self.store.default_toleration_s = self.default_toleration_s
        access = self._outside(base) if self.outside else None
        version = discovery.ORDINARY_VERSION if self.outside else discovery.KUBE_VERSION
        self.server = ApiServer(
            self.store, host=self.host, port=self.port, version=version, security=self._security
        )
        self.node_events = EventRecorder(self.store, "node-controller")
        self.hub = Hub(self.store)
        self.jobsets = JobSetController(self.store, self.hub)
        self.jobs = JobController(self.store, self.hub)
        self.scheduler = Scheduler(self.store, self.hub)
        self.kubelet = Kubelet(
            self.store,
            self.log_dir or base / "logs",
            simulated=self._simulated,
            sim_duration_s=self.sim_duration_s,
            sim_term_exit_code=self.sim_term_exit_code,
            cwd=self.workdir,
            events=self.hub,
            runtime=self.runtime,
            shared=self.shared,
            access=access,
        )
        self.nodelife = NodeLifecycle(self.store, self.hub, self.node_monitor_grace_s)
        self._components = [self.kubelet, self.nodelife, self.scheduler, self.jobs, self.jobsets]
        if self.pki is not None:
            self._components.append(NamespaceAccess(self.store, self.pki.ca_pem, self.hub))
        self._create_nodes()
        if self.outside:
            self._install_jobset()
        for c in self._components:
            c.start()
        self.server.add_route("POST", ROUTE, self.handle_route)
        if not self.outside:  # what tells a client it talks to the embedded cluster (reslice preflight)
            self.server.add_route("GET", ROUTE, self.handle_route)
        self.server.set_log_source(self.kubelet.log_stream)
        self.server.start()
        if self.outside:
            self._publish_service()
        self.kubeconfig = kubeconfig.write_kubeconfig(
            base / "kubeconfig", self.url, credentials=self.credentials
        )
        self._started = True
        return self

    def _outside(self, base: Path) -> PodAccess:
        """Outside mode's parts: the PKI, who may do what at the API, the ServiceAccount token
        volume on created pods, and what the kubelet gives process pods (tokens, DNS, mounts)."""
        # Imported here: the keys and tokens need the cryptography package, the embedded mode does not.
        from launcher.embedded.auth import pki
        from launcher.embedded.auth.authn import Authenticator, TokenIssuer
        from launcher.embedded.auth.rbac import Authorizer

        self.pki = pki.load_or_make(base / "pki")
        signer = self.pki.signer()
        self._security = Security(
            self.pki.server_context(),
            Authenticator(self.store, signer, self.pki.admin_token),
            Authorizer(self.store),
        )
        self.credentials = Credentials(self.pki.ca_file, self.pki.admin_token)
        self.store.service_account_tokens = True
        return PodAccess(issue=TokenIssuer(self.store, signer).issue, dns=ClusterDns(base / "hosts"))

    def _publish_service(self) -> None:
        """The `kubernetes` Service in `default`, which pods find the API server by
        (KUBERNETES_SERVICE_HOST/PORT): kube-apiserver keeps it pointing at itself. Its cluster IP
        is the address this machine's pods reach the server at (no kube-proxy here)."""
        port = self.server.port
        spec = {
            "type": "ClusterIP", "clusterIP": self.host, "clusterIPs": [self.host], "sessionAffinity": "None",
            "ports": [{"name": "https", "port": port, "protocol": "TCP", "targetPort": port}],
        }  # fmt: skip
        svc = {
            "metadata": {"name": "kubernetes", "labels": {"component": "apiserver", "provider": "kubernetes"}}
        }
        try:
            self.store.create(self.res["services"], {**svc, "spec": spec}, "default")
        except ApiError as e:
            if e.code != 409:
                raise
            current = self.store.get(self.res["services"], "default", "kubernetes")
            self.store.update(self.res["services"], {**current, "spec": {**current["spec"], **spec}})

    def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        for c in reversed(self._components):
            c.stop()
        self.hub.close()
        self.server.stop()
        self.store.close()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> EmbeddedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return self.server.url

    def api_client(self) -> Any:
        from launcher.embedded.api import kubeconfig

        return kubeconfig.api_client(self.url, self.credentials)

    def restart_apiserver(self, downtime_s: float = 0.5) -> None:
        """The API server goes away and comes back: watches end, old resourceVersions answer 410,
        the store reloads from its state dir when it has one. The components resync."""
        self.server.restart(downtime_s=downtime_s)
        for c in self._components:
            c.resync()

    # -- node pools ----------------------------------------------------------------------------
    def _simulated(self, node: str) -> bool:
        pool = self.pools.get(self._node_pool.get(node, ""))
        return pool.simulate if pool is not None else self.mode == "simulate"

    def _create_nodes(self) -> None:
        existing = {objects.meta(n)["name"] for n in self.store.list(self.res["nodes"])[0]}
        for pool in self.pools.values():
            if pool.name in self._gone:
                continue
            for i, name in enumerate(pool.node_names):
                if name not in existing:
                    self.store.create(self.res["nodes"], nodes.node_object(pool, i))

    def _install_jobset(self) -> None:
        """What a cluster with JobSet installed has and a client may read: its namespace and its
        controller's Deployment (`jobset.installed_deployment`)."""
        deployment, status = installed_deployment()
        meta = deployment["metadata"]
        with contextlib.suppress(ApiError):  # there already (a state dir's)
            self.store.create(self.res["namespaces"], {"metadata": {"name": meta["namespace"]}})
        with contextlib.suppress(ApiError):
            created = self.store.create(self.res["deployments"], deployment, meta["namespace"])
            self.store.update(self.res["deployments"], {**created, "status": status}, subresource="status")

    @property
    def node_pool_of(self) -> dict[str, str]:
        """Node name → its node pool, for every node the pools define (present or not)."""
        return self._node_pool

    def pool_name(self, name: str) -> str:
        """A node pool by name, or by a unique suffix ('np-0' when only one pool ends so)."""
        if name in self.pools:
            return name
        hits = [p for p in self.pools if p.endswith(name) or p.endswith("-" + name)]
        if len(hits) == 1:
            return hits[0]
        raise UserError(f"unknown node pool {name!r} (node pools: {', '.join(self.pools)})")

    def mark_gone(self, pool: str, gone: bool) -> None:
        (self._gone.add if gone else self._gone.discard)(pool)
        if self.state_dir is not None:
            (self.state_dir / "gone.json").write_text(json.dumps(sorted(self._gone)))

    def _load_gone(self) -> None:
        f = self.state_dir / "gone.json" if self.state_dir else None
        if f is not None and f.exists():
            self._gone = set(json.loads(f.read_text()))

    # -- faults --------------------------------------------------------------------------------
    def preempt(self, pool: str, grace_s: float = 15.0, wait: bool = True) -> dict[str, Any]:
        return faults.preempt(self, pool, grace_s, wait)

    def remove(self, pool: str) -> dict[str, Any]:
        return faults.remove(self, pool)

    def restore(self, pool: str) -> dict[str, Any]:
        return faults.restore(self, pool)

    def kill_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return faults.kill_pod(self, namespace, name)

    def crash_host(self, namespace: str, name: str, down_s: float = 0.0) -> dict[str, Any]:
        return faults.crash_host(self, namespace, name, down_s)

    def drain(self, node: str, timeout_s: float = 60.0, wait: bool = True) -> dict[str, Any]:
        return faults.drain(self, node, timeout_s, wait)

    def uncordon(self, node: str) -> dict[str, Any]:
        return faults.uncordon(self, node)

    def repair(self, node: str) -> dict[str, Any]:
        return faults.repair(self, node)

    def partition(self, node: str) -> dict[str, Any]:
        return faults.partition(self, node)

    def heal(self, node: str) -> dict[str, Any]:
        return faults.heal(self, node)

    # -- simulate mode and tests ---------------------------------------------------------------
    def sim_finish(
        self, label_selector: str | None = None, exit_code: int = 0, namespace: str | None = None
    ) -> int:
        """Simulated pods matching the selector (running ones) exit with `exit_code`; returns how many."""
        pods, _ = self.store.list(self.res["pods"], namespace=namespace, label_selector=label_selector)
        uids = {objects.meta(p)["uid"] for p in pods}
        n = 0
        for run in self.kubelet.runs():
            if run.uid in uids and run.simulate and not run.done.is_set():
                self.kubelet.finish_run(run, exit_code)
                n += 1
        return n

    def dump_stacks(self) -> int:
        """SIGUSR1 to the processes of every running pod that is not simulated (the trainer writes
        its threads' stacks to its log on it: trainer/__main__.py); how many pods were signalled."""
        n = 0
        for run in self.kubelet.runs():
            if not run.simulate and not run.done.is_set():
                self.kubelet.runtime.signal(run, signal.SIGUSR1)
                n += 1
        return n

    def idle(self) -> bool:
        return all(c.idle() for c in self._components)

    def settle(self, timeout: float = 30.0, quiet_s: float = 0.05) -> bool:
        """Wait until every component has caught up with every change (tests, benchmarks)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.store.flush(max(0.0, deadline - time.monotonic()))
            if self.idle():
                time.sleep(quiet_s)
                self.store.flush(1.0)
                if self.idle():
                    return True
            else:
                time.sleep(0.01)
        return False

    # -- the fault routes ----------------------------------------------------------------------
    def handle_route(self, method: str, path: str, query: dict, body: bytes | None) -> tuple[int, dict]:
        """POST /embedded/v1/{preempt,remove,restore,kill-pod,crash-host} with a JSON body, and
        /embedded/v1/{drain,uncordon,repair,partition,heal} with {"node": ...};
        GET /embedded/v1/info: mode, the JobSet release it emulates, node pools."""
        action = path[len(ROUTE) :].strip("/")
        try:
            args = json.loads(body or b"{}")
            if method == "GET" and action == "info":
                return 200, self.info()
            if method != "POST":
                return 405, _status(405, "MethodNotAllowed", f"{method} {path}")
            if action == "preempt":
                out = self.preempt(
                    args["nodepool"], float(args.get("grace_s", 15.0)), wait=bool(args.get("wait", False))
                )
            elif action == "remove":
                out = self.remove(args["nodepool"])
            elif action == "restore":
                out = self.restore(args["nodepool"])
            elif action == "kill-pod":
                out = self.kill_pod(args.get("namespace") or "default", args["pod"])
            elif action == "crash-host":
                out = self.crash_host(
                    args.get("namespace") or "default", args["pod"], float(args.get("down_s", 0.0))
                )
            elif action == "drain":
                out = self.drain(
                    args["node"], float(args.get("timeout_s", 60.0)), bool(args.get("wait", True))
                )
            elif action in ("uncordon", "repair", "partition", "heal"):
                out = getattr(self, action)(args["node"])
            else:
                return 404, _status(404, "NotFound", f"no fault {action!r}")
            return 200, out
        except UserError as e:
            return 400, _status(400, "BadRequest", str(e))
        except (KeyError, ValueError) as e:
            return 400, _status(400, "BadRequest", f"bad request: {e}")

    def info(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "runtime": str(self.runtime),
            "jobset_version": EMULATED_VERSION,
            "nodepools": [
                {
                    "name": p.name,
                    "preset": p.shape.name,
                    "hosts": p.shape.hosts,
                    "spot": p.spot,
                    "simulate": p.simulate,
                    "gone": p.name in self._gone,
                }
                for p in self.pools.values()
            ],
        }


def runtime_unavailable(runtime: str, image: str) -> str | None:
    """Why the kubelet cannot run `image` with `runtime` here, in one line; None when it can (the
    process runtime runs no image)."""
    return podman_unavailable(image) if runtime == PodRuntime.PODMAN else None


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": reason,
        "message": message,
        "code": code,
    }
