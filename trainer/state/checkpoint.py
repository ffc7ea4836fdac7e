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

import contextlib
import gc
import inspect
import json
import logging
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import jax
import orbax.checkpoint as ocp
import tensorstore as ts
from absl import flags
from etils import epath

from trainer.config import ConfigError, kept_decay, kept_schedule, schedule_change

COMMIT_FILE = "commit_success.txt"
UNUSABLE_DIR = "checkpoints-unusable"  # beside checkpoints/: steps that did not restore, kept
UNUSABLE_REASON = "UNUSABLE.txt"
_meta_bytes_read = [0]  # the JSON of the steps' meta items this process read (Orbax reads it in Python)


def storage_bytes_read() -> int:
    """Bytes this process has read from checkpoints so far: tensorstore's own counters of every
    kvstore driver (``/tensorstore/kvstore/<driver>/bytes_read``: file, gcs, ...), through which
    Orbax reads the arrays, plus the meta items' JSON. A restore from memory adds nothing."""
    total = _meta_bytes_read[0]
    for metric in ts.experimental_collect_matching_metrics("/tensorstore/kvstore/"):
        if metric["name"].endswith("/bytes_read"):
            total += sum(int(v.get("value", 0)) for v in metric["values"])
    return total


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


def _use_replica_parallel_only_for_large_arrays() -> None:
    """Orbax splits every replicated array into one slice per replica to write them in parallel.

    For small arrays that is hundreds of tiny device slices inside the *blocking* part of an async
    save (docs/measurements.md, "Figures behind the code's constants"); below the handler's
    ``min_slice_bytes_for_replica_parallel`` one replica writes it.
    Registering again (each Checkpointer) replaces the handler with an equal one: no flag needed.
    """
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)  # "overriding jax.Array" is what we mean
    try:
        handler = ocp.type_handlers.ArrayHandler(min_slice_bytes_for_replica_parallel=4 << 20)
        ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)
    finally:
        absl_logger.setLevel(level)


def _barriers_of_the_coordination_service() -> None:
    """Orbax's barriers (opening the manager, each restore, several per save) as the JAX
    coordination service's, not as a jitted all-gather over every device.

    By default Orbax 0.12.8 syncs processes with ``multihost_utils.sync_global_devices``: a program
    lowered, compiled and run across every device, on a simulated slice a 16-rank Gloo collective,
    waiting without a timeout of its own for a peer that may be dead. Orbax's flag
    ``experimental_orbax_use_distributed_barrier`` (what its own multi-process benchmarks set) makes
    them ``wait_at_barrier`` calls on the coordination service, with Orbax's own timeout, like the
    trainer's start barrier: the start-up phase that opens the manager (with the mesh) then takes
    much less of a resumed process's start-up (docs/measurements.md, "Figures behind the code's
    constants"). The flag is read through absl, which this process never parses: parsing the one
    flag makes it readable."""
    flag = flags.FLAGS["experimental_orbax_use_distributed_barrier"]
    if not flag.present:
        flag.parse("true")


