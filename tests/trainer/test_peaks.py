"""The peak FLOP/s behind ``perf/mfu`` (trainer/telemetry/peaks.py): the launcher's
``RESLICE_PEAK_TFLOPS`` first, then the table by JAX's device kind, else none (a CPU); and the
table agrees with the launcher's presets (the two packages import nothing of each other)."""

from __future__ import annotations

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
