"""The write probe of the MaxText profile: `python -m maxtext_entry --probe-write RUN_DIR` writes and
deletes one object under the run directory through the entrypoint's own storage layer (`storage`:
gcsfs for gs://), and says which interpreter would run MaxText. It is what the pod that `reslice
preflight --trainer maxtext` starts on the target node pools runs, in the MaxText image (which has no
`trainer` package), and what process 0 does before MaxText starts: host-network pods on GKE write
gs:// as the node's service account, within the node pool's scopes (docs/gke.md, "What the node pools
need to write gs://"), and a run directory nobody can write should stop the run at once, with the
fix, rather than at MaxText's first checkpoint. The wording of each case follows reslice's trainer
(`trainer/state/storage.py`), which this package may not import."""

from __future__ import annotations

import contextlib
import errno
import os
import socket

from maxtext_entry import storage

PROBE_PREFIX = ".reslice-write-probe-"  # readers of the run directory ignore these (docs/contract.md)
SCOPES_FIX = (
    "create the TPU node pools with --scopes=storage-full (or cloud-platform) and grant their service"
    " account roles/storage.objectUser on the bucket, or create them with"
    " --service-account=NAME@PROJECT.iam.gserviceaccount.com (a custom node service account gets the"
    " cloud-platform scope) holding roles/storage.objectUser"
)


class StorageError(Exception):
    """The run directory cannot be written; the message names the fix (exit 2)."""


def probe_write(run_dir: str) -> str:
    """Write and delete one small object under `run_dir` (a local directory the probe had to create
    is removed again); the object's path, or StorageError."""
    target = storage.join(run_dir, f"{PROBE_PREFIX}{socket.gethostname()}-{os.getpid()}")
    created = [] if storage.is_remote(run_dir) else _missing(run_dir)
    try:
        storage.write_text(target, "reslice write probe: safe to delete\n")
        storage.remove(target)
    except Exception as e:  # any storage failure: the message says which and what to do
        raise StorageError(explain(run_dir, e)) from None
    for d in created:  # innermost first: nothing of the probe stays behind
        with contextlib.suppress(OSError):
            os.rmdir(d)
    return target


def _missing(path: str) -> list[str]:
    out = []
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        out.append(path)
        path = os.path.dirname(path)
    return out


def explain(run_dir: str, error: BaseException) -> str:
    """One line: what failed writing `run_dir`, then `; fix: ` and what to do. Pure."""
    text = " ".join(str(error).split()) or type(error).__name__
    if run_dir.startswith("gs://"):
        bucket = run_dir[len("gs://") :].split("/", 1)[0]
        # gcsfs raises OSError("Forbidden: <url> ...") on a 403, HttpError with .code otherwise.
        if text.startswith("Forbidden") or getattr(error, "code", None) == 403:
            return (
                f"the node pool's service account cannot write {run_dir} (403 Forbidden); fix: {SCOPES_FIX}"
            )
        if isinstance(error, FileNotFoundError):
            return (
                f"bucket gs://{bucket} does not exist (or its project hides it from this service account);"
                f" fix: create it (gcloud storage buckets create gs://{bucket} --location=REGION) or choose"
                " another --run-dir"
            )
        return f"cannot write {run_dir}: {text}; fix: check the bucket and the node pool's storage access"
    if isinstance(error, OSError) and error.errno in (errno.ENOTDIR, errno.EEXIST):
        return (
            f"cannot create run directory {run_dir}: a part of the path is a file ({text}); fix: choose a"
            " --run-dir whose parents are directories"
        )
    return f"cannot write run directory {run_dir}: {text}; fix: choose a writable --run-dir (on GKE a gs:// bucket)"
