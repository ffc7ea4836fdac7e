"""What the kubelet knows of a pod it runs (`PodRun`: its processes or simulated exit, exit codes,
logs, termination cause, crash back-off), and the crash back-off delay.

Shared by `kubelet.Kubelet` (the pod lifecycle) and the container runtimes (`runtimes.py`);
`faults.py` and `cluster.py` read the runs through `Kubelet.runs()`.
"""

from __future__ import annotations

import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

# The kubelet's crash back-off: the first restart at once, then doubling from initialBackOff up to
# MaxContainerBackOff (pkg/kubelet/kuberuntime).
CRASH_BACKOFF_S = 10.0
CRASH_BACKOFF_MAX_S = 300.0


def crash_backoff_s(restarts: int) -> float:
    """The wait before the `restarts`-th restart in place: none for the first, then doubling, capped."""
    return 0.0 if restarts == 1 else min(CRASH_BACKOFF_S * 2 ** (restarts - 2), CRASH_BACKOFF_MAX_S)


@dataclass
class PodRun:
    uid: str
    namespace: str
    name: str
    node: str
    simulate: bool
    started_at: str = ""
    pod_ip: str = "127.0.0.1"  # its own loopback address when it is a JobSet's pod (podenv.AddressMap)
    # container → the process the kubelet waits on: the command itself (process runtime) or the
    # `podman run` client attached to the container (podman runtime), which exits with its code.
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)  # container → containerID, `<runtime>://<id>`
    images: dict[str, tuple[str, str]] = field(default_factory=dict)  # container → (image, imageID)
    exit_codes: dict[str, int] = field(default_factory=dict)
    finished_at: dict[str, str] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)
    cause: str | None = None  # None | "delete" | "shutdown" | "gone" | "crash"
    terminating: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    kill_timer: threading.Timer | None = None
    deadline: float = float("inf")
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Held from a restart's launch until its Running status is written: a container that exits at
    # once waits here before its exit's status is written, which would otherwise come first (its
    # startedAt the pod's, then Running over Terminated). Upstream's kubelet reports a container's
    # start before its exit.
    relaunching: threading.Lock = field(default_factory=threading.Lock)
    restart_policy: str = "Never"
    restarts: int = 0
    plans: dict[str, tuple[list[str], dict[str, str], str]] = field(default_factory=dict)  # argv, env, cwd
    backoff: dict[str, int] = field(default_factory=dict)  # container → exit code, awaiting restart
