"""Data mixtures over token files (``data.sources``) and held-out evaluation (``eval.*``).

The mixture is host-side: which source and record fill each global position is a function of
(sources, weights, seed, step, global batch), so the pure tests read 400 steps as 1, 2 or 4
processes with and without accumulation; the trainer runs then check the same digests and
per-source token counts on 8 devices, 2 devices with accumulation and 2 processes, that
evaluation changes no training loss, and that the eval loss of one checkpoint is the same on
8 devices and on 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from tests.support.fake_gcs import FakeGCS
from tests.trainer import runs
from trainer import config, evaluate, loop
from trainer.config import ConfigError, DataConfig
from trainer.data import pipeline as data
from trainer.model.mesh import batch_sharding, mesh_for
from trainer.state.checkpoint import Checkpointer

GB, SEQ, VOCAB = 16, 32, 256  # the tiny config's


def write(path: Path, tokens: np.ndarray, dtype: str = "uint16") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.asarray(tokens).astype(np.dtype(dtype).newbyteorder("<")).tofile(path)
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Source ``a``: ids 0-127 in two files of a directory; ``b``: ids 128-255 in three files
    matched by a glob; ``held``: a held-out file over the whole vocabulary."""
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    for i in range(2):
        write(root / "a" / f"part-{i}.npy", rng.integers(0, 128, 3000 + 500 * i))
    for i in range(3):
        write(root / "b" / f"part-{i}.npy", rng.integers(128, 256, 4000))
    write(root / "held.npy", rng.integers(0, 256, 2000))
    return {"a": str(root / "a"), "b": str(root / "b" / "part-*.npy"), "held": str(root / "held.npy")}


def sources(corpus: dict[str, str], wa: float = 0.25, wb: float = 0.75) -> list[dict]:
    return [
        {"name": "a", "path": corpus["a"], "weight": wa},
        {"name": "b", "path": corpus["b"], "weight": wb},
    ]


def read_step(mixture: data.Mixture, step: int, processes: int, accum: int) -> tuple[np.ndarray, str, dict]:
    """Global tokens [GB, SEQ + 1] of ``step`` read as ``processes`` hosts with ``accum``
    micro-batches would, put back in global order; the digest and tokens per source."""
    parts = [
        data.StepBatch(mixture, None, data.Layout(GB, accum, processes, p))(step) for p in range(processes)
    ]
    assert len({b["digest"] for b in parts}) == 1 and all(
        b["source_tokens"] == parts[0]["source_tokens"] for b in parts
    )
    tokens = np.concatenate([b["tokens"] for b in parts], axis=1).reshape(GB, -1)
    return tokens, parts[0]["digest"], parts[0]["source_tokens"]


