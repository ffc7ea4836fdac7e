"""The MaxText profile's JobSet (launcher/core/maxtext.py through launcher/core/render.py): the keys a rung
gets, the distributed environment, and bad input refused with one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.adapters.preset_files import make_shape
from launcher.core.errors import UserError
from launcher.core.render import render_jobset
from launcher.core.spec import RunSpec
from tests.support.cli import run_cli

PRESET = "tpu7x-2x2x2"  # 2 hosts and 16 JAX devices per slice


def _spec(**kw) -> RunSpec:
    base = dict(run="mt", run_dir="/runs/mt", global_batch=64, max_micro_batch=2, trainer="maxtext")
    base["config"] = "base"
    base["overrides"] = ("steps=30", "base_emb_dim=64")
    return RunSpec(**{**base, **kw})


def _container(jobset: dict) -> dict:
    return jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]


def _keys(jobset: dict) -> dict[str, str]:
    command = _container(jobset)["command"]
    assert command[:4] == ["python", "-m", "maxtext_entry", "--"]
    return dict(arg.split("=", 1) for arg in command[4:] if "=" in arg)


def _env(jobset: dict) -> dict[str, object]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in _container(jobset)["env"]}


def test_two_slices_and_one_slice_keep_the_global_batch() -> None:
    two = _keys(render_jobset(_spec(), make_shape(PRESET, 2)))
    one = _keys(render_jobset(_spec(), make_shape(PRESET, 1), segment=1))
    # 32 devices × 2 × 1 and 16 devices × 2 × 2: MaxText's global batch is 64 on both.
    assert (two["per_device_batch_size"], two["gradient_accumulation_steps"]) == ("2", "1")
    assert (one["per_device_batch_size"], one["gradient_accumulation_steps"]) == ("2", "2")
    # Slices over DCN, a slice's devices over ICI (FSDP), every other axis pinned to 1.
    assert (two["dcn_data_parallelism"], two["ici_fsdp_parallelism"]) == ("2", "16")
    assert (one["dcn_data_parallelism"], one["ici_fsdp_parallelism"]) == ("1", "16")
    for keys in (one, two):
        assert all(v == "1" for k, v in keys.items() if k.startswith("dcn_") and k != "dcn_data_parallelism")
        assert keys["steps"] == keys["learning_rate_schedule_steps"] == "30"
        assert (keys["base_output_directory"], keys["run_name"]) == ("/runs/mt", "maxtext")
        assert keys["checkpoint_period"] == "100"
        for flag in ("enable_checkpointing", "async_checkpointing", "enable_autocheckpoint"):
            assert keys[flag] == "true"
        assert keys["skip_jax_distributed_system"] == "false"
        assert keys["base_emb_dim"] == "64"
        assert "metrics_file" not in keys and "hardware" not in keys  # the entrypoint's


def test_the_distributed_environment_names_process_zero_without_a_port() -> None:
    env = _env(render_jobset(_spec(), make_shape(PRESET, 2), segment=3))
    assert env["JAX_COORDINATOR_ADDRESS"] == "mt-3-slice-0-0.mt-3"
    assert env["JOB_INDEX"] == {"fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/job-index']"}}
    assert (env["PROCESSES_IN_JOB"], env["JAX_PROCESS_COUNT"]) == ("2", "4")
    assert env["RESLICE_RUN_DIR"] == "/runs/mt" and env["RESLICE_SEGMENT"] == "3"  # the contract's, as before


def test_a_config_file_and_the_run_s_own_keys_pass_through() -> None:
    spec = _spec(
        config="/configs/tiny.yml",
        overrides=(
            "steps=30",
            "learning_rate_schedule_steps=100",
            "checkpoint_period=5",
            "ici_tensor_parallelism=4",
        ),
    )
    jobset = render_jobset(spec, make_shape(PRESET, 2))
    assert _container(jobset)["command"][4] == "/configs/tiny.yml"
    keys = _keys(jobset)
    assert keys["learning_rate_schedule_steps"] == "100"  # the run pinned it itself
    assert keys["checkpoint_period"] == "5"
    assert (keys["ici_tensor_parallelism"], keys["ici_fsdp_parallelism"]) == ("4", "4")


def test_short_notice_capacity_gets_the_short_interval() -> None:
    spec = _spec(save_seconds=100.0, short_notice_interval=7, grace_period_s=30)
    assert _keys(render_jobset(spec, make_shape(PRESET, 2)))["checkpoint_period"] == "7"


def test_grain_input_resumes_by_step_on_any_process_count() -> None:
    grain = ("steps=30", "dataset_type=grain", "grain_train_files=/data/train.array_record")
    keys = _keys(render_jobset(_spec(overrides=grain), make_shape(PRESET, 2)))
    assert (keys["grain_use_elastic_iterator"], keys["packing"]) == ("true", "false")
    synthetic = _keys(render_jobset(_spec(), make_shape(PRESET, 2)))
    assert "grain_use_elastic_iterator" not in synthetic and "packing" not in synthetic


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ("grain_use_elastic_iterator=false", "resumes grain input on other shapes by step"),
        ("grain_file_type=tfrecord", "reads only arrayrecord"),
        ("packing=true", "forbids packing"),
        ("use_truncation=false", "needs truncation"),
        ("grain_train_mixture_config_path=/m.json", "reads one file pattern"),
    ],
)
def test_grain_input_that_cannot_resume_by_step_is_refused(extra: str, words: str) -> None:
    spec = _spec(overrides=("steps=30", "dataset_type=grain", "grain_train_files=/d/t.array_record", extra))
    with pytest.raises(UserError, match=words):
        render_jobset(spec, make_shape(PRESET, 2))


def test_the_reslice_trainer_is_unchanged() -> None:
    spec = RunSpec(run="r", run_dir="/runs/r", global_batch=32)
    container = _container(render_jobset(spec, make_shape(PRESET, 2)))
    assert container["command"] == ["python", "-m", "trainer"]
    assert "JAX_COORDINATOR_ADDRESS" not in {e["name"] for e in container["env"]}


@pytest.mark.parametrize(
    ("overrides", "config", "words"),
    [
        (("steps=30", "no_such_key=1"), "base", "'no_such_key' is not a MaxText 0.2.5 configuration key"),
        (("steps=30", "per_device_batch_size=4"), "base", "reslice sets per_device_batch_size"),
        (("steps=30", "dcn_data_parallelism=4"), "base", "reslice sets dcn_data_parallelism"),
        (("steps=30", "metrics_file=/tmp/m"), "base", "reslice sets metrics_file"),
        (("base_emb_dim=64",), "base", "needs the run's length: --set steps=N"),
        (("steps=0",), "base", "steps must be a positive integer"),
        (("steps=30", "ici_tensor_parallelism=3"), "base", "does not divide the 16 devices of a slice"),
        (("steps=30",), "configs/tiny.yml", "an absolute path of a .yml file"),
        (("steps=30",), "tiny", "give 'base'"),
    ],
)
def test_bad_keys_are_refused(overrides: tuple[str, ...], config: str, words: str) -> None:
    with pytest.raises(UserError, match=words.replace("(", r"\(").replace(".", r"\.")):
        render_jobset(_spec(overrides=overrides, config=config), make_shape(PRESET, 2))


RENDER = ["render", "--preset", PRESET, "--run", "mt", "--run-dir", "/runs/mt", "--trainer", "maxtext"]


def test_render_prints_the_profile(capsys) -> None:
    code, out, err = run_cli(capsys, *RENDER, "-b", "64", "--set", "steps=30", "--json")
    assert code == 0, err
    jobset = json.loads(out)
    assert _keys(jobset)["per_device_batch_size"] == "4"  # 16 devices, the default max micro-batch
    assert _env(jobset)["RESLICE_CONFIG"] == "base"  # MaxText's base.yml when --config is not given


def test_each_profile_defaults_to_its_own_image(capsys) -> None:
    """`--trainer maxtext` runs the MaxText image (docker/maxtext.Dockerfile) unless --image says
    otherwise; reslice's own trainer keeps its image."""
    images = []
    for argv in (
        [*RENDER, "-b", "64", "--set", "steps=30"],
        [*RENDER, "-b", "64", "--set", "steps=30", "--image", "reg.example/p/mt:7"],
        ["render", "--preset", PRESET, "--run", "r", "--run-dir", "/runs/r", "-b", "64"],
    ):
        code, out, err = run_cli(capsys, *argv, "--json")
        assert code == 0, err
        images.append(_container(json.loads(out))["image"])
    assert images == ["reslice-maxtext:latest", "reg.example/p/mt:7", "reslice-trainer:latest"]


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["-b", "40", "--set", "steps=30"], "global batch 40 is not divisible by 16 devices"),
        (["-b", "64", "--set", "steps=30", "--set", "bogus=1"], "'bogus' is not a MaxText"),
        (["-b", "64", "--set", "steps=30", "--trainer", "megatron"], "--trainer 'megatron': expected one of"),
    ],
)
def test_render_bad_input_is_one_line_and_exit_2(
    capsys, tmp_path: Path, extra: list[str], words: str
) -> None:
    out = tmp_path / "js.yaml"
    code, stdout, err = run_cli(capsys, *RENDER, *extra, "-o", str(out))
    assert code == 2
    assert words in err and err.count("\n") == 1 and err.startswith("reslice: error: ")
    assert not out.exists() and stdout == ""


def test_launch_refuses_a_bad_key_before_it_connects(capsys, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["launch", "--preset", PRESET, "--run", "mt", "-b", "64", "--trainer", "maxtext", "--detach"]
    # A kubeconfig that does not exist: had the check come after connecting, the error would say so.
    argv += ["--kubeconfig", str(tmp_path / "none"), "--set", "steps=30", "--set", "bogus=1"]
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and "'bogus' is not a MaxText 0.2.5 configuration key" in err
    assert list(tmp_path.iterdir()) == []  # no run directory
