"""``python -m trainer.tokenize``: a tiny BPE tokenizer trained here on text the test writes (no
downloads), raw text in, token files out that the trainer's data layer reads back as documents
separated by EOS."""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tests.trainer import runs
from trainer import tokenize as tokenize_module
from trainer.data import pipeline as data
from trainer.data import token_meta

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
    # Nothing else but the metadata, no temporary left.
    assert sorted(p.name for p in out.iterdir()) == sorted([*summary["files"], token_meta.FILENAME])
    meta = json.loads((out / token_meta.FILENAME).read_text())
    assert meta == {
        "format": token_meta.FORMAT, "dtype": "uint16", "vocab_size": summary["vocab_size"], "eos_id": eos,
        "eos_token": "<|endoftext|>", "files": summary["files"], "documents": 1001, "tokens": summary["tokens"],
        "tokenizer": {"name": str(tokenizer_file), "sha256": hashlib.sha256(tokenizer_file.read_bytes()).hexdigest()},
    }  # fmt: skip
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
        ("empty", "the inputs hold no text"),
        ("empty-text", "the inputs hold no text"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_created(
    setup: str, message: str, tokenizer_file: Path, tmp_path: Path
) -> None:
    src = tmp_path / "in"
    src.mkdir()
    good = '{"text": "the quick fox"}\n'
    (src / "a.jsonl").write_text(
        {"bad-json": good + "{oops\n", "no-field": '{"txt": "x"}\n', "empty": "\n\n"}.get(setup, good)
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
    if setup == "empty-text":  # an empty plain-text file, and nothing else
        (src / "a.txt").write_text("")
        args = ["--out", str(out), str(src / "a.txt")]
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


def test_a_plain_text_file_is_streamed_in_pieces_with_the_ids_of_the_whole(
    tokenizer_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    rng = np.random.default_rng(5)
    lines = []
    for i, doc in enumerate(corpus(400, 7)):
        end = [". ", "!\n", "\n\n", "  \n", "\n", ", ", "\n \n"][i % 7]
        lines.append(doc.capitalize() + end + ("12 345 " if rng.random() < 0.2 else ""))
    text = "".join(lines)
    (tmp_path / "book.txt").write_text(text)
    encoded: list[int] = []
    tok = Tokenizer.from_file(str(tokenizer_file))
    real = Tokenizer.encode_batch

    def counting(self: Tokenizer, batch: list[str], **kw: object) -> list:
        encoded.extend(len(p) for p in batch)
        return real(self, batch, **kw)

    monkeypatch.setattr(tokenize_module, "PIECE_CHARS", 500)
    monkeypatch.setattr(Tokenizer, "encode_batch", counting)
    out = tmp_path / "tokens"
    argv = ["--tokenizer", str(tokenizer_file), "--tokenizer-name", "tiny-bpe", "--out", str(out)]
    assert tokenize_module.main([*argv, str(tmp_path / "book.txt")]) == 0
    assert json.loads((out / token_meta.FILENAME).read_text())["tokenizer"]["name"] == "tiny-bpe"
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["documents"] == 1
    # In pieces: none over 4 pieces' length, none the whole text.
    assert len(encoded) > 20 and max(encoded) <= 2000 and sum(encoded) == len(text)
    tokens = np.fromfile(out / "part-00000.npy", "<u2")
    eos = tok.token_to_id("<|endoftext|>")
    assert tokens.tolist() == [*tok.encode(text, add_special_tokens=False).ids, eos]


def test_pieces_cut_at_a_line_break_between_words_else_at_a_single_space() -> None:
    import io

    def cut(text: str, size: int) -> list[str]:
        return list(tokenize_module.pieces(io.StringIO(text), size))

    text = "alpha beta\ngamma  delta\n\nepsilon zeta eta"
    got = cut(text, 12)
    assert "".join(got) == text
    for piece, after in itertools.pairwise(got):
        # A cut after "x\ny" or before " y" (one space between non-spaces), never inside a word.
        assert (piece[-1] == "\n" and not piece[-2].isspace() and not after[0].isspace()) or (
            after[0] == " " and not after[1].isspace() and not piece[-1].isspace()
        ), (piece, after)
    assert cut("x" * 50, 10) == ["x" * 40, "x" * 10]  # no place to cut: at 4 pieces' length
