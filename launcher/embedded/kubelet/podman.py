"""The podman runtime: a pod's container runs as `podman run` of its image, attached, so that the
client's output is the container's log (the same file the process runtime writes and pods/log
reads) and its exit status the container's exit code.

What it gives the container (docs/embedded.md "Runtimes"):
- the image's entrypoint, or the pod's `command` in its place and `args` after it, as Kubernetes
  composes them with an image's ENTRYPOINT/CMD; $(VAR)s expanded by the kubelet;
- the pod's environment (downward API included) and the kubelet's own settings of a simulated host
  (`podenv.local_env` over an empty base: nothing of the kubelet's environment leaks in but JAX's
  compile-cache settings, whose directory is mounted at its own path);
- the host's network (`--network host`): the pod's address and the JobSet hostname rewrite to local
  ports are the process runtime's, so the trainers of a multi-host slice meet as they do there;
- volumes: `emptyDir` (a folder of the pod's; `medium: Memory` a folder on the host's /dev/shm
  tmpfs, as the kubelet mounts a tmpfs), `hostPath`; and the cluster's shared folders (a local run
  directory) bind-mounted at their own paths, where the controller and `reslice status` read them;
- SIGTERM and SIGKILL with `podman kill` (to the container's PID 1, as the kubelet's runtime
  signals it); the container is removed when it exits (`--rm`), and restarted in place as a new one.

The pod's status carries the image as containerd's CRI reports it (pkg/cri/server/container_status.go):
`image` the image's tag, `imageID` its repo digest (`localhost/reslice-trainer@sha256:...`), else
the image ID.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from launcher.embedded.kubelet import podenv
from launcher.embedded.kubelet.podrun import PodRun
from launcher.embedded.kubelet.processes import ProcessRunner

# The kubelet's settings that a container takes from its environment: JAX's persistent compile
# cache (its directory mounted), so that a shape compiled once loads in every later container.
PASSED_ENV = (
    "JAX_COMPILATION_CACHE_DIR",
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES",
)
CREATE_S = 120.0  # how long `podman run` may take to create the container before it counts as failed


class PodmanRunner(ProcessRunner):
    """Runs each container of a `PodRun` as an attached `podman run` of the container's image."""

    scheme = "podman"

    def __init__(self, store: Any, log_dir: Path, cwd: Path, shared: Sequence[Path] = ()) -> None:
        super().__init__(store, log_dir, cwd)
        self.shared = tuple(Path(p).resolve() for p in shared)

    # -- the container -------------------------------------------------------------------------
    def base_env(self) -> Mapping[str, str]:
        return {k: os.environ[k] for k in PASSED_ENV if k in os.environ}

    def plan(
        self,
        run: PodRun,
        pod: Mapping[str, Any],
        container: Mapping[str, Any],
        env: dict[str, str],
        pod_env: Mapping[str, str],
        hostname: str,
    ) -> tuple[list[str], dict[str, str], str]:
        cname, image = container["name"], container.get("image") or ""
        run.images[cname] = image_ref(image, container.get("imagePullPolicy") or "IfNotPresent")
        command, args = podenv.command_args(container, pod_env)
        name = f"k8s_{cname}_{run.name}_{run.namespace}_{run.uid[:8]}"
        cidfile = self.pod_dir(run) / f"{cname}.cid"
        # --replace: a container restarted in place takes the name while its predecessor, ended,
        # may still be being removed.
        argv = ["podman", "run", "--rm", "--replace", "--name", name, "--cidfile", str(cidfile)]
        argv += ["--network", "host", "--hostname", hostname, "--pull", "never", "--sig-proxy=false"]
        # The pod's hostname resolves to its address, as the kubelet's /etc/hosts says (Gloo, JAX's
        # CPU collectives, binds to what the hostname resolves to).
        argv += ["--add-host", f"{hostname}:{run.pod_ip}"]
        argv += ["--label", f"io.kubernetes.pod.uid={run.uid}"]
        if command:
            # Kubernetes: a command replaces the image's ENTRYPOINT and drops its CMD.
            argv += ["--entrypoint", json.dumps(command)]
        if container.get("workingDir"):
            argv += ["--workdir", container["workingDir"]]
        argv += _user(pod, container)
        for k, v in env.items():
            argv += ["--env", f"{k}={v}"]
        argv += self._mounts(run, pod, container)
        cache = self.base_env().get("JAX_COMPILATION_CACHE_DIR")
        if cache and env.get("JAX_COMPILATION_CACHE_DIR") == cache and Path(cache).is_absolute():
            Path(cache).mkdir(parents=True, exist_ok=True)
            argv += ["--volume", f"{cache}:{cache}"]
        return [*argv, image, *args], dict(os.environ), str(self.cwd)

    def _mounts(self, run: PodRun, pod: Mapping[str, Any], container: Mapping[str, Any]) -> list[str]:
        volumes = {v["name"]: v for v in (pod.get("spec") or {}).get("volumes") or []}
        out: list[str] = []
        for d in self.shared:
            out += ["--volume", f"{d}:{d}"]
        for m in container.get("volumeMounts") or []:
            vol = volumes.get(m["name"])
            if vol is None:
                raise podenv.ContainerConfigError(f'volume "{m["name"]}" not found in the pod')
            source = self._volume_source(run, vol) / (m.get("subPath") or "")
            mode = ":ro" if m.get("readOnly") else ""
            out += ["--volume", f"{source}:{m['mountPath']}{mode}"]
        return out

    def _volume_source(self, run: PodRun, vol: Mapping[str, Any]) -> Path:
        """The host folder (or file) a volume is: made as the kubelet makes it."""
        if "emptyDir" in vol:
            if (vol["emptyDir"] or {}).get("medium") == "Memory":
                return self.memory_volume(run, vol["name"])
            path = self.pod_dir(run) / "volumes" / vol["name"]
            path.mkdir(parents=True, exist_ok=True)
            return path
        if "hostPath" in vol:
            path, kind = Path(vol["hostPath"]["path"]), vol["hostPath"].get("type") or ""
            if kind == "DirectoryOrCreate":
                path.mkdir(parents=True, exist_ok=True)
            elif kind == "FileOrCreate":
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
            elif kind and not path.exists():
                raise podenv.ContainerConfigError(f"hostPath type check failed: {path} is not a {kind}")
            return path
        kinds = sorted(k for k in vol if k != "name")
        raise podenv.ContainerConfigError(
            f'volume "{vol["name"]}": the podman runtime mounts emptyDir and hostPath, not {", ".join(kinds)}'
        )

    # -- lifecycle -----------------------------------------------------------------------------
    def launch(self, run: PodRun, cname: str) -> None:
        """Start the container and wait until podman has created it (its ID in the cidfile)."""
        cidfile = self.pod_dir(run) / f"{cname}.cid"
        cidfile.unlink(missing_ok=True)  # podman refuses to overwrite one
        super().launch(run, cname)
        proc = run.procs[cname]
        deadline = time.monotonic() + CREATE_S
        while time.monotonic() < deadline and proc.poll() is None:
            cid = cidfile.read_text().strip() if cidfile.exists() else ""
            if cid:
                run.ids[cname] = f"{self.scheme}://{cid}"
                return
            time.sleep(0.05)
        run.ids[cname] = ""  # never created (podman's error is in the container's log)

    def signal(self, run: PodRun, sig: int) -> None:
        """`podman kill` of every container still running, in the background: a container being
        created is signalled once it exists."""
        for cname, proc in list(run.procs.items()):
            if proc.poll() is None:
                threading.Thread(
                    target=_kill, args=(proc, run, cname, sig), daemon=True, name=f"kill-{run.name}"
                ).start()


