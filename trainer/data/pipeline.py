"""Data: a random-access Grain pipeline whose global batch for step s depends only on
(dataset, seed, s, global batch) — never on processes, devices, micro-batching or loader workers.

Order (docs/design.md "Data order", docs/platform.md §5):

- A source is a list of N records (``seq_len + 1`` tokens each). ``grain.MapDataset.range(N)
  .shuffle(seed)`` gives a random-access permutation, reshuffled at every pass over the source; with one source,
  global position r holds sample id ``order[r]``. A mixture of sources (``data.sources``) decides
  which source fills each position from (weights, seed, step, global batch) alone
  (:class:`Mixture`); each source then walks its own permutation.
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
- ``files`` / ``data.sources``: token files (see :class:`TokenFileSource`, OLMo-core's format),
  local or ``gs://``; a source's path is a file, a glob or a directory / prefix (:func:`expand`).
- Held-out evaluation reads its own sources' fixed batches (:func:`eval_batch`).

Called by trainer/loop.py (the training pipeline, the start-up checks) and trainer/evaluate.py.
This module does not import JAX: Grain worker processes import it.
"""

from __future__ import annotations

import glob as globlib
import hashlib
import os
import re
import sys
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grain
import numpy as np

from trainer.config import ConfigError, DataConfig, TokenDtype
from trainer.data import token_meta


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


class DataError(ConfigError):
    """Token files that do not fit the config (a token id outside the vocabulary, a file that is not
    a whole number of tokens, a path that matches nothing): a configuration error, exit 2."""


class NoRecord(ConfigError):
    """A token file shorter than one record."""


class TokenFileSource:
    """A token file: a flat array of little-endian ``uint16`` or ``uint32`` token ids, no header
    (OLMo-core's ``.npy`` token files are this, read as they are).

    Documents are concatenated (each ended by the tokenizer's EOS). Record i is tokens
    ``[i·seq_len, i·seq_len + seq_len + 1)``: consecutive records overlap by one token, the target
    of the last position. N = (num_tokens − 1) // seq_len. The path is local (memory-mapped) or
    ``gs://bucket/object`` (read with byte-range requests through gcsfs).

    With ``vocab_size``, token ids are checked against it: the first and last record when the file
    is opened (cheap), and every record as it is read (a max over what was read anyway), so a bad
    id fails the step that would train on it, with the file and record named, without a scan of the
    corpus first (a full scan of a TB corpus takes hours).
    """

    def __init__(self, path: str, dtype: str, seq_len: int, vocab_size: int = 0, size: int | None = None):
        self.path, self.dtype, self.seq_len = path, np.dtype(dtype).newbyteorder("<"), seq_len
        self.vocab_size = vocab_size
        self._local = threading.local()
        if size is None:
            try:
                size = self._fs().size(path) if path.startswith("gs://") else os.path.getsize(path)
            except FileNotFoundError:
                raise ConfigError(f"token file {path} does not exist") from None
        if size % self.dtype.itemsize:
            raise DataError(
                f"token file {path} holds {size} bytes, not a whole number of {self.dtype.name} tokens"
                " (is data.dtype right?)"
            )
        self.num_tokens = size // self.dtype.itemsize
        self.n = (self.num_tokens - 1) // seq_len
        if self.n < 1:
            raise NoRecord(f"token file {path} holds {self.num_tokens} tokens: not one record")
        if vocab_size:
            self.records(np.array(sorted({0, self.n - 1})))

    def _fs(self) -> Any:
        return _gcs(self._local)

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
            out = np.stack([np.frombuffer(b, self.dtype) for b in blobs]).astype(np.int32)
        else:
            if not hasattr(self._local, "mm"):
                self._local.mm = np.memmap(self.path, dtype=self.dtype, mode="r")
            out = np.asarray(self._local.mm[ids[:, None] * self.seq_len + np.arange(width)], dtype=np.int32)
        if self.vocab_size and out.size and int(out.max()) >= self.vocab_size:
            row = int(np.argmax(out.max(axis=1) >= self.vocab_size))
            raise DataError(
                f"token file {self.path} record {int(ids[row])} (tokens from {int(ids[row]) * self.seq_len})"
                f" holds token id {int(out[row].max())}, not below model.vocab_size={self.vocab_size}"
                " (a file of another tokenizer, or the wrong data.dtype?)"
            )
        return out


