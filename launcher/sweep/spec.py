"""The pure half of the ragged-buffer sweep: its factors and their names, its spec (`SweepSpec`,
checked from the command line by `make_sweep`) and what a rerun does with each of its runs
(`next_action`). No I/O; called by `launcher/sweep/driver.py` (the driver), `launcher/sweep/files.py`,
`launcher/sweep/results.py` and `reslice sweep` (`launcher/cli/commands/sweeping.py`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from launcher.adapters.preset_files import make_shape
from launcher.core.errors import UserError
from launcher.core.record import RunRecord
from launcher.core.render import DNS1035
from launcher.core.words import RunState, TrainerProfile, TrainerState

FACTOR_KEY = "moe.ragged_buffer_factor"
# The factor's key in each trainer profile: reslice's trainer (trainer/model/moe.py) and MaxText's
# `ragged_buffer_factor` (base.yml: the buffer is balanced size × factor; ≤ 0 is dropless).
FACTOR_KEYS: dict[str, str] = {
    TrainerProfile.RESLICE: FACTOR_KEY,
    TrainerProfile.MAXTEXT: "ragged_buffer_factor",
}
# What a MaxText run of the sweep gets besides the factor: MaxText's two overflow probes (0.2.5's
# base.yml; docs/maxtext.md, The sweep), which MaxText accepts only on the ring-of-experts ragged
# path (`validate_moe_log_max_load_ratio`, `configs/types.py`), so that path is set too.
MAXTEXT_PROBES = {
    "moe_log_max_load_ratio": "true",
    "log_required_ragged_buffer_factor": "true",
    "use_ring_of_experts": "true",
    "use_ragged_sort": "true",
}


def is_dropless(factor: float) -> bool:
    return factor <= 0


def factor_label(factor: float) -> str:
    """``1.0625``, ``2`` or ``dropless``: short, and exact (falls back to repr when ``g`` rounds)."""
    if is_dropless(factor):
        return "dropless"
    short = format(factor, "g")
    return short if float(short) == factor else repr(factor)


def sort_key(factor: float) -> tuple[int, float]:
    """Ascending factor, dropless last (it is the largest buffer of all)."""
    return (1, 0.0) if is_dropless(factor) else (0, factor)


DEFAULT_FACTORS = "1.0,1.0625,1.125,1.25,1.5,2.0,-1"
# The first steps are not what a run settles into: the router is still near its random init, the
# learning rate is still warming up (10 steps in the named configs) and step 1 includes compilation.
DEFAULT_WARMUP = 10
DEFAULT_MAX_DROP = 0.001  # a share of routed (token, expert) rows
# Keys the sweep sets itself, per profile: a --set of one of them would silently break the comparison.
RESERVED: dict[str, dict[str, str]] = {
    TrainerProfile.RESLICE: {
        FACTOR_KEY: "--factors",
        "train.steps": "--steps",
        "train.global_batch": "--global-batch",
    },
    TrainerProfile.MAXTEXT: {
        FACTOR_KEYS[TrainerProfile.MAXTEXT]: "--factors",
        "steps": "--steps",
        **{k: "nothing: the sweep reads MaxText's overflow probes, which need it" for k in MAXTEXT_PROBES},
    },
}

# next_action() outcomes.
DONE = "done"  # finished with results: read them, touch nothing
ATTACH = "attach"  # still live in the cluster (the sweep was interrupted): control it to the end
LAUNCH = "launch"  # never launched (or its record is gone and it never finished)
RELAUNCH = "relaunch"  # Failed or Stopped: launch again under the same name; it resumes its checkpoint
MISSING = "missing"  # Finished, but its results are gone: rerunning would not bring them back


# --- factors and names ---------------------------------------------------------------------------


def factor_slug(factor: float) -> str:
    """DNS-1035-safe and one-to-one over floats: ``1p0625``, ``2``, ``1em05``, ``dropless``."""
    if is_dropless(factor):
        return "dropless"
    text = repr(factor)
    if text.endswith(".0"):
        text = text[:-2]
    return text.replace(".", "p").replace("-", "m").replace("+", "")


def run_name(sweep: str, factor: float) -> str:
    return f"{sweep}-f{factor_slug(factor)}"


def parse_factors(text: str) -> tuple[float, ...]:
    """``"1.0,1.25,-1"`` -> (1.0, 1.25, -1.0). Every mistake is a UserError naming the culprit."""
    items = [t.strip() for t in text.split(",")]
    if not text.strip():
        raise UserError("--factors is empty: give a comma-separated list such as 1.0,1.25,-1")
    out: list[float] = []
    for item in items:
        if not item:
            raise UserError(f"--factors {text!r}: empty item")
        try:
            value = float(item)
        except ValueError:
            raise UserError(f"--factors: {item!r} is not a number") from None
        if not math.isfinite(value):
            raise UserError(f"--factors: {item!r} is not a finite number")
        out.append(value)
    dropless = [f for f in out if is_dropless(f)]
    if len(dropless) > 1:
        raise UserError(
            f"--factors: {len(dropless)} values ≤ 0 ({text}); any value ≤ 0 means dropless: give one"
        )
    seen: set[float] = set()
    for f in out:
        if f in seen:
            raise UserError(f"--factors: {factor_label(f)} is given twice")
        seen.add(f)
    return tuple(out)


# --- the sweep spec ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepSpec:
    name: str
    sweep_dir: str
    preset: str
    slices: int
    config: str
    factors: tuple[float, ...]
    steps: int
    global_batch: int
    overrides: tuple[str, ...] = ()
    warmup: int = DEFAULT_WARMUP
    max_drop: float = DEFAULT_MAX_DROP
    max_parallel: int = 1
    trainer: str = TrainerProfile.RESLICE  # the trainer profile (launcher/core/maxtext.py)

    @property
    def factor_key(self) -> str:
        return FACTOR_KEYS[self.trainer]

    def run_dir(self, factor: float) -> str:
        return f"{self.sweep_dir.rstrip('/')}/{run_name(self.name, factor)}"

    def run_overrides(self, factor: float) -> tuple[str, ...]:
        # The sweep's own keys come last, so they win over anything the config file says.
        if self.trainer == TrainerProfile.MAXTEXT:
            probes = tuple(f"{k}={v}" for k, v in MAXTEXT_PROBES.items())
            return (*self.overrides, f"steps={self.steps}", *probes, f"{self.factor_key}={factor!r}")
        return (*self.overrides, f"train.steps={self.steps}", f"{FACTOR_KEY}={factor!r}")

    def identity(self) -> dict[str, Any]:
        """What every run of the sweep must share for the runs to be comparable (and resumable)."""
        return {
            "preset": self.preset,
            "slices": self.slices,
            "config": self.config,
            "steps": self.steps,
            "global_batch": self.global_batch,
            "overrides": list(self.overrides),
            "trainer": self.trainer,
        }

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["factors"], d["overrides"] = list(self.factors), list(self.overrides)
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> SweepSpec:
        known = {f.name for f in fields(SweepSpec)}
        d = {k: v for k, v in d.items() if k in known}
        return SweepSpec(**{**d, "factors": tuple(d["factors"]), "overrides": tuple(d.get("overrides", ()))})


def make_sweep(
    *,
    name: str,
    preset: str,
    slices: int | None,
    config: str,
    factors: str,
    steps: int,
    global_batch: int | None = None,
    overrides: Sequence[str] = (),
    warmup: int = DEFAULT_WARMUP,
    max_drop: float = DEFAULT_MAX_DROP,
    max_parallel: int = 1,
    sweep_dir: str | None = None,
    trainer: str = TrainerProfile.RESLICE,
) -> SweepSpec:
    """Validate the command line into a SweepSpec (no I/O). Raises UserError on bad input."""
    if not DNS1035.match(name):
        raise UserError(f"--name {name!r} is not a DNS-1035 label (lowercase letters, digits and '-')")
    parsed = parse_factors(factors)
    if steps < 1:
        raise UserError(f"--steps {steps}: must be positive")
    if warmup < 0:
        raise UserError(f"--warmup {warmup}: must be ≥ 0")
    if steps <= warmup:
        raise UserError(f"--steps {steps} ≤ --warmup {warmup}: no step would be measured")
    if not 0 <= max_drop < 1:
        raise UserError(f"--max-drop {max_drop}: a fraction in [0, 1) (0.001 = 0.1 %)")
    if max_parallel < 1:
        raise UserError(f"--max-parallel {max_parallel}: must be ≥ 1")
    reserved = RESERVED[trainer]
    for kv in overrides:
        key = kv.split("=", 1)[0].strip()
        if key in reserved:
            raise UserError(f"--set {kv!r}: the sweep sets {key} itself (use {reserved[key]})")
    if trainer == TrainerProfile.MAXTEXT:
        moe_model(config, overrides)
    shape = make_shape(preset, slices)
    # Two sequences per device: the smallest batch that gives every device more than one sequence.
    gb = global_batch if global_batch is not None else 2 * shape.devices
    return SweepSpec(
        name=name,
        sweep_dir=default_sweep_dir(name, sweep_dir),
        preset=shape.preset.name,
        slices=shape.slices,
        config=config,
        factors=parsed,
        steps=steps,
        global_batch=gb,
        overrides=tuple(overrides),
        warmup=warmup,
        max_drop=max_drop,
        max_parallel=max_parallel,
        trainer=trainer,
    )


def moe_model(config: str, overrides: Sequence[str]) -> None:
    """A MaxText sweep needs a MoE model: MaxText's base.yml has one expert (`num_experts: 1`), so
    without a config file or a named model (`model_name`), `--set num_experts=N` (N > 1) must say
    it. A config file or model name is MaxText's to read (an image path, not opened here)."""
    keys = dict(kv.split("=", 1) for kv in overrides if "=" in kv)
    if config != "base" or "model_name" in keys:
        return
    experts = keys.get("num_experts", "1").strip()
    if not (experts.isdigit() and int(experts) > 1):
        raise UserError(
            "--trainer maxtext sweeps a MoE model, and MaxText's base.yml has num_experts: 1: give "
            "--set num_experts=N (N > 1) with its MoE keys, --set model_name=NAME or --config MODEL.yml"
        )


