"""Topology presets (`presets/*.yaml`) and shapes (a preset times a number of slices).

A preset names one TPU slice shape as GKE provisions it: the node labels its pods select, the
machine type, chips per host (= per node = per pod) and JAX devices per chip. Loading validates
everything against the generation's rules (FACTS.md §1), so a typo fails at `reslice presets`, not
hours later as a Pending pod.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from launcher.errors import UserError

DEFAULT_PRESETS_DIR = Path(__file__).resolve().parent.parent / "presets"


def presets_dir() -> Path:
    """`RESLICE_PRESETS_DIR` (e.g. in a container image) or the repository's `presets/`."""
    return Path(os.environ.get("RESLICE_PRESETS_DIR") or DEFAULT_PRESETS_DIR)


# Node label `cloud.google.com/gke-tpu-accelerator` -> generation.
GENERATIONS = {
    "tpu7x": "tpu7x",
    "tpu-v6e-slice": "v6e",
    "tpu-v5p-slice": "v5p",
    "tpu-v4-podslice": "v4",
}
DEVICES_PER_CHIP = {"tpu7x": 2, "v6e": 1, "v5p": 1, "v4": 1}
# Most 4-chip cubes a 3-D slice may span (xpk 1.16's rule).
MAX_CUBES = {"tpu7x": 144, "v5p": 140, "v4": 64}
SMALL_3D = {"2x2x1", "2x2x2", "2x2x4", "2x4x4"}
V6E_TOPOLOGIES = {"1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"}

LABEL_ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
LABEL_TOPOLOGY = "cloud.google.com/gke-tpu-topology"
LABEL_NODEPOOL = "cloud.google.com/gke-nodepool"
LABEL_SPOT = "cloud.google.com/gke-spot"
LABEL_PLACEMENT = "cloud.google.com/placement-policy-name"
RESOURCE_TPU = "google.com/tpu"

REQUIRED = {
    "name",
    "accelerator",
    "machine_type",
    "topology",
    "chips_per_host",
    "devices_per_chip",
    "peak_tflops_per_chip",
}
OPTIONAL = {"slices", "spot", "fallbacks", "description"}


@dataclass(frozen=True)
class Preset:
    name: str
    accelerator: str
    machine_type: str
    topology: str
    chips_per_host: int
    devices_per_chip: int
    peak_tflops_per_chip: float
    slices: int = 1
    spot: bool = False
    fallbacks: tuple[str, ...] = ()
    description: str = ""

    @property
    def generation(self) -> str:
        return GENERATIONS[self.accelerator]

    @property
    def chips(self) -> int:
        return math.prod(int(d) for d in self.topology.split("x"))

    @property
    def hosts(self) -> int:
        """Hosts (nodes, pods) per slice."""
        return self.chips // self.chips_per_host

    @property
    def devices(self) -> int:
        """JAX devices per slice."""
        return self.chips * self.devices_per_chip

    @property
    def devices_per_host(self) -> int:
        return self.chips_per_host * self.devices_per_chip

    @property
    def accelerator_type(self) -> str:
        """GCE accelerator type name: `<gen>-<TensorCores>` (tpu7x-128 is 64 chips)."""
        return f"{self.generation}-{self.chips * self.devices_per_chip}"

    @property
    def placement_policy(self) -> str | None:
        """Multi-host Ironwood node pools carry a placement policy that pods must select."""
        if self.generation == "tpu7x" and self.hosts > 1:
            return f"{self.accelerator_type}-{self.topology}-placement-policy"
        return None

    def node_selector(self) -> dict[str, str]:
        """What a pod of this preset selects: the labels GKE puts on the slice's nodes."""
        sel = {LABEL_ACCELERATOR: self.accelerator, LABEL_TOPOLOGY: self.topology}
        if self.placement_policy:
            sel[LABEL_PLACEMENT] = self.placement_policy
        if self.spot:
            sel[LABEL_SPOT] = "true"
        return sel


@dataclass(frozen=True)
class Shape:
    """A preset times a number of slices: what one segment of a run runs on."""

    preset: Preset
    slices: int

    @property
    def chips(self) -> int:
        return self.slices * self.preset.chips

    @property
    def hosts(self) -> int:
        return self.slices * self.preset.hosts

    @property
    def devices(self) -> int:
        return self.slices * self.preset.devices

    @property
    def label(self) -> str:
        return f"{self.preset.name} x{self.slices}"

    def __str__(self) -> str:
        return self.label


