"""Data order: the global batch of a step depends on (dataset, seed, step, global batch) only."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.fake_gcs import FakeGCS
from trainer.config import ConfigError, DataConfig
from trainer.data import pipeline as data
from trainer.data import token_meta

GB, SEQ, VOCAB = 16, 32, 256
STEPS = (0, 3, 17, 250)


def global_batch(source, order, step: int, processes: int, grad_accum: int) -> tuple[np.ndarray, np.ndarray]:
    """Read step ``step`` as ``processes`` hosts would, then put the pieces in global order."""
    parts = [
        data.StepBatch(source, order, data.Layout(GB, grad_accum, processes, p))(step)
        for p in range(processes)
    ]
    ids = np.concatenate([b["ids"] for b in parts], axis=1)  # [A, GB/A]: micro-batch m, then process
    tokens = np.concatenate([b["tokens"] for b in parts], axis=1)
    return ids.reshape(-1), tokens.reshape(GB, -1)


@pytest.fixture(scope="module")
def source() -> data.SyntheticSource:
    return data.SyntheticSource(DataConfig(num_records=1000), VOCAB, SEQ)


def test_same_samples_for_every_process_count_and_accumulation(source: data.SyntheticSource) -> None:
    order = data.sample_order(len(source), seed=7)
    for step in STEPS:
        want_ids, want_tokens = global_batch(source, order, step, 1, 1)
        np.testing.assert_array_equal(want_ids, data.global_sample_ids(order, step, GB))
        for processes in (1, 2, 4):
            for accum in (1, 2, 4):
                ids, tokens = global_batch(source, order, step, processes, accum)
                np.testing.assert_array_equal(ids, want_ids, err_msg=f"P={processes} A={accum}")
                np.testing.assert_array_equal(tokens, want_tokens)
        np.testing.assert_array_equal(want_tokens, np.stack([source[i] for i in want_ids]))
    # Another step, seed or global batch does change the batch.
    assert not np.array_equal(data.global_sample_ids(order, 1, GB), data.global_sample_ids(order, 2, GB))
    assert not np.array_equal(
        data.global_sample_ids(order, 1, GB), data.global_sample_ids(data.sample_order(1000, 8), 1, GB)
    )


def test_process_blocks_are_contiguous_within_each_micro_batch() -> None:
    layout = data.Layout(GB, 2, 4, 3)
    np.testing.assert_array_equal(
        layout.local_positions(5), [[5 * GB + 6, 5 * GB + 7], [5 * GB + 14, 5 * GB + 15]]
    )
    with pytest.raises(ValueError):
        data.Layout(GB, 4, 8, 0)  # a micro-batch of 4 cannot be split over 8 processes


def test_epochs_cover_every_record_once_in_a_new_order() -> None:
    order = data.sample_order(64, seed=3)
    epoch0 = np.concatenate([data.global_sample_ids(order, s, GB) for s in range(4)])
    epoch1 = np.concatenate([data.global_sample_ids(order, s, GB) for s in range(4, 8)])
    assert sorted(epoch0) == sorted(epoch1) == list(range(64))
    assert not np.array_equal(epoch0, epoch1)


def test_two_workers_give_the_same_batches_as_none() -> None:
    cfg = DataConfig(num_records=1000, seed=11)
    layout = data.Layout(GB, 2, 2, 1)

    def read(workers: int) -> list[tuple[int, np.ndarray, np.ndarray]]:
        cfg.workers = workers
        it = iter(data.make_dataset(cfg, VOCAB, SEQ, layout, 5, 25))
        out = [(b["step"], np.array(b["ids"]), np.array(b["tokens"])) for b in it]
        if hasattr(it, "close"):
            it.close()
        return out

    threads, workers = read(0), read(2)
    assert [s for s, _, _ in workers] == list(range(5, 25))
    for (s0, ids0, tok0), (s2, ids2, tok2) in zip(threads, workers, strict=True):
        assert s0 == s2
        np.testing.assert_array_equal(ids0, ids2)
        np.testing.assert_array_equal(tok0, tok2)


def test_synthetic_corpus_is_deterministic_skewed_and_learnable(source: data.SyntheticSource) -> None:
    again = data.SyntheticSource(DataConfig(num_records=1000), VOCAB, SEQ)
    records = np.stack([source[i] for i in range(400)])
    np.testing.assert_array_equal(records, np.stack([again[i] for i in range(400)]))
    assert records.shape == (400, SEQ + 1) and records.min() >= 0 and records.max() < VOCAB
    counts = np.bincount(records.ravel(), minlength=VOCAB) / records.size
    assert counts.max() > 10 / VOCAB  # Zipf: the top token is far above uniform
    follows = (records[:, 1:] == (source.mul[1] * records[:, :-1] + source.add[1]) % VOCAB).mean()
    assert 0.7 < follows < 0.85  # copy_prob = 0.75 (+ fresh draws that happen to match)
    other = data.SyntheticSource(DataConfig(num_records=1000, seed=99), VOCAB, SEQ)
    assert not np.array_equal(records[0], other[0])


def write_tokens(path: Path, n: int, dtype: str) -> np.ndarray:
    tokens = (np.arange(n) * 7919 % 50000).astype(dtype)
    tokens.astype(np.dtype(dtype).newbyteorder("<")).tofile(path)
    return tokens


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_local_token_file(tmp_path: Path, dtype: str) -> None:
    tokens = write_tokens(tmp_path / "tokens.bin", 1000, dtype)
    src = data.TokenFileSource(str(tmp_path / "tokens.bin"), dtype, SEQ)
    assert len(src) == (1000 - 1) // SEQ
    for i in (0, 5, len(src) - 1):
        np.testing.assert_array_equal(src[i], tokens[i * SEQ : i * SEQ + SEQ + 1].astype(np.int32))
    cfg = DataConfig(source="files", path=str(tmp_path / "tokens.bin"), dtype=dtype)
    batch = next(iter(data.make_dataset(cfg, 50000, SEQ, data.Layout(8, 1), 2, 3)))
    for ids, row in zip(batch["ids"][0], batch["tokens"][0], strict=True):
        np.testing.assert_array_equal(row, src[ids])


def test_gcs_token_file_reads_the_same_records(tmp_path: Path, gcs: FakeGCS) -> None:
    tokens = write_tokens(tmp_path / "tokens.bin", 2000, "uint16")
    gcs.write_object("reslice", "data/tokens.bin", (tmp_path / "tokens.bin").read_bytes())
    script = (
        "import json, sys; from trainer.data import pipeline as data;"
        "s = data.TokenFileSource('gs://reslice/data/tokens.bin', 'uint16', 32);"
        "print(json.dumps([len(s)] + s.records([0, 17, len(s) - 1]).tolist() + [s[5].tolist()]))"
    )
    env = {**gcs.env, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    n, *rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert n == (2000 - 1) // SEQ
    for i, row in zip((0, 17, n - 1, 5), rows, strict=True):
        assert row == tokens[i * SEQ : i * SEQ + SEQ + 1].tolist()


def test_a_missing_or_empty_token_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        data.TokenFileSource(str(tmp_path / "nope.bin"), "uint16", SEQ)
    write_tokens(tmp_path / "short.bin", SEQ, "uint16")
    with pytest.raises(ConfigError, match="not one record"):
        data.TokenFileSource(str(tmp_path / "short.bin"), "uint16", SEQ)


def labelled(
    folder: Path, dtype: str, n: int = 1000, sha: str = "a" * 64, over: dict | None = None
) -> np.ndarray:
    """Token files as ``python -m trainer.tokenize`` writes them: a part file and the metadata beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    tokens = write_tokens(folder / "part-00000.npy", n, dtype)
    meta = token_meta.build(dtype, 50000, 0, "<|endoftext|>", "tok.json", sha, ["part-00000.npy"], 1, n)
    (folder / token_meta.FILENAME).write_text(json.dumps({**meta, **(over or {})}))
    return tokens


