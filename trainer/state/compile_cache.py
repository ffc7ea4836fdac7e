"""The run's compile cache (``<run_dir>/compile_cache``): JAX's persistent compilation cache, and
the train step's and the initial state's executables stored under keys known before tracing.

A segment on a shape the run has run before loads the train step's executable instead of compiling
it again (minutes for a 7B on TPU, paid on every shrink and grow otherwise). The path is local or
gs:// (JAX reads and writes it through ``etils.epath``).

``JAX_COMPILATION_CACHE_DIR``, when set, wins: one cache shared by many runs (a cache baked into
the image, a team bucket, the test suite's) is the operator's choice, and JAX already reads it.

Two levels, the first tried first (``train_step``; ``initial_state`` for a fresh start's
initializer, keyed alike with the seed beside the program), and the state's abstract values beside
them (``abstract_state``: the restore target and the executable's key, without tracing the model).
With these in the cache a trainer, resumed or fresh, never imports flax or optax (trainer/step.py).

- **The train step without tracing** (``<cache>/train-step/``). JAX's cache key hashes the lowered
  program, so a hit still traces and lowers the flax nnx step (most of a hit's CPU for
  ``tiny``; far more for a large model). Here the key is what the program is a function of: the
  trainer's own source files, the versions of the libraries that trace and compile it (jax, jaxlib,
  flax, optax, numpy, Python), the resolved config less what only the host reads (``program``),
  the arguments' tree, shapes, dtypes and shardings, the mesh and its devices in order, the
  platform and process count, JAX's configuration values and the ``JAX_*`` / ``XLA_*`` /
  ``LIBTPU_INIT_ARGS`` environment. The entry holds the serialized executable and its argument and
  result trees (``jax.experimental.serialize_executable``). A library patched in place without a
  version change is the one change the key cannot see: turn ``train.compile_cache`` off or empty
  the cache then.
- **The lowered program** (a miss above): JAX's own cache, whose key covers the program, its
  shardings, the devices' topology and the compiler version. On simulated CPU devices with several
  processes it would serve process 0 only: its key hashes the CPU client's topology, which differs
  per process (``jax/_src/cache_key.py``, ``_hash_accelerator_config``), and JAX writes entries
  from process 0 only (``compiler.py``, ``_cache_write``). So on CPU this module keeps the entries
  of lowered programs itself, under ``<cache>/lowered/`` (``load_or_compile``), keyed by the
  program and its devices but not the process: one executable serves every process.

On CPU the processes of a run share one machine's cores (simulated hosts), and N of them compiling
the same program at once took N times its CPU (docs/measurements.md, "Figures behind the code's
constants"). So there process 0 resolves each program first and the others load what it wrote
(``_process_0_first``). On TPU each host compiles on its own CPUs at the same time, so none
waits: JAX's key is the same on every host of a slice, and process 0 writes the train-step entry.
Runs that share a local cache (``JAX_COMPILATION_CACHE_DIR``: a machine's runs, the test suite's
workers) compile each program once too: whoever resolves a key first holds a lock named for the
entry while it compiles, and the others wait, then load the entry (``_one_at_a_time``). A gs://
cache has no such lock: each host compiles on its own CPUs.
Entries are written only from an executable compiled by this process or an earlier one, never
from one JAX's cache loaded (``_compile``). Entries carry a sha256 of their payload and are
written aside, then renamed: a reader never loads half an entry.

``hits()`` counts JAX's own ``/jax/compilation_cache/cache_hits`` events and the loads here, so
the loop can report whether its compile was a load (``perf/compile_cache_hits``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pickle
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import jax
import numpy as np
from etils import epath
from jax.experimental import serialize_executable
from jax.experimental.compilation_cache import compilation_cache
from jax.sharding import Mesh, NamedSharding
from orbax.checkpoint import multihost

from trainer.config import Config, decay_steps

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
        # Cache every executable: JAX's default minimum compile time would skip the small programs of
        # a run and, on a fast compile, the train step itself.
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


def kept_here(platform: str) -> bool:
    """Whether this module keeps the entries of lowered programs rather than JAX's cache: on CPU,
    where JAX's key differs per process and JAX's cache serves process 0 only."""
    return platform == "cpu"


def entry_path(lowered: jax.stages.Lowered, device_ids: Sequence[int]) -> epath.Path:
    """The program (its shardings included), the devices it runs on, the compiler."""
    key = hashlib.sha256()
    for part in (
        lowered.as_text(),
        ",".join(map(str, device_ids)),
        jax.__version__,
        jax.lib.__version__,
        os.environ.get("XLA_FLAGS", ""),
        xla_options(),
    ):
        key.update(part.encode())
        key.update(b"\0")
    return epath.Path(_dir) / "lowered" / key.hexdigest()


def xla_options() -> str:
    """sha256 of the compile options XLA builds in this process, its parsed flags among them. XLA
    reads ``XLA_FLAGS`` once per process, at the first compile option it builds, so the variable
    may say otherwise by then: the test suite's own process compiles at -O0 and its trainers at -O1
    (tests/conftest.py), and an executable of one must never be loaded as the other's."""
    from jax._src.lib import xla_client  # no public name for it; the jax version is in every key

    return hashlib.sha256(xla_client.CompileOptions().SerializeAsString()).hexdigest()


