"""MaxText's committed checkpoints: `<base_output_directory>/<run_name>/checkpoints/<k>/` with
Orbax's `commit_success.txt` (written last, docs/contract.md). MaxText's k is 0-based: the state
after k + 1 steps, which is reslice's step k + 1."""

from __future__ import annotations

import os

COMMIT_FILE = "commit_success.txt"


def committed(directory: str) -> list[int]:
    """MaxText steps with a committed checkpoint, ascending; [] when there is no directory yet."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    steps = [int(n) for n in names if n.isdigit() and os.path.isfile(os.path.join(directory, n, COMMIT_FILE))]
    return sorted(steps)


def latest(directory: str) -> int | None:
    steps = committed(directory)
    return steps[-1] if steps else None


def done_steps(maxtext_step: int | None) -> int:
    """Steps a checkpoint holds, reslice's 1-based step: 0 without one."""
    return 0 if maxtext_step is None else maxtext_step + 1