@pytest.mark.parametrize(
    ("written", "read", "over", "message"),
    [
        (
            "uint32",
            "uint16",
            {},
            "its token ids are uint32 but the trainer would read them as uint16 (set data.dtype=uint32)",
        ),
        ("uint16", "uint32", {}, "its token ids are uint16 but the trainer would read them as uint32"),
        ("uint16", "uint16", {"eos_id": 7}, "its EOS id is 7, not data.eos_id=0 (set data.eos_id=7)"),
        (
            "uint16",
            "uint16",
            {"vocab_size": 60000},
            "its tokenizer has 60,000 ids, more than model.vocab_size=50,000",
        ),
        ("uint16", "uint16", {"dtype": "int8"}, "is not token files' metadata"),
    ],
)
def test_token_files_whose_metadata_disagrees_with_the_config_are_refused(
    tmp_path: Path, written: str, read: str, over: dict, message: str
) -> None:
    labelled(tmp_path / "web", written, over=over)
    cfg = DataConfig(source="files", path=str(tmp_path / "web"), dtype=read, eos_id=0)
    with pytest.raises(ConfigError, match=re.escape(message)):
        data.make_mixture(cfg, 50000, SEQ, 8)


def test_token_files_that_agree_are_read_and_the_metadata_is_no_token_file(tmp_path: Path) -> None:
    tokens = labelled(tmp_path / "web", "uint32")
    for path in (tmp_path / "web", tmp_path / "web" / "*", tmp_path / "web" / "part-00000.npy"):
        files = data.TokenFiles(str(path), "uint32", SEQ, 50000, eos_id=0)
        assert [f.path for f in files.files] == [str(tmp_path / "web" / "part-00000.npy")]
        assert files.tokenizer == "a" * 64
        np.testing.assert_array_equal(files[3], tokens[3 * SEQ : 4 * SEQ + 1])
    # data.eos_id=-1 (no document boundaries) takes the files' EOS as it is.
    data.TokenFiles(str(tmp_path / "web"), "uint32", SEQ, 50000, eos_id=-1)


