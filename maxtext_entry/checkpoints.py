"""MaxText's committed checkpoints: `<base_output_directory>/<run_name>/checkpoints/<k>/` with
Orbax's `commit_success.txt` (written last, docs/contract.md; on gs:// `<k>/` is written in place and
the commit file is its last object). MaxText's k is 0-based: the state after k + 1 steps, which is
reslice's step k + 1. Local or gs:// (`storage`)."""

from __future__ import annotations

from maxtext_entry import storage

COMMIT_FILE = "commit_success.txt"


def _steps(directory: str) -> list[int]:
    return sorted(int(n) for n in storage.listdir(directory) if n.isdigit())


def latest(directory: str) -> int | None:
    """The latest committed step: newest first, so that a poll costs one listing and one or two
    lookups (a save in flight, then the step before it), not one per checkpoint on gs://."""
    for k in reversed(_steps(directory)):
        if storage.isfile(storage.join(directory, str(k), COMMIT_FILE)):
            return k
    return None


def done_steps(maxtext_step: int | None) -> int:
    """Steps a checkpoint holds, reslice's 1-based step: 0 without one."""
    return 0 if maxtext_step is None else maxtext_step + 1