def default_sweep_dir(name: str, sweep_dir: str | None) -> str:
    """`--sweep-dir` as given (gs://) or made absolute (local; default ./sweeps/<name>)."""
    if sweep_dir and sweep_dir.startswith("gs://"):
        return sweep_dir.rstrip("/")
    return str(Path(sweep_dir or f"sweeps/{name}").resolve())


# --- resumability (pure) -------------------------------------------------------------------------


def next_action(record: RunRecord | None, status: dict | None, has_last_step: bool, steps: int) -> str:
    """What a (re)run of the sweep does with one of its runs, from its record and run directory.

    The run directory is the truth about results (a cluster may have lost its records); the record
    is the truth about whether a run is still alive. A run that finished is never rerun.
    """
    finished = (
        status is not None
        and status.get("state") == TrainerState.FINISHED
        and int(status.get("step", 0)) >= steps
    )
    if record is not None and not record.terminal:
        return ATTACH  # alive, perhaps even done and not yet noticed: let the controller finish it
    if finished and has_last_step:
        return DONE
    if record is None:
        return LAUNCH
    if record.state == RunState.FINISHED:
        return MISSING
    return RELAUNCH  # Failed or Stopped: same name, same run directory, resumes its last checkpoint


def off_shape(record: RunRecord, preset: str, slices: int) -> str | None:
    """Why a run of the sweep cannot be measured, or None: the controller put a segment of it on a
    shape other than the sweep's (capacity lost, it shrank). A sweep compares every factor on the one
    shape it names, so such a run is stopped and reported, never measured."""
    for seg in record.segments:
        if (seg.preset, seg.slices) != (preset, slices):
            before = record.segments[seg.index - 1] if seg.index > 0 else None
            why = (before.end_reason if before is not None else None) or seg.reason
            return (
                f"not measured: its segment {seg.index} would run on {seg.preset} x{seg.slices}, "
                f"not the sweep's {preset} x{slices} ({why})"
            )
    return None
