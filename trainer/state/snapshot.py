"""State from memory: in-memory snapshots of the train state, and a restore from them onto a new world.

An in-place run's pod outlives its trainer children (``trainer.elastic.supervisor``). Every
``checkpoint.memory_interval`` steps each process copies the shards of the state that it holds to a
file in the pod's memory directory (``RESLICE_MEMORY_DIR``, a directory the supervisor makes under
``/dev/shm``, which the renderer mounts as an ``emptyDir`` with ``medium: Memory``). The next child
in the same pod reads it back before it would read the run directory.

The copy overlaps training: the state after step n is copied on the devices (each distinct local
shard by ``jax.device_put`` with ``may_alias=False``, dispatched before step n + 1 donates the
state; ``_local_copies`` says why not the global arrays), and a thread moves the
copy to the host and writes it, while the devices run the next steps. At most ``IN_FLIGHT``
snapshots are on their way: the next one waits for the oldest (the host copy of the state after
step n can only start once step n is done, which is when the loop reaches step n + 1: with one in
flight the loop would wait for every copy). Each file is written under a temporary name and
renamed once its step's metrics record is written (RAM needs no fsync; a restore never skips a
step the metrics lack; the records of the steps since the previous snapshot are kept beside it as
``<step>.record.json``, for the world that restores that step when the previous world's process 0
never wrote them): a file named
``<step>.snap`` is complete, which is this process's "done step s" marker. Each process keeps its
``KEEP`` newest snapshots.

Why four: a process finishes step n only after every peer dispatched step n, and a process that
dispatched step n had finished its snapshot n - 3k (k, the interval; it waited for that one before
it started n - k, with two in flight). So the newest complete snapshots of any two live processes
are at most 3k apart, and a window of four holds the oldest of them everywhere: the processes
agree on the newest step that all of them hold, as Orbax's commit needs every process's part.

The restore (``restore``): each process lists the snapshots whose meta matches this run (config
hash, global batch, run directory) and, for the new world's shardings, whether it holds every
shard its devices need (compared by the shard's index into the global array, so any device order
that gives a process the same blocks it held before will do; with data parallelism across slices
and ``trainer.model.mesh``'s slice-major device order, a surviving slice's processes hold exactly their
blocks). The processes agree through the coordination service's key-value store on the newest step
every one of them can serve; none: the run directory, as before (``docs/contract.md``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import struct
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from contract import envvars
from contract.words import StateSource

IN_FLIGHT = 2
KEEP = IN_FLIGHT + 2
_MAGIC = b"RESLICE-SNAPSHOT-1\n"
_ALIGN = 64
_NAME = re.compile(r"^(\d+)\.snap$")
_RECORD = re.compile(r"^(\d+)\.record\.json$")


def _key(index: tuple[slice, ...], shape: tuple[int, ...]) -> str:
    """A shard's place in its global array, as text: ``"0:4,0:64"``."""
    return ",".join(f"{a}:{b}" for (a, b, _) in (s.indices(d) for s, d in zip(index, shape, strict=True)))


