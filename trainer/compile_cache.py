"""JAX's persistent compilation cache under the run directory (``<run_dir>/compile_cache``).

A segment on a shape the run has run before loads the train step's executable instead of compiling
it again (minutes for a 7B on TPU, paid on every shrink and grow otherwise). The cache key covers
the program, its shardings, the devices' topology and the compiler version, so a different shape
or config simply misses. The path is local or gs:// (JAX reads and writes it through
``etils.epath``); in a multi-process run JAX writes an entry from one process only.

``JAX_COMPILATION_CACHE_DIR``, when set, wins: one cache shared by many runs (a cache baked into
the image, a team bucket, the test suite's) is the operator's choice, and JAX already reads it.

``hits()`` counts JAX's own ``/jax/compilation_cache/cache_hits`` events (and the loads below), so
the loop can report whether its compile was a load (``perf/compile_cache_hits``).

On simulated CPU devices with several processes JAX's cache serves process 0 only: its key hashes
the CPU client's topology, which differs per process (``jax/_src/cache_key.py``,
``_hash_accelerator_config``), and JAX writes entries from process 0 only (``compiler.py``,
``_cache_write``), so every other process compiled the train step again on every segment while
process 0 waited for it at the start barrier (bench.recovery). There ``compiled`` keeps one entry per process under
``<cache>/process-<i>/``, written by that process with JAX's own executable serialization. On TPU
the key hashes the slice's topology, the same on every host, and JAX's cache alone is used.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Sequence

import jax
from etils import epath
from jax.experimental import serialize_executable
from jax.experimental.compilation_cache import compilation_cache

_dir: str | None = None
_hits = 0


def _listen(event: str, **_: object) -> None:
    global _hits
    if event == "/jax/compilation_cache/cache_hits":
        _hits += 1


def enable(run_dir: str) -> str:
    """Point JAX's cache at this run directory (before the first compile of the run)."""
    global _dir
    path = os.environ.get("JAX_COMPILATION_CACHE_DIR") or f"{run_dir.rstrip('/')}/compile_cache"
    if _dir is None:
        jax.monitoring.register_event_listener(_listen)
        # Cache every executable: the default 1 s threshold would skip the small programs of a run
        # and, on a fast compile, the train step itself.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if path != _dir:
        if _dir is not None:  # another run in the same process (tests, benchmarks)
            compilation_cache.reset_cache()
        compilation_cache.set_cache_dir(path)
        _dir = path
    return path


def hits() -> int:
    return _hits


def own_entries(platform: str, process_index: int) -> bool:
    """Whether this process keeps its own entries: JAX's key differs per process only on CPU, and
    JAX's cache serves process 0."""
    return platform == "cpu" and process_index > 0


def compiled(lowered: jax.stages.Lowered, devices: Sequence[jax.Device]) -> jax.stages.Compiled:
    """``lowered.compile()`` for ``devices`` (the mesh's, in its order), loaded from this process's
    own entry where JAX's cache cannot serve it."""
    if _dir is None or not own_entries(jax.default_backend(), jax.process_index()):
        return lowered.compile()
    return load_or_compile(lowered, entry_path(lowered, [d.id for d in devices]), devices)


def entry_path(lowered: jax.stages.Lowered, device_ids: Sequence[int]) -> epath.Path:
    """The program (its shardings included), the devices it runs on, this process, the compiler."""
    key = hashlib.sha256()
    for part in (
        lowered.as_text(),
        ",".join(map(str, device_ids)),
        str(jax.process_index()),
        jax.__version__,
        jax.lib.__version__,
        os.environ.get("XLA_FLAGS", ""),
    ):
        key.update(part.encode())
        key.update(b"\0")
    return epath.Path(_dir) / f"process-{jax.process_index()}" / key.hexdigest()


def load_or_compile(
    lowered: jax.stages.Lowered, path: epath.Path, devices: Sequence[jax.Device]
) -> jax.stages.Compiled:
    """Load the entry at ``path`` if it is whole, else compile and write it."""
    global _hits
    payload = _read_whole(path)
    if payload is not None:
        try:
            executable = serialize_executable.deserialize_and_load(
                payload, lowered.in_tree, lowered.out_tree, execution_devices=list(devices)
            )
        except Exception as e:  # whole but not loadable here: compile instead
            print(f"trainer: compile cache entry {path} unusable ({type(e).__name__}), compiling", flush=True)
        else:
            _hits += 1
            return executable
    executable = lowered.compile()
    payload, _, _ = serialize_executable.serialize(executable)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written aside, then renamed: a reader never sees half an entry from this writer.
        tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}"
        tmp.write_bytes(hashlib.sha256(payload).digest() + payload)
        tmp.replace(path)
    except OSError as e:  # a cache is an optimization: the run goes on without the entry
        print(f"trainer: compile cache entry {path} not written ({e})", flush=True)
    return executable


def _read_whole(path: epath.Path) -> bytes | None:
    """The entry's payload if its checksum holds: XLA loads a truncated executable without an
    error and fails only when it runs."""
    if not path.exists():
        return None
    data = path.read_bytes()
    digest, payload = data[:32], data[32:]
    if hashlib.sha256(payload).digest() != digest:
        print(f"trainer: compile cache entry {path} is not whole, compiling", flush=True)
        return None
    return payload