def topology_error(generation: str, topology: str) -> str | None:
    """Why `topology` is not a valid slice of `generation`, or None if it is."""
    dims_s = topology.split("x")
    if not all(d.isdigit() and int(d) > 0 for d in dims_s):
        return f"topology {topology!r} is not of the form AxB or AxBxC with positive integers"
    dims = [int(d) for d in dims_s]
    if generation == "v6e":
        if topology not in V6E_TOPOLOGIES:
            return f"v6e topology {topology!r} is not one of {', '.join(sorted(V6E_TOPOLOGIES, key=_area))}"
        return None
    if len(dims) != 3:
        return f"{generation} topology {topology!r} must be 3-D (AxBxC)"
    if topology in SMALL_3D:
        return None
    if any(d % 4 for d in dims):
        return f"{generation} topology {topology!r}: beyond {sorted(SMALL_3D)} every dimension must be a multiple of 4"
    if generation != "v4" and dims != sorted(dims):
        return f"{generation} topology {topology!r}: dimensions must be in non-decreasing order (A <= B <= C)"
    cubes = math.prod(d // 4 for d in dims)
    if cubes > MAX_CUBES[generation]:
        return f"{generation} topology {topology!r} spans {cubes} cubes, more than the {MAX_CUBES[generation]} allowed"
    return None


def _area(topology: str) -> int:
    return math.prod(int(d) for d in topology.split("x"))


def parse_preset(raw: object, source: str) -> Preset:
    """Validate one preset document (already parsed YAML) and build the Preset."""
    if not isinstance(raw, dict):
        raise UserError(f"{source}: a preset must be a mapping, got {type(raw).__name__}")
    unknown = set(raw) - REQUIRED - OPTIONAL
    if unknown:
        raise UserError(f"{source}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
    missing = REQUIRED - set(raw)
    if missing:
        raise UserError(f"{source}: missing key(s) {', '.join(sorted(missing))}")
    name = raw["name"]
    if raw["accelerator"] not in GENERATIONS:
        raise UserError(
            f"{source}: unknown accelerator {raw['accelerator']!r} (known: {', '.join(GENERATIONS)})"
        )
    for key in ("chips_per_host", "devices_per_chip", "slices"):
        value = raw.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UserError(f"{source}: {key} must be a positive integer, got {value!r}")
    peak = raw["peak_tflops_per_chip"]
    if not isinstance(peak, int | float) or isinstance(peak, bool) or peak <= 0:
        raise UserError(f"{source}: peak_tflops_per_chip must be a positive number, got {peak!r}")
    fallbacks = raw.get("fallbacks") or []
    if not isinstance(fallbacks, list) or not all(isinstance(f, str) for f in fallbacks):
        raise UserError(f"{source}: fallbacks must be a list of preset names")
    if not isinstance(raw.get("spot", False), bool):
        raise UserError(f"{source}: spot must be true or false")
    preset = Preset(
        name=str(name),
        accelerator=raw["accelerator"],
        machine_type=str(raw["machine_type"]),
        topology=str(raw["topology"]),
        chips_per_host=raw["chips_per_host"],
        devices_per_chip=raw["devices_per_chip"],
        peak_tflops_per_chip=float(peak),
        slices=raw.get("slices", 1),
        spot=raw.get("spot", False),
        fallbacks=tuple(fallbacks),
        description=str(raw.get("description", "")),
    )
    gen = preset.generation
    if err := topology_error(gen, preset.topology):
        raise UserError(f"{source}: {err}")
    if preset.devices_per_chip != DEVICES_PER_CHIP[gen]:
        raise UserError(
            f"{source}: {gen} has {DEVICES_PER_CHIP[gen]} JAX device(s) per chip, not {preset.devices_per_chip}"
        )
    if preset.chips % preset.chips_per_host:
        raise UserError(
            f"{source}: {preset.chips} chips of {preset.topology} do not divide into hosts of {preset.chips_per_host}"
        )
    return preset


def load_preset_file(path: Path) -> Preset:
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"{path.name}:{where} malformed YAML: {getattr(e, 'problem', e)}") from None
    except OSError as e:
        raise UserError(f"cannot read preset {path}: {e.strerror}") from None
    preset = parse_preset(raw, path.name)
    if preset.name != path.stem:
        raise UserError(f"{path.name}: name {preset.name!r} does not match the file name")
    return preset


def load_presets(directory: Path | None = None) -> dict[str, Preset]:
    """Every preset in `directory`, validated together (fallbacks must exist and be smaller)."""
    return _load_presets(directory or presets_dir())


@cache
def _load_presets(directory: Path) -> dict[str, Preset]:
    if not directory.is_dir():
        raise UserError(f"presets directory {directory} does not exist")
    presets = {p.stem: load_preset_file(p) for p in sorted(directory.glob("*.yaml"))}
    for preset in presets.values():
        for fb in preset.fallbacks:
            if fb not in presets:
                raise UserError(f"{preset.name}.yaml: fallback {fb!r} is not a known preset")
            if presets[fb].chips >= preset.chips:
                raise UserError(
                    f"{preset.name}.yaml: fallback {fb!r} ({presets[fb].chips} chips) is not smaller "
                    f"than {preset.name} ({preset.chips} chips)"
                )
    return presets


def load_preset(name: str, directory: Path | None = None) -> Preset:
    presets = load_presets(directory)
    if name not in presets:
        raise UserError(f"unknown preset {name!r} (known: {', '.join(presets)})")
    return presets[name]


def make_shape(preset_name: str, slices: int | None = None, directory: Path | None = None) -> Shape:
    preset = load_preset(preset_name, directory)
    n = preset.slices if slices is None else slices
    if n < 1:
        raise UserError(f"slices must be at least 1, got {n}")
    return Shape(preset, n)