class Checkpointer:
    def __init__(self, run_dir: str, keep: int, async_save: bool = True, save_delay_s: float = 0.0):
        _use_replica_parallel_only_for_large_arrays()
        _barriers_of_the_coordination_service()
        self.directory = epath.Path(run_dir) / "checkpoints"
        self.set_aside: list[dict[str, Any]] = []  # the unusable steps moved aside at start-up
        self.save_delay_s = save_delay_s  # checkpoint.debug_save_delay_s, a test hook
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
        meta = dict(restored["meta"])
        _meta_bytes_read[0] += len(json.dumps(meta))
        return meta

    def check_newest(self, check: Callable[[int, dict[str, Any]], None]) -> None:
        """`check` on the newest committed step when its meta reads as a checkpoint's: the identity
        check, asked before the trainer writes anything (`usable_start` judges every step later)."""
        step = self.manager.latest_step()
        if step is None:
            return
        try:
            meta = self.read_meta(step)
        except Exception:
            return  # unreadable: usable_start sets it aside and checks the step before
        if isinstance(meta, dict) and meta.get("step") == step and "config_hash" in meta:
            check(step, meta)

    def check_compatible(
        self,
        step: int,
        meta: dict[str, Any],
        config_hash: str,
        identity: dict,
        global_batch: int,
        schedule: dict[str, Any] | None = None,
    ) -> None:
        """Refuse (ConfigError, exit 2) a checkpoint of another run: never silently resume it.

        ``schedule`` (trainer.config.schedule_point): a WSD schedule's decay, which a run may move
        (or grow by more steps) while the steps it already trained are unaffected."""
        where = f"checkpoint {self.directory}/{step}"
        if meta.get("global_batch") != global_batch:
            raise ConfigError(
                f"{where} has global batch {meta.get('global_batch')}, this run {global_batch}: refusing to resume"
            )
        if meta.get("config_hash") != config_hash:
            saved = meta.get("identity", {})
            diff = _first_difference(saved, identity) or "unknown field"
            # An extended run (train.steps raised) whose cosine decay followed train.steps: say how
            # to go on, in the same line.
            hint = kept_schedule(meta.get("config_hash"), saved, identity)
            raise ConfigError(
                f"{where} has config hash {meta.get('config_hash')}, this run {config_hash} ({diff}): refusing to resume"
                + (f"; {hint}" if hint else "")
            )
        saved_point = meta.get("schedule") or {}
        why = schedule_change(step, saved_point, schedule or {})
        if why:
            hint = kept_decay(saved_point, schedule or {})
            raise ConfigError(f"{where} was {why}: refusing to resume" + (f"; {hint}" if hint else ""))

    def usable_start(
        self,
        total_steps: int,
        abstract: Any,
        check: Callable[[int, dict[str, Any]], None],
        retrace: Callable[[], Any] | None = None,
    ) -> tuple[int, Any]:
        """(step, state) of the newest committed step that restores, or (0, None) when none does.

        A step already at or past `total_steps` is returned without its state (the run is done).
        `check` refuses a foreign checkpoint (ConfigError: exit 2, never skipped over). A step whose
        meta is not JSON of this layout, or whose state is missing or does not restore (truncated
        arrays), is unusable: one line says so, it is moved aside (never deleted), and the previous
        committed step is tried, which costs the steps since then and no more.

        `retrace` (given when `abstract` came from the compile cache, not from tracing the model)
        returns the traced abstract state: the first step that does not restore into the cached one
        is tried again with it before it is judged, so that a stale cache entry (a library patched
        in place, its version unchanged) costs a trace, never a checkpoint."""
        with _quiet_abandoned_reads(lambda: bool(self.set_aside)):
            for step in sorted(self.manager.all_steps(), reverse=True):
                try:
                    meta = self.read_meta(step)
                    if not isinstance(meta, dict) or meta.get("step") != step or "config_hash" not in meta:
                        raise ValueError(f"its meta is not a checkpoint's (step {meta.get('step')!r})")
                except Exception as e:
                    self._set_aside(step, e)
                    continue
                check(step, meta)
                if step >= total_steps:
                    return step, None
                try:
                    return step, self.restore(step, abstract)
                except Exception as e:
                    error = e
                if retrace is not None and not transient(error):
                    print(
                        f"trainer: checkpoint {self.directory}/{step} does not restore into the compile"
                        f" cache's abstract state ({_reason(error)}): tracing the model for it",
                        flush=True,
                    )
                    abstract, retrace = retrace(), None
                    try:
                        return step, self.restore(step, abstract)
                    except Exception as e:
                        error = e
                self._set_aside(step, error)
        if self.set_aside:
            raise ConfigError(
                f"no usable checkpoint in {self.directory}: all {len(self.set_aside)} committed steps were "
                f"moved to {self.directory.parent / UNUSABLE_DIR}; resume from none (a new run directory) or repair them"
            )
        return 0, None

    def _set_aside(self, step: int, error: BaseException) -> None:
        """Move checkpoint `step` to ``<run_dir>/checkpoints-unusable/<step>-<unix time>``, where no
        reader takes it for a step, and keep it for a post-mortem."""
        if transient(error):  # the storage failed, not the checkpoint: keep it, fail this attempt
            raise error
        reason = _reason(error)
        target = self.directory.parent / UNUSABLE_DIR / f"{step}-{int(time.time())}"
        print(
            f"trainer: checkpoint {self.directory}/{step} is unusable ({reason}): moved to {target}",
            flush=True,
        )
        if jax.process_index() == 0:  # one mover; every process skips the step the same way
            target.parent.mkdir(parents=True, exist_ok=True)
            # Also what makes the folder exist on gs://, where epath's rename needs its destination's.
            (target.parent / "README.txt").write_text(
                "Checkpoints the trainer could not restore, moved here from checkpoints/ (never deleted).\n"
            )
            _move(self.directory / str(step), target)
            (target / UNUSABLE_REASON).write_text(reason + "\n")
        self.set_aside.append({"step": step, "moved_to": str(target), "reason": reason})
        self.manager.reload()

    def restore(self, step: int, abstract: Any) -> Any:
        """Restore ``state`` into the shardings carried by ``abstract`` (the current mesh)."""
        restored = self.manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract))
        )
        return restored["state"]

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> float:
        """Start a save; returns the seconds the caller was blocked (device-to-host copy, setup)."""
        if self.save_delay_s:
            delay = self.save_delay_s
            print(
                f"trainer: checkpoint.debug_save_delay_s: sleeping {delay:g} s before saving step {step}",
                flush=True,
            )
            time.sleep(delay)
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

    def committed(self, step: int) -> bool:
        """Whether ``step``'s commit marker is in storage (written last, by process 0)."""
        return (self.directory / str(step) / COMMIT_FILE).exists()

    def close(self) -> None:
        """Orbax (0.12.8) removes the unfinished steps of earlier incarnations
        (``cleanup_tmp_directories``) in a thread of its own, started with the manager, and awaits it
        before a save but not in ``close()``. A trainer that ends soon after opening the manager (a
        checkpoint of another run refused: exit 2) would end the interpreter under that thread,
        whose ``asyncio.to_thread`` then fails into stderr with a traceback. Awaited here first."""
        # Orbax's own name for it (no public one); test_corrupt_checkpoint.py fails if it goes.
        await_cleanup = getattr(self.manager, "_maybe_await_cleanup_tmp_directory", lambda: None)
        try:
            await_cleanup()
        except Exception as e:  # the exit in progress is the one to report
            print(
                f"trainer: removing unfinished checkpoint steps failed ({type(e).__name__}: {e})", flush=True
            )
        self.manager.close()


