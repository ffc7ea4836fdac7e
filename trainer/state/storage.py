"""The write probe: can this process write its run directory? Asked before anything else is written.

A run directory the trainer cannot write fails only at the first checkpoint, after start-up and
compilation (minutes at scale), or never reaches the launcher at all. On GKE the trainer pods use the
host network, so Workload Identity does not apply to them: they write gs:// as the node's service
account, within the node pool's OAuth scopes, and GKE's default scopes give storage read-only
(docs/contract.md). So process 0 writes and deletes one small object first, through the storage layer
the trainer writes with (``etils.epath``: gcsfs for gs://), and a failure is a configuration error
(exit 2) in one line that names the fix. ``python -m trainer --probe-write DIR`` runs only this (the
pod that ``reslice preflight`` starts). No JAX here.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
from pathlib import Path

from etils import epath

from trainer.config import ConfigError

PROBE_PREFIX = ".reslice-write-probe-"

SCOPES_FIX = (
    "create the TPU node pools with --scopes=storage-full (or cloud-platform) and grant their service"
    " account roles/storage.objectUser on the bucket, or create them with"
    " --service-account=NAME@PROJECT.iam.gserviceaccount.com (a custom node service account gets the"
    " cloud-platform scope) holding roles/storage.objectUser"
)


class StorageError(ConfigError):
    """The run directory cannot be written; the message names the fix."""


# Bucket names (https://cloud.google.com/storage/docs/buckets#naming): lowercase letters, digits,
# '-', '_' and '.', start and end alphanumeric, 3-222 characters, dotted parts of at most 63.
_BUCKET = re.compile(r"^[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9]$")


def bucket_error(run_dir: str) -> str | None:
    """Why a gs:// run directory cannot be one (its bucket name), or None: asked before the storage
    layer is, whose client retries and logs a traceback for a name no bucket can have."""
    if not _is_gcs(run_dir):
        return None
    bucket = run_dir.removeprefix("gs://").split("/", 1)[0]
    if _BUCKET.match(bucket) and ".." not in bucket and all(len(p) <= 63 for p in bucket.split(".")):
        return None
    return f"run directory {run_dir}: {bucket!r} is not a valid Cloud Storage bucket name"


def probe_write(run_dir: str) -> str:
    """Write and delete a small object under `run_dir`, leaving it as it was (a local directory the
    probe had to create is removed again); the object's path, or StorageError."""
    if err := bucket_error(run_dir):
        raise StorageError(err)
    root = epath.Path(run_dir)
    target = root / f"{PROBE_PREFIX}{socket.gethostname()}-{os.getpid()}"
    # An object store's directory is only a name prefix: nothing to create (or to remove) there.
    created = [] if "://" in run_dir else _missing(Path(run_dir))
    try:
        if created:
            root.mkdir(parents=True, exist_ok=True)
        target.write_text("reslice write probe: safe to delete\n")
        target.unlink()
    except Exception as e:  # any storage failure: the message says which and what to do
        raise StorageError(explain(run_dir, e)) from None
    for d in created:  # innermost first: a config error found next must leave nothing behind
        with contextlib.suppress(OSError):
            d.rmdir()
    return str(target)


def _missing(path: Path) -> list[Path]:
    """`path` and its ancestors that do not exist yet, innermost first."""
    out = []
    while not path.exists() and path != path.parent:
        out.append(path)
        path = path.parent
    return out


def _is_gcs(run_dir: str) -> bool:
    return run_dir.startswith("gs://")


def explain(run_dir: str, error: BaseException) -> str:
    """One line: what failed writing `run_dir`, then `; fix: ` and what to do. Pure."""
    text = " ".join(str(error).split()) or type(error).__name__
    if _is_gcs(run_dir):
        bucket = run_dir[len("gs://") :].split("/", 1)[0]
        if _forbidden(error):
            return (
                f"the node pool's service account cannot write {run_dir} (403 Forbidden); fix: {SCOPES_FIX}"
            )
        if isinstance(error, FileNotFoundError):
            return (
                f"bucket gs://{bucket} does not exist (or its project hides it from this service account);"
                f" fix: create it (gcloud storage buckets create gs://{bucket} --location=REGION) or choose"
                " another --run-dir"
            )
        if _no_credentials(error):
            return (
                f"no Google credentials to write {run_dir} ({text}); fix: on GKE the node's service account"
                " is used (check the node pool's scopes); elsewhere run `gcloud auth application-default login`"
            )
        return f"cannot write {run_dir}: {text}; fix: check the bucket and the node pool's storage access"
    if isinstance(error, OSError) and error.errno in (errno.ENOTDIR, errno.EEXIST):
        return (
            f"cannot create run directory {run_dir}: a part of the path is a file ({text}); fix: choose a"
            " --run-dir whose parents are directories"
        )
    if isinstance(error, OSError) and error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (
            f"run directory {run_dir} is not writable ({text}); fix: choose a writable --run-dir (on GKE a"
            " gs:// bucket: trainer pods share no disk)"
        )
    return f"cannot write run directory {run_dir}: {text}; fix: choose a writable --run-dir"


def _forbidden(error: BaseException) -> bool:
    # gcsfs (retry.validate_response) raises OSError("Forbidden: <url>\n<message>") on a 403, and
    # HttpError with .code for statuses it has no exception for.
    return str(error).startswith("Forbidden") or getattr(error, "code", None) == 403


def _no_credentials(error: BaseException) -> bool:
    return any(c.__module__.startswith("google.auth") for c in type(error).__mro__)