def test_two_sources_keep_their_weights_and_the_same_samples_on_every_layout(corpus: dict[str, str]) -> None:
    cfg = DataConfig(sources=config.source_list("data.sources", sources(corpus)), seed=11)
    mixture = data.make_mixture(cfg, VOCAB, SEQ, GB)
    assert [len(p.source) for p in mixture.parts] == [
        (3000 - 1) // SEQ + (3500 - 1) // SEQ,
        3 * ((4000 - 1) // SEQ),
    ]
    from_a = total = 0
    counted = {"a": 0, "b": 0}
    for step in range(400):
        want, digest, per_source = read_step(mixture, step, 1, 1)
        for processes, accum in ((2, 4), (8, 1)):
            tokens, other, _ = read_step(mixture, step, processes, accum)
            assert other == digest, f"step {step}: P={processes} A={accum}"
            np.testing.assert_array_equal(tokens, want)
        inputs = want[:, :-1]  # the trained positions, as data/tokens/<name> counts them
        from_a += int((inputs < 128).sum())
        total += inputs.size
        for name, n in per_source.items():
            counted[name] += n
        # A record comes from one source: its ids lie in that source's range.
        assert all(row.max() < 128 or row.min() >= 128 for row in want)
    share_a = from_a / total
    print(f"400 steps: source a {share_a:.4f} of {total} tokens (weight 0.25), b {1 - share_a:.4f} (0.75)")
    assert abs(share_a - 0.25) <= 0.02 and abs((1 - share_a) - 0.75) <= 0.02, share_a
    assert counted == {"a": from_a, "b": total - from_a}


@pytest.mark.parametrize("weights", [(0.3, 0.7), (1.0, 2.0, 7.0), (0.05, 0.15, 0.8)])
def test_every_prefix_of_the_run_holds_each_source_within_a_sample_of_its_weight(weights: tuple) -> None:
    """Every source but the heaviest within half a sample of its share of every prefix of the run,
    the heaviest (which takes the rest) within (K - 1) / 2."""
    parts = [data.Part(f"s{k}", range(1000 + k), w) for k, w in enumerate(weights)]
    orders = [data.sample_order(1000 + k, k) for k in range(len(weights))]
    mixture = data.Mixture(parts, orders, seed=5, global_batch=GB)
    w = np.array(weights) / sum(weights)
    seen = np.zeros(len(weights), np.int64)
    for step in range(300):
        src, _ = mixture.step(step)
        seen += np.bincount(src, minlength=len(weights))
        error = np.abs(seen - (step + 1) * GB * w)
        heaviest = int(np.argmax(w))
        assert error[heaviest] <= (len(w) - 1) / 2 + 1e-9, (step, seen)
        assert np.all(np.delete(error, heaviest) <= 0.5 + 1e-9), (step, seen)
        np.testing.assert_array_equal(seen, mixture.counts((step + 1) * GB))


def test_each_source_walks_its_own_shuffle_and_covers_an_epoch_before_repeating(
    corpus: dict[str, str],
) -> None:
    cfg = DataConfig(sources=config.source_list("data.sources", sources(corpus, 1, 1)), seed=3)
    mixture = data.make_mixture(cfg, VOCAB, SEQ, GB)
    n_a = len(mixture.parts[0].source)
    got: list[int] = []
    step = 0
    while len(got) < n_a:
        src, ids = mixture.step(step)
        got += ids[src == 0].tolist()
        step += 1
    assert sorted(got[:n_a]) == list(range(n_a))


def test_one_source_is_the_order_of_before_mixtures(tmp_path: Path) -> None:
    """``data.path`` (one file) and a one-source ``data.sources`` give the single-file order: the
    same records and the same digest as ``global_sample_ids`` of the data seed."""
    write(tmp_path / "t.npy", np.arange(5000) % 256)
    single = data.make_mixture(
        DataConfig(source="files", path=str(tmp_path / "t.npy"), seed=9), VOCAB, SEQ, GB
    )
    listed = data.make_mixture(
        DataConfig(sources=[{"name": "web", "path": str(tmp_path / "t.npy"), "weight": 2.0}], seed=9),
        VOCAB,
        SEQ,
        GB,
    )
    order = data.sample_order(len(single.parts[0].source), 9)
    for step in (0, 7, 300):
        want = data.global_sample_ids(order, step, GB)
        for mixture in (single, listed):
            batch = data.StepBatch(mixture, None, data.Layout(GB, 1))(step)
            np.testing.assert_array_equal(batch["ids"][0], want)
            assert batch["digest"] == data.sample_digest(want)
    assert data.StepBatch(listed, None, data.Layout(GB, 1))(0)["source_tokens"] == {"web": GB * SEQ}


def test_token_files_that_do_not_fit_the_config_are_refused(tmp_path: Path) -> None:
    tokens = np.arange(4000) % 200
    tokens[SEQ * 60 + 5] = 300  # inside record 60 only
    write(tmp_path / "bad.npy", tokens)
    files = data.TokenFiles(
        str(tmp_path / "bad.npy"), "uint16", SEQ, VOCAB
    )  # first and last records are fine
    files.records(np.array([0, 1, 100]))
    with pytest.raises(
        data.DataError, match=r"bad.npy record 60 .* token id 300, not below model.vocab_size=256"
    ):
        files.records(np.array([3, 60]))
    (tmp_path / "odd.npy").write_bytes(b"\x01\x00" * 100 + b"\x01")
    with pytest.raises(data.DataError, match="not a whole number of uint16 tokens"):
        data.TokenFiles(str(tmp_path / "odd.npy"), "uint16", SEQ, VOCAB)
    write(tmp_path / "last.npy", np.r_[np.zeros(6 * SEQ, int), 999])  # the last record's last target
    with pytest.raises(data.DataError, match="token id 999"):  # the cheap check at open: last record
        data.TokenFiles(str(tmp_path / "last.npy"), "uint16", SEQ, VOCAB)
    with pytest.raises(data.DataError, match="matches no token files"):
        data.TokenFiles(str(tmp_path / "nothing-*.npy"), "uint16", SEQ, VOCAB)
    with pytest.raises(ConfigError, match="does not exist"):
        data.TokenFiles(str(tmp_path / "missing.npy"), "uint16", SEQ, VOCAB)
    parts = [data.Part(f"s{k}", range(100), w) for k, w in enumerate((1, 1, 1, 1, 1, 1))]
    with pytest.raises(data.DataError, match=r"too small for data\.sources' weights"):
        data.Mixture(parts, [data.sample_order(100, 0)] * 6, 0, global_batch=4)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.sources=[{name: a, path: /x, weight: 0}]"], "weight must be a positive number"),
        (["data.sources=[{name: a, path: /x}, {name: a, path: /y}]"], "source name 'a' appears twice"),
        (["data.sources=[{name: 'a b', path: /x}]"], "name must be"),
        (["data.sources=[{name: a, path: /x, wieght: 1}]"], "unknown key 'wieght'"),
        (["data.sources=/x"], "expected a list"),
        (["eval.sources=[{name: a, path: /x, weight: 1}]"], "unknown key 'weight'"),
        (["data.path=/x", "data.sources=[{name: a, path: /y}]"], "exclude each other"),
        (
            ["data.dtype=uint16", "model.vocab_size=70000", "data.source=files", "data.path=/x"],
            "data.dtype=uint16 cannot hold",
        ),
        (["data.eos_id=256"], "data.eos_id must be"),
        (["eval.batches=0"], "eval.batches positive"),
        (["train.steps=[1, 2]"], "train.steps: value must be a scalar"),
    ],
)
def test_source_config_errors(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config.resolve("tiny", overrides, {})


def test_a_yaml_config_on_a_base_with_a_mixture_and_eval(tmp_path: Path) -> None:
    path = tmp_path / "mix.yaml"
    path.write_text(
        "base: small\n"
        "data:\n  eos_id: 0\n  sources:\n"
        "    - {name: web, path: gs://b/web/, weight: 3}\n"
        "    - name: code\n      path: /data/code/*.npy\n      weight: 1e0\n"
        "eval:\n  interval: 500\n  sources:\n    - {name: c4, path: gs://b/c4-val.npy}\n"
        "train:\n  steps: 1000\n"
    )
    cfg = config.resolve(str(path), ["eval.batches=4"], {})
    assert cfg.model.d_model == 256 and cfg.train.steps == 1000 and cfg.train.global_batch == 32  # small's
    assert cfg.data.sources == [
        {"name": "web", "path": "gs://b/web/", "weight": 3.0},
        {"name": "code", "path": "/data/code/*.npy", "weight": 1.0},
    ]
    assert cfg.data.eos_id == 0 and (cfg.eval.interval, cfg.eval.batches) == (500, 4)
    assert cfg.eval.sources == [{"name": "c4", "path": "gs://b/c4-val.npy"}]
    # The same list as a JSON override (what RESLICE_SET carries), replacing the file's.
    env = {"RESLICE_SET": json.dumps(['data.sources=[{"name": "x", "path": "/x.npy", "weight": 1}]'])}
    assert config.resolve(str(path), [], env).data.sources == [{"name": "x", "path": "/x.npy", "weight": 1.0}]
    # The mixture is part of the run's identity; evaluation is not (it changes no training step).
    base = config.config_hash(cfg)
    assert config.config_hash(config.resolve(str(path), ["eval.batches=9"], {})) == base
    other = config.resolve(str(path), ["data.sources=[{name: web, path: gs://b/web/, weight: 1}]"], {})
    assert config.config_hash(other) != base


def test_gcs_prefix_and_glob_list_the_token_files(tmp_path: Path, gcs: FakeGCS) -> None:
    rng = np.random.default_rng(1)
    blobs = {f"mix/web/part-{i}.npy": rng.integers(0, 256, 1500).astype("<u2") for i in range(2)}
    blobs["mix/web/README.txt"] = np.zeros(10, "<u2")  # not a token file: not listed under a prefix
    for name, arr in blobs.items():
        gcs.write_object("reslice", name, arr.tobytes())
    script = (
        "import json; from trainer.data import pipeline as data;"
        "p = data.TokenFiles('gs://reslice/mix/web/', 'uint16', 32, 256);"
        "g = data.TokenFiles('gs://reslice/mix/web/part-*.npy', 'uint16', 32, 256);"
        "print(json.dumps([[f.path for f in p.files], len(p), p.records([0, 47, 50]).tolist(), len(g)]))"
    )
    env = {**gcs.env, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(runs.ROOT)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    paths, n, rows, n_glob = json.loads(out.stdout.strip().splitlines()[-1])
    assert paths == ["gs://reslice/mix/web/part-0.npy", "gs://reslice/mix/web/part-1.npy"]
    per_file = (1500 - 1) // SEQ
    assert n == n_glob == 2 * per_file
    first, second = blobs["mix/web/part-0.npy"], blobs["mix/web/part-1.npy"]
    assert rows[0] == first[: SEQ + 1].tolist()
    assert rows[2] == second[(50 - per_file) * SEQ : (50 - per_file) * SEQ + SEQ + 1].tolist()


# --- the trainer ---------------------------------------------------------------------------------

STEPS = ["--set", "train.steps=8", "--set", "checkpoint.interval=4", "--set", "optim.decay_steps=40"]


def mix_args(corpus: dict[str, str], eval_on: bool) -> list[str]:
    sets = ["data.sources=" + json.dumps(sources(corpus))]
    if eval_on:
        sets += [
            "eval.sources=" + json.dumps([{"name": "held", "path": corpus["held"]}]),
            "eval.interval=4",
            "eval.batches=2",
        ]
    return [*STEPS, *(a for s in sets for a in ("--set", s))]


@pytest.fixture(scope="module")
def mixed(corpus: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """8 devices, the two-source mixture, held-out eval after steps 4 and 8."""
    run_dir = tmp_path_factory.mktemp("mixed") / "run"
    rc, out = runs.run(runs.env_for(str(run_dir), 8), run_dir.parent / "trainer.log", mix_args(corpus, True))
    assert rc == 0, out[-4000:]
    return {"dir": run_dir, "records": runs.parse_metrics(runs.metrics_files(run_dir))}


def test_the_trainer_logs_tokens_per_source_and_eval_loss(mixed: dict) -> None:
    from tests.trainer.test_train import tensorboard_scalars

    records = mixed["records"]
    assert sorted(records) == list(range(1, 9))
    for rec in records.values():
        assert (rec["data/tokens/a"], rec["data/tokens/b"]) == (GB * SEQ // 4, 3 * GB * SEQ // 4)
    evaluated = {s for s, r in records.items() if "eval/held/loss" in r}
    assert evaluated == {4, 8}
    for s in evaluated:
        r = records[s]
        assert 0 < r["eval/held/loss"] < 7 and r["eval/held/perplexity"] == pytest.approx(
            np.exp(r["eval/held/loss"])
        )
        assert r["perf/eval_seconds"] > 0
        assert "perf/eval_seconds" not in records[s - 1]
    scalars = tensorboard_scalars(mixed["dir"])
    assert [s for s, _ in scalars["eval/held/loss"]] == [4, 8]
    assert len(scalars["data/tokens/a"]) == 8


def test_eval_changes_no_training_loss(mixed: dict, corpus: dict[str, str], tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    rc, out = runs.run(runs.env_for(str(run_dir), 8), tmp_path / "trainer.log", mix_args(corpus, False))
    assert rc == 0, out[-4000:]
    plain = runs.parse_metrics(runs.metrics_files(run_dir))
    assert not any("eval/held/loss" in r for r in plain.values())
    for step, rec in mixed["records"].items():
        assert rec["learning/loss"] == plain[step]["learning/loss"], step  # bit for bit
        assert rec["data/sample_digest"] == plain[step]["data/sample_digest"]


@pytest.mark.parametrize("shape", ["2 devices, accumulation 4", "2 processes"])
def test_the_mixture_takes_the_same_samples_on_every_shape(
    shape: str, mixed: dict, corpus: dict[str, str], tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    args = mix_args(corpus, shape == "2 processes")  # evaluation across processes too
    if shape == "2 processes":
        procs = runs.processes(str(run_dir), tmp_path, count=2, devices=2, args=args)
        for p in procs:
            assert p.wait() == 0, p.output()[-4000:]
    else:
        rc, out = runs.run(runs.env_for(str(run_dir), 2, grad_accum=4), tmp_path / "trainer.log", args)
        assert rc == 0, out[-4000:]
    records = runs.parse_metrics(runs.metrics_files(run_dir))
    assert sorted(records) == list(range(1, 9))
    for step, rec in records.items():
        ref = mixed["records"][step]
        assert rec["data/sample_digest"] == ref["data/sample_digest"], f"{shape}: step {step}"
        assert (rec["data/tokens/a"], rec["data/tokens/b"]) == (ref["data/tokens/a"], ref["data/tokens/b"])
        assert abs(rec["learning/loss"] - ref["learning/loss"]) <= 1e-5, f"{shape}: step {step}"
        if "eval/held/loss" in rec:  # the eval of parameters within 1e-5 of the 8-device run's
            assert abs(rec["eval/held/loss"] - ref["eval/held/loss"]) <= 1e-4, f"{shape}: step {step}"
            print(
                f"{shape}: step {step} eval loss {rec['eval/held/loss']!r} vs {ref['eval/held/loss']!r} on 8 devices"
            )
    if shape == "2 processes":
        assert {s for s, r in records.items() if "eval/held/loss" in r} == {4, 8}


def eval_at(
    run_dir: Path, step: int, devices: list, grad_accum: int, corpus: dict[str, str]
) -> dict[str, float]:
    """The eval of checkpoint ``step`` of the mixed run, restored onto a mesh of ``devices``."""
    sets = [*runs.MODEL, "eval.sources=" + json.dumps([{"name": "held", "path": corpus["held"]}]), "eval.batches=2",
            f"train.grad_accum={grad_accum}"]  # fmt: skip
    cfg = config.resolve("tiny", sets, {})
    mesh = mesh_for(cfg, devices)
    with jax.set_mesh(mesh):
        model = loop.Model(cfg, mesh)
        ckpt = Checkpointer(str(run_dir), keep=3, async_save=False)
        try:
            state = ckpt.restore(step, model.abstract())
        finally:
            ckpt.close()
        shape = (grad_accum, GB // grad_accum, SEQ + 1)
        ev = evaluate.Evaluator.build(cfg, data.Layout(GB, grad_accum), batch_sharding(mesh), shape)
        assert ev is not None
        ev.compile(model, state)
        return ev(state)


def test_eval_loss_of_a_checkpoint_is_the_same_on_8_and_2_devices(
    mixed: dict, corpus: dict[str, str], cpu8: list
) -> None:
    on8 = eval_at(mixed["dir"], 8, cpu8, 1, corpus)
    on2 = eval_at(mixed["dir"], 8, cpu8[:2], 4, corpus)
    # What the run logged after step 8 is this checkpoint's eval (the state it saved).
    assert abs(on8["eval/held/loss"] - mixed["records"][8]["eval/held/loss"]) <= 1e-6
    print(
        f"eval loss of checkpoint 8: {on8['eval/held/loss']!r} on 8 devices, {on2['eval/held/loss']!r} on 2 (accumulation 4)"
    )
    assert abs(on2["eval/held/loss"] - on8["eval/held/loss"]) <= 1e-5, (on2, on8)
    # A different checkpoint evaluates differently: the figure is the parameters', not a constant.
    assert eval_at(mixed["dir"], 4, cpu8, 1, corpus)["eval/held/loss"] != on8["eval/held/loss"]


def test_a_token_id_outside_the_vocabulary_mid_run_is_exit_2_in_one_line(tmp_path: Path) -> None:
    """The first and last records pass the start-up check; a middle one, read at step 1 or 2 (20
    records, 16 a step), fails the run with the file and the record named, not retried."""
    tokens = np.random.default_rng(2).integers(0, VOCAB, 20 * SEQ + 1)
    tokens[10 * SEQ + 3] = 4000
    write(tmp_path / "bad.npy", tokens)
    args = [
        "--set",
        "train.steps=4",
        "--set",
        "data.sources=" + json.dumps([{"name": "x", "path": str(tmp_path / "bad.npy")}]),
    ]
    rc, out = runs.run(runs.env_for(str(tmp_path / "run"), 2), tmp_path / "trainer.log", args)
    assert rc == 2, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("trainer: config error:")]
    assert len(errors) == 1 and "Traceback" not in out, out[-3000:]
    assert f"{tmp_path / 'bad.npy'} record 10 " in errors[0] and "token id 4000" in errors[0]
