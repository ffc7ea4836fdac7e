"""The peak FLOP/s behind ``perf/mfu`` (trainer/telemetry/peaks.py): the launcher's
``RESLICE_PEAK_TFLOPS`` first, then the table by JAX's device kind, else none (a CPU); and the
table agrees with the launcher's presets (the two packages import nothing of each other)."""

from __future__ import annotations

import os

import jax
import pytest

from launcher.adapters.preset_files import load_presets
from trainer.config import ConfigError
from trainer.telemetry import peaks

# JAX's device kind of each generation the presets name (the bench's, on the chips themselves).
KIND = {"tpu7x": "TPU7x", "v6e": "TPU v6 lite", "v5p": "TPU v5p", "v4": "TPU v4"}


@pytest.mark.parametrize(
    ("env", "kind", "expected"),
    [
        ({}, "TPU v5 lite", 197.0),  # no launcher: the table
        ({"RESLICE_PEAK_TFLOPS": ""}, "TPU v5 lite", 197.0),  # empty is unset
        ({"RESLICE_PEAK_TFLOPS": "150.5"}, "TPU v5 lite", 150.5),  # the launcher's preset wins
        ({"RESLICE_PEAK_TFLOPS": "1153.5"}, "a chip the table does not know", 1153.5),
        ({}, "a chip the table does not know", None),
        ({}, "TPU7x", 2307 / 2),  # per JAX device: two a chip
        ({}, "TPU v5", 459.0),  # v5p, as some releases name it
    ],
)
def test_the_launchers_peak_then_the_table(env: dict[str, str], kind: str, expected: float | None) -> None:
    assert peaks.peak_tflops(env, kind) == expected


def test_a_cpu_has_no_peak() -> None:
    kind = jax.devices("cpu")[0].device_kind
    assert peaks.peak_tflops({}, kind) is None
    assert peaks.peak_tflops({"RESLICE_PEAK_TFLOPS": "2"}, kind) == 2.0  # told, it is believed


@pytest.mark.parametrize("raw", ["fast", "0", "-3", "nan"])
def test_a_peak_that_is_not_a_positive_number_is_a_config_error(raw: str) -> None:
    with pytest.raises(ConfigError, match="RESLICE_PEAK_TFLOPS"):
        peaks.peak_tflops({"RESLICE_PEAK_TFLOPS": raw}, "TPU v5 lite")


def test_the_table_has_every_presets_figures() -> None:
    presets = load_presets()
    assert {p.generation for p in presets.values()} == set(KIND)
    for name, p in presets.items():
        chip = peaks.CHIPS[KIND[p.generation]]
        assert (chip.tflops, chip.devices) == (p.peak_tflops_per_chip, p.devices_per_chip), name
        # What the renderer sets RESLICE_PEAK_TFLOPS to is what the table gives without it.
        assert peaks.device_peak_tflops(KIND[p.generation]) == p.peak_tflops_per_chip / p.devices_per_chip


@pytest.mark.parametrize("known", [True, False], ids=["a-device-the-table-knows", "a-cpu"])
def test_the_trainer_records_mfu_whenever_the_devices_peak_is_known_without_the_launcher(
    tmp_path, monkeypatch: pytest.MonkeyPatch, cpu8: list, known: bool
) -> None:
    """``perf/mfu`` in the trainer's own records, no ``RESLICE_PEAK_TFLOPS`` (no launcher): from the
    table when it knows the device (here the CPU, entered as a chip of 8 devices), null when not."""
    import json

    from tests.trainer import runs
    from trainer.__main__ import main

    if known:
        monkeypatch.setitem(peaks.CHIPS, cpu8[0].device_kind, peaks.Chip(8.0, devices=8))
    for k in [k for k in os.environ if k.startswith("RESLICE_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("RESLICE_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("RESLICE_GLOBAL_BATCH", "16")
    sets = [*runs.MODEL, "train.steps=2", "metrics.log_every=1000"]
    assert main(["--config", "tiny", *(a for s in sets for a in ("--set", s))]) == 0
    records = [
        json.loads(x) for f in (tmp_path / "metrics").glob("*.jsonl") for x in f.read_text().splitlines()
    ]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        want = r["perf/per_device_tflops_per_sec"] / 1.0 if known else None
        assert r["perf/mfu"] == (pytest.approx(want) if known else None), r
