"""The process runtime: a pod's containers as local processes, each in its own process group,
output appended to a log file per container; the environment and argv the kubelet gives them
(`podenv.py`: env, the JobSet hostname rewrite to local ports, TPU chips), signals to the whole
process tree, and the log files the API server's pods/log reads.

What every runtime shares lives here too (the pod's environment, the log files, waiting on the
process that stands for a container): the podman runtime (`podman.py`) is this class with its own
`plan` (a `podman run` of the image instead of the command), `launch` (the container's ID) and
`signal` (`podman kill`).

In outside mode (`access`: docs/embedded.md "Outside mode") a pod also gets what a real node gives
it: the Service variables (`podenv.service_env`: KUBERNETES_SERVICE_HOST/PORT), its projected
volumes (`volumes.py`: the service-account token, ca.crt, namespace), and a mount namespace of its
own (`podns.py`) in which they are where its `volumeMounts` say and /etc/hosts is the cluster's
DNS (`dns.py`). Called by `kubelet.Kubelet` through `runtimes.ContainerRuntime`, which
owns the pod lifecycle (when to start, restart, signal, and what status to write); this module
does no API writes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from launcher.embedded.kubelet import podenv, volumes
from launcher.embedded.kubelet.podrun import PodRun
from launcher.embedded.kubelet.volumes import PodAccess
from launcher.embedded.nodes import devices_per_chip
from launcher.embedded.types import objects
from launcher.embedded.types.resources import RESOURCES

SHM = Path("/dev/shm")  # the host's tmpfs: where a pod's `medium: Memory` emptyDirs are made


class ProcessRunner:
    """Starts and signals the processes of `PodRun`s and keeps their log files."""

    scheme = "process"  # containerID's `<type>://`

    def __init__(self, store: Any, log_dir: Path, cwd: Path, access: PodAccess | None = None) -> None:
        self.store = store
        self.access = access
        self.jobsets = RESOURCES["jobsets"]
        self.configmaps = RESOURCES["configmaps"]
        self.services = RESOURCES["services"]
        self.log_dir = log_dir
        self.cwd = cwd
        self.ports = podenv.PortMap()
        self.addresses = podenv.AddressMap()
        self._logs: dict[tuple[str, str], dict[str, Path]] = {}
        self._shm: dict[tuple[str, str], Path] = {}  # pod → its Memory emptyDirs' folder

    # -- logs ----------------------------------------------------------------------------------
    def log_path(self, namespace: str, name: str, container: str) -> Path | None:
        logs = self._logs.get((namespace, name))
        if logs and container in logs:
            return logs[container]
        # Not started by this process (an earlier run of a cluster with a state dir): look on disk.
        hits = sorted(self.log_dir.glob(f"{namespace}_{name}_*/{container}.log"))
        return hits[-1] if hits else None

    def forget(self, namespace: str, name: str) -> None:
        """The pod left the API: its logs are no longer served from memory, and its Memory
        emptyDirs go (RAM, as the kubelet unmounts a pod's tmpfs)."""
        self._logs.pop((namespace, name), None)
        shm = self._shm.pop((namespace, name), None)
        if shm is not None:
            shutil.rmtree(shm, ignore_errors=True)

    def memory_volume(self, run: PodRun, volume: str) -> Path:
        """The host folder of the pod's `medium: Memory` emptyDir `volume`, on the host's /dev/shm
        tmpfs; it goes with the pod (`forget`)."""
        base = self._shm.setdefault((run.namespace, run.name), SHM / f"reslice-{run.uid}")
        path = base / volume
        path.mkdir(parents=True, exist_ok=True)
        return path

    def stop(self) -> None:
        """The kubelet stops, its runs ended: nothing of the runtime's outlives them."""
        for key in list(self._shm):
            self.forget(*key)

    def log_stream(
        self,
        namespace: str,
        name: str,
        container: str,
        follow: bool,
        run_of: Callable[[str, str], PodRun | None],
    ) -> Iterator[bytes]:
        """The file so far, and with follow, what is appended until the container exits
        (`run_of(namespace, name)`: the pod's run, None when it runs no more)."""
        path = self.log_path(namespace, name, container)
        if path is None or not path.exists():
            return
        with open(path, "rb") as f:
            while True:
                data = f.read(65536)
                if data:
                    yield data
                    continue
                if not follow:
                    return
                run = run_of(namespace, name)
                if run is None or run.done.is_set():
                    rest = f.read()
                    if rest:
                        yield rest
                    return
                time.sleep(0.1)

    # -- starting ------------------------------------------------------------------------------
    def _jobset_rewrite(self, pod: Mapping[str, Any]) -> tuple[Callable[[str], str] | None, str]:
        """The rewrite of the JobSet's pod hostnames, and the pod's own address (podIP)."""
        js_name = objects.labels(pod).get(objects.JOBSET_NAME)
        if not js_name:
            return None, podenv.LOOPBACK
        try:
            js = self.store.get(self.jobsets, objects.meta(pod).get("namespace"), js_name)
        except Exception:
            return None, podenv.LOOPBACK
        pattern = podenv.hostname_pattern(js)
        uid, attempt = objects.meta(js)["uid"], objects.labels(pod).get(objects.RESTART_ATTEMPT, "0")

        def address(host: str) -> str:
            return self.addresses.get(uid, attempt, host)

        def rewrite(v: str) -> str:
            return podenv.rewrite_hosts(v, pattern, lambda port: self.ports.get(uid, attempt, port), address)

        own = (pod.get("spec") or {}).get("hostname")
        return rewrite, address(own) if own else podenv.LOOPBACK

    def _configmap(self, ns: str, name: str) -> dict[str, Any] | None:
        try:
            return self.store.get(self.configmaps, ns, name)
        except Exception:
            return None

    def spawn(self, run: PodRun, pod: dict[str, Any], node: dict[str, Any]) -> None:
        """Start every container of the pod; raises podenv.ContainerConfigError (CreateContainerConfigError)
        before starting any when one cannot be configured."""
        spec = pod.get("spec") or {}
        rewrite, run.pod_ip = self._jobset_rewrite(pod)
        chips = objects.pod_tpu_request(pod)
        dpc = devices_per_chip(objects.labels(node).get(objects.ACCELERATOR_LABEL))
        hostname = run.node if spec.get("hostNetwork") else (spec.get("hostname") or run.name)
        d = self.pod_dir(run)
        d.mkdir(parents=True, exist_ok=True)
        services, mounted = self._node_gives(run, pod, d)
        plans = {}
        for c in spec.get("containers") or []:
            pod_env = podenv.container_env(pod, c, node, self._configmap, run.pod_ip, services)
            env = podenv.local_env(pod_env, self.base_env(), chips, dpc, hostname, rewrite)
            plan = self.plan(run, pod, c, env, {k: env[k] for k in pod_env}, hostname)
            plans[c["name"]] = self._in_namespace(plan, c, mounted, d) if self.access else plan
        for cname, plan in plans.items():
            run.plans[cname] = plan
            run.logs[cname] = d / f"{cname}.log"
            self.launch(run, cname)
        self._logs[(run.namespace, run.name)] = dict(run.logs)

    def _node_gives(
        self, run: PodRun, pod: dict[str, Any], d: Path
    ) -> tuple[dict[str, str], dict[str, Path]]:
        """Outside mode: the Service variables, the projected volumes (volume name -> host folder),
        and the pod's names in the cluster's DNS; nothing otherwise (the embedded cluster's own)."""
        if self.access is None:
            return {}, {}
        spec = pod.get("spec") or {}
        ns = objects.meta(pod).get("namespace") or "default"
        listed = self.store.list(self.services, ns)[0]
        if ns != "default":
            listed += self.store.list(self.services, "default")[0]
        services = podenv.service_env(listed, ns, spec.get("enableServiceLinks", True) is not False)
        mounted = volumes.project(run, pod, d / "volumes", self.access, self._configmap)
        if spec.get("hostname") and spec.get("subdomain"):
            self.access.dns.add(spec["hostname"], spec["subdomain"], ns, run.pod_ip)
        return services, mounted

    def _in_namespace(
        self,
        plan: tuple[list[str], dict[str, str], str],
        container: Mapping[str, Any],
        mounted: Mapping[str, Path],
        d: Path,
    ) -> tuple[list[str], dict[str, str], str]:
        """The container's process started through podns.py: its mounts and the cluster's DNS."""
        assert self.access is not None
        args, env, cwd = plan
        wrapper = [
            sys.executable,
            "-m",
            "launcher.embedded.kubelet.podns",
            "--hosts",
            str(self.access.dns.path),
        ]
        for m in container.get("volumeMounts") or []:
            if m.get("name") in mounted:
                wrapper += ["--mount", f"{mounted[m['name']]}:{m['mountPath']}"]
        wrapper += ["--scratch", str(d / f"ns-{container['name']}"), "--"]
        return [*wrapper, *args], env, cwd

    def pod_dir(self, run: PodRun) -> Path:
        """The pod's own folder: its containers' logs (and the podman runtime's emptyDir volumes)."""
        return self.log_dir / f"{run.namespace}_{run.name}_{run.uid}"

    def base_env(self) -> Mapping[str, str]:
        """What a container's environment starts from: a local process inherits the kubelet's."""
        return os.environ

    def plan(
        self,
        run: PodRun,
        pod: Mapping[str, Any],
        container: Mapping[str, Any],
        env: dict[str, str],
        pod_env: Mapping[str, str],
        hostname: str,
    ) -> tuple[list[str], dict[str, str], str]:
        """The argv, environment and working directory of one container's process; `pod_env` (the
        variables the pod spec defines) expands the command's $(VAR)s."""
        args = podenv.argv(container, pod_env)
        if not args:
            raise podenv.ContainerConfigError(
                f"container {container['name']} has no command (no image to take it from)"
            )
        if args[0] in ("python", "python3"):
            args[0] = sys.executable  # no image here: the kubelet's own interpreter
        wd = container.get("workingDir")
        env = {**env, **self._memory_paths(run, pod, container, pod_env)}
        return args, env, wd if wd and Path(wd).is_dir() else str(self.cwd)

    def _memory_paths(
        self, run: PodRun, pod: Mapping[str, Any], container: Mapping[str, Any], pod_env: Mapping[str, str]
    ) -> dict[str, str]:
        """A local process has no mounts of its own: each variable of the pod that names a path in
        one of the container's `medium: Memory` emptyDir mounts (the trainer's RESLICE_MEMORY_ROOT,
        /dev/shm) names the same path in the volume's host folder instead, so that what the
        process keeps there goes with the pod, as a tmpfs mount's content does."""
        volumes = {v["name"]: v for v in (pod.get("spec") or {}).get("volumes") or []}
        mounts = {}
        for m in container.get("volumeMounts") or []:
            vol = volumes.get(m["name"]) or {}
            if "emptyDir" in vol and (vol["emptyDir"] or {}).get("medium") == "Memory":
                mounts[m["mountPath"].rstrip("/")] = self.memory_volume(run, m["name"])
        out = {}
        for k, value in pod_env.items():
            for at, host in mounts.items():
                if value == at or value.startswith(at + "/"):
                    out[k] = str(host) + value[len(at) :]
        return out

    def launch(self, run: PodRun, cname: str) -> None:
        """(Re)start one container from its plan."""
        args, env, cwd = run.plans[cname]
        with open(run.logs[cname], "ab") as out:  # a restarted container appends, as its log does
            run.procs[cname] = subprocess.Popen(
                args,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: signals reach the whole tree
            )
        run.ids[cname] = f"{self.scheme}://{run.procs[cname].pid}"

    @staticmethod
    def watch(run: PodRun, cname: str, on_exit: Callable[[PodRun, str, int], None]) -> None:
        """Call `on_exit(run, cname, returncode)` from a thread once the container's process ends."""
        proc = run.procs[cname]
        threading.Thread(
            target=lambda: on_exit(run, cname, proc.wait()), daemon=True, name=f"wait-{run.name}"
        ).start()

    def signal(self, run: PodRun, sig: int) -> None:
        """Signal the process group of every container still running."""
        for proc in run.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