def _gcs(local: threading.local) -> Any:
    import gcsfs  # only for gs://, and after the emulator environment is set

    if not hasattr(local, "fs"):
        local.fs = gcsfs.GCSFileSystem()
    return local.fs


_GLOB = re.compile(r"[*?\[]")


def expand(path: str) -> list[tuple[str, int | None]]:
    """A source's path -> its token files, sorted by name (so the same files in the same order on
    every process), each with its size when the listing gave it. ``path`` is one file, a glob
    (``/data/web/*.npy``, ``gs://b/web/part-*.npy``) or a directory / gs:// prefix (every ``.npy``
    file under it, recursively)."""
    if path.startswith("gs://"):
        fs = _gcs(_listing)
        if _GLOB.search(path):
            found = fs.glob(path, detail=True)
        elif fs.isfile(path):
            return [(path, None)]
        else:
            found = fs.find(path, detail=True)
        files: list[tuple[str, int | None]] = [
            ("gs://" + k, int(v["size"]))
            for k, v in found.items()
            if v.get("type") == "file" and (_GLOB.search(path) or k.endswith(".npy"))
        ]
    elif _GLOB.search(path):
        files = [(p, None) for p in globlib.glob(path, recursive=True) if os.path.isfile(p)]
    elif os.path.isdir(path):
        files = [(str(p), None) for p in Path(path).rglob("*.npy") if p.is_file()]
    else:
        return [(path, None)]  # one file (TokenFileSource says when it does not exist)
    # A glob's matches may hold the folder's metadata (``data/web/*``): it is no token file.
    files = [(name, size) for name, size in files if os.path.basename(name) != token_meta.FILENAME]
    if not files:
        raise DataError(f"{path} matches no token files (a file, a glob, or a directory of .npy files)")
    return sorted(files)


_listing = threading.local()


def _folder(name: str) -> str:
    return name.rsplit("/", 1)[0] if name.startswith("gs://") else (os.path.dirname(name) or ".")


def read_meta(folder: str) -> dict[str, Any] | None:
    """The metadata beside the token files of `folder` (``trainer.data.token_meta``), or None
    when there is none; DataError when it is not readable as such."""
    where = f"{folder}/{token_meta.FILENAME}"
    try:
        if folder.startswith("gs://"):
            text = _gcs(_listing).cat_file(where)
        else:
            with open(where, "rb") as f:
                text = f.read()
    except FileNotFoundError:
        return None
    try:
        return token_meta.parse(text, where)
    except ConfigError as e:
        raise DataError(str(e)) from None


_warned: set[str] = set()  # source paths whose token files without metadata were reported


class TokenFiles:
    """One source of a mixture: its token files' records, numbered file after file. A record never
    spans two files (each file's documents are its own); a file shorter than one record adds none,
    as long as some file has one.

    The metadata beside its files (``trainer.data.token_meta``, one per folder) must agree with how
    they are read (`dtype`, `vocab_size`, `eos_id`: -1 for none), and all name one tokenizer
    (``tokenizer``: its sha256), else DataError. Files without any are read as `dtype` says, with
    a warning (``warn_unlabelled``)."""

    def __init__(self, path: str, dtype: str, seq_len: int, vocab_size: int = 0, eos_id: int = -1):
        self.path = path
        self.files: list[TokenFileSource] = []
        found = expand(path)
        metas = {folder: read_meta(folder) for folder in dict.fromkeys(_folder(name) for name, _ in found)}
        for folder, meta in metas.items():
            if meta is not None and (
                why := token_meta.disagreement(meta, dtype, vocab_size or meta["vocab_size"], eos_id)
            ):
                raise DataError(f"token files {folder} ({token_meta.FILENAME}): {why}")
        shas = {meta["tokenizer"]["sha256"] for meta in metas.values() if meta is not None}
        if len(shas) > 1:
            raise DataError(
                f"{path}: its token files were written by {len(shas)} different tokenizers ({token_meta.FILENAME})"
            )
        self.tokenizer: str | None = shas.pop() if shas else None
        for name, size in found:
            try:
                self.files.append(TokenFileSource(name, dtype, seq_len, vocab_size, size))
            except NoRecord:
                if len(found) == 1:
                    raise
        if not self.files:
            raise DataError(f"{path}: no token file holds one record of {seq_len + 1} tokens")
        self.offsets = np.cumsum([0] + [len(f) for f in self.files])
        self.n = int(self.offsets[-1])
        self.dtype = dtype
        self.unlabelled = None in metas.values()  # some of its files have no metadata

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return self.records(np.array([i]))[0]

    def records(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, np.int64)
        which = np.searchsorted(self.offsets, ids, side="right") - 1
        out = np.empty((len(ids), self.files[0].seq_len + 1), np.int32)
        for f in np.unique(which):
            rows = which == f
            out[rows] = self.files[f].records(ids[rows] - self.offsets[f])
        return out


