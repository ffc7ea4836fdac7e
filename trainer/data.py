"""Data: a random-access Grain pipeline whose global batch for step s depends only on
(dataset, seed, s, global batch) — never on processes, devices, micro-batching or loader workers.

Order (docs/design.md "Data order", docs/platform.md §5):

- The corpus is a list of N records (``seq_len + 1`` tokens each). ``grain.MapDataset.range(N)
  .shuffle(seed)`` gives a random-access permutation, reshuffled every epoch; global position r
  holds sample id ``order[r]``.
- Global batch of step s = positions ``[s·GB, (s+1)·GB)``.
- Micro-batch m (of A) = the contiguous positions ``[m·GB/A, (m+1)·GB/A)`` of that batch, and
  process p (of P) reads the contiguous block p of every micro-batch. The trainer assembles the
  global ``[A, GB/A, seq_len + 1]`` array with ``jax.make_array_from_process_local_data``.
- The pipeline is indexed by step (one element = this process's part of one step), so resuming at
  step s needs no iterator state, and ``mp_prefetch`` workers (which take every W-th element and
  are read round-robin) cannot reorder anything.

Sources:

- ``synthetic``: deterministic records with learnable structure and a skewed (Zipf) unigram
  distribution, so that the loss falls and MoE routing is imbalanced (see :class:`SyntheticSource`).
- ``files``: a token file (see :class:`TokenFileSource`), local or ``gs://``.

This module does not import JAX: Grain worker processes import it.
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass
from typing import Any

import grain
import numpy as np

from trainer.config import ConfigError, DataConfig


class SyntheticSource:
    """Record i: a Zipf-distributed start token, then runs that follow a fixed successor map.

    Token t+1 is ``succ(token t)`` with probability ``copy_prob``, else a fresh Zipf draw, where
    ``succ(v) = (a·v + c) mod V`` is a bijection chosen from the seed. Fresh draws follow
    ``p(rank) ∝ (rank + 1)^-zipf_exponent`` over a seeded permutation of the vocabulary. The loss
    can fall from ln V towards the entropy of the fresh draws; frequent tokens skew expert routing.
    Records are a pure function of (seed, i).
    """

    def __init__(self, cfg: DataConfig, vocab_size: int, seq_len: int):
        self.n, self.v, self.length = cfg.num_records, vocab_size, seq_len + 1
        self.seed, self.copy_prob = cfg.seed, cfg.copy_prob
        rng = np.random.default_rng((cfg.seed, 0xDA7A))
        self.rank_to_token = rng.permutation(vocab_size)
        p = (np.arange(vocab_size) + 1.0) ** -cfg.zipf_exponent
        self.cdf = np.cumsum(p / p.sum())
        a = int(rng.integers(1, vocab_size)) | 1
        while np.gcd(a, vocab_size) != 1:
            a += 2
        c = int(rng.integers(0, vocab_size))
        # succ^j(v) = A[j]·v + C[j] (mod V), for j up to a whole record.
        mul, add = np.ones(self.length, np.int64), np.zeros(self.length, np.int64)
        for j in range(1, self.length):
            mul[j] = (mul[j - 1] * a) % vocab_size
            add[j] = (add[j - 1] * a + c) % vocab_size
        self.mul, self.add = mul, add

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return self.records(np.array([i]))[0]

    def records(self, ids: np.ndarray) -> np.ndarray:
        """[n] ids -> [n, seq_len + 1] int32, vectorised over the whole batch."""
        pos = np.arange(self.length)
        u_token = _uniform(self.seed, 1, ids, self.length)
        u_copy = _uniform(self.seed, 2, ids, self.length)
        fresh = self.rank_to_token[np.minimum(np.searchsorted(self.cdf, u_token), self.v - 1)]
        is_fresh = u_copy >= self.copy_prob
        is_fresh[:, 0] = True
        start = np.maximum.accumulate(np.where(is_fresh, pos, 0), axis=1)  # where the current run began
        off = pos - start
        first = np.take_along_axis(fresh, start, axis=1)
        return ((self.mul[off] * first + self.add[off]) % self.v).astype(np.int32)


_M1, _M2, _GOLDEN = (
    np.uint64(0xBF58476D1CE4E5B9),
    np.uint64(0x94D049BB133111EB),
    np.uint64(0x9E3779B97F4A7C15),
)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a counter-based generator needs no per-record state."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def _uniform(seed: int, stream: int, ids: np.ndarray, length: int) -> np.ndarray:
    """Uniform [0, 1) floats, a pure function of (seed, stream, id, position)."""
    with np.errstate(over="ignore"):
        key = _mix(np.array([seed * 4 + stream], np.uint64) * _GOLDEN)
        rows = _mix(key ^ (np.asarray(ids, np.uint64) * _GOLDEN))
        z = _mix(rows[:, None] + np.arange(length, dtype=np.uint64)[None, :] * _GOLDEN)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


class TokenFileSource:
    """A token file: a flat array of little-endian ``uint16`` or ``uint32`` token ids, no header.

    Documents are concatenated (with whatever separator token the tokenizer uses). Record i is
    tokens ``[i·seq_len, i·seq_len + seq_len + 1)``: consecutive records overlap by one token, the
    target of the last position. N = (num_tokens − 1) // seq_len. The path is local or
    ``gs://bucket/object`` (read with byte-range requests through gcsfs).
    """

    def __init__(self, path: str, dtype: str, seq_len: int):
        self.path, self.dtype, self.seq_len = path, np.dtype(dtype).newbyteorder("<"), seq_len
        self._local = threading.local()
        try:
            size = self._fs().size(path) if path.startswith("gs://") else os.path.getsize(path)
        except FileNotFoundError:
            raise ConfigError(f"token file {path} does not exist") from None
        self.num_tokens = size // self.dtype.itemsize
        self.n = (self.num_tokens - 1) // seq_len
        if self.n < 1:
            raise ConfigError(f"token file {path} holds {self.num_tokens} tokens: not one record")

    def _fs(self) -> Any:
        import gcsfs  # only for gs://, and after the emulator environment is set

        if not hasattr(self._local, "fs"):
            self._local.fs = gcsfs.GCSFileSystem()
        return self._local.fs

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_local")
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return self.records(np.array([i]))[0]

    def records(self, ids: np.ndarray) -> np.ndarray:
        """[n] ids -> [n, seq_len + 1] int32: one gather locally, one batch of range reads on gs://."""
        ids = np.asarray(ids, np.int64)
        width = self.seq_len + 1
        if self.path.startswith("gs://"):
            starts = [int(i) * self.seq_len * self.dtype.itemsize for i in ids]
            ends = [s + width * self.dtype.itemsize for s in starts]
            blobs = self._fs().cat_ranges([self.path] * len(starts), starts, ends)  # concurrent requests
            return np.stack([np.frombuffer(b, self.dtype) for b in blobs]).astype(np.int32)
        if not hasattr(self._local, "mm"):
            self._local.mm = np.memmap(self.path, dtype=self.dtype, mode="r")
        return np.asarray(self._local.mm[ids[:, None] * self.seq_len + np.arange(width)], dtype=np.int32)


