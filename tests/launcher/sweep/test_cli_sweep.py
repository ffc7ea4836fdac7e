"""`reslice sweep` refuses bad input in one line with exit code 2 before it connects to any cluster;
`reslice sweep-report` redraws from stored results."""

import json

import pytest

import launcher.cli.connect
from launcher.sweep.files import write_outputs
from launcher.sweep.results import FactorResult
from launcher.sweep.spec import make_sweep
from tests.support.cli import run_cli


@pytest.fixture
def no_cluster(monkeypatch, tmp_path):
    """Any attempt to reach (or start) a cluster is recorded, and would find none."""
    calls = []
    monkeypatch.setattr(
        launcher.cli.connect, "connect", lambda *a, **k: calls.append(a) or pytest.fail("connected")
    )
    monkeypatch.setenv("RESLICE_CLUSTER_DIR", str(tmp_path / "cluster"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    return calls


BASE = ["sweep", "--preset", "tpu7x-2x2x1", "--steps", "20", "--name", "s"]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--factors", ""], "--factors is empty"),
        (["--factors", "1.0,x"], "'x' is not a number"),
        (["--factors", "1.0,1.25,1"], "1 is given twice"),
        (["--factors", "1,-1,0"], "means dropless"),
        (["--warmup", "20"], "--steps 20 ≤ --warmup 20"),
        (["--set", "moe.ragged_buffer_factor=3"], "use --factors"),
        (["--set", "nokey"], "expected key=value"),
        (["--max-drop", "-0.1"], "--max-drop"),
        (["--global-batch", "12"], "not divisible by 8 devices"),
        (["--steps", "abc"], "--steps"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_launches_nothing(capsys, tmp_path, no_cluster, extra, needle):
    sweep_dir = tmp_path / "sw"
    code, out, err = run_cli(capsys, *BASE, "--sweep-dir", str(sweep_dir), *extra)
    assert code == 2, (out, err)
    assert needle in err and len(err.strip().splitlines()) == 1, err
    assert no_cluster == [] and not sweep_dir.exists() and not (tmp_path / "cluster").exists()


def test_a_directory_holding_another_sweep_is_refused(capsys, tmp_path, no_cluster):
    other = make_sweep(name="s", preset="tpu7x-2x2x1", slices=None, config="tiny", factors="1,-1", steps=30,
                       sweep_dir=str(tmp_path))  # fmt: skip
    write_outputs(other, [])
    before = (tmp_path / "sweep.json").read_text()
    code, _, err = run_cli(capsys, *BASE, "--sweep-dir", str(tmp_path))
    assert code == 2 and "different settings (steps=30)" in err and no_cluster == []
    assert (tmp_path / "sweep.json").read_text() == before


def test_sweep_report_redraws_from_stored_results(capsys, tmp_path):
    s = make_sweep(name="s", preset="tpu7x-2x2x1", slices=None, config="tiny", factors="1,2,-1", steps=20,
                   sweep_dir=str(tmp_path))  # fmt: skip
    rs = [
        FactorResult(
            f,
            f"s-f{f}",
            "Finished",
            measured_steps=5,
            buffer_rows=b,
            dropped_fraction=d,
            step_time_median_s=t,
            tokens_per_sec=1000.0,
        )
        for f, b, d, t in [(1.0, 128, 0.1234, 0.02), (2.0, 256, 0.0004, 0.025), (-1.0, 512, 0.0, 0.03)]
    ]
    write_outputs(s, rs)
    (tmp_path / "sweep.png").unlink()
    code, out, err = run_cli(capsys, "sweep-report", "s", "--sweep-dir", str(tmp_path))
    assert code == 0, err
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    for needle in (
        "12.340 %",
        "0.040 %",
        "dropless",
        "512",
        "◀ recommended",
        "moe.ragged_buffer_factor=2",
        "16.7 % saved",
    ):
        assert needle in out, needle
    assert json.loads((tmp_path / "sweep.json").read_text())["recommendation"]["factor"] == 2.0


def test_sweep_report_of_a_missing_sweep(capsys, tmp_path):
    code, _, err = run_cli(capsys, "sweep-report", "nope", "--sweep-dir", str(tmp_path / "nope"))
    assert code == 2 and "no sweep results" in err and len(err.strip().splitlines()) == 1
