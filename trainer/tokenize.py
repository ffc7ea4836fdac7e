"""``python -m trainer.tokenize``: raw text -> token files the trainer reads (``data.sources``).

    python -m trainer.tokenize --tokenizer tokenizer.json --out /data/web INPUT [INPUT ...]

Inputs are JSON Lines (``.jsonl``, ``.json``: one document per line, its text in ``--field``,
default ``text``) or plain text (any other suffix: the whole file is one document); ``.gz`` of
either is read as it streams. The tokenizer is a ``tokenizers`` library JSON file (what
``Tokenizer.save`` and the Hugging Face hub's ``tokenizer.json`` are). Each document is encoded
without special tokens and followed by the EOS token (``--eos``, default the first of the usual
end-of-text tokens the vocabulary has), as OLMo-core's and Dolma's token files are. The output is
``OUT/part-00000.npy``, ``part-00001.npy``, ...: flat little-endian ``uint16`` (a vocabulary of at
most 65,536 ids) or ``uint32`` arrays with no header, a new file begun at the first document
boundary after ``--shard-tokens`` tokens, so no document spans two files.

Beside them, ``OUT/reslice-tokens.json`` says what they are (``trainer.data.token_meta``: dtype,
vocabulary size, EOS id and token, the tokenizer's name, ``--tokenizer-name`` or its path, and the
sha256 of its file): the trainer refuses to read them otherwise (a dtype, EOS id or vocabulary
that disagrees with its config, sources of different tokenizers).

Streaming: documents are read and encoded in batches (``encode_batch``, the library's threads),
never the whole input at once, with a progress bar over the input bytes on stderr. A plain-text
file, one document however large, is read in pieces of about PIECE_CHARS characters, each cut where
a line break stands between two characters that are not white space (else before a single space
between two such characters), encoded on its own, and its ids written in order: the byte-level
BPE pre-tokenizers (GPT-2's, GPT-NeoX's, cl100k's and dolma2's patterns) never join text across such
a cut, so the ids are those of the whole text, in bounded memory (encoded whole, the library's
memory grows with the text: docs/measurements.md). A tokenizer that treats the start of a string
specially (a SentencePiece ``Metaspace`` prefix) may differ at the cuts. The summary (files,
documents, tokens, dtype, EOS id) is one JSON line on stdout; set ``data.eos_id`` to its ``eos_id``.

Bad input (a missing input, a tokenizer file that does not load, an EOS token the vocabulary lacks,
an output directory that is a file or not empty, a line that is not JSON or lacks the field, inputs
with no text at all): one line on stderr, exit 2, and nothing left behind: the files are written
into a temporary directory beside ``OUT`` and renamed into place at the end.

A user runs it (docs/recipe.md, docs/contract.md); it imports no JAX.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn

import numpy as np

from contract.exits import Exit
from trainer.data import token_meta

EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "[SEP]")
BATCH_DOCS = 512  # documents per encode_batch call
PIECE_CHARS = 1 << 18  # a plain-text file's pieces, about (characters)
PIECES_PER_BATCH = 8  # pieces per encode_batch call: the library's threads encode them side by side


class InputError(Exception):
    """Bad input: one line on stderr, exit 2."""


class _TokenizeParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2
        print(f"tokenize: usage error: {message}", file=sys.stderr)
        sys.exit(Exit.CONFIG)


@dataclass
class Totals:
    documents: int = 0
    tokens: int = 0


def _open(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _is_jsonl(path: Path) -> bool:
    name = path.name[: -len(".gz")] if path.name.endswith(".gz") else path.name
    return name.endswith((".jsonl", ".json"))


def _cut(text: str) -> int:
    """Where a piece of plain text may end (0: nowhere): after the last line break that stands
    between two characters that are not white space, else before the last single space between
    two such characters. No byte-level BPE pre-tokenizer's token spans either."""
    at = len(text) - 1
    while (at := text.rfind("\n", 1, at)) > 0:
        if not text[at - 1].isspace() and not text[at + 1].isspace():
            return at + 1
    at = len(text) - 1
    while (at := text.rfind(" ", 1, at)) > 0:
        if not text[at - 1].isspace() and not text[at + 1].isspace():
            return at
    return 0


def pieces(f: IO[str], size: int = 0) -> Iterator[str]:
    """A plain-text file's text in pieces of about `size` characters (PIECE_CHARS), cut where
    ``_cut`` allows (a text with no such place for 4 pieces' length is cut there)."""
    size = size or PIECE_CHARS
    buf = ""
    while chunk := f.read(size):
        buf += chunk
        if len(buf) < size:
            continue
        at = _cut(buf) or (len(buf) if len(buf) >= 4 * size else 0)
        if at:
            yield buf[:at]
            buf = buf[at:]
    if buf:
        yield buf


