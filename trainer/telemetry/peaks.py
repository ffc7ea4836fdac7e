"""Peak dense bf16 FLOP/s per JAX device: the denominator of ``perf/mfu`` and of bench.accelerator's MFU.

The launcher sets ``RESLICE_PEAK_TFLOPS`` from its preset (docs/contract.md "Environment"); a
trainer started without it (``python -m trainer`` on a TPU VM, no launcher) finds its device's peak
here, by JAX's ``device_kind``. A device this table does not know (a CPU) has none: MFU is then null.
Pure: the caller reads the device kind (``jax.devices()[0].device_kind``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from contract import envvars
from trainer.config import ConfigError


@dataclass(frozen=True)
class Chip:
    """A chip's peak dense bf16 TFLOP/s (vendor data sheets, without sparsity) and how many JAX
    devices it shows (docs/platform.md): each device has its share of the chip's peak."""

    tflops: float
    devices: int = 1

    @property
    def per_device(self) -> float:
        return self.tflops / self.devices


# By JAX's ``device_kind``: every generation the launcher's presets and the bench know. The
# launcher's presets hold the same figures per chip (tests/trainer/test_peaks.py holds them equal).
CHIPS: dict[str, Chip] = {
    "TPU v4": Chip(275),  # one JAX device per chip (its two TensorCores as one, megacore)
    "TPU v5 lite": Chip(197),  # v5e
    "TPU v5": Chip(459),  # v5p (megacore)
    "TPU v5p": Chip(459),
    "TPU v6 lite": Chip(918),  # v6e (Trillium)
    "TPU7x": Chip(2307, devices=2),  # Ironwood: each of its two TensorCores is a JAX device
    "NVIDIA H200": Chip(989),
    "NVIDIA H100 80GB HBM3": Chip(989),
}


def device_peak_tflops(device_kind: str) -> float | None:
    """The table's peak TFLOP/s of one JAX device of `device_kind`; None for a kind it does not know."""
    chip = CHIPS.get(device_kind)
    return chip.per_device if chip is not None else None


def peak_tflops(env: Mapping[str, str], device_kind: str) -> float | None:
    """The peak TFLOP/s of one JAX device, for MFU: ``RESLICE_PEAK_TFLOPS`` when set (the launcher's
    preset wins: it may know a chip this table does not), else the table's for `device_kind`, else
    None (a CPU). A value that is not a positive number is a configuration error (exit 2)."""
    raw = env.get(envvars.PEAK_TFLOPS)
    if not raw:
        return device_peak_tflops(device_kind)
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise ConfigError(f"{envvars.PEAK_TFLOPS}={raw!r}: expected TFLOP/s > 0 per JAX device")
    return value