# How long a process waits for process 0 to resolve a program before compiling it itself: as long
# as the first process waits for the last to join (trainer.elastic.distributed.INIT_TIMEOUT_S). A process 0
# that dies meanwhile ends this one sooner (the coordination service's heartbeat).
SHARED_WAIT_S = 900.0


@contextlib.contextmanager
def _process_0_first(site: str, path: epath.Path) -> Iterator[None]:
    """Around resolving the entry at ``path`` (load, or compile and write) at ``site``
    ("initial-state", "train-step"): on CPU with several processes, process 0 announces in the coordination
    service's key-value store once it is done (loaded, written, or failed: then the others compile
    for themselves), and any other process that finds no entry waits for that first. The
    announcement carries the entry's name: a process whose key came out different (an environment
    of its own) compiles for itself instead of waiting for an entry that will never come."""
    shared = _dir is not None and kept_here(jax.default_backend()) and jax.process_count() > 1
    if shared and jax.process_index() != 0 and not path.exists():
        announced = _await_announcement(f"reslice/compile-cache/{site}")
        if announced is not None and announced != path.name:
            print(f"trainer: process 0's {site} program differs from this process's, compiling", flush=True)
    try:
        yield
    finally:
        if shared and jax.process_index() == 0:
            try:
                client = multihost.get_jax_distributed_client()
                client.key_value_set(f"reslice/compile-cache/{site}", path.name, allow_overwrite=True)
            except Exception as e:  # the others then wait out SHARED_WAIT_S, or die with the group
                print(f"trainer: {site} program not announced to the other processes ({e})", flush=True)


@contextlib.contextmanager
def _one_at_a_time(path: epath.Path, poll_s: float = 0.1) -> Iterator[None]:
    """Around resolving the entry at a local ``path``: an exclusive lock on a file named for it
    (in ``<cache>/locks/``, so that the entries' folders hold entries only). Of the processes on
    this machine that miss the entry at once (other runs sharing the cache), one compiles and the
    others then load what it wrote. Taken in short non-blocking tries, so that a SIGTERM meanwhile
    runs its handler; given up after SHARED_WAIT_S (a holder stopped, not dead: the kernel
    releases a dead one's lock), and then this process compiles too."""
    fd = None
    if "://" not in str(path):  # gs://: no lock across hosts; each compiles, as with JAX's own cache
        lock = path.parent.parent / "locks" / f"{path.parent.name}-{path.name}"
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
        except OSError as e:  # a cache is an optimization: compile without the lock
            print(f"trainer: compile cache lock for {path} not taken ({e})", flush=True)
    try:
        deadline, said = time.monotonic() + SHARED_WAIT_S, False
        while fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    print(f"trainer: {path} still locked after {SHARED_WAIT_S:.0f} s, compiling", flush=True)
                    break
                if not said:
                    print(f"trainer: another process compiles {path.name[:12]}, waiting for it", flush=True)
                    said = True
                time.sleep(poll_s)
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def _await_announcement(key: str, chunk_ms: int = 200) -> str | None:
    """Process 0's announcement under ``key``, or None after SHARED_WAIT_S. Waited for in short
    blocking gets: a blocked C++ call runs no Python signal handler (a SIGTERM meanwhile)."""
    client = multihost.get_jax_distributed_client()
    deadline = time.monotonic() + SHARED_WAIT_S
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        try:
            return client.blocking_key_value_get(key, chunk_ms)
        except Exception:  # DEADLINE_EXCEEDED until process 0 announces
            time.sleep(max(0.0, chunk_ms / 1000 - (time.monotonic() - t0)))  # no spin on a fast error
    print(f"trainer: process 0 did not announce {key} within {SHARED_WAIT_S:.0f} s, compiling", flush=True)
    return None


