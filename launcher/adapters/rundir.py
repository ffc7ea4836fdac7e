"""The run directory: a local path or gs://bucket/prefix. The one module that touches storage.

The trainer owns most of it (docs/contract.md): checkpoints, metrics, status.json. The launcher
writes `run.json` and the ledger `events.jsonl`, and reads the rest. GCS objects cannot be appended
to, so the ledger is rewritten with a generation precondition: two writers never lose a line.
Called by the layers above the adapters: controller (launch, loop, snapshot), cli (watch, demo), sweep (driver, files), report (io).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterable
from functools import cache
from pathlib import Path

from launcher.core.maxtext import checkpoint_layout

COMMIT_MARKER = "commit_success.txt"  # Orbax writes it last (docs/contract.md)
LEDGER = "events.jsonl"


def _gcs_client():
    return _client_for(os.environ.get("STORAGE_EMULATOR_HOST"))


@cache
def _client_for(emulator: str | None):
    """One client per endpoint (a test may start a new emulator; production has one)."""
    from google.cloud import storage

    if emulator:
        from google.auth.credentials import AnonymousCredentials

        project = os.environ.get("GOOGLE_CLOUD_PROJECT", "local")
        return storage.Client(project=project, credentials=AnonymousCredentials())
    return storage.Client()


class RunDir:
    """Read and write files of one run directory, locally or on GCS, by relative path."""

    def __init__(self, url: str, trainer: str = "reslice") -> None:
        self.url = url.rstrip("/")
        # Where the trainer profile commits checkpoints, and its step of a checkpoint's name.
        self.checkpoints, self.step_offset = checkpoint_layout(trainer)
        if self.url.startswith("gs://"):
            bucket, _, prefix = self.url[len("gs://") :].partition("/")
            self.bucket_name, self.prefix = bucket, prefix.strip("/")
            self.root: Path | None = None
        else:
            self.root = Path(self.url)

    def _blob(self, rel: str):
        name = f"{self.prefix}/{rel}" if self.prefix else rel
        return _gcs_client().bucket(self.bucket_name).blob(name)

    def read_text(self, rel: str) -> str | None:
        if self.root is not None:
            path = self.root / rel
            try:
                return path.read_text()
            except FileNotFoundError:
                return None
        from google.api_core.exceptions import NotFound

        try:
            return self._blob(rel).download_as_text()
        except NotFound:
            return None

    def write_text(self, rel: str, text: str) -> None:
        if self.root is not None:
            path = self.root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
            tmp.write_text(text)
            tmp.replace(path)  # atomic: readers never see half a file
            return
        self._blob(rel).upload_from_string(text)

    def delete(self, rel: str) -> None:
        """Remove one file (absent is fine)."""
        if self.root is not None:
            (self.root / rel).unlink(missing_ok=True)
            return
        from google.api_core.exceptions import NotFound

        with contextlib.suppress(NotFound):
            self._blob(rel).delete()

    def missing_dirs(self) -> list[Path]:
        """The local run directory and its ancestors that do not exist yet, innermost first."""
        if self.root is None:
            return []
        root = self.root.resolve()
        return [p for p in (root, *root.parents) if not p.exists()]

    def append_lines(self, rel: str, lines: Iterable[str]) -> None:
        chunk = "".join(line.rstrip("\n") + "\n" for line in lines)
        if not chunk:
            return
        if self.root is not None:
            path = self.root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as f:
                f.write(chunk)
            return
        from google.api_core.exceptions import NotFound, PreconditionFailed

        for _ in range(20):
            # A fresh handle each try: a reloaded blob remembers its generation, and reloading
            # it again would ask for that (now overwritten) generation.
            blob = self._blob(rel)
            try:
                blob.reload()
                current, generation = (
                    blob.download_as_text(if_generation_match=blob.generation),
                    blob.generation,
                )
            except NotFound:
                current, generation = "", 0
            try:
                blob.upload_from_string(current + chunk, if_generation_match=generation)
                return
            except PreconditionFailed:
                time.sleep(0.05)  # another writer appended first: read again
        raise RuntimeError(f"could not append to {self.url}/{rel}: too much contention")

    def list_dir(self, rel: str) -> list[str]:
        """Names directly under `rel` (files and directories)."""
        if self.root is not None:
            path = self.root / rel
            return sorted(p.name for p in path.iterdir()) if path.is_dir() else []
        prefix = "/".join(p for p in (self.prefix, rel.strip("/")) if p) + "/"
        it = _gcs_client().list_blobs(self.bucket_name, prefix=prefix, delimiter="/")
        files = [b.name[len(prefix) :] for b in it]
        dirs = [p[len(prefix) :].rstrip("/") for p in it.prefixes]
        return sorted(files + dirs)

    def exists(self, rel: str) -> bool:
        if self.root is not None:
            return (self.root / rel).exists()
        return self._blob(rel).exists()

    # --- what the trainer writes ---------------------------------------------------------------

    def committed_steps(self) -> list[int]:
        """Checkpoint steps that finished committing (docs/contract.md), oldest first, as reslice's
        1-based steps (after s global batches), whichever trainer profile wrote them.

        Orbax writes into a temporary directory and renames it (local disk), or writes the commit
        marker last (GCS); a step without the marker may be half written and is never counted.
        (`_CHECKPOINT_METADATA` is no marker: Orbax writes it when a save starts.)
        """
        names = [n for n in self.list_dir(self.checkpoints) if n.isdigit()]
        names = [n for n in names if self.exists(f"{self.checkpoints}/{n}/{COMMIT_MARKER}")]
        return sorted(int(n) + self.step_offset for n in names)

    def latest_committed_step(self) -> int | None:
        steps = self.committed_steps()
        return steps[-1] if steps else None

    def status(self) -> dict | None:
        text = self.read_text("status.json")
        try:
            return json.loads(text) if text else None
        except json.JSONDecodeError:
            return None  # caught mid-write by a non-atomic writer: next pass reads it whole

    def metrics(self) -> list[dict]:
        """Every metrics line of every trainer incarnation, in the order they were written."""
        lines = []
        for name in self.list_dir("metrics"):
            if name.endswith(".jsonl"):
                lines += read_jsonl(self.read_text(f"metrics/{name}"))
        return sorted(lines, key=lambda r: (r.get("time", 0.0), r.get("step", 0)))

    def latest_metrics(self) -> dict | None:
        """The newest metrics line, without reading a long run's whole history: the last line of
        the metrics file that sorts last (one file per trainer incarnation, named by segment,
        restart attempt and start time)."""
        names = [n for n in self.list_dir("metrics") if n.endswith(".jsonl")]
        for name in reversed(names):  # the newest file may not have its first line yet
            lines = read_jsonl(self._tail(f"metrics/{name}"))
            if lines:
                return lines[-1]
        return None

    def _tail(self, rel: str, size: int = 1 << 16) -> str | None:
        if self.root is None:
            return self.read_text(rel)  # the trainer rotates GCS objects every 2,000 lines
        try:
            with (self.root / rel).open("rb") as f:
                f.seek(0, os.SEEK_END)
                start = max(0, f.tell() - size)
                f.seek(start)
                data = f.read().decode(errors="replace")
        except FileNotFoundError:
            return None
        return data.split("\n", 1)[-1] if start else data  # drop a partial first line

    # --- what the launcher writes --------------------------------------------------------------

    def ledger(self) -> list[dict]:
        return read_jsonl(self.read_text(LEDGER))

    def log(self, entries: Iterable[dict]) -> None:
        self.append_lines(LEDGER, (json.dumps(e, sort_keys=True) for e in entries))


def read_jsonl(text: str | None) -> list[dict]:
    """The lines of a JSON-lines text (metrics, the ledger), each a dict, skipping blank lines and a line
    caught half-written."""
    out = []
    for line in (text or "").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line being written right now; it is whole on the next read
    return out