# Status codes (absl / tensorstore / gRPC) of a storage that failed for now: retrying may succeed.
_TRANSIENT = (
    "UNAVAILABLE",
    "DEADLINE_EXCEEDED",
    "PERMISSION_DENIED",
    "UNAUTHENTICATED",
    "RESOURCE_EXHAUSTED",
)


def _chain(error: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    e: BaseException | None = error
    while e is not None and e not in out:
        out.append(e)
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return out


def transient(error: BaseException) -> bool:
    """Whether a failed read is the storage's (network, credentials), not the checkpoint's content."""
    return any(
        isinstance(e, (ConnectionError, TimeoutError, PermissionError))
        or any(c in str(e) for c in _TRANSIENT)
        for e in _chain(error)
    )


def _reason(error: BaseException) -> str:
    """One short line: the innermost message that says what is wrong (tensorstore's, under Orbax's)."""
    for e in reversed(_chain(error)):
        text = " ".join(str(e).split()).split(" See full TensorStore details")[0]
        if text:
            return f"{type(e).__name__}: {text}"[:240]
    return type(error).__name__


@contextlib.contextmanager
def _quiet_abandoned_reads(abandoned: Callable[[], bool]) -> Iterator[None]:
    """A failed restore abandons Orbax's other array reads; when collected, each prints "Exception
    ignored in <coroutine>" or asyncio's "Task exception was never retrieved" with a traceback
    (2500 lines for the tiny model). The one line that says the step is unusable is the report.
    ``abandoned()``: whether a restore failed, so that there is garbage to collect (a full
    collection after the trainer's imports is not free, and would be paid on every start-up).

    A read still in flight when Orbax gave up (on gs://) completes later on tensorstore's thread and
    calls back into Orbax's closed event loop: "RuntimeError: Event loop is closed", an unraisable
    error without an object, which the default hook prints as a bare traceback. It may come after
    this block, so once a restore was abandoned those stay quiet for the process's life."""
    previous = sys.unraisablehook
    asyncio_log = logging.getLogger("asyncio")
    level = asyncio_log.level
    asyncio_log.setLevel(logging.CRITICAL)

    def hook(unraisable: Any) -> None:
        if not (inspect.iscoroutine(unraisable.object) or _closed_loop(unraisable.exc_value)):
            previous(unraisable)

    def late(unraisable: Any) -> None:
        if not _closed_loop(unraisable.exc_value):
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        if abandoned():
            # The abandoned coroutines go now, while the hook is in place. One never started says
            # so as a RuntimeWarning ("coroutine ... was never awaited"), not an unraisable error:
            # two more lines of a trainer's stderr beside the one that reports the step.
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "coroutine .* was never awaited", RuntimeWarning)
                gc.collect()
        sys.unraisablehook = late if abandoned() else previous
        asyncio_log.setLevel(level)


def _closed_loop(error: BaseException | None) -> bool:
    return isinstance(error, RuntimeError) and str(error) == "Event loop is closed"


def _move(src: epath.Path, dst: epath.Path) -> None:
    """A rename locally; object by object on an object store (gcsfs's move falls back to this after
    logging a traceback where the bucket has no moveTo, as non-HNS buckets do)."""
    if "://" not in str(src):
        src.rename(dst)
        return
    for f in _files(src):
        f.copy(dst / str(f)[len(str(src)) + 1 :])
    src.rmtree()


def _files(root: epath.Path) -> list[epath.Path]:
    """Every file under `root` (epath refuses `**` on gs://)."""
    out: list[epath.Path] = []
    for p in root.iterdir():
        out += _files(p) if p.is_dir() else [p]
    return out
