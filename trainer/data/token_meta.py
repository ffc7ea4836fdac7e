"""The metadata file beside token files: what they are, so that the trainer can refuse to read them
as something else (uint32 ids read as uint16 train silently on garbage).

``python -m trainer.tokenize`` writes ``reslice-tokens.json`` into its output directory, beside the
``part-*.npy`` files::

    {"format": "reslice-tokens/1", "dtype": "uint32", "vocab_size": 100278, "eos_id": 100257,
     "eos_token": "<|endoftext|>", "tokenizer": {"name": "dolma2/tokenizer.json", "sha256": "..."},
     "files": ["part-00000.npy", ...], "documents": 1200, "tokens": 4812345}

The trainer (``trainer.data.pipeline.TokenFiles``) reads the one beside each token file it opens
and refuses (``ConfigError``: exit 2, before anything is written) a source whose ``dtype`` is not
the one it would read (``data.dtype``, or for ``auto`` what ``model.vocab_size`` implies), whose
``vocab_size`` exceeds ``model.vocab_size``, whose ``eos_id`` is not ``data.eos_id`` (when that is
set), or sources of one run written by different tokenizers (``sha256``). Token files without one
(OLMo-core's, older outputs) are read as before, with a warning: their dtype is the config's.
"""

from __future__ import annotations

import json
from typing import Any

from trainer.config import ConfigError

FILENAME = "reslice-tokens.json"
FORMAT = "reslice-tokens/1"
DTYPES = ("uint16", "uint32")


def build(
    dtype: str,
    vocab_size: int,
    eos_id: int,
    eos_token: str,
    tokenizer_name: str,
    tokenizer_sha256: str,
    files: list[str],
    documents: int,
    tokens: int,
) -> dict[str, Any]:
    return {
        "format": FORMAT, "dtype": dtype, "vocab_size": vocab_size, "eos_id": eos_id, "eos_token": eos_token,
        "tokenizer": {"name": tokenizer_name, "sha256": tokenizer_sha256},
        "files": files, "documents": documents, "tokens": tokens,
    }  # fmt: skip


def parse(text: str | bytes, where: str) -> dict[str, Any]:
    """A metadata file's content, checked; ConfigError naming `where` when it is not one."""
    try:
        meta = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ConfigError(f"{where} is not JSON (token files' metadata, {FORMAT})") from None
    ok = (
        isinstance(meta, dict)
        and meta.get("format") == FORMAT
        and meta.get("dtype") in DTYPES
        and all(isinstance(meta.get(k), int) for k in ("vocab_size", "eos_id"))
        and isinstance(meta.get("tokenizer"), dict)
        and isinstance(meta["tokenizer"].get("sha256"), str)
    )
    if not ok:
        raise ConfigError(
            f"{where} is not token files' metadata of format {FORMAT}"
            " (format, dtype uint16|uint32, vocab_size, eos_id, tokenizer.sha256)"
        )
    return meta


def disagreement(meta: dict[str, Any], dtype: str, vocab_size: int, eos_id: int) -> str | None:
    """Why token files described by `meta` cannot be read as the config reads them (`dtype`, the
    model's `vocab_size`, `eos_id`: -1 for none), with the fix; None when they can."""
    if meta["dtype"] != dtype:
        return (
            f"its token ids are {meta['dtype']} but the trainer would read them as {dtype}"
            f" (set data.dtype={meta['dtype']})"
        )
    if meta["vocab_size"] > vocab_size:
        return (
            f"its tokenizer has {meta['vocab_size']:,} ids, more than model.vocab_size={vocab_size:,}"
            f" (set model.vocab_size >= {meta['vocab_size']})"
        )
    if eos_id != -1 and meta["eos_id"] != eos_id:
        return f"its EOS id is {meta['eos_id']}, not data.eos_id={eos_id} (set data.eos_id={meta['eos_id']})"
    return None
