"""Checkpoints: an Orbax ``CheckpointManager`` under ``<run_dir>/checkpoints``, local or gs://.

Each step holds two items: ``state`` (parameters, Adam moments, step counter) and ``meta`` (JSON:
step, data position, segment, shape and batch plan, config hash and identity, global batch).

Committed steps (what Orbax 0.12.8 does, and what readers such as the launcher rely on):
``checkpoints/<step>/commit_success.txt`` is written last. On local disk Orbax writes everything
into ``<step>.orbax-checkpoint-tmp-<n>/``, writes the commit file there and renames the directory to
``<step>/``; on gs:// (no atomic rename) it writes ``<step>/`` in place and the commit file last.
So: a directory named by digits that contains ``commit_success.txt`` is committed, on both.
Orbax only lists such steps, and deletes unfinished ones (``cleanup_tmp_directories``) when the
manager opens, so a save killed half-way is never restored from.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint._src.serialization import jax_array_handlers

from trainer.config import ConfigError

COMMIT_FILE = "commit_success.txt"


def _first_difference(saved: Any, current: Any, prefix: str = "") -> str | None:
    if isinstance(saved, dict) and isinstance(current, dict):
        for key in sorted(set(saved) | set(current)):
            diff = _first_difference(saved.get(key), current.get(key), f"{prefix}{key}.")
            if diff:
                return diff
        return None
    if saved != current:
        return f"{prefix.rstrip('.')} {saved!r} -> {current!r}"
    return None


_HANDLER_SET = False


def _use_replica_parallel_only_for_large_arrays() -> None:
    """Orbax splits every replicated array into one slice per replica to write them in parallel.

    For small arrays that is hundreds of tiny device slices inside the *blocking* part of an async
    save (0.2 s for the tiny model on 8 CPU devices); below 4 MiB per slice one replica writes it.
    """
    global _HANDLER_SET
    if _HANDLER_SET:
        return
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)  # "overriding jax.Array" is what we mean
    try:
        handler = jax_array_handlers.ArrayHandler(min_slice_bytes_for_replica_parallel=4 << 20)
        ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)
    finally:
        absl_logger.setLevel(level)
    _HANDLER_SET = True


class Checkpointer:
    def __init__(self, run_dir: str, keep: int, async_save: bool = True):
        _use_replica_parallel_only_for_large_arrays()
        self.directory = epath.Path(run_dir) / "checkpoints"
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            save_interval_steps=1,  # the loop decides when to save
            enable_async_checkpointing=async_save,
            cleanup_tmp_directories=True,
            create=True,
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def read_meta(self, step: int) -> dict[str, Any]:
        restored = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(restored["meta"])

    def check_compatible(
        self, step: int, meta: dict[str, Any], config_hash: str, identity: dict, global_batch: int
    ) -> None:
        """Refuse (ConfigError, exit 2) a checkpoint of another run: never silently resume it."""
        where = f"checkpoint {self.directory}/{step}"
        if meta.get("global_batch") != global_batch:
            raise ConfigError(
                f"{where} has global batch {meta.get('global_batch')}, this run {global_batch}: refusing to resume"
            )
        if meta.get("config_hash") != config_hash:
            diff = _first_difference(meta.get("identity", {}), identity) or "unknown field"
            raise ConfigError(
                f"{where} has config hash {meta.get('config_hash')}, this run {config_hash} ({diff}): refusing to resume"
            )

    def restore(self, step: int, abstract: Any) -> Any:
        """Restore ``state`` into the shardings carried by ``abstract`` (the current mesh)."""
        restored = self.manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract))
        )
        return restored["state"]

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> float:
        """Start a save; returns the seconds the caller was blocked (device-to-host copy, setup)."""
        start = time.perf_counter()
        self.manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
            force=True,
        )
        return time.perf_counter() - start

    def wait(self) -> None:
        """Block until every started save has committed."""
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()


def committed_steps(run_dir: str) -> list[int]:
    """Committed steps as a reader outside Orbax sees them (the contract's rule)."""
    root = epath.Path(run_dir) / "checkpoints"
    if not root.exists():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and (p / COMMIT_FILE).exists())
