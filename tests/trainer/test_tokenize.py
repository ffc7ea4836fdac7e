"""``python -m trainer.tokenize``: a tiny BPE tokenizer trained here on text the test writes (no
downloads), raw text in, token files out that the trainer's data layer reads back as documents
separated by EOS."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tests.trainer import runs
from trainer.data import pipeline as data

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "wizards",
    "quietly",
    "hex",
    "jolly",
    "bakers",
]


def corpus(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, int(rng.integers(3, 40)))) for _ in range(n)]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tok.train_from_iterator(corpus(200, 0), trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def tokenize(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainer.tokenize", *args],
        cwd=runs.ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_jsonl_and_text_become_documents_separated_by_eos(tokenizer_file: Path, tmp_path: Path) -> None:
    docs = corpus(1500, 1)
    lines = [json.dumps({"text": d, "id": i}) for i, d in enumerate(docs[:1000])]
    (tmp_path / "a.jsonl").write_text("\n".join(lines[:600]) + "\n\n")  # a blank line is no document
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.write("\n".join(lines[600:]) + "\n")
    (tmp_path / "c.txt").write_text(" ".join(docs[1000:]))  # a plain text file: one document
    out = tmp_path / "tokens"
    done = tokenize("--tokenizer", str(tokenizer_file), "--out", str(out), "--shard-tokens", "5000",
                    str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl.gz"), str(tmp_path / "c.txt"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    tok = Tokenizer.from_file(str(tokenizer_file))
    eos = tok.token_to_id("<|endoftext|>")
    assert summary["eos_id"] == eos and summary["dtype"] == "uint16" and summary["documents"] == 1001
    files = sorted(out.glob("part-*.npy"))
    assert [p.name for p in files] == summary["files"] and len(files) > 2
    assert sorted(p.name for p in out.iterdir()) == summary["files"]  # nothing else, no temporary left
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tokens.")]
    # Every file is a flat little-endian uint16 array; each begins at a document boundary.
    arrays = [np.fromfile(p, "<u2") for p in files]
    assert all(a[-1] == eos for a in arrays)
    tokens = np.concatenate(arrays)
    assert len(tokens) == summary["tokens"]
    expected = [*docs[:1000], " ".join(docs[1000:])]
    ends = np.flatnonzero(tokens == eos)
    assert len(ends) == len(expected)
    starts = np.r_[0, ends[:-1] + 1]
    for text, s, e in zip(expected, starts, ends, strict=True):
        assert tok.decode(tokens[s:e].tolist()) == text
    # The trainer's data layer reads the directory as one source, ids checked against the vocabulary.
    files_source = data.TokenFiles(str(out), "uint16", 32, summary["vocab_size"])
    assert len(files_source) == sum((len(a) - 1) // 32 for a in arrays)
    np.testing.assert_array_equal(files_source[0], arrays[0][:33])


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing-input", "is not a file"),
        ("bad-json", "a.jsonl:2: not JSON"),
        ("no-field", "a.jsonl:1: no string field 'text'"),
        ("bad-tokenizer", "does not load"),
        ("no-eos", "has no token '<bos>'"),
        ("out-not-empty", "is not empty"),
        ("out-is-file", "is a file"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_created(
    setup: str, message: str, tokenizer_file: Path, tmp_path: Path
) -> None:
    src = tmp_path / "in"
    src.mkdir()
    good = '{"text": "the quick fox"}\n'
    (src / "a.jsonl").write_text(
        {"bad-json": good + "{oops\n", "no-field": '{"txt": "x"}\n'}.get(setup, good)
    )
    tok = str(tokenizer_file)
    out = tmp_path / "new" / "tokens"
    args = ["--out", str(out), str(src / "a.jsonl")]
    if setup == "missing-input":
        args.append(str(src / "nope.jsonl"))
    if setup == "bad-tokenizer":
        (src / "tok.json").write_text("{not a tokenizer")
        tok = str(src / "tok.json")
    if setup == "no-eos":
        args += ["--eos", "<bos>"]
    if setup == "out-not-empty":
        out.mkdir(parents=True)
        (out / "keep.txt").write_text("x")
    if setup == "out-is-file":
        out.parent.mkdir()
        out.write_text("x")
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    done = tokenize("--tokenizer", tok, *args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and message in done.stderr and "Traceback" not in done.stderr, (
        done.stderr
    )
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_the_trainer_trains_on_what_it_wrote(tokenizer_file: Path, tmp_path: Path) -> None:
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in corpus(400, 3)))
    done = tokenize(
        "--tokenizer", str(tokenizer_file), "--out", str(tmp_path / "web"), str(tmp_path / "docs.jsonl")
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    sets = [f"model.vocab_size={summary['vocab_size']}", f"data.eos_id={summary['eos_id']}", "train.steps=3",
            "data.sources=" + json.dumps([{"name": "web", "path": str(tmp_path / "web")}])]  # fmt: skip
    rc, out = runs.run(runs.env_for(str(tmp_path / "run"), 2), tmp_path / "trainer.log",
                       [a for s in sets for a in ("--set", s)])  # fmt: skip
    assert rc == 0, out[-3000:]
    records = runs.parse_metrics(runs.metrics_files(tmp_path / "run"))
    assert sorted(records) == [1, 2, 3] and all(r["data/tokens/web"] == 16 * 32 for r in records.values())
