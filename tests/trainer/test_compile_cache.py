"""The run's compile cache (trainer.state.compile_cache): the train step and the initial state stored
under keys known before tracing, and the per-process entries of lowered programs on simulated CPU
devices, where JAX's own cache serves process 0 only."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from etils import epath

from trainer.state import compile_cache


def test_on_cpu_the_entries_of_lowered_programs_are_kept_here() -> None:
    assert compile_cache.kept_here("cpu")
    assert not compile_cache.kept_here("tpu")  # one JAX key for every host of a slice


def test_an_entry_is_written_whole_and_one_cut_short_is_compiled_over(tmp_path: Path) -> None:
    # A constant of its own: no cache of an earlier run can hold this program.
    salt = float(np.random.default_rng().integers(1, 1_000_000))
    lowered = jax.jit(lambda x: jnp.tanh(x) * salt).lower(jax.ShapeDtypeStruct((8,), np.float32))
    path, dev = epath.Path(tmp_path) / "lowered" / "entry", jax.devices()[:1]
    x = np.arange(8, dtype=np.float32)

    hits = compile_cache.hits()
    executable, payload = compile_cache.load_or_compile(lowered, path, dev)
    np.testing.assert_allclose(executable(x), np.tanh(x) * salt, rtol=1e-6)
    assert compile_cache.hits() == hits
    assert [p.name for p in path.parent.iterdir()] == ["entry"]  # no temporary left beside it
    whole = path.read_bytes()
    assert compile_cache._read_whole(path) == whole[32:] == payload

    path.write_bytes(whole[:-100])  # cut short, as an interrupted copy leaves it
    assert compile_cache._read_whole(path) is None  # XLA would load it, and fail when it runs
    executable, _ = compile_cache.load_or_compile(lowered, path, dev)
    np.testing.assert_allclose(executable(x), np.tanh(x) * salt, rtol=1e-6)
    assert compile_cache.hits() == hits and compile_cache._read_whole(path) is not None  # written again

    executable, _ = compile_cache.load_or_compile(lowered, path, dev)  # whole now: loaded
    np.testing.assert_allclose(executable(x), np.tanh(x) * salt, rtol=1e-6)
    assert compile_cache.hits() == hits + 1


def test_the_train_step_loads_without_tracing_and_a_changed_config_misses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compile_cache, "_dir", str(tmp_path))  # enable() would also set JAX's cache
    traced: list[int] = []
    made: list[int] = []
    salt = float(np.random.default_rng().integers(1, 1_000_000))

    def jitted() -> jax.stages.Wrapped:
        """A function of its own each time: JAX keeps one trace per function, this test none."""
        made.append(1)  # a hit never builds it (the loop's builds it with flax)

        def step(x: jax.Array) -> jax.Array:
            traced.append(1)  # runs once per trace
            return jnp.tanh(x) * salt

        return jax.jit(step)

    args, dev = (jax.ShapeDtypeStruct((8,), np.float32),), jax.devices()[:1]
    x = np.arange(8, dtype=np.float32)
    hits = compile_cache.hits()
    first = compile_cache.train_step(jitted, args, dev, {"optim": {"lr": 1.0}})
    assert len(traced) == 1 and compile_cache.hits() == hits
    # A new function would be traced if it were lowered: the entry is loaded instead.
    again = compile_cache.train_step(jitted, args, dev, {"optim": {"lr": 1.0}})
    assert len(traced) == 1 and len(made) == 1 and compile_cache.hits() == hits + 1
    np.testing.assert_allclose(again(x), first(x), rtol=0)
    assert len(list((tmp_path / "train-step").iterdir())) == 1

    compile_cache.train_step(jitted, args, dev, {"optim": {"lr": 2.0}})  # another config
    assert len(traced) == 2 and len(list((tmp_path / "train-step").iterdir())) == 2
    other_shape = (jax.ShapeDtypeStruct((4,), np.float32),)
    compile_cache.train_step(jitted, other_shape, dev, {"optim": {"lr": 1.0}})
    assert len(traced) == 3

    # A whole entry that is not a train step (another writer's format): compiled over, not run.
    for entry in (tmp_path / "train-step").iterdir():
        compile_cache._write_whole(epath.Path(entry), b"not a pickled executable")
    np.testing.assert_allclose(
        compile_cache.train_step(jitted, args, dev, {"optim": {"lr": 1.0}})(x), first(x), rtol=0
    )
    assert len(traced) == 4


def test_runs_sharing_a_cache_compile_a_program_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs that miss one entry at once (the suite's workers, a machine's runs sharing
    JAX_COMPILATION_CACHE_DIR): the second waits for the first's compile and loads its entry; a
    lock held past SHARED_WAIT_S (a stopped holder) is given up and the program compiled."""
    monkeypatch.setattr(compile_cache, "_dir", str(tmp_path))
    salt = float(np.random.default_rng().integers(1, 1_000_000))
    args, dev, program = (jax.ShapeDtypeStruct((8,), np.float32),), jax.devices()[:1], {"optim": {"lr": 1.0}}
    made: list[str] = []
    inside, finish = threading.Event(), threading.Event()

    def maker(run: str, hold: bool = False):
        def make() -> jax.stages.Wrapped:
            made.append(run)
            if hold:  # still tracing and compiling while the other run misses the entry
                inside.set()
                finish.wait(30)
            return jax.jit(lambda x: jnp.tanh(x) * salt)

        return make

    got: dict[str, jax.stages.Compiled] = {}
    first = threading.Thread(
        target=lambda: got.update(a=compile_cache.train_step(maker("a", True), args, dev, program))
    )
    first.start()
    assert inside.wait(30)
    hits = compile_cache.hits()
    second = threading.Thread(
        target=lambda: got.update(b=compile_cache.train_step(maker("b"), args, dev, program))
    )
    second.start()
    time.sleep(1.0)
    assert second.is_alive() and made == ["a"]  # waiting for the first, not compiling
    finish.set()
    first.join(30)
    second.join(30)
    assert made == ["a"] and compile_cache.hits() == hits + 1  # the second loaded the first's entry
    x = np.arange(8, dtype=np.float32)
    np.testing.assert_allclose(got["b"](x), got["a"](x), rtol=0)
    (entry,) = (tmp_path / "train-step").iterdir()  # the entries' folder holds entries only
    assert [p.name for p in (tmp_path / "locks").iterdir()] == [f"train-step-{entry.name}"]

    # A holder that never lets go (stopped, say): the wait ends and this process compiles.
    monkeypatch.setattr(compile_cache, "SHARED_WAIT_S", 0.5)
    other = {"optim": {"lr": 2.0}}
    key = compile_cache.program_key(other, args, dev)
    with open(tmp_path / "locks" / f"train-step-{key}", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        t0 = time.monotonic()
        compile_cache.train_step(maker("c"), args, dev, other)
        assert made == ["a", "c"] and time.monotonic() - t0 >= 0.5


def test_the_initial_state_loads_without_tracing_and_serves_every_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compile_cache, "_dir", str(tmp_path))
    lowered: list[str] = []
    salt = float(np.random.default_rng().integers(1, 1_000_000))

    def lower() -> jax.stages.Lowered:
        lowered.append("lowered")  # the loop's traces the model's initializers with flax here
        return jax.jit(lambda seed: jnp.arange(8, dtype=jnp.float32) * seed * salt).lower(
            jax.ShapeDtypeStruct((), jnp.uint32)
        )

    dev, hits = jax.devices()[:1], compile_cache.hits()
    first = compile_cache.initial_state(lower, dev, {"model": {"d": 1}})
    assert lowered == ["lowered"] and compile_cache.hits() == hits
    again = compile_cache.initial_state(lower, dev, {"model": {"d": 1}})
    assert lowered == ["lowered"] and compile_cache.hits() == hits + 1  # loaded, never lowered
    np.testing.assert_array_equal(again(np.uint32(1)), first(np.uint32(1)))
    # The seed is the program's argument: one entry, every seed's values.
    np.testing.assert_array_equal(again(np.uint32(2)), first(np.uint32(1)) * 2)
    compile_cache.initial_state(lower, dev, {"model": {"d": 2}})  # another program
    assert lowered == ["lowered"] * 2 and len(list((tmp_path / "initial-state").iterdir())) == 2


