"""The kubelet's container runtimes: one interface (`ContainerRuntime`), two implementations —
local processes of the container's command (`processes.ProcessRunner`, the default) and `podman run`
of the container's image (`podman.PodmanRunner`). The kubelet owns the pod lifecycle (start,
restart in place, SIGTERM/grace/SIGKILL, exit codes to status) alike for both; a runtime only
starts, signals and logs what it is told. Simulated node pools use neither."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from launcher.core.words import PodRuntime
from launcher.embedded.kubelet.podman import PodmanRunner
from launcher.embedded.kubelet.podrun import PodRun
from launcher.embedded.kubelet.processes import ProcessRunner
from launcher.embedded.kubelet.volumes import PodAccess

__all__ = ["ContainerRuntime", "make_runtime"]


class ContainerRuntime(Protocol):
    """What the kubelet asks of a runtime. `spawn` fills the run's `procs` (the process to wait on
    per container: its exit status is the container's exit code), `ids` (containerID) and `images`
    ((image, imageID), empty when no image runs), or raises podenv.ContainerConfigError before
    starting any container."""

    log_dir: Path  # each pod's containers' logs, in a folder of its own (what `kubectl logs` reads)

    def spawn(self, run: PodRun, pod: dict[str, Any], node: dict[str, Any]) -> None: ...

    def launch(self, run: PodRun, cname: str) -> None:
        """(Re)start one container of a spawned run (a restart in place)."""

    def watch(self, run: PodRun, cname: str, on_exit: Callable[[PodRun, str, int], None]) -> None: ...

    def signal(self, run: PodRun, sig: int) -> None:
        """Deliver `sig` (SIGTERM, SIGKILL) to every container of the run still running."""

    def log_stream(
        self,
        namespace: str,
        name: str,
        container: str,
        follow: bool,
        run_of: Callable[[str, str], PodRun | None],
    ) -> Iterator[bytes]: ...

    def forget(self, namespace: str, name: str) -> None:
        """The pod left the API: what the runtime kept for it goes."""

    def stop(self) -> None:
        """The kubelet stops (its runs ended): what the runtime holds on the host goes."""


def make_runtime(
    kind: str,
    store: Any,
    log_dir: Path,
    cwd: Path,
    shared: Sequence[Path] = (),
    access: PodAccess | None = None,
) -> ContainerRuntime:
    """`kind`: a PodRuntime value; `shared`: host folders the podman runtime mounts into every
    container at their own paths (the process runtime's processes see the whole host); `access`:
    what outside mode's process pods get (the process runtime only)."""
    if kind == PodRuntime.PODMAN:
        if access is not None:
            raise ValueError("outside mode runs its pods with the process runtime")
        return PodmanRunner(store, log_dir, cwd, shared)
    if kind == PodRuntime.PROCESS:
        return ProcessRunner(store, log_dir, cwd, access)
    raise ValueError(f"unknown pod runtime {kind!r} (runtimes: {', '.join(PodRuntime)})")
