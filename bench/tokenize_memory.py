"""``python -m trainer.tokenize``'s peak memory on one large plain-text file (one document).

    python -m bench.tokenize_memory [--mb 40] [--vocab 4096] [--script PATH] [--workdir DIR] [--keep]

Writes a plain-text file of about ``--mb`` MB (seeded words of 1-12 letters in lines of 1-30 words,
paragraphs between blank lines), trains a byte-level BPE tokenizer of ``--vocab`` ids on its first
MB (no downloads), then runs ``python -m trainer.tokenize`` on the file in a child process and
prints the child's peak resident set (``ru_maxrss`` from ``wait4``), its wall time, and the
tokens written, as one JSON line. ``--script``: run that file instead of the module, e.g. the
version before a change (``git show main:trainer/tokenize.py > /tmp/old_tokenize.py``). The figures (before and after a change) go in
docs/measurements.md; run it with ``PYTHONDONTWRITEBYTECODE`` unset, as a user's run would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench._cli import Parser

ROOT = Path(__file__).resolve().parents[1]


def write_text(path: Path, mb: float, seed: int = 0) -> int:
    """About `mb` MB of word-like text, written in pieces; its size in bytes."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    p = np.linspace(2.0, 0.2, len(letters))
    words = ["".join(rng.choice(letters, int(n), p=p / p.sum())) for n in rng.integers(1, 13, 20_000)]
    target, size = int(mb * 1e6), 0
    with open(path, "w", encoding="utf-8") as f:
        while size < target:
            lines = []
            for _ in range(int(rng.integers(1, 8))):
                line = " ".join(words[i] for i in rng.integers(0, len(words), int(rng.integers(1, 31))))
                lines.append(line[0].upper() + line[1:] + ".")
            piece = "\n".join(lines) + "\n\n"
            f.write(piece)
            size += len(piece.encode())
    return size


def train_tokenizer(text: Path, vocab: int, out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    with open(text, encoding="utf-8") as f:
        sample = f.read(1_000_000).splitlines()
    tok.train_from_iterator(sample, trainer)
    tok.save(str(out))


def main() -> int:
    parser = Parser(prog="python -m bench.tokenize_memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=40.0, help="size of the text file, MB")
    parser.add_argument("--vocab", type=int, default=4096, help="the tokenizer's vocabulary")
    parser.add_argument("--script", help="a tokenize.py to run instead of python -m trainer.tokenize")
    parser.add_argument("--workdir", help="where to write (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the files written")
    args = parser.parse_args()
    if args.mb <= 0:
        parser.error(f"--mb {args.mb}: nothing to tokenize (more than 0)")
    if args.vocab < 257:  # a byte-level BPE starts from the 256 bytes (and its special tokens)
        parser.error(f"--vocab {args.vocab}: at least 257 (the 256 bytes and a merge)")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tokmem-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        text, tok = work / "input.txt", work / "tokenizer.json"
        size = write_text(text, args.mb)
        train_tokenizer(text, args.vocab, tok)
        out = work / "tokens"
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, *([args.script] if args.script else ["-m", "trainer.tokenize"]),
             "--tokenizer", str(tok), "--out", str(out), str(text)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        # wait4: this child's own peak RSS (getrusage(RUSAGE_CHILDREN) would be the largest of all).
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        assert proc.stdout is not None and proc.stderr is not None
        stdout, stderr = proc.stdout.read().decode(), proc.stderr.read().decode()
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            print(f"bench: tokenize exited {code}: {stderr[-2000:]}", file=sys.stderr)
            return 1
        summary = json.loads(stdout.strip().splitlines()[-1])
        print(json.dumps({
            "input_mb": round(size / 1e6, 1), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "wall_s": round(wall, 2), "tokens": summary["tokens"], "documents": summary["documents"],
            "vocab": args.vocab,
        }))  # fmt: skip
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
