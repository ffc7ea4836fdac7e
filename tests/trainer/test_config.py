"""Config resolution, validation, hashing, and the models' sizes (built abstractly only)."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from trainer import config
from trainer.__main__ import main
from trainer.config import ConfigError
from trainer.model import mesh, sizes, transformer


def abstract_param_count(name: str) -> int:
    abstract = transformer.abstract_model(config.load(name))
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


def test_tiny_is_under_a_million_parameters() -> None:
    total, active = sizes.param_counts(config.load("tiny"))
    assert abstract_param_count("tiny") == total < 1_000_000
    assert active < total


def test_olmoe_config_is_about_one_billion_active_parameters() -> None:
    """Counted from ``nnx.eval_shape``: nothing is materialised."""
    cfg = config.load("olmoe-1b")
    total, active = sizes.param_counts(cfg)
    assert abstract_param_count("olmoe-1b") == total
    assert 6.5e9 < total < 7.5e9 and 1.1e9 < active < 1.5e9
    assert 6 * active < sizes.flops_per_token(cfg) < 6 * active * 1.2
    assert abstract_param_count("small") == sizes.param_counts(config.load("small"))[0]


def test_precedence_config_then_overrides_then_contract_env(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("base: small\noptim:\n  lr: 0.01\ntrain:\n  global_batch: 64\n")
    env = {
        "RESLICE_CONFIG": "tiny",  # --config wins over it
        "RESLICE_SET": json.dumps(["optim.lr=0.02", "train.steps=7", "moe.transport=dense"]),
        "RESLICE_GLOBAL_BATCH": "128",
        "RESLICE_MICRO_BATCH": "4",
        "RESLICE_GRAD_ACCUM": "2",
        "RESLICE_RUN_DIR": "gs://bucket/run",
    }
    cfg = config.resolve(
        str(path), ["train.steps=9", "moe.ragged_buffer_factor=1.5", "run_dir=/elsewhere"], env
    )
    assert cfg.model.d_model == 256  # from base: small
    assert cfg.optim.lr == 0.02  # RESLICE_SET over the file
    assert cfg.train.steps == 9  # --set over RESLICE_SET
    assert cfg.moe.ragged_buffer_factor == 1.5 and cfg.moe.transport == "dense"
    assert (cfg.train.global_batch, cfg.train.micro_batch, cfg.train.grad_accum) == (128, 4, 2)  # env last
    assert cfg.run_dir == "gs://bucket/run"
    assert config.resolve(None, [], {"RESLICE_CONFIG": "small"}).name == "small"


@pytest.mark.parametrize(
    ("overrides", "env", "message"),
    [
        (["train.stepz=3"], {}, "unknown config key 'train.stepz'"),
        (["nope.x=1"], {}, "unknown config section 'nope'"),
        (["train.steps=1.5"], {}, "train.steps: expected int"),
        (["moe.top_k=20"], {}, "moe.top_k must be in"),
        (["train.debug_start_delay_s=-1"], {}, "train.debug_start_delay_s must be >= 0"),
        (["train.debug_step_pause_s=-0.5"], {}, "train.debug_step_pause_s must be >= 0"),
        (["checkpoint.debug_save_delay_s=-1"], {}, "checkpoint.debug_save_delay_s must be >= 0"),
        (["train.steps"], {}, "not of the form"),
        ([], {"RESLICE_SET": "train.steps=3"}, "RESLICE_SET is not a JSON list"),
        ([], {"RESLICE_GLOBAL_BATCH": "many"}, "RESLICE_GLOBAL_BATCH='many' is not an integer"),
        ([], {"RESLICE_CONFIG": "huge"}, "neither a named config"),
    ],
)
def test_config_errors(overrides: list[str], env: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config.resolve(None, overrides, env)


def test_main_reports_config_errors_in_one_line_with_exit_2(
    capsys: pytest.CaptureFixture, monkeypatch
) -> None:
    monkeypatch.delenv("RESLICE_CONFIG", raising=False)
    assert main(["--config", "tiny", "--set", "optim.lr=fast"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "optim.lr: expected float" in err
    with pytest.raises(SystemExit) as exit_info:
        main(["--bogus"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_batch_plan_is_checked_against_the_devices(cpu8: list, capsys, monkeypatch, tmp_path: Path) -> None:
    cfg = config.resolve("tiny", [], {"RESLICE_GLOBAL_BATCH": "32", "RESLICE_GRAD_ACCUM": "2"})
    assert mesh.batch_plan(cfg, 8, 1, 8) == mesh.BatchPlan(8, 2, 2, 1, 8, 8)  # micro-batch derived
    # Tensor parallel 4: 2 data-parallel ranks share the batch, 8 sequences each per micro-step.
    assert mesh.batch_plan(cfg, 8, 1, 1, ranks=2, fsdp=2) == mesh.BatchPlan(8, 8, 2, 1, 1, 2, 2, 4)
    with pytest.raises(ConfigError, match=r"8 × 2 × 1 = 16 ≠ global batch 32"):
        mesh.batch_plan(
            config.resolve("tiny", [], {"RESLICE_GLOBAL_BATCH": "32", "RESLICE_MICRO_BATCH": "2"}), 8, 1, 8
        )
    with pytest.raises(ConfigError, match="≠ global batch 12"):
        mesh.batch_plan(config.resolve("tiny", [], {"RESLICE_GLOBAL_BATCH": "12"}), 8, 1, 8)
    # Through the real entry point, against the 8 devices JAX sees here; nothing is written.
    monkeypatch.setenv("RESLICE_GLOBAL_BATCH", "12")
    monkeypatch.setenv("RESLICE_RUN_DIR", str(tmp_path / "run"))
    assert main(["--config", "tiny"]) == 2
    assert "8 × 1 × 1 = 8 ≠ global batch 12" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_config_hash_covers_the_run_identity_not_the_layout() -> None:
    base = config.config_hash(config.load("tiny"))
    same = config.resolve(
        "tiny",
        [
            "moe.ragged_buffer_factor=1.25",
            "moe.transport=dense",
            "data.workers=2",
            "train.debug_start_delay_s=40",
            "train.debug_step_pause_s=0.3",
            "mesh.fsdp=4",
            "mesh.tensor=2",
            "model.remat=full",
            "model.attention_block=8",
            "model.loss_chunk=16",
        ],
        {},
    )  # the test hook is set on one process of a run only: it must not make it another run
    assert config.config_hash(same) == base
    for change in (
        "optim.lr=0.001",
        "model.d_model=32",
        "data.seed=5",
        "moe.top_k=1",
        "train.steps=41",
    ):
        assert config.config_hash(config.resolve("tiny", [change], {})) != base, change
    assert config.config_hash(config.resolve("tiny", ["train.steps=41", "optim.decay_steps=60"], {})) == (
        config.config_hash(config.resolve("tiny", ["train.steps=99", "optim.decay_steps=60"], {}))
    )


def test_a_refused_extension_names_the_pin_that_keeps_its_schedule() -> None:
    """What the refusal of a resume with ``train.steps`` raised adds to its line (docs/contract.md
    "Extending a run"): the decay length that gives the run its hash back, only when it would."""

    def ident(*sets: str) -> tuple[str, dict]:
        cfg = config.resolve("tiny", list(sets), {})
        return config.config_hash(cfg), json.loads(json.dumps(config.identity(cfg)))  # as a meta holds it

    saved_hash, saved = ident("train.steps=40")
    hint = config.kept_schedule(saved_hash, saved, ident("train.steps=60")[1])
    assert hint == (
        "the cosine decay follows train.steps when optim.decay_steps=0:"
        " --set optim.decay_steps=40 keeps this run's schedule"
    )
    assert ident("train.steps=60", "optim.decay_steps=40")[0] == saved_hash  # what the pin gives
    assert config.kept_schedule(saved_hash, saved, ident("train.steps=60", "optim.lr=1e-3")[1]) is None
    assert config.kept_schedule(saved_hash, saved, ident("optim.schedule=wsd")[1]) is None
    assert config.kept_schedule(None, {}, ident("train.steps=60")[1]) is None  # a meta without identity

    def point(*sets: str) -> dict:
        return config.schedule_point(config.resolve("tiny", ["optim.schedule=wsd", *sets], {}))

    hint = config.kept_decay(point("train.steps=40"), point("train.steps=60"))
    assert hint is not None and "--set optim.decay_steps=40 keeps this run's decay" in hint
    assert point("train.steps=60", "optim.decay_steps=40") == point("train.steps=40")  # what the pin gives
    assert (
        config.kept_decay(point("train.steps=40"), point("train.steps=40", "optim.decay_fraction=0.2"))
        is None
    )
    assert config.kept_decay({}, point("train.steps=60")) is None  # cosine before: the hash refused it


@pytest.mark.parametrize(
    ("override", "key", "value"),
    [
        ("optim.lr=1e-3", "lr", 1e-3),  # YAML 1.1 reads this as a string; the contract's example
        ("optim.lr=5E-4", "lr", 5e-4),
        ("optim.lr=.002", "lr", 0.002),
        ("optim.lr=3", "lr", 3.0),
        ("train.steps=1e2", "steps", 100),
        ("train.steps=2.0e1", "steps", 20),
    ],
)
def test_numbers_in_scientific_notation_are_numbers(override: str, key: str, value: float) -> None:
    cfg = config.resolve("tiny", [override], {})
    section = cfg.optim if override.startswith("optim") else cfg.train
    got = getattr(section, key)
    assert got == value and type(got) is type(value)


def test_a_yaml_file_takes_scientific_notation_too(tmp_path: Path) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text("base: tiny\noptim:\n  lr: 1e-4\n")
    assert config.load(str(path)).optim.lr == 1e-4


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optim.lr=.inf", "finite"),
        ("optim.lr=.nan", "finite"),
        ("optim.lr=-1e-3", "positive"),
        ("train.steps=1.5e0", "expected int"),
        ("optim.b2=1", r"\[0, 1\)"),
        ("data.copy_prob=2", r"\[0, 1\]"),
        ("optim.eps=0", "eps must be positive"),
        ("metrics.log_every=0", "log_every"),
        ("model.dtype=1e2", "float32 or bfloat16"),
    ],
)
def test_numbers_out_of_range_are_config_errors(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config.resolve("tiny", [override], {})


def test_a_missing_token_file_is_exit_2_before_anything_is_written(
    cpu8: list, capsys, monkeypatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RESLICE_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("RESLICE_GLOBAL_BATCH", "16")
    args = ["--config", "tiny", "--set", "data.source=files", "--set", f"data.path={tmp_path / 'none.bin'}"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not exist" in err[0]
    assert not (tmp_path / "run").exists()  # no checkpoints/, no metrics/


def test_keys_added_later_leave_an_older_runs_hash_as_it_was() -> None:
    """A run checkpointed before data mixtures, eval, the OLMo 3 recipe keys, stages and
    ``data.dtype: auto`` existed resumes under the same config hash: these are the hashes those
    configs had then."""
    assert config.config_hash(config.resolve("tiny", [], {})) == "475b43bf7696b39d"
    assert config.config_hash(config.resolve("small", [], {})) == "2fac280ceb71bcec"
    assert config.config_hash(config.resolve("tiny", ["data.dtype=uint16"], {})) == "475b43bf7696b39d"
