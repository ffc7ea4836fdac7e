"""JAX's persistent compilation cache under the run directory (``<run_dir>/compile_cache``).

A segment on a shape the run has run before loads the train step's executable instead of compiling
it again (minutes for a 7B on TPU, paid on every shrink and grow otherwise). The cache key covers
the program, its shardings, the devices' topology and the compiler version, so a different shape
or config simply misses. The path is local or gs:// (JAX reads and writes it through
``etils.epath``); in a multi-process run JAX writes an entry from one process only.

``JAX_COMPILATION_CACHE_DIR``, when set, wins: one cache shared by many runs (a cache baked into
the image, a team bucket, the test suite's) is the operator's choice, and JAX already reads it.

``hits()`` counts JAX's own ``/jax/compilation_cache/cache_hits`` events, so the loop can report
whether its compile was a load (``perf/compile_cache_hits``).
"""

from __future__ import annotations

import os

import jax
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