def load_or_compile(
    lowered: jax.stages.Lowered, path: epath.Path, devices: Sequence[jax.Device]
) -> tuple[jax.stages.Compiled, bytes | None]:
    """Load the entry at ``path`` if it is whole, else compile and write it; the executable and its
    serialization (``_compile``)."""
    whole = _read_whole(path)
    if whole is not None:
        entry = whole  # bound for the closure: the checker does not narrow a name into a lambda
        executable = _load(path, lambda: (entry, lowered.in_tree, lowered.out_tree), devices)
        if executable is not None:
            return executable, whole
    executable, payload = _compile(lowered)
    if payload is not None:
        _write_whole(path, payload)
    return executable, payload


def _load(
    path: epath.Path, entry: Callable[[], tuple[bytes, Any, Any]], devices: Sequence[jax.Device]
) -> jax.stages.Compiled | None:
    """The executable of a whole entry (``entry()``: its serialization, argument and result trees),
    counted as a hit; None where it does not load here: then the caller compiles."""
    global _hits
    try:
        payload, in_tree, out_tree = entry()
        executable = serialize_executable.deserialize_and_load(
            payload, in_tree, out_tree, execution_devices=list(devices)
        )
    except Exception as e:  # whole but not loadable here: compile instead
        print(f"trainer: compile cache entry {path} unusable ({type(e).__name__}), compiling", flush=True)
        return None
    _hits += 1
    return executable


# The initializer's compile options off a CPU. It runs once, so its compile is all that counts, and
# on a fresh start it compiles beside the train step: the longer of the two holds the first step.
# Its random numbers come from counters (iotas) that are constants of the program, which XLA's TPU
# compiler would fold on the host element by element: computed on the device instead. The least
# optimisation effort besides: the same values, compiled in about half the time, under the train
# step's (docs/measurements.md, "Recovery at olmo-7b's shape").
INITIALIZER_OPTIONS: dict[str, Any] = {
    "xla_disable_hlo_passes": "constant_folding",
    "exec_time_optimization_effort": -1.0,
    "xla_backend_optimization_level": 0,
}


def _compile(
    lowered: jax.stages.Lowered, options: dict[str, Any] | None = None
) -> tuple[jax.stages.Compiled, bytes | None]:
    """``lowered.compile()`` and, when it was compiled here, its serialization; None when JAX's
    cache loaded it. On XLA:CPU serializing a loaded executable gives a payload without the
    compiled functions (``NOT_FOUND: Function ... not found`` when it runs), so on CPU, where this
    module's entries stand in for JAX's cache, programs are compiled without JAX's."""
    if kept_here(jax.default_backend()):
        with _jax_cache_off():
            executable = lowered.compile()
        return executable, serialize_executable.serialize(executable)[0]
    hits = _hits
    executable = compile_with(lowered, options) if options else lowered.compile()
    if _hits > hits:
        return executable, None
    return executable, serialize_executable.serialize(executable)[0]


def compile_with(lowered: jax.stages.Lowered, options: dict[str, Any]) -> jax.stages.Compiled:
    """``lowered`` compiled with ``options``; where this XLA refuses them, with fewer (the last one
    left out, then the one before), at worst with none."""
    keys = list(options)
    while True:
        try:
            return lowered.compile(compiler_options={k: options[k] for k in keys})
        except Exception as e:  # an option this compiler does not take
            if not keys:
                raise
            print(
                f"trainer: compile option {keys[-1]} not taken ({type(e).__name__}): compiling without",
                flush=True,
            )
            keys.pop()


@contextlib.contextmanager
def _jax_cache_off() -> Iterator[None]:
    # JAX decides whether its cache is used once per process; reset_cache makes it decide again.
    before = jax.config.values["jax_enable_compilation_cache"]
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", before)
        compilation_cache.reset_cache()


def _write_whole(path: epath.Path, payload: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written aside, then renamed: a reader never sees half an entry from this writer.
        tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}"
        tmp.write_bytes(hashlib.sha256(payload).digest() + payload)
        tmp.replace(path)
    except OSError as e:  # a cache is an optimization: the run goes on without the entry
        print(f"trainer: compile cache entry {path} not written ({e})", flush=True)


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


# The trainer package (this file's grandparent since the trainer's folders): every module of it,
# the model's above all, may shape the program.
_SOURCES = Path(__file__).resolve().parents[1]
_source_digest: str | None = None