def make_source(cfg: DataConfig, vocab_size: int, seq_len: int) -> SyntheticSource | TokenFileSource:
    if cfg.source == "synthetic":
        return SyntheticSource(cfg, vocab_size, seq_len)
    return TokenFileSource(cfg.path, cfg.dtype, seq_len)


@dataclass(frozen=True)
class Layout:
    """How one process takes its part of every global batch.

    ``num_processes``/``process_index``: the contiguous blocks the batch splits into and this
    process's block; processes of one tensor-parallel group read the same block
    (``trainer.mesh.process_block``)."""

    global_batch: int
    grad_accum: int
    num_processes: int = 1
    process_index: int = 0

    def __post_init__(self) -> None:
        per_micro, rem = divmod(self.global_batch, self.grad_accum)
        if rem or per_micro % self.num_processes:
            raise ValueError(
                f"global batch {self.global_batch} does not split into {self.grad_accum} micro-batches"
                f" over {self.num_processes} processes"
            )

    @property
    def micro_global(self) -> int:
        return self.global_batch // self.grad_accum

    @property
    def micro_local(self) -> int:
        return self.micro_global // self.num_processes

    def local_positions(self, step: int) -> np.ndarray:
        """[A, GB/A/P] global positions this process reads for ``step``."""
        m = np.arange(self.grad_accum)[:, None] * self.micro_global
        j = np.arange(self.micro_local)[None, :] + self.process_index * self.micro_local
        return step * self.global_batch + m + j


def sample_order(num_records: int, seed: int) -> grain.MapDataset:
    """Global position -> sample id (a Grain random-access shuffle, reshuffled every epoch)."""
    return grain.MapDataset.range(num_records).shuffle(seed=seed)


def global_sample_ids(order: grain.MapDataset, step: int, global_batch: int) -> np.ndarray:
    """The sample ids of the global batch of ``step``, in global order (cheap: no records read)."""
    n = len(order)
    return np.array([order[r] % n for r in range(step * global_batch, (step + 1) * global_batch)], np.int64)


def sample_digest(ids: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(ids, "<i8").tobytes()).hexdigest()[:16]


class StepBatch:
    """step -> this process's part of that step: ids [A, L] and tokens [A, L, seq_len + 1]."""

    def __init__(self, source: Any, order: grain.MapDataset, layout: Layout):
        self.source, self.order, self.layout = source, order, layout

    def __call__(self, step: int) -> dict[str, Any]:
        every = global_sample_ids(self.order, int(step), self.layout.global_batch)
        pos = self.layout.local_positions(int(step)) - int(step) * self.layout.global_batch
        ids = every[pos]
        tokens = self.source.records(ids.ravel())
        return {
            "step": int(step),
            "ids": ids,
            "tokens": tokens.reshape(*pos.shape, -1),
            "digest": sample_digest(every),  # of the *global* batch: the same on every shape
            "first_sample": int(every[0]),
        }


def make_dataset(
    cfg: DataConfig, vocab_size: int, seq_len: int, layout: Layout, start_step: int, end_step: int
) -> grain.IterDataset:
    """Per-process batches for steps ``[start_step, end_step)``, in step order."""
    source = make_source(cfg, vocab_size, seq_len)
    steps = grain.MapDataset.range(start_step, end_step).map(
        StepBatch(source, sample_order(len(source), cfg.seed), layout)
    )
    if cfg.workers > 0:
        from absl import flags

        if not flags.FLAGS.is_parsed():  # Grain's worker pool reads absl flags; we have no absl main
            flags.FLAGS.mark_as_parsed()
        opts = grain.MultiprocessingOptions(
            num_workers=cfg.workers, per_worker_buffer_size=max(cfg.prefetch, 1)
        )
        return steps.to_iter_dataset().mp_prefetch(opts)
    read = grain.ReadOptions(num_threads=1 if cfg.prefetch else 0, prefetch_buffer_size=cfg.prefetch)
    return steps.to_iter_dataset(read)