def documents(path: Path, field: str) -> Iterator[tuple[str, int]]:
    """(text, input bytes consumed) for each document of a JSON Lines ``path``, in order."""
    with _open(path) as f:
        for number, line in enumerate(f, 1):
            size = len(line.encode())
            if not line.strip():
                yield "", size
                continue
            try:
                doc = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}:{number}: not JSON ({e.msg})") from None
            text = doc.get(field) if isinstance(doc, dict) else None
            if not isinstance(text, str):
                raise InputError(f"{path}:{number}: no string field {field!r}")
            yield text, size


class ShardWriter:
    """``part-NNNNN.npy`` files under ``root``, each begun at a document boundary."""

    def __init__(self, root: Path, dtype: np.dtype, shard_tokens: int):
        self.root, self.dtype, self.shard_tokens = root, dtype, shard_tokens
        self.files: list[str] = []
        self._file: IO[bytes] | None = None
        self._in_file = 0
        self._boundary = True  # between documents: a new file may begin here

    def write(self, ids: np.ndarray) -> None:
        """Part of the document being written (``end`` ends it)."""
        if self._file is None or (self._boundary and self._in_file >= self.shard_tokens):
            self._next()
        assert self._file is not None
        self._file.write(ids.astype(self.dtype, copy=False).tobytes())
        self._in_file += len(ids)
        self._boundary = False

    def end(self) -> None:
        self._boundary = True

    def document(self, ids: np.ndarray) -> None:
        self.write(ids)
        self.end()

    def _next(self) -> None:
        self.close()
        name = f"part-{len(self.files):05d}.npy"
        self.files.append(name)
        self._file = open(self.root / name, "wb")  # noqa: SIM115 (closed by close())
        self._in_file = 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def load_tokenizer(path: str, eos: str | None) -> tuple[Any, int, int]:
    """(tokenizer, vocabulary size, EOS id) or InputError."""
    from tokenizers import Tokenizer

    if not Path(path).is_file():
        raise InputError(f"tokenizer file {path} does not exist")
    try:
        tok = Tokenizer.from_file(path)
    except Exception as e:  # the library raises a bare Exception for a malformed file
        raise InputError(f"tokenizer file {path} does not load: {' '.join(str(e).split())[:200]}") from None
    vocab = tok.get_vocab_size(with_added_tokens=True)
    names = (eos,) if eos else EOS_CANDIDATES
    for name in names:
        eos_id = tok.token_to_id(name)
        if eos_id is not None:
            return tok, vocab, eos_id
    if eos:
        raise InputError(f"the tokenizer has no token {eos!r} (--eos)")
    raise InputError(
        f"the tokenizer has none of {', '.join(EOS_CANDIDATES)}: name its end-of-text token with --eos"
    )


def _missing(path: Path) -> list[Path]:
    """``path`` and its ancestors that do not exist yet, innermost first."""
    out = []
    while not path.exists() and path != path.parent:
        out.append(path)
        path = path.parent
    return out


def check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file")
    if out.is_dir() and any(out.iterdir()):
        raise InputError(f"--out {out} is not empty (nothing is overwritten): choose a new directory")
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise InputError(f"--out {out}: {parent} is not a writable directory")