def source_digest(package: Path = _SOURCES) -> str:
    """sha256 over the trainer's source files (names and contents), once per process."""
    global _source_digest
    if package != _SOURCES or _source_digest is None:
        h = hashlib.sha256()
        for f in sorted(package.rglob("*.py")):
            h.update(f.relative_to(package).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
        if package != _SOURCES:
            return h.hexdigest()
        _source_digest = h.hexdigest()
    return _source_digest


def _describe(args: Any) -> str:
    """The arguments as the executable sees them: tree, then shape, dtype, weak type and sharding of
    every leaf (arrays or ShapeDtypeStructs)."""
    leaves, tree = jax.tree.flatten(args)
    return repr(tree) + "".join(
        f"\n{x.shape}|{x.dtype}|{getattr(x, 'weak_type', False)}|{x.sharding!r}" for x in leaves
    )


# What the host alone reads of the config: the compiled programs are not a function of it.
HOST_ONLY = ("name", "run_dir", "data", "eval", "checkpoint", "metrics")
HOST_ONLY_TRAIN = (
    "steps",
    "seed",
    "crash_at_step",
    "stall_timeout_s",
    "compile_cache",
    "debug_start_delay_s",
    "debug_step_pause_s",
    "init_from",  # a stage's source is read by the host; the step is the same program
    "init_optimizer",
    "profile_steps",  # a trace is taken around the step, of the same executable
)
# The batch plan, which the train step takes from its arguments' shapes (tokens [A, GB/A, T+1],
# in its key as `args`) and the state does not depend on: an auto micro-batch and the same one
# set by hand are one program, and a fresh start at another global batch on a mesh the cache has
# seen loads its initializer and abstract state.
BATCH_PLAN = ("global_batch", "micro_batch", "grad_accum")
# What the train step reads of the (otherwise host-only) data section: the EOS masks the loss and
# bounds the documents.
DATA_IN_STEP = ("eos_id",)


def program(cfg: Config) -> dict[str, Any]:
    """What the train step and the state's shapes are a function of (compile_cache's keys): the
    config less what only the host reads, with the schedule's decay steps resolved (``train.steps``
    counts through them only). So a run extended by more steps, a changed checkpoint or metrics
    cadence, or another run of the config sharing one cache (JAX_COMPILATION_CACHE_DIR) loads
    the train step without tracing. A field added to the config is in the key until named here."""
    out = {k: v for k, v in cfg.to_dict().items() if k not in HOST_ONLY}
    out["train"] = {k: v for k, v in out["train"].items() if k not in HOST_ONLY_TRAIN + BATCH_PLAN}
    out["data"] = {k: getattr(cfg.data, k) for k in DATA_IN_STEP}
    out["optim"] = {**out["optim"], "decay_steps": decay_steps(cfg)}
    return out


def _versions() -> list[str]:
    # The model's libraries by their installed version: importing them would cost a resumed
    # trainer the imports this cache saves it (flax imports linen, treescope and rich).
    return [
        jax.__version__,
        jax.lib.__version__,
        version("flax"),
        version("optax"),
        np.__version__,
        sys.version,
    ]


def program_key(
    program: dict[str, Any], args: Any, devices: Sequence[jax.Device], sources: str | None = None
) -> str:
    """The train step's key without tracing it: ``program`` (the resolved config, less what does not
    shape the program), ``sources`` (default: ``source_digest()``) and everything else the
    executable is a function of (module docstring)."""
    env = {k: v for k, v in os.environ.items() if k.startswith(("JAX_", "XLA_")) or k == "LIBTPU_INIT_ARGS"}
    platform = jax.default_backend()
    parts = {
        "sources": sources or source_digest(),
        "versions": _versions(),
        "program": program,
        "args": _describe(args),
        "devices": [(d.id, d.process_index, d.platform, d.device_kind) for d in devices],
        "platform": platform,
        "processes": jax.process_count(),
        "jax_config": sorted((k, repr(v)) for k, v in jax.config.values.items()),
        "env": sorted(env.items()),
        "xla_options": xla_options(),
    }  # fmt: skip
    return _digest(parts)


def _digest(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=repr).encode()).hexdigest()


