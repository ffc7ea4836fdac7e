"""Where the entrypoint finds MaxText, and the coordinator address it gives MaxText's JAX on CPU
(docs/maxtext.md, The embedded cluster): pure functions of the environment and the checkout."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from maxtext_entry.args import ConfigError
from maxtext_entry.run import child_env, maxtext_python


def test_maxtext_python_from_the_environment_else_the_checkouts_venv(tmp_path) -> None:
    # The suite's venv has no MaxText: the checkout's .venv-maxtext, then nothing (exit 2 upstream).
    with pytest.raises(ConfigError, match=r"no MaxText here: .*\.venv-maxtext/bin/python.*dev.py maxtext"):
        maxtext_python({}, str(tmp_path))
    python = tmp_path / ".venv-maxtext" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    assert maxtext_python({}, str(tmp_path)) == str(python)
    assert maxtext_python({"RESLICE_MAXTEXT_PYTHON": "/opt/mt/python"}, str(tmp_path)) == "/opt/mt/python"


def test_the_coordinator_binds_its_own_address_on_cpu_only() -> None:
    # MaxText appends its fixed port 1234; bound to the pod's own address, not [::]:1234.
    env = {"JAX_COORDINATOR_ADDRESS": "127.31.4.15", "PATH": "/bin"}
    assert child_env(env, cpu=True) == {**env, "JAX_COORDINATOR_BIND_ADDRESS": "127.31.4.15:1234"}
    local = child_env({"JAX_COORDINATOR_ADDRESS": "localhost"}, cpu=True)
    assert local["JAX_COORDINATOR_BIND_ADDRESS"] == "127.0.0.1:1234"
    assert child_env(env, cpu=False) == env  # TPU: JAX's own discovery, port 8476
    mine = {**env, "JAX_COORDINATOR_BIND_ADDRESS": "[::]:1234"}
    assert child_env(mine, cpu=True) == mine
    # Not resolvable (yet): left to MaxText, which retries the lookup.
    assert "JAX_COORDINATOR_BIND_ADDRESS" not in child_env(
        {"JAX_COORDINATOR_ADDRESS": "no-such-host.invalid"}, cpu=True
    )


def test_maxtext_runs_through_pretrain_py_for_grain_input_or_several_processes_on_cpu() -> None:
    from dataclasses import replace

    from maxtext_entry import metrics
    from maxtext_entry.args import Command
    from maxtext_entry.run import TRAIN_MODULE, Context, child_program

    synthetic, grain = Command([], {"dataset_type": "synthetic"}), Command([], {"dataset_type": "grain"})
    one = Context("/r", 0, 0, 0, metrics.Incarnation(0, 0, 8, 1, 1, 1), cpu=True, python="/mt/python")
    assert child_program(one, synthetic) == ["/mt/python", "-m", TRAIN_MODULE]
    four = replace(one, who=replace(one.who, num_processes=4))
    for ctx, cmd in ((four, synthetic), (one, grain), (replace(four, cpu=False), grain)):
        program = child_program(ctx, cmd)
        assert program[0] == "/mt/python" and program[1].endswith("/maxtext_entry/pretrain.py")
        assert Path(program[1]).is_file()
    # TPU (no Gloo), MaxText's own input: nothing to fix.
    assert child_program(replace(four, cpu=False), synthetic) == ["/mt/python", "-m", TRAIN_MODULE]


def test_xla_flags_the_profiles_jaxlib_lacks_are_dropped() -> None:
    # jaxlib 0.12.0.1 aborts on --xla_cpu_use_fusion_emitters (checked: "Unknown flag in XLA_FLAGS").
    flags = "--xla_dump_to=/d --xla_cpu_use_fusion_emitters=false --xla_backend_optimization_level=1"
    out = child_env({"XLA_FLAGS": flags}, cpu=True)
    assert out["XLA_FLAGS"] == "--xla_dump_to=/d --xla_backend_optimization_level=1"
    assert "XLA_FLAGS" not in child_env({}, cpu=False)