def test_sources_of_different_tokenizers_are_refused(tmp_path: Path) -> None:
    labelled(tmp_path / "web", "uint16", sha="a" * 64)
    labelled(tmp_path / "code", "uint16", sha="b" * 64)
    sources = [{"name": "web", "path": str(tmp_path / "web"), "weight": 1.0},
               {"name": "code", "path": str(tmp_path / "code"), "weight": 1.0}]  # fmt: skip
    with pytest.raises(
        ConfigError, match=r"web \(aaaaaaaaaaaa\), code \(bbbbbbbbbbbb\) were written by different"
    ):
        data.make_mixture(DataConfig(sources=sources, dtype="uint16"), 50000, SEQ, 8)
    with pytest.raises(ConfigError, match="2 different tokenizers"):
        data.TokenFiles(str(tmp_path / "*" / "*.npy"), "uint16", SEQ, 50000)


def test_token_files_without_metadata_are_read_as_configured_with_one_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    tokens = write_tokens(tmp_path / "old.npy", 1000, "uint16")
    for _ in range(2):
        files = data.TokenFiles(str(tmp_path / "old.npy"), "uint16", SEQ, 50000)
        np.testing.assert_array_equal(files[1], tokens[SEQ : 2 * SEQ + 1])
        data.warn_unlabelled([data.Part("old", files, 1.0)])
    assert files.tokenizer is None and files.unlabelled
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"without {token_meta.FILENAME}" in err and "read as uint16" in err


def test_the_trainer_refuses_a_source_whose_metadata_disagrees_exit_2_nothing_written(tmp_path: Path) -> None:
    labelled(tmp_path / "web", "uint32")
    run_dir = tmp_path / "run"
    sets = [
        "data.source=files",
        f"data.path={tmp_path / 'web'}",
        "data.dtype=uint16",
        "model.vocab_size=50000",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "--config", "tiny", f"--set=run_dir={run_dir}", *(f"--set={s}" for s in sets)],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert (
        len(lines) == 1
        and "trainer: config error: token files" in lines[0]
        and "set data.dtype=uint32" in lines[0]
    )
    assert not run_dir.exists() or not any(run_dir.iterdir())


def test_gcs_token_files_metadata_is_read_and_checked(tmp_path: Path, gcs: FakeGCS) -> None:
    labelled(tmp_path / "web", "uint32")
    for name in ("part-00000.npy", token_meta.FILENAME):
        gcs.write_object("reslice", f"web/{name}", (tmp_path / "web" / name).read_bytes())
    script = """
import json
from trainer.data import pipeline as data
from trainer.config import ConfigError
ok = data.TokenFiles("gs://reslice/web/*", "uint32", 32, 50000)
try:
    data.TokenFiles("gs://reslice/web", "uint16", 32, 50000)
    refused = ""
except ConfigError as e:
    refused = str(e)
print(json.dumps([[f.path for f in ok.files], ok.tokenizer, refused]))
"""
    env = {**gcs.env, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    files, tokenizer, refused = json.loads(out.stdout.strip().splitlines()[-1])
    assert files == ["gs://reslice/web/part-00000.npy"] and tokenizer == "a" * 64
    assert "token files gs://reslice/web (reslice-tokens.json): its token ids are uint32" in refused