def abstract_state(
    program: dict[str, Any], mesh: Mesh, build: Callable[[], dict], rebuild: bool = False
) -> dict:
    """The state's abstract values on ``mesh`` (trainer.step's ``plain`` form: a ShapeDtypeStruct
    with its NamedSharding per leaf): from this cache, else ``build()`` (flax tracing the model's
    initializers), then stored. An entry holds each leaf's path, shape, dtype and PartitionSpec;
    its key is what they are a function of: the program, the trainer's sources, the libraries'
    versions and the mesh's axes. Every process that misses writes the same entry (renamed into
    place: a reader never sees half of one). ``rebuild``: build and store over the entry, for one
    that a checkpoint of this very program did not restore into (a library changed in place)."""
    if _dir is None:
        return build()
    parts = {
        "sources": source_digest(),
        "versions": _versions(),
        "program": program,
        "mesh": dict(mesh.shape),
    }
    path = epath.Path(_dir) / "abstract-state" / _digest(parts)
    entry = None if rebuild else _read_whole(path)
    if entry is not None:
        try:
            out: dict = {}
            for keys, shape, dtype, spec in pickle.loads(entry):
                node = out
                for k in keys[:-1]:
                    node = node.setdefault(k, {})
                node[keys[-1]] = jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))
            return out
        except Exception as e:  # whole but not an entry of this format: build it instead
            print(f"trainer: compile cache entry {path} unusable ({type(e).__name__}), tracing", flush=True)
    abstract = build()
    leaves = [
        (tuple(k.key for k in keys), a.shape, a.dtype, a.sharding.spec)
        for keys, a in jax.tree_util.tree_flatten_with_path(abstract)[0]
    ]
    _write_whole(path, pickle.dumps(leaves))
    return abstract


def train_step(
    make: Callable[[], Any], args: tuple, devices: Sequence[jax.Device], program: dict[str, Any]
) -> jax.stages.Compiled:
    """``make().lower(*args).compile()`` for ``devices`` (the mesh's, in its order): loaded without
    tracing when this cache holds it (``make``, which builds the jitted step with flax, is then
    never called), else lowered and compiled through the second level, and stored for the next
    incarnation (module docstring)."""
    if _dir is None:
        return make().lower(*args).compile()
    path = epath.Path(_dir) / "train-step" / program_key(program, args, devices)
    return _keyed("train step", path, lambda: make().lower(*args), devices)


def _initial_state_path(devices: Sequence[jax.Device], program: dict[str, Any]) -> epath.Path:
    return epath.Path(str(_dir)) / "initial-state" / program_key(program, (), devices)  # (argument: the seed)


def initial_state_held(devices: Sequence[jax.Device], program: dict[str, Any]) -> bool:
    """Whether ``initial_state`` would find its entry (it still checks that it is whole and loads)."""
    return _dir is not None and _initial_state_path(devices, program).exists()


def initial_state(
    lower: Callable[[], jax.stages.Lowered], devices: Sequence[jax.Device], program: dict[str, Any]
) -> jax.stages.Compiled:
    """The initializer of a fresh start (``lower()``: traced and lowered, it takes the seed and
    returns the initial state in its shardings: trainer.step.lower_initial_state), keyed before
    tracing as the train step is: one entry serves every seed. A hit neither imports flax nor
    traces the model's initializers (docs/measurements.md)."""
    if _dir is None:
        return lower().compile()
    return _keyed("initial state", _initial_state_path(devices, program), lower, devices, INITIALIZER_OPTIONS)


def _keyed(
    what: str,
    path: epath.Path,
    lower: Callable[[], jax.stages.Lowered],
    devices: Sequence[jax.Device],
    options: dict[str, Any] | None = None,
) -> jax.stages.Compiled:
    """The executable of the entry at ``path`` (a key known before tracing), else ``lower()``
    compiled through the second level and stored at ``path``; process 0 first (on CPU)."""
    with _process_0_first(what.replace(" ", "-"), path), _one_at_a_time(path):
        entry = _read_whole(path)
        if entry is not None:
            loaded = _load(path, lambda: pickle.loads(entry), devices)
            if loaded is not None:
                print(f"trainer: {what} loaded without tracing from {path}", flush=True)
                return loaded
        lowered, ids = lower(), [d.id for d in devices]
        if kept_here(jax.default_backend()):
            executable, payload = load_or_compile(lowered, entry_path(lowered, ids), devices)
        else:
            executable, payload = _compile(lowered, options)  # (off a CPU only: see INITIALIZER_OPTIONS)
        if payload is not None and (kept_here(jax.default_backend()) or jax.process_index() == 0):
            _write_whole(path, pickle.dumps((payload, lowered.in_tree, lowered.out_tree)))
        return executable
