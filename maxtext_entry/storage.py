"""The run directory as the entrypoint reads and writes it: a local path through `os`, a gs:// one
through etils' epath (gcsfs), which is how MaxText's own Orbax writes its checkpoint metadata there;
tensorstore writes the arrays. Called by `checkpoints` (committed steps), `run` (status.json, the
metrics records, the copy of MaxText's metrics file) and `probe` (the write probe).

A local run directory never imports etils: the entrypoint stays standard library there. A GCS
object cannot be appended to or renamed, so a gs:// file is always written whole (`write_text`),
and a listing is read afresh each time (gcsfs keeps listings in a cache of its own, which would
hide the checkpoints another process, MaxText, commits)."""

from __future__ import annotations

import os
from typing import Any


def is_remote(path: str) -> bool:
    return "://" in path


def join(root: str, *parts: str) -> str:
    """`root/part/...` for a local path or a URL alike."""
    return "/".join([root.rstrip("/"), *parts]) if is_remote(root) else os.path.join(root, *parts)


def _epath(path: str) -> Any:
    from etils import epath  # gs:// only: MaxText's image and the launcher's venv both have it

    return epath.Path(path)


def _fresh_fs(path: str) -> Any:
    """The gcsfs filesystem epath uses for `path`, with its listing cache for `path` dropped."""
    from etils.epath import backend

    fs = backend.fsspec_backend.fs(path)
    fs.invalidate_cache(path)
    return fs


def listdir(path: str) -> list[str]:
    """The names directly under `path`; [] when there is nothing there (yet)."""
    if not is_remote(path):
        try:
            return os.listdir(path)
        except FileNotFoundError:
            return []
    fs = _fresh_fs(path)
    try:
        entries = fs.ls(path, detail=False)
    except FileNotFoundError:
        return []
    return [e.rstrip("/").rsplit("/", 1)[-1] for e in entries]


def isfile(path: str) -> bool:
    if not is_remote(path):
        return os.path.isfile(path)
    return _fresh_fs(path).exists(path)


def write_text(path: str, text: str) -> None:
    """Replace the file whole: locally written aside and renamed (readers never see half a file);
    on gs:// one upload, which GCS makes visible only once complete."""
    if is_remote(path):
        _epath(path).write_text(text)
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def append_text(path: str, text: str) -> None:
    """Local files only (gs:// objects are rewritten whole: `Sink`)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:
        f.write(text)


def remove(path: str) -> None:
    if is_remote(path):
        _epath(path).unlink()
    else:
        os.remove(path)


ROTATE_LINES = 2000  # lines per gs:// object: each rewrite stays small


class Sink:
    """Lines that accumulate in one file of the run directory, under names `<prefix>-<ms><suffix>`.

    Locally each `add` appends. On gs:// `add` keeps the lines and `flush` rewrites the object
    whole, continuing in a new object (a later name) every `ROTATE_LINES` lines, as reslice's
    trainer does with its metrics (docs/contract.md): readers take every file of the folder."""

    def __init__(self, folder: str, prefix: str, suffix: str, now_ms: int) -> None:
        self.folder, self.prefix, self.suffix = folder, prefix, suffix
        self.remote = is_remote(folder)
        self.ms = now_ms
        self.path = self._name(now_ms)
        self.lines: list[str] = []
        self.dirty = False

    def _name(self, ms: int) -> str:
        return join(self.folder, f"{self.prefix}-{ms}{self.suffix}")

    def add(self, lines: list[str]) -> None:
        if not lines:
            return
        if not self.remote:
            append_text(self.path, "".join(f"{line}\n" for line in lines))
            return
        self.lines += lines
        self.dirty = True

    def flush(self, now_ms: int) -> None:
        if not (self.remote and self.dirty):
            return
        write_text(self.path, "".join(f"{line}\n" for line in self.lines))
        self.dirty = False
        if len(self.lines) >= ROTATE_LINES:
            self.ms = max(now_ms, self.ms + 1)  # a later name: readers order the objects by it
            self.path, self.lines = self._name(self.ms), []
