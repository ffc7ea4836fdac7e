"""Topology presets (`presets/*.yaml`), the catalog of them, and shapes (a preset times a number of
slices).

A preset names one TPU slice shape as GKE provisions it: the node labels its pods select, the
machine type, chips per host (= per node = per pod), JAX devices per chip, the termination notice
its capacity gets and the host CPU/memory the trainer requests. Loading validates everything against
the generation's rules (docs/platform.md §1), so a typo fails at `reslice presets`, not hours later
as a Pending pod.

Pure: a preset is parsed from data (`parse_preset`), never read here. The core (plan, record, policy,
signals, render) is handed a `Catalog`; only the edges (the CLI commands, `launch.prepare`, a
`Controller` when it is built, preflight) read one from disk, through launcher/adapters/preset_files.py,
once each.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from launcher.core.errors import UserError

# Node label `cloud.google.com/gke-tpu-accelerator` -> generation.
GENERATIONS = {
    "tpu7x": "tpu7x",
    "tpu-v6e-slice": "v6e",
    "tpu-v5p-slice": "v5p",
    "tpu-v4-podslice": "v4",
}
DEVICES_PER_CHIP = {"tpu7x": 2, "v6e": 1, "v5p": 1, "v4": 1}
# Most 4-chip cubes a 3-D slice may span (docs/platform.md §1): tpu7x 9,216 chips, v5p 16x16x24
# (6,144 chips, the largest GKE v5p topology), v4 4,096 chips.
MAX_CUBES = {"tpu7x": 144, "v5p": 96, "v4": 64}
SMALL_3D = {"2x2x1", "2x2x2", "2x2x4", "2x4x4"}
V6E_TOPOLOGIES = {"1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"}

LABEL_ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
LABEL_TOPOLOGY = "cloud.google.com/gke-tpu-topology"
LABEL_NODEPOOL = "cloud.google.com/gke-nodepool"
LABEL_SPOT = "cloud.google.com/gke-spot"
LABEL_PLACEMENT = "cloud.google.com/placement-policy-name"
LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
RESOURCE_TPU = "google.com/tpu"

# vCPUs and memory (GiB) of each TPU host machine type (docs/platform.md §1). The trainer requests a
# quarter of each by default: enough to never be BestEffort (first evicted under node pressure), far
# enough below allocatable (GKE reserves some of each) that the request never makes a pod Pending.
MACHINE_TYPES = {
    "tpu7x-standard-4t": (224, 960),
    "ct6e-standard-4t": (180, 720),
    "ct6e-standard-8t": (180, 1440),
    "ct5p-hightpu-4t": (208, 448),
    "ct4p-hightpu-4t": (240, 407),
}
REQUEST_SHARE = 4
# Seconds a pod gets between SIGTERM and SIGKILL: spot capacity gives pods part of its notice
# (more only with a node system config); maintenance of on-demand and reserved TPU hosts honours
# terminationGracePeriodSeconds (docs/platform.md §2).
SPOT_NOTICE_S = 15
ON_DEMAND_NOTICE_S = 120

REQUIRED = {
    "name",
    "accelerator",
    "machine_type",
    "topology",
    "chips_per_host",
    "devices_per_chip",
    "peak_tflops_per_chip",
}
OPTIONAL = {
    "hbm_gib_per_chip",
    "slices",
    "spot",
    "fallbacks",
    "description",
    "placement_policy",
    "termination_notice_s",
    "cpu_request",
    "memory_request",
}


@dataclass(frozen=True)
class Preset:
    name: str
    accelerator: str
    machine_type: str
    topology: str
    chips_per_host: int
    devices_per_chip: int
    peak_tflops_per_chip: float
    hbm_gib_per_chip: float | None = None  # None: unknown, no memory check
    slices: int = 1
    spot: bool = False
    fallbacks: tuple[str, ...] = ()
    description: str = ""
    # A workload/compact placement policy the node pools were created with. Users name their own,
    # so it is selected only when a preset or `--placement-policy` names one: a selector that
    # matches no node looks to the controller exactly like lost capacity.
    placement_policy: str | None = None
    termination_notice_s: int | None = None  # None: SPOT_NOTICE_S or ON_DEMAND_NOTICE_S
    cpu_request: str | None = None  # None: a quarter of the machine type's vCPUs
    memory_request: str | None = None  # None: a quarter of its memory

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
    def hbm_bytes_per_device(self) -> float | None:
        if self.hbm_gib_per_chip is None:
            return None
        return self.hbm_gib_per_chip * 2**30 / self.devices_per_chip

    @property
    def devices(self) -> int:
        """JAX devices per slice."""
        return self.chips * self.devices_per_chip

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1

    @property
    def notice_s(self) -> int:
        """Seconds between SIGTERM and SIGKILL that this capacity gives a pod."""
        if self.termination_notice_s is not None:
            return self.termination_notice_s
        return SPOT_NOTICE_S if self.spot else ON_DEMAND_NOTICE_S

    def requests(self) -> dict[str, str]:
        """The trainer container's cpu and memory requests (google.com/tpu is added by the renderer)."""
        vcpus, mem_gib = MACHINE_TYPES.get(self.machine_type, (8 * REQUEST_SHARE, 32 * REQUEST_SHARE))
        return {
            "cpu": self.cpu_request or str(vcpus // REQUEST_SHARE),
            "memory": self.memory_request or f"{mem_gib // REQUEST_SHARE}Gi",
        }

    def node_selector(self) -> dict[str, str]:
        """What a pod of this preset selects: the labels GKE puts on the slice's nodes. The machine
        type is selected too: one topology can exist in several (v6e 2x4 as one 8-chip VM or two
        4-chip VMs), and two pods of a slice must never share a VM."""
        sel = {
            LABEL_ACCELERATOR: self.accelerator,
            LABEL_TOPOLOGY: self.topology,
            LABEL_INSTANCE_TYPE: self.machine_type,
        }
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

    @property
    def error(self) -> str | None:
        """Why GKE cannot run this shape, or None. Multislice only supports multi-host slice node
        pools (GKE, "Deploy TPU Multislices in GKE")."""
        if self.slices > 1 and not self.preset.multi_host:
            return (
                f"{self.label}: GKE multislice needs multi-host slices, and {self.preset.name} is one host; "
                "use one slice of it or a multi-host preset"
            )
        return None

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
    notice = raw.get("termination_notice_s")
    if notice is not None and (not isinstance(notice, int) or isinstance(notice, bool) or notice < 1):
        raise UserError(f"{source}: termination_notice_s must be a positive integer, got {notice!r}")
    for key in ("placement_policy", "cpu_request", "memory_request"):
        if raw.get(key) is not None and (not isinstance(raw[key], str | int) or not str(raw[key]).strip()):
            raise UserError(f"{source}: {key} must be a non-empty string")
    if str(raw["machine_type"]) not in MACHINE_TYPES and not (
        raw.get("cpu_request") and raw.get("memory_request")
    ):
        raise UserError(
            f"{source}: machine type {raw['machine_type']!r} is not one reslice knows "
            f"({', '.join(MACHINE_TYPES)}): give cpu_request and memory_request"
        )
    preset = Preset(
        name=str(name),
        accelerator=raw["accelerator"],
        machine_type=str(raw["machine_type"]),
        topology=str(raw["topology"]),
        chips_per_host=raw["chips_per_host"],
        devices_per_chip=raw["devices_per_chip"],
        peak_tflops_per_chip=float(peak),
        hbm_gib_per_chip=_hbm(source, raw.get("hbm_gib_per_chip")),
        slices=raw.get("slices", 1),
        spot=raw.get("spot", False),
        fallbacks=tuple(fallbacks),
        description=str(raw.get("description", "")),
        placement_policy=_opt_str(raw.get("placement_policy")),
        termination_notice_s=notice,
        cpu_request=_opt_str(raw.get("cpu_request")),
        memory_request=_opt_str(raw.get("memory_request")),
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


def _hbm(source: str, value: Any) -> float | None:
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        raise UserError(f"{source}: hbm_gib_per_chip must be a positive number, got {value!r}")
    return float(value)


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


def check_fallbacks(presets: Mapping[str, Preset]) -> None:
    """UserError unless every preset's fallbacks are presets of the same set, each smaller than it."""
    for preset in presets.values():
        for fb in preset.fallbacks:
            if fb not in presets:
                raise UserError(f"{preset.name}.yaml: fallback {fb!r} is not a known preset")
            if presets[fb].chips >= preset.chips:
                raise UserError(
                    f"{preset.name}.yaml: fallback {fb!r} ({presets[fb].chips} chips) is not smaller "
                    f"than {preset.name} ({preset.chips} chips)"
                )


class Catalog(Mapping[str, Preset]):
    """Every preset of one presets directory, by name: a read-only mapping, validated together."""

    def __init__(self, presets: Mapping[str, Preset]) -> None:
        self._presets = dict(presets)

    def __getitem__(self, name: str) -> Preset:
        return self._presets[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._presets)

    def __len__(self) -> int:
        return len(self._presets)

    def preset(self, name: str) -> Preset:
        """The preset called `name`; a UserError naming the known ones if there is none."""
        if name not in self._presets:
            raise UserError(f"unknown preset {name!r} (known: {', '.join(self._presets)})")
        return self._presets[name]

    def shape(self, preset_name: str, slices: int | None = None) -> Shape:
        """`slices` (default: the preset's own) of the preset, or a UserError if GKE cannot run it."""
        preset = self.preset(preset_name)
        n = preset.slices if slices is None else slices
        if n < 1:
            raise UserError(f"slices must be at least 1, got {n}")
        shape = Shape(preset, n)
        if err := shape.error:
            raise UserError(err)
        return shape
