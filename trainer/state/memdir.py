"""The pod's memory directory for in-memory snapshots (trainer/state/snapshot.py). Pure, no JAX: the
in-place supervisor makes it before its first child and removes it when it exits.

It lies under ``RESLICE_MEMORY_ROOT`` (default ``/dev/shm``, which the renderer mounts as an
``emptyDir`` with ``medium: Memory``: RAM that outlives the trainer child, counted in the pod's
memory, and goes with the pod; the embedded cluster's process runtime gives each pod a folder of
its own there, removed with the pod, and sets the variable to it). Its name holds the run, the slice, the host and the supervisor's pid: on one machine
(the embedded cluster's pods share its ``/dev/shm``) no two pods share one, and a later pod of the
same slice and host never reads an earlier pod's snapshots. A leftover of a supervisor that was
killed (its pid gone: on one machine, any run's) is removed when the next one starts; in a pod the
memory ``emptyDir`` goes with the pod anyway.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

from contract import envvars

DEFAULT_ROOT = "/dev/shm"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def make(env: Mapping[str, str], slice_id: str, host: int) -> Path | None:
    """Create this pod's memory directory; None when the root is not a writable directory (then
    the children take no snapshots and restore from storage)."""
    root = Path(env.get(envvars.MEMORY_ROOT) or DEFAULT_ROOT)
    run = re.sub(r"[^A-Za-z0-9_.-]", "_", env.get(envvars.RUN) or "run")
    prefix = f"reslice-{run}-{re.sub(r'[^A-Za-z0-9_.-]', '_', slice_id)}-{host}-"
    try:
        for old in root.iterdir():
            tail = old.name.rpartition("-")[2]
            if old.name.startswith("reslice-") and tail.isdigit() and not _alive(int(tail)):
                shutil.rmtree(old, ignore_errors=True)
        path = root / f"{prefix}{os.getpid()}"
        path.mkdir(exist_ok=True)
    except OSError:
        return None
    return path


def remove(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            shutil.rmtree(path)