def _kill(proc: subprocess.Popen, run: PodRun, cname: str, sig: int) -> None:
    name = signal.Signals(sig).name.removeprefix("SIG")
    deadline = time.monotonic() + CREATE_S
    while proc.poll() is None and time.monotonic() < deadline:
        cid = run.ids.get(cname, "").partition("://")[2]
        if cid:
            done = subprocess.run(["podman", "kill", "--signal", name, cid], capture_output=True)
            if done.returncode == 0 or proc.poll() is not None:
                return
        time.sleep(0.1)
    if proc.poll() is None and sig == signal.SIGKILL:
        proc.kill()  # podman never created it: end the client, nothing else is there


def image_ref(image: str, pull_policy: str) -> tuple[str, str]:
    """(image, imageID) of a local image, as containerd's CRI reports them: the tag that names it,
    and its repo digest, else its ID. An image not here fails the container's creation (no registry
    is reached: with pull policy Never the kubelet's ErrImageNeverPull, else ErrImagePull)."""
    done = subprocess.run(["podman", "image", "inspect", image], capture_output=True, text=True)
    if done.returncode:
        if pull_policy == "Never":
            raise podenv.ContainerConfigError(
                f'Container image "{image}" is not present with pull policy of Never', "ErrImageNeverPull"
            )
        raise podenv.ContainerConfigError(
            f'Failed to pull image "{image}": the embedded cluster reaches no registry '
            "(`python3.11 dev.py images` builds the project's)",
            "ErrImagePull",
        )
    info = json.loads(done.stdout)[0]
    tags = info.get("RepoTags") or []
    tag = next((t for t in tags if t == image or t.endswith("/" + image)), tags[0] if tags else image)
    repo = tag.rsplit(":", 1)[0] if ":" in tag.rsplit("/", 1)[-1] else tag
    digests = info.get("RepoDigests") or []
    ref = next((d for d in digests if d.startswith(repo + "@")), digests[0] if digests else "")
    return tag, ref or f"sha256:{info['Id'].removeprefix('sha256:')}"


def _user(pod: Mapping[str, Any], container: Mapping[str, Any]) -> list[str]:
    """securityContext's runAsUser/runAsGroup (the container's over the pod's)."""
    pod_sc = (pod.get("spec") or {}).get("securityContext") or {}
    sc = {**pod_sc, **(container.get("securityContext") or {})}
    if sc.get("runAsUser") is None:
        return []
    group = f":{sc['runAsGroup']}" if sc.get("runAsGroup") is not None else ""
    return ["--user", f"{sc['runAsUser']}{group}"]


def podman_unavailable(image: str) -> str | None:
    """Why the podman runtime cannot run `image` here, in one line; None when it can."""
    if shutil.which("podman") is None:
        return "podman is not installed (`python3.11 dev.py images` installs it and builds the images)"
    done = subprocess.run(["podman", "image", "exists", image], capture_output=True, text=True)
    if done.returncode == 1:
        return f"no image {image} (`python3.11 dev.py images` builds it)"
    if done.returncode:
        return f"podman does not run here: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
    return None