def tokenize(
    inputs: list[Path], tokenizer: Any, eos_id: int, dtype: np.dtype, out: Path, field: str, shard_tokens: int
) -> tuple[Totals, list[str]]:
    """Write the token files into ``out`` (which exists and is empty); stream with a progress bar."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    totals, writer = Totals(), ShardWriter(out, dtype, shard_tokens)
    eos = np.array([eos_id], dtype)
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
               TextColumn("{task.fields[tokens]:,} tokens"))  # fmt: skip
    total_bytes = sum(p.stat().st_size for p in inputs)
    with Progress(*columns, transient=False, disable=not sys.stderr.isatty()) as bar:
        task = bar.add_task("tokenizing", total=total_bytes, tokens=0)

        def flush(batch: list[str], consumed: int) -> None:
            for enc in tokenizer.encode_batch(batch, add_special_tokens=False):
                writer.document(np.concatenate([np.asarray(enc.ids, dtype), eos]))
                totals.tokens += len(enc.ids) + 1
            totals.documents += len(batch)
            bar.update(task, advance=consumed, tokens=totals.tokens)

        def text_file(path: Path) -> None:
            """One document, however large, encoded piece by piece (``pieces``)."""
            written, chars = 0, 0

            def encode(batch: list[str]) -> None:
                nonlocal written, chars
                chars += sum(len(p) for p in batch)
                for enc in tokenizer.encode_batch(batch, add_special_tokens=False):
                    writer.write(np.asarray(enc.ids, dtype))
                    written += len(enc.ids)
                bar.update(task, advance=sum(len(p.encode()) for p in batch), tokens=totals.tokens + written)

            with _open(path) as f:
                batch: list[str] = []
                for piece in pieces(f):
                    batch.append(piece)
                    if len(batch) >= PIECES_PER_BATCH:
                        encode(batch)
                        batch = []
                if batch:
                    encode(batch)
            if chars:  # an empty file is no document
                writer.document(eos)
                totals.tokens += written + 1
                totals.documents += 1

        try:
            for path in inputs:
                if not _is_jsonl(path):
                    text_file(path)
                    continue
                batch, consumed = [], 0
                for text, size in documents(path, field):
                    consumed += size
                    if text:
                        batch.append(text)
                    if len(batch) >= BATCH_DOCS:
                        flush(batch, consumed)
                        batch, consumed = [], 0
                flush(batch, consumed)
        finally:
            writer.close()
    if not totals.documents:
        raise InputError("the inputs hold no text: nothing to tokenize")
    return totals, writer.files


def main(argv: list[str] | None = None) -> int:
    parser = _TokenizeParser(prog="python -m trainer.tokenize", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "inputs", nargs="+", metavar="INPUT", help=".jsonl/.json (one document a line) or text"
    )
    parser.add_argument("--tokenizer", required=True, help="a tokenizers-library JSON file")
    parser.add_argument("--out", required=True, help="output directory (new or empty)")
    parser.add_argument(
        "--eos", help=f"end-of-text token (default: the first of {', '.join(EOS_CANDIDATES)})"
    )
    parser.add_argument("--field", default="text", help="the JSON field holding a document's text")
    parser.add_argument("--shard-tokens", type=int, default=1 << 30, help="tokens per output file (about)")
    parser.add_argument(
        "--tokenizer-name",
        help=f"the tokenizer's name in {token_meta.FILENAME} (default: --tokenizer as given)",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    try:
        if args.shard_tokens < 1:
            raise InputError("--shard-tokens must be positive")
        inputs = [Path(p) for p in args.inputs]
        for p in inputs:
            if not p.is_file():
                raise InputError(f"input {p} is not a file")
        tokenizer, vocab, eos_id = load_tokenizer(args.tokenizer, args.eos)
        dtype = np.dtype("<u2" if vocab <= 1 << 16 else "<u4")
        dtype_name = "uint16" if dtype.itemsize == 2 else "uint32"
        with open(args.tokenizer, "rb") as f:
            sha256 = hashlib.file_digest(f, "sha256").hexdigest()
        check_out(out)
        created = _missing(out.parent)
        out.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            totals, files = tokenize(inputs, tokenizer, eos_id, dtype, work, args.field, args.shard_tokens)
            meta = token_meta.build(
                dtype_name, vocab, eos_id, tokenizer.id_to_token(eos_id), args.tokenizer_name or args.tokenizer,
                sha256, files, totals.documents, totals.tokens,
            )  # fmt: skip
            (work / token_meta.FILENAME).write_text(json.dumps(meta, indent=1) + "\n")
            if out.is_dir():
                out.rmdir()  # empty (checked): replaced whole
            work.rename(out)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            for d in created:  # innermost first: leave the file system as it was
                with contextlib.suppress(OSError):
                    d.rmdir()
            raise
    except InputError as e:
        print(f"tokenize: error: {e}", file=sys.stderr, flush=True)
        return Exit.CONFIG
    except UnicodeDecodeError as e:
        print(f"tokenize: error: an input is not UTF-8 text ({e.reason} at byte {e.start})", file=sys.stderr)
        return Exit.CONFIG
    summary = {
        "out": str(out), "files": files, "documents": totals.documents, "tokens": totals.tokens,
        "dtype": dtype_name, "vocab_size": vocab, "eos_id": eos_id, "metadata": token_meta.FILENAME,
        "tokenizer_sha256": sha256,
    }  # fmt: skip
    print(json.dumps(summary), flush=True)
    return Exit.FINISHED


if __name__ == "__main__":
    sys.exit(main())