def make_source(cfg: DataConfig, vocab_size: int, seq_len: int) -> SyntheticSource | TokenFiles:
    """The single source of ``data.source`` (synthetic, or the token files of ``data.path``)."""
    if cfg.source == "synthetic":
        return SyntheticSource(cfg, vocab_size, seq_len)
    return TokenFiles(cfg.path, _dtype(cfg, vocab_size), seq_len, vocab_size, cfg.eos_id)


def _dtype(cfg: DataConfig, vocab_size: int) -> str:
    if cfg.dtype != TokenDtype.AUTO:
        return cfg.dtype
    return TokenDtype.UINT16 if vocab_size <= 1 << 16 else TokenDtype.UINT32


@dataclass(frozen=True)
class Part:
    """One source of a mixture: its name (``data/tokens/<name>``), records and relative weight."""

    name: str
    source: Any
    weight: float


class Mixture:
    """Which source and record fill each global position of a step: a pure function of (sources,
    weights, seed, step, global batch).

    Source k's count among the first R positions is ``F_k(R) = floor(R·w_k + ½)`` (R·w_k rounded)
    for every source but the heaviest, which takes the rest (``w`` normalised). Each ``F_k`` is
    non-decreasing, so step s holds ``F_k((s+1)·GB) − F_k(s·GB)`` samples of source k, and the
    heaviest source's count never goes negative as long as ``GB − Σ_{k≠heaviest} ceil(GB·w_k) ≥ 0``
    (checked). Over any prefix of the run every source but the heaviest is within half a sample of
    its weight and the heaviest within (K − 1)/2: no sampling noise. Within the step the positions of
    each source are spread by a permutation drawn from (seed, step), and source k's j-th sample
    overall is record ``order_k[j]`` of its own shuffle (reshuffled at every pass, as a single
    source's).

    With one source this is exactly the single-source order (position r holds ``order[r]``), so a
    run's data order and ``data/sample_digest`` are unchanged by the mixture machinery.
    """

    def __init__(self, parts: list[Part], orders: list[grain.MapDataset], seed: int, global_batch: int):
        self.parts, self.orders, self.seed, self.gb = parts, orders, seed, global_batch
        total = sum(p.weight for p in parts)
        self.w = np.array([p.weight / total for p in parts], np.float64)
        self.heaviest = int(np.argmax(self.w))
        others = sum(int(np.ceil(global_batch * w)) for k, w in enumerate(self.w) if k != self.heaviest)
        if global_batch < others:
            raise DataError(
                f"train.global_batch={global_batch} is too small for data.sources' weights"
                f" {[p.weight for p in parts]}: a step cannot hold every source's share"
            )

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.parts]

    def counts(self, positions: int) -> np.ndarray:
        """[K] how many of the first ``positions`` global positions each source fills."""
        f = np.floor(positions * self.w + 0.5).astype(np.int64)
        f[self.heaviest] = 0
        f[self.heaviest] = positions - f.sum()
        return f

    def step(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(source [GB], record id [GB]) of every global position of ``step``, in global order."""
        gb = self.gb
        if len(self.parts) == 1:
            order, n = self.orders[0], len(self.parts[0].source)
            picked = [order[r] % n for r in range(step * gb, (step + 1) * gb)]
            return np.zeros(gb, np.int64), np.array(picked, np.int64)
        before, after = self.counts(step * gb), self.counts((step + 1) * gb)
        # Which positions of the step each source fills: a permutation drawn from (seed, step).
        slot = np.argsort(_uniform(self.seed, 4, np.array([step]), gb)[0], kind="stable")
        src = np.empty(gb, np.int64)
        src[slot] = np.repeat(np.arange(len(self.parts)), after - before)
        ids = np.empty(gb, np.int64)
        for k, (order, part) in enumerate(zip(self.orders, self.parts, strict=True)):
            n = len(part.source)
            ids[src == k] = [order[j] % n for j in range(before[k], after[k])]
        return src, ids

    def records(self, src: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """[n] (source, id) pairs -> [n, seq_len + 1] tokens, one read per source."""
        out = None
        for k in np.unique(src):
            rows = src == k
            got = self.parts[k].source.records(ids[rows])
            if out is None:
                out = np.empty((len(ids), got.shape[1]), np.int32)
            out[rows] = got
        assert out is not None
        return out


def source_seed(seed: int, k: int) -> int:
    """Source k's shuffle seed: the single source keeps ``data.seed`` (its order is unchanged)."""
    return seed if k == 0 else int(_mix(np.array([seed * 1_000_003 + k], np.uint64))[0] % np.uint64(2**31))


def make_mixture(cfg: DataConfig, vocab_size: int, seq_len: int, global_batch: int) -> Mixture:
    """The training data of ``cfg``: ``data.sources``, else the one source of ``data.source``.
    Opens every token file (sizes, the first and last record's ids): a bad path or file is a
    DataError here, before anything is written."""
    if cfg.sources:
        dtype = _dtype(cfg, vocab_size)
        parts = [
            Part(s["name"], TokenFiles(s["path"], dtype, seq_len, vocab_size, cfg.eos_id), s["weight"])
            for s in cfg.sources
        ]
        one_tokenizer(parts)
    else:
        name = "synthetic" if cfg.source == "synthetic" else "train"
        parts = [Part(name, make_source(cfg, vocab_size, seq_len), 1.0)]
    orders = [sample_order(len(p.source), source_seed(cfg.seed, k)) for k, p in enumerate(parts)]
    return Mixture(parts, orders, cfg.seed, global_batch)


@dataclass(frozen=True)
class Layout:
    """How one process takes its part of every global batch.

    ``num_processes``/``process_index``: the contiguous blocks the batch splits into and this
    process's block; processes of one tensor-parallel group read the same block
    (``trainer.model.mesh.process_block``)."""

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
    """Global position -> sample id (a Grain random-access shuffle, reshuffled at every pass over the records)."""
    return grain.MapDataset.range(num_records).shuffle(seed=seed)


def global_sample_ids(order: grain.MapDataset, step: int, global_batch: int) -> np.ndarray:
    """The sample ids of the global batch of ``step``, in global order (cheap: no records read)."""
    n = len(order)
    return np.array([order[r] % n for r in range(step * global_batch, (step + 1) * global_batch)], np.int64)


def sample_digest(ids: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(ids, "<i8").tobytes()).hexdigest()[:16]


def mixture_digest(src: np.ndarray, ids: np.ndarray, sources: int) -> str:
    """``sample_digest`` of a step: of the ids alone for one source (as before mixtures), else of
    the (source, id) pairs."""
    if sources == 1:
        return sample_digest(ids)
    return sample_digest(np.stack([np.asarray(src, np.int64), np.asarray(ids, np.int64)], axis=1))


class StepBatch:
    """step -> this process's part of that step: ids [A, L] and tokens [A, L, seq_len + 1], with
    the global batch's digest and tokens per source (the same on every process and shape)."""

    def __init__(self, source: Any, order: grain.MapDataset | None, layout: Layout):
        """``source``: a Mixture, or one source with its ``order`` (a one-source mixture)."""
        if not isinstance(source, Mixture):
            assert order is not None
            source = Mixture([Part("train", source, 1.0)], [order], 0, layout.global_batch)
        self.mixture, self.layout = source, layout

    def __call__(self, step: int) -> dict[str, Any]:
        mix = self.mixture
        src_all, every = mix.step(int(step))
        pos = self.layout.local_positions(int(step)) - int(step) * self.layout.global_batch
        src, ids = src_all[pos], every[pos]
        tokens = mix.records(src.ravel(), ids.ravel())
        seq = tokens.shape[-1] - 1
        counts = np.bincount(src_all, minlength=len(mix.parts))
        return {
            "step": int(step),
            "ids": ids,
            "sources": src,
            "tokens": tokens.reshape(*pos.shape, -1),
            "digest": mixture_digest(src_all, every, len(mix.parts)),  # of the *global* batch
            "first_sample": int(every[0]),
            "source_tokens": {n: int(c) * seq for n, c in zip(mix.names, counts, strict=True)},
        }


def make_dataset(
    cfg: DataConfig, vocab_size: int, seq_len: int, layout: Layout, start_step: int, end_step: int
) -> grain.IterDataset:
    """Per-process batches for steps ``[start_step, end_step)``, in step order."""
    mixture = make_mixture(cfg, vocab_size, seq_len, layout.global_batch)
    steps = grain.MapDataset.range(start_step, end_step).map(StepBatch(mixture, None, layout))
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


def eval_order(name: str, num_records: int) -> grain.MapDataset:
    """An eval source's fixed order: seeded from its name alone, so that every run (any
    ``data.seed``, any shape) evaluates the same records under that name."""
    return sample_order(num_records, zlib.crc32(name.encode()) & 0x7FFFFFFF)


def eval_batch(source: Any, order: grain.MapDataset, batch: int, layout: Layout) -> np.ndarray:
    """This process's part [A, L, seq_len + 1] of eval batch ``batch`` (global positions
    ``[batch·GB, (batch+1)·GB)`` of ``order``, split as a training step is)."""
    n, gb = len(source), layout.global_batch
    pos = layout.local_positions(batch) - batch * gb
    every = np.array([order[r] % n for r in range(batch * gb, (batch + 1) * gb)], np.int64)
    return source.records(every[pos].ravel()).reshape(*pos.shape, -1)


def eval_sources(sources: list[dict[str, Any]], cfg: DataConfig, vocab_size: int, seq_len: int) -> list[Part]:
    """``eval.sources`` opened (token files checked as the training data's are); weight unused."""
    dtype = _dtype(cfg, vocab_size)
    parts = [
        Part(s["name"], TokenFiles(s["path"], dtype, seq_len, vocab_size, cfg.eos_id), 1.0) for s in sources
    ]
    one_tokenizer(parts)
    return parts


def warn_unlabelled(parts: list[Part]) -> None:
    """One line on stderr for each source of `parts` with token files without metadata, once per
    process: read as the config says, unchecked against a tokenizer. The loop calls it once every
    source opened, so that a bad source's error is the only line."""
    for p in parts:
        if getattr(p.source, "unlabelled", False) and p.source.path not in _warned:
            _warned.add(p.source.path)
            print(
                f"trainer: warning: {p.source.path}: token files without {token_meta.FILENAME} (another"
                f" writer's, or older): read as {p.source.dtype} (data.dtype), unchecked against a tokenizer",
                file=sys.stderr,
                flush=True,
            )


def one_tokenizer(parts: list[Part]) -> None:
    """DataError when the token files of `parts` were written by different tokenizers (by their
    metadata; files without any are not compared)."""
    seen: dict[str, str] = {}
    for p in parts:
        if (sha := getattr(p.source, "tokenizer", None)) is not None:
            seen.setdefault(sha, p.name)
    if len(seen) > 1:
        names = ", ".join(f"{name} ({sha[:12]})" for sha, name in seen.items())
        raise DataError(
            f"the token files of {names} were written by different tokenizers ({token_meta.FILENAME})"
        )