def _leaves(tree: Any) -> list[tuple[str, Any]]:
    return [(jax.tree_util.keystr(p), leaf) for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


class NoRoom(Exception):
    """The devices have no room for a copy of the state (``_local_copies``)."""


def _local_copies(leaves: list[tuple[str, jax.Array]], on_device: bool = True) -> list[list[tuple[str, Any]]]:
    """Per leaf, copies of this process's distinct shards (one per place in the global array: a
    shard replicated on several local devices is copied once), each on its own device, all in one
    batched ``device_put`` (a call per shard took 2.7 times as long to dispatch). A single-device
    copy is dispatched behind the step in flight; a global device_put in a multi-process run is a
    jitted copy per leaf (jax._src.dispatch), which waited for that step: the next step was then
    dispatched only after it, one step's pipelining lost, and the first snapshot compiled them.

    Where the devices cannot hold a second copy of the state beside the step (``NoRoom`` the first
    time; ``on_device`` False after), the shards come to the host now instead, in one batched
    transfer: the next step, which donates the state, waits for it."""
    picked = []
    for _, x in leaves:
        shards: dict[str, Any] = {}
        for shard in x.addressable_shards:
            shards.setdefault(_key(shard.index, x.shape), shard.data)
        picked.append(shards)
    flat = [d for shards in picked for d in shards.values()]
    if on_device:
        try:
            copied = iter(jax.device_put(flat, [d.sharding for d in flat], may_alias=False))
        except jax.errors.JaxRuntimeError as e:
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            raise NoRoom(str(e).splitlines()[0]) from None
    else:
        copied = iter(jax.device_get(flat))
    return [[(k, next(copied)) for k in shards] for shards in picked]


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def write(
    directory: Path,
    step: int,
    host: list[tuple[str, tuple, str, list[tuple[str, np.ndarray]]]],
    meta: dict,
    ready: Callable[[], bool] = lambda: True,
) -> Path | None:
    """Write one snapshot (``host``: per leaf its path, global shape, dtype and distinct shards by
    key) as ``<step>.snap``: under a temporary name, renamed once ``ready()`` (False: removed
    instead, None returned). Returns the file."""
    leaves: list[dict[str, Any]] = []
    offset = 0
    for path, shape, dtype, shards in host:
        entry: dict[str, Any] = {"path": path, "shape": list(shape), "dtype": dtype, "shards": {}}
        for key, data in shards:
            entry["shards"][key] = [offset, int(data.nbytes), list(data.shape)]
            offset = _aligned(offset + int(data.nbytes))
        leaves.append(entry)
    header = json.dumps({"step": step, "meta": meta, "leaves": leaves}).encode()
    start = _aligned(len(_MAGIC) + 8 + len(header))
    tmp = directory / f".{step}.snap.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(_MAGIC + struct.pack("<Q", len(header)) + header)
        for entry, (_, _, _, shards) in zip(leaves, host, strict=True):
            for key, data in shards:
                f.seek(start + entry["shards"][key][0])
                f.write(np.ascontiguousarray(data).data.cast("B"))
    if not ready():
        tmp.unlink()
        return None
    final = directory / f"{step}.snap"
    os.replace(tmp, final)
    return final


def read_header(path: Path) -> dict:
    """A snapshot's header: step, meta and where each shard lies (``data_start`` added)."""
    with open(path, "rb") as f:
        head = f.read(len(_MAGIC) + 8)
        if head[: len(_MAGIC)] != _MAGIC:
            raise ValueError(f"{path} is not a snapshot")
        (n,) = struct.unpack("<Q", head[len(_MAGIC) :])
        header = json.loads(f.read(n))
    header["data_start"] = _aligned(len(_MAGIC) + 8 + n)
    header["file"] = str(path)
    return header


def complete_steps(directory: Path) -> list[int]:
    """The steps of this directory's complete snapshots, newest first."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted((int(m.group(1)) for n in names if (m := _NAME.match(n))), reverse=True)


def prune(directory: Path, keep: int = KEEP, above: int | None = None) -> None:
    """Keep the `keep` newest snapshots (and none above step `above`, another lineage's or a step
    the world did not agree on), and no temporary file of a writer that is gone."""
    steps = complete_steps(directory)
    doomed = [s for s in steps if above is not None and s > above]
    doomed += [s for s in steps if s not in doomed][keep:]
    for s in doomed:
        with contextlib.suppress(FileNotFoundError):
            (directory / f"{s}.snap").unlink()
    kept = set(steps) - set(doomed)
    newest = max(kept, default=-1)
    names = os.listdir(directory)
    # This process's snapshots on their way in (``.<step>.snap.tmp-<pid>``): with two in flight the
    # newer one can be done first, and the older one's record, written before its rename, stays.
    writing = {
        int(n[1:].split(".", 1)[0])
        for n in names
        if n.startswith(".") and n.endswith(f".snap.tmp-{os.getpid()}")
    }
    for name in names:
        # A step's record goes with its snapshot (one above the newest may be on its way in).
        if (m := _RECORD.match(name)) and (
            int(m.group(1)) in doomed or (int(m.group(1)) not in kept | writing and int(m.group(1)) <= newest)
        ):
            with contextlib.suppress(FileNotFoundError):
                (directory / name).unlink()
        if name.startswith(".") and ".snap.tmp-" in name:
            pid = name.rsplit("-", 1)[-1]
            if pid != str(os.getpid()):
                with contextlib.suppress(FileNotFoundError):
                    (directory / name).unlink()


class Snapshotter:
    """Takes the snapshots of one trainer incarnation: a device copy now, the host copy and the
    file on a thread. A failed write (the memory medium full) is reported once and turns snapshots
    off: the run directory's checkpoints still stand."""

    def __init__(self, directory: Path, interval: int, extra: Mapping[str, Any] | None = None) -> None:
        self.directory, self.interval, self.extra = directory, interval, dict(extra or {})
        self._threads: list[threading.Thread] = []  # the snapshots on their way, oldest first
        self._failed: list[BaseException] = []
        # Steps whose metrics record is written, and whether the trainer is leaving: a snapshot is
        # renamed into place (done) only once its step is recorded.
        self._recorded = threading.Condition()
        self._recorded_up_to = -1
        self._abandoned = False
        # The metrics record of every step, kept beside the next snapshot: process 0 alone writes
        # the run's metrics, and a world can lose the last ones after the other processes finished
        # those steps (process 0 killed, or waiting on a peer of its slice that died), so the next
        # world writes the records up to the step it restores that the metrics lack (``step_records``).
        self._records: dict[int, dict] = {}
        self.written: list[int] = []  # steps written by this incarnation, in order
        self.on_device = True  # the copy taken on the devices (False: no room, straight to the host)
        self.write_seconds = 0.0  # the thread's time (host copy + file), summed
        directory.mkdir(parents=True, exist_ok=True)

    @property
    def on(self) -> bool:
        return self.interval > 0 and not self._failed

    def due(self, step: int) -> bool:
        return self.on and step % self.interval == 0

    def recorded(self, step: int, record: Mapping[str, Any] | None = None) -> None:
        """Step `step`'s metrics record is written (`record`: it, kept with the step's snapshot)."""
        with self._recorded:
            if record is not None and self.on:
                self._records[step] = dict(record)
                for s in [s for s in self._records if s <= step - KEEP * self.interval]:
                    del self._records[s]  # a snapshot that was never taken (its trainer stopping)
            self._recorded_up_to = max(self._recorded_up_to, step)
            self._recorded.notify_all()

    def _keep_record(self, step: int) -> bool:
        """Beside snapshot `step`, before it is renamed into place: the metrics records of the steps
        after the previous due step, up to `step` (a stop's snapshot is not due: the records since)."""
        first = (step - 1) // self.interval * self.interval + 1
        with self._recorded:
            records = [self._records.pop(s) for s in range(first, step + 1) if s in self._records]
        if records:
            tmp = self.directory / f".{step}.record.tmp-{os.getpid()}"
            tmp.write_text(json.dumps(records))
            os.replace(tmp, self.directory / f"{step}.record.json")
        return True

    def _await_record(self, step: int) -> bool:
        with self._recorded:
            self._recorded.wait_for(lambda: self._recorded_up_to >= step or self._abandoned)
            return self._recorded_up_to >= step

    def take(self, step: int, state: Any, meta: dict, recorded: bool = False) -> float:
        """Start the snapshot of `state` (the state after `step`, before the next step donates it).
        Returns the seconds the caller was blocked (the previous snapshot's end, the dispatch)."""
        t0 = time.perf_counter()
        while len(self._threads) >= IN_FLIGHT:
            self._threads.pop(0).join()
        if not self.on:
            return time.perf_counter() - t0
        leaves = _leaves(state)
        try:
            local = _local_copies(leaves, self.on_device)
        except NoRoom as e:
            print(
                f"trainer: no room on the devices for a copy of the state ({e}): each snapshot copies"
                " it to the host before the next step",
                flush=True,
            )
            self.on_device = False
            local = _local_copies(leaves, self.on_device)
        copies = [
            (path, tuple(x.shape), x.dtype.name, shards)
            for (path, x), shards in zip(leaves, local, strict=True)
        ]
        if recorded:
            self.recorded(step)
        thread = threading.Thread(
            target=self._write,
            args=(step, copies, {**meta, **self.extra}),
            name="memory-snapshot",
            daemon=True,
        )
        thread.start()
        self._threads.append(thread)
        return time.perf_counter() - t0

    def _write(
        self, step: int, copies: list[tuple[str, tuple, str, list[tuple[str, jax.Array]]]], meta: dict
    ) -> None:
        t0 = time.perf_counter()
        try:
            host = [
                (path, shape, dtype, [(k, np.asarray(c)) for k, c in shards])
                for path, shape, dtype, shards in copies
            ]
            del copies

            def ready() -> bool:
                return self._await_record(step) and self._keep_record(step)

            if write(self.directory, step, host, meta, ready) is None:
                return  # the trainer left before the step was recorded: not done
            prune(self.directory)
            self.written.append(step)
        except BaseException as e:
            self._failed.append(e)
            print(
                f"trainer: memory snapshot of step {step} failed ({type(e).__name__}: {e}): snapshots off",
                flush=True,
            )
        finally:
            self.write_seconds += time.perf_counter() - t0

    def wait(self) -> None:
        """Until the snapshot in flight is written."""
        while self._threads:
            self._threads.pop(0).join()

    def abandon(self, timeout_s: float) -> None:
        """A trainer on its way out (a failed step): a snapshot of a recorded step is still
        finished (within `timeout_s`), one of a step never recorded is dropped."""
        with self._recorded:
            self._abandoned = True
            self._recorded.notify_all()
        deadline = time.monotonic() + timeout_s
        while self._threads:
            self._threads.pop(0).join(max(0.0, deadline - time.monotonic()))


def step_records(directory: Path | None, up_to: int) -> list[dict]:
    """The metrics records kept beside the snapshots (``Snapshotter``) of steps up to `up_to`, by
    step, when this process holds snapshot `up_to` itself: then every file up to it is of that
    step's lineage (a restore prunes the snapshots above the step it restores). A process without
    it (its slice away while the run rolled back and went on) may hold another lineage's: none."""
    if directory is None or not (directory / f"{up_to}.snap").is_file():
        return []
    out: dict[int, dict] = {}
    for name in os.listdir(directory):
        if (m := _RECORD.match(name)) is None or int(m.group(1)) > up_to:
            continue
        try:
            records = json.loads((directory / name).read_text())
        except (OSError, ValueError):
            continue  # pruned meanwhile
        for r in records if isinstance(records, list) else [records]:
            if isinstance(r, dict) and isinstance(r.get("step"), int) and r["step"] <= up_to:
                out[r["step"]] = r
    return [out[s] for s in sorted(out)]


# --- restore ----------------------------------------------------------------------------------------


def candidates(directory: Path, accept: Callable[[dict], bool]) -> dict[int, dict]:
    """This process's complete snapshots whose meta `accept`s, by step (their headers)."""
    out = {}
    for step in complete_steps(directory):
        try:
            header = read_header(directory / f"{step}.snap")
        except (OSError, ValueError):
            continue  # removed meanwhile, or not ours
        if header.get("step") == step and accept(header.get("meta") or {}):
            out[step] = header
    return out


def covers(header: dict, abstract: Any) -> bool:
    """Whether the snapshot holds every shard this process's devices need of `abstract` (a pytree
    of ShapeDtypeStructs with their shardings on the new mesh)."""
    saved = {e["path"]: e for e in header["leaves"]}
    for path, leaf in _leaves(abstract):
        entry = saved.get(path)
        if (
            entry is None
            or tuple(entry["shape"]) != tuple(leaf.shape)
            or entry["dtype"] != np.dtype(leaf.dtype).name
        ):
            return False
        for index in leaf.sharding.addressable_devices_indices_map(leaf.shape).values():
            if _key(index, leaf.shape) not in entry["shards"]:
                return False
    return len(saved) == len(_leaves(abstract))


class Prefetch:
    """The newest snapshot of this run in the pod's memory directory, made ready in this process's
    memory on a thread of its own, started before the accelerator's runtime: a new trainer in a pod
    spends its first seconds starting that runtime (opening a TPU's chips), and the restore then
    finds its bytes in RAM instead of reading the file after it.

    The file is mapped read-only and its pages populated in one call (``MAP_POPULATE``), with no
    copy: the bytes already sit in RAM (``/dev/shm``), so mapping them costs the page tables alone,
    where a copy into fresh memory pays a fault for every page twice over (the file's and the
    buffer's), and on a sandboxed host (gVisor) each fault is costly and competed with the runtime's
    own start (docs/measurements.md, "Recovery at olmo-7b's shape"). A snapshot is renamed into
    place whole and never written again, so its mapping stays valid after a prune unlinks it.

    A guess: the world may agree on another step, or this process may hold no step it needs, and
    then the file is read as before (``_Shards``). The bytes stand for the file only while it is
    the same file (inode, size and modification time): a later lineage may write the same step
    afresh."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.error: OSError | None = None
        st = os.stat(path)
        self.identity = (st.st_ino, st.st_size, st.st_mtime_ns)
        self.buffer: np.ndarray | None = None
        self.seconds = 0.0
        self._thread = threading.Thread(
            target=self._map, args=(st.st_size,), name="snapshot-prefetch", daemon=True
        )
        self._thread.start()

    @classmethod
    def newest(cls, directory: Path | None, expected: Mapping[str, Any]) -> Prefetch | None:
        """The read of the newest complete snapshot in `directory` whose meta `matches` `expected`,
        started; None without one."""
        if directory is None:
            return None
        for step in complete_steps(directory):
            try:
                header = read_header(directory / f"{step}.snap")
                if header.get("step") == step and matches(header.get("meta") or {}, expected):
                    return cls(directory / f"{step}.snap")
            except (OSError, ValueError):
                continue  # pruned meanwhile, or not ours
        return None

    def _map(self, size: int) -> None:
        import mmap

        t0 = time.perf_counter()
        try:
            with open(self.path, "rb") as f:
                flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
                self.buffer = np.frombuffer(mmap.mmap(f.fileno(), size, flags, mmap.PROT_READ), np.uint8)
        except (OSError, ValueError) as e:  # ValueError: an empty file
            self.error = e if isinstance(e, OSError) else OSError(f"{self.path}: {e}")
        finally:
            self.seconds = time.perf_counter() - t0

    def bytes_of(self, path: str) -> np.ndarray | None:
        """The file's bytes once ready, if `path` is the file read and it is unchanged; else None
        (the caller reads the file itself)."""
        if str(path) != str(self.path):
            return None
        self._thread.join()
        try:
            st = os.stat(path)
        except OSError:
            st = None
        if self.error is not None or st is None or (st.st_ino, st.st_size, st.st_mtime_ns) != self.identity:
            return None
        return self.buffer


class _Shards:
    """Reads the shards of one snapshot file by leaf path and key, each once: views of the
    prefetched bytes when they are this file's (``Prefetch``), else read from the file."""

    def __init__(self, header: dict, prefetched: Prefetch | None = None) -> None:
        self.header = header
        self.saved = {e["path"]: e for e in header["leaves"]}
        self.bytes = prefetched.bytes_of(header["file"]) if prefetched is not None else None
        self.file = None if self.bytes is not None else open(header["file"], "rb")  # noqa: SIM115 (close())
        self.read: dict[tuple[str, str], np.ndarray] = {}

    def get(self, path: str, key: str, dtype: np.dtype) -> np.ndarray:
        if (path, key) not in self.read:
            offset, nbytes, shape = self.saved[path]["shards"][key]
            start = self.header["data_start"] + offset
            if self.bytes is not None:
                buf = self.bytes[start : start + nbytes].view(dtype).reshape(shape)
            else:
                assert self.file is not None
                buf = np.empty(shape, dtype)
                got = os.preadv(self.file.fileno(), [buf.data.cast("B")], start) if nbytes else 0
                if got != nbytes:
                    raise OSError(f"{self.header['file']}: short read of {path} ({got} of {nbytes} bytes)")
            self.read[(path, key)] = buf
        return self.read[(path, key)]

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


# The bytes of host arrays handed to the devices in one batched transfer, each batch on the devices
# before the next goes: a TPU's runtime stages transfers through a buffer of host memory it maps
# at its start, and a batch of large arrays beyond it took several times as long
# (docs/measurements.md, "On a TPU").
TRANSFER_BATCH_BYTES = 1 << 30


def _put(arrays: list[np.ndarray], devices: list[Any]) -> list[jax.Array]:
    """``jax.device_put(arrays, devices)`` in batches of at most ``TRANSFER_BATCH_BYTES`` (an array
    larger than that alone), each waited for but the last."""
    out: list[jax.Array] = []
    start = previous = 0
    while start < len(arrays):
        end, size = start, 0
        while end < len(arrays) and (end == start or size + arrays[end].nbytes <= TRANSFER_BATCH_BYTES):
            size += arrays[end].nbytes
            end += 1
        if out:
            jax.block_until_ready(out[previous:])
        previous = len(out)
        out += jax.device_put(arrays[start:end], devices[start:end])
        start = end
    return out


def load(header: dict, abstract: Any, prefetched: Prefetch | None = None) -> Any:
    """The state of `abstract`'s structure and shardings, from this process's snapshot (``covers``).
    The shards go to their devices in batched transfers (``_put``: one call per shard dispatches
    each transfer on its own); the last batch may still be arriving when this returns."""
    shards = _Shards(header, prefetched)
    try:
        treedef = jax.tree_util.tree_structure(abstract)
        places = [
            (path, leaf, list(leaf.sharding.addressable_devices_indices_map(leaf.shape).items()))
            for path, leaf in _leaves(abstract)
        ]
        host = [
            shards.get(path, _key(index, leaf.shape), np.dtype(leaf.dtype))
            for path, leaf, where in places
            for _, index in where
        ]
        moved = iter(_put(host, [device for _, _, where in places for device, _ in where]))
        out = [
            jax.make_array_from_single_device_arrays(leaf.shape, leaf.sharding, [next(moved) for _ in where])
            for _, leaf, where in places
        ]
    finally:
        shards.close()
    return jax.tree_util.tree_unflatten(treedef, out)


def broadcastable(abstract: Any, mesh: Any, slices: int) -> bool:
    """Whether every slice holds a whole replica of `abstract` on `mesh`: the ``data`` axis is the
    slices and no leaf is sharded over it."""
    if mesh.shape.get("data") != slices:
        return False
    for _, leaf in _leaves(abstract):
        for part in leaf.sharding.spec:
            if part == "data" or (isinstance(part, tuple) and "data" in part):
                return False
    return True


def broadcast(
    header: dict | None, abstract: Any, mesh: Any, source: int, prefetched: Prefetch | None = None
) -> Any:
    """The state of `abstract`, from the replica of slice `source` (the data axis's index `source`):
    every process puts what it holds (its snapshot's shards, or zeros: `header` None) at its devices'
    data index of an array with a leading data axis, and one program picks index `source` into the
    target shardings (XLA: a broadcast over the data axis). Every process calls it."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    slices = mesh.shape["data"]
    shards = _Shards(header, prefetched) if header is not None else None
    try:
        flat, treedef = jax.tree_util.tree_flatten(abstract)
        stacked = []
        for path, leaf in _leaves(abstract):
            dtype = np.dtype(leaf.dtype)
            spec = NamedSharding(mesh, P("data", *leaf.sharding.spec))
            shape = (slices, *leaf.shape)
            arrays = []
            for device, index in spec.addressable_devices_indices_map(shape).items():
                assert index is not None  # a NamedSharding gives each of its devices its slices
                inner = index[1:]
                if shards is not None:
                    data = shards.get(path, _key(inner, leaf.shape), dtype)
                else:
                    data = np.zeros(
                        [len(range(*s.indices(d))) for s, d in zip(inner, leaf.shape, strict=True)], dtype
                    )
                arrays.append(jax.device_put(data[None], device))
            stacked.append(jax.make_array_from_single_device_arrays(shape, spec, arrays))
    finally:
        if shards is not None:
            shards.close()
    pick = jax.jit(lambda xs: [x[source] for x in xs], out_shardings=[leaf.sharding for leaf in flat])
    return jax.tree_util.tree_unflatten(treedef, pick(stacked))


def gather(tag: str, steps: list[int], timeout_s: float) -> list[list[int]]:
    """Every process's `steps`, by process id: through the coordination service's key-value store,
    so before any collective (every process calls it). Alone: ``[steps]``."""
    if jax.process_count() == 1:
        return [sorted(steps)]
    from orbax.checkpoint import multihost

    client = multihost.get_jax_distributed_client()
    client.key_value_set(f"reslice/memory/{tag}/{jax.process_index()}", json.dumps(sorted(steps)))
    return [
        json.loads(client.blocking_key_value_get(f"reslice/memory/{tag}/{p}", int(timeout_s * 1000)))
        for p in range(jax.process_count())
    ]


def whole(per_process: list[list[int]], hosts_per_slice: int) -> dict[int, tuple[int, ...]]:
    """Step -> the slices (positions: process id // hosts per slice) whose every process listed it."""
    slices = len(per_process) // hosts_per_slice
    out: dict[int, tuple[int, ...]] = {}
    for step in sorted({s for steps in per_process for s in steps}):
        full = tuple(
            i
            for i in range(slices)
            if all(step in per_process[p] for p in range(i * hosts_per_slice, (i + 1) * hosts_per_slice))
        )
        if full:
            out[step] = full
    return out


def matches(meta: Mapping[str, Any], expected: Mapping[str, Any]) -> bool:
    """A snapshot's meta is this run's: the same run directory, config hash, global batch and
    schedule point (what a storage checkpoint is checked for: docs/contract.md)."""
    return all(meta.get(k) == v for k, v in expected.items())


# --- the loop's view -------------------------------------------------------------------------------

AUTO_ACCELERATOR = 10  # checkpoint.memory_interval 0 on an accelerator (docs/design.md, "State from memory")


def directory(env: Mapping[str, str]) -> Path | None:
    """The pod's memory directory (set by the in-place supervisor), or None: no snapshots."""
    raw = env.get(envvars.MEMORY_DIR, "")
    return Path(raw) if raw else None


def interval(configured: int) -> int:
    """``checkpoint.memory_interval`` resolved: 0 is every step on simulated CPU devices,
    ``AUTO_ACCELERATOR`` elsewhere; < 0 is none (0 returned)."""
    if configured < 0:
        return 0
    if configured:
        return configured
    return 1 if jax.default_backend() == "cpu" else AUTO_ACCELERATOR


def with_slice_replicas(cfg: Any, slices: int) -> Any:
    """With snapshots on, an automatic ``mesh.data`` is the number of slices: every slice then holds
    a whole replica of the state, sharded alike inside each slice, so that the survivors of a lost
    slice hold exactly what a world of fewer slices needs (``mesh.shard_over_data`` or an explicit
    ``mesh.data`` is left as configured: a shrink then restores from storage)."""
    import dataclasses

    if slices > 1 and cfg.mesh.data == 0 and not cfg.mesh.shard_over_data:
        return dataclasses.replace(cfg, mesh=dataclasses.replace(cfg.mesh, data=slices))
    return cfg


class Memory:
    """One trainer incarnation's snapshots: the restore's agreement, and the Snapshotter after it.
    Off (every method a no-op) without a memory directory or with a zero interval: all processes of
    a world are alike in that (the same environment and config)."""

    def __init__(
        self,
        root: Path | None,
        every: int,
        expected: Mapping[str, Any],
        tag: str,
        hosts_per_slice: int = 1,
        prefetched: Prefetch | None = None,
    ) -> None:
        self.root = root if every > 0 else None
        self.every, self.expected, self.tag, self.hosts = every, dict(expected), tag, max(1, hosts_per_slice)
        self.prefetched = prefetched  # the newest snapshot's bytes, read while the runtime started
        self.headers: dict[int, dict] = {}
        self.source: StateSource | None = None  # MEMORY or PEERS once `load` chose

    def describe(self) -> str:
        return f"{self.source or StateSource.MEMORY} ({self.root})"

    def held(self, timeout_s: float) -> list[int]:
        """Steps of this run that some slice's processes all hold a snapshot of, newest first (the
        same on every process, which all call it)."""
        if self.root is None:
            return []
        self.root.mkdir(parents=True, exist_ok=True)
        self.headers = candidates(self.root, lambda meta: matches(meta, self.expected))
        per_process = gather(f"{self.tag}/held", list(self.headers), timeout_s)
        return sorted(whole(per_process, self.hosts), reverse=True)

    def agreed(
        self, held: list[int], abstract: Any, mesh: Any, timeout_s: float
    ) -> tuple[int, tuple[int, ...]] | None:
        """(step, the slices that hold it whole for `abstract`): the newest step that every slice
        holds, or (with a whole replica per slice) that some slice holds; None: neither. Every
        process calls it when `held` is not empty (it is the same everywhere)."""
        if not held:
            return None
        servable = [s for s in held if s in self.headers and covers(self.headers[s], abstract)]
        by_step = whole(gather(f"{self.tag}/covered", servable, timeout_s), self.hosts)
        slices = jax.process_count() // self.hosts
        for step in sorted(by_step, reverse=True):
            if len(by_step[step]) == slices or broadcastable(abstract, mesh, slices):
                return step, by_step[step]
        return None

    def load(self, chosen: tuple[int, tuple[int, ...]], abstract: Any, mesh: Any) -> Any:
        """The state of `chosen` (``agreed``): each process's own shards when every slice holds
        them, else a broadcast over the data axis from the first slice that does."""
        step, slices = chosen
        if len(slices) == jax.process_count() // self.hosts:
            self.source = StateSource.MEMORY
            return load(self.headers[step], abstract, self.prefetched)
        self.source = StateSource.PEERS
        mine = jax.process_index() // self.hosts in slices
        return broadcast(self.headers[step] if mine else None, abstract, mesh, slices[0], self.prefetched)

    def snapshotter(self, start: int) -> Snapshotter | None:
        """The incarnation's Snapshotter, after the restore of step `start`: snapshots above it
        (not agreed, or of the lineage that step replaced) go first."""
        if self.root is None:
            return None
        prune(self.root, above=start)
        return Snapshotter(self.root, self.every, {"run_dir": self.expected["run_dir"]})
