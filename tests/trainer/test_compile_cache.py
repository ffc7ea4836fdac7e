"""The per-process compile cache entries (trainer.compile_cache): what a process other than 0 loads
on simulated CPU devices, where JAX's own cache serves process 0 only."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from trainer import compile_cache


def test_only_processes_other_than_0_on_cpu_keep_their_own_entries() -> None:
    assert compile_cache.own_entries("cpu", 1) and compile_cache.own_entries("cpu", 3)
    assert not compile_cache.own_entries("cpu", 0)  # JAX's cache serves process 0
    assert not compile_cache.own_entries("tpu", 1)  # one key for every host of a slice


def test_an_entry_is_written_whole_and_one_cut_short_is_compiled_over(tmp_path: Path) -> None:
    # Loading a whole entry needs a fresh process (XLA:CPU does not load an executable into the
    # process that compiled it): the two-process resume in test_train.py shows it.
    lowered = jax.jit(lambda x: jnp.tanh(x) * 3).lower(jax.ShapeDtypeStruct((8,), np.float32))
    path, dev = epath.Path(tmp_path) / "process-1" / "entry", jax.devices()[:1]
    x = np.arange(8, dtype=np.float32)

    hits = compile_cache.hits()
    np.testing.assert_allclose(
        compile_cache.load_or_compile(lowered, path, dev)(x), np.tanh(x) * 3, rtol=1e-6
    )
    assert compile_cache.hits() == hits
    assert [p.name for p in path.parent.iterdir()] == ["entry"]  # no temporary left beside it
    whole = path.read_bytes()
    assert compile_cache._read_whole(path) == whole[32:]

    path.write_bytes(whole[:-100])  # cut short, as an interrupted copy leaves it
    assert compile_cache._read_whole(path) is None  # XLA would load it, and fail when it runs
    np.testing.assert_allclose(
        compile_cache.load_or_compile(lowered, path, dev)(x), np.tanh(x) * 3, rtol=1e-6
    )
    assert compile_cache.hits() == hits and compile_cache._read_whole(path) is not None  # written again