def test_the_keys_hold_the_options_xla_parsed_not_the_variable() -> None:
    """This process parsed XLA_FLAGS at -O0 and set the variable back to the trainers' -O1
    (tests/conftest.py): a process started with that variable parses -O1, and its keys differ from
    this process's, so neither loads the other's executables; two such processes agree."""
    code = "from trainer.state import compile_cache; print(compile_cache.xla_options())"
    theirs = [
        subprocess.run([sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True)
        for _ in range(2)
    ]
    assert [p.returncode for p in theirs] == [0, 0], theirs[0].stderr[-2000:]
    assert theirs[0].stdout == theirs[1].stdout
    assert theirs[0].stdout.strip() != compile_cache.xla_options()
    assert "--xla_backend_optimization_level=1" in os.environ["XLA_FLAGS"]


def test_the_key_covers_the_code_the_devices_and_the_arguments(tmp_path: Path) -> None:
    package = Path(compile_cache.__file__).resolve().parents[1]
    assert (package / "model" / "attention.py").is_file()  # the whole trainer, not trainer/state alone
    shutil.copytree(package, tmp_path / "trainer", ignore=shutil.ignore_patterns("__pycache__"))
    copy = compile_cache.source_digest(tmp_path / "trainer")
    assert copy == compile_cache.source_digest()  # names and contents, not where they are
    with open(tmp_path / "trainer" / "model" / "attention.py", "a") as f:
        f.write("\n# a comment is a change too\n")
    edited = compile_cache.source_digest(tmp_path / "trainer")
    assert edited != copy

    devs = jax.devices()[:2]
    args = (jax.ShapeDtypeStruct((8,), np.float32),)
    base = compile_cache.program_key({"a": 1}, args, devs)
    assert base == compile_cache.program_key({"a": 1}, args, devs, sources=copy)
    assert base != compile_cache.program_key({"a": 1}, args, devs, sources=edited)
    assert base != compile_cache.program_key({"a": 2}, args, devs)
    assert base != compile_cache.program_key({"a": 1}, (jax.ShapeDtypeStruct((8,), np.int32),), devs)
    assert base != compile_cache.program_key({"a": 1}, (args[0], args[0]), devs)
    assert base != compile_cache.program_key({"a": 1}, args, devs[::-1])


def test_the_abstract_state_is_kept_and_rebuilt_on_the_current_mesh(
    cpu8: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer import config, step
    from trainer.model.mesh import mesh_for
    from trainer.state.compile_cache import program

    monkeypatch.setattr(compile_cache, "_dir", str(tmp_path))
    cfg = config.resolve("tiny", ["mesh.fsdp=2"], {})
    mesh = mesh_for(cfg)
    with jax.set_mesh(mesh):
        traced = step.plain(step.abstract_state(cfg, mesh)[1])
    built: list[int] = []

    def build() -> dict:
        built.append(1)
        return traced

    def untraceable() -> dict:
        raise AssertionError("traced although the cache holds the abstract state")

    assert compile_cache.abstract_state(program(cfg), mesh, build) is traced and built == [1]
    kept = compile_cache.abstract_state(program(cfg), mesh, untraceable)
    assert jax.tree.structure(kept) == jax.tree.structure(traced)
    for a, b in zip(jax.tree.leaves(kept), jax.tree.leaves(traced), strict=True):
        assert (a.shape, a.dtype, a.sharding) == (b.shape, b.dtype, b.sharding)
    assert any(len(set(a.sharding.spec) - {None}) for a in jax.tree.leaves(kept))  # sharded leaves
    # Another model, or another mesh, is traced again.
    compile_cache.abstract_state(
        program(config.resolve("tiny", ["mesh.fsdp=2", "model.d_model=32"], {})), mesh, build
    )
    other = mesh_for(config.resolve("tiny", ["mesh.fsdp=4"], {}))
    compile_cache.abstract_state(program(cfg), other, build)
    assert built == [1, 1, 1]


def test_the_program_key_leaves_out_what_only_the_host_reads() -> None:
    from trainer import config
    from trainer.state.compile_cache import program

    base = config.resolve("tiny", ["train.steps=40"], {})
    same = [
        ["train.steps=42", "optim.decay_steps=40"],  # extended, the schedule unchanged
        ["train.steps=40", "checkpoint.interval=3", "metrics.log_every=1", "train.seed=7"],
        ["train.steps=40", "train.stall_timeout_s=9", "data.prefetch=4"],
        ["train.steps=40", "train.profile_steps=[2, 3]"],  # a trace around the same executable
        ["train.steps=40", "train.global_batch=32", "train.micro_batch=2"],  # in the step's arguments
    ]
    for sets in same:
        assert program(config.resolve("tiny", sets, {})) == program(base), sets
    for sets in (
        ["train.steps=42"],
        ["train.steps=40", "optim.lr=0.1"],
        ["train.steps=40", "model.d_model=32"],
    ):
        assert program(config.resolve("tiny", sets, {})) != program(base), sets  # decay follows steps


def test_the_initializer_is_one_program_whatever_the_batch_plan(cpu8: list) -> None:
    """compile_cache.program leaves BATCH_PLAN out of every key, the initializer's and the abstract
    state's too: sound only while the initial state does not depend on it (the MoE's buffers, say,
    sized by the micro-batch). The train step's arguments carry it (its key's `args`)."""
    from trainer import config, step
    from trainer.model.mesh import mesh_for
    from trainer.state.compile_cache import BATCH_PLAN

    def initializer(sets: list[str]) -> str:
        cfg = config.resolve("tiny", ["mesh.fsdp=2", *sets], {})
        mesh = mesh_for(cfg)
        with jax.set_mesh(mesh):
            return step.lower_initial_state(cfg, step.abstract_state(cfg, mesh)[1]).as_text()

    base = initializer(["train.global_batch=16"])
    assert initializer(["train.global_batch=32", "train.micro_batch=2", "train.grad_accum=4"]) == base
    assert initializer(["train.global_batch=16", "model.d_model=32"]) != base  # the model: another
    assert set(BATCH_PLAN) <= set(config.TrainConfig.__dataclass_fields__)


def test_compile_options_this_xla_refuses_are_left_out_one_by_one_and_said(capsys) -> None:
    """The initializer's options off a CPU (``INITIALIZER_OPTIONS``): one this XLA does not know is
    left out, named, and the others still apply; the program computes the same."""
    lowered = jax.jit(lambda x: x * 2 + 1).lower(jnp.ones(4))
    options = {**compile_cache.INITIALIZER_OPTIONS, "no_such_option": 1}
    executable = compile_cache.compile_with(lowered, options)
    np.testing.assert_array_equal(np.asarray(executable(jnp.ones(4))), np.full(4, 3.0))
    said = capsys.readouterr().out
    assert "compile option no_such_option not taken" in said
    assert all(f"option {k} not taken" not in said for k in compile_cache.INITIALIZER_OPTIONS)
