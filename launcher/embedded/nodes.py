"""Fake TPU node pools, labelled and tainted as GKE labels and taints TPU nodes.

One node pool is one slice: `hosts` nodes, each with `chips_per_host` `google.com/tpu`. Pure
builders; the cluster writes what they return.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from launcher.adapters.preset_files import load_preset
from launcher.core import rfc3339
from launcher.core.errors import UserError
from launcher.core.presets import Preset
from launcher.embedded.types import objects


def load_shape(preset: str) -> Preset:
    """The preset a node pool is made of (raises UserError for an unknown one)."""
    return load_preset(preset)


@dataclass(frozen=True)
class NodePoolSpec:
    """`count` node pools (slices) of one preset. `names` overrides the default pool names;
    `spot` overrides the preset; `simulate` overrides the cluster's kubelet mode for these pools."""

    preset: str
    count: int = 1
    names: tuple[str, ...] = field(default_factory=tuple)
    spot: bool | None = None
    simulate: bool | None = None


def parse_nodepools(spec: str) -> list[NodePoolSpec]:
    """'tpu7x-2x2x2:2,tpu7x-4x4x4:1' → [NodePoolSpec('tpu7x-2x2x2', 2), NodePoolSpec('tpu7x-4x4x4', 1)].
    Suffixes: ':spot' marks spot capacity, ':sim' / ':process' pick the kubelet mode of those pools
    ('tpu7x-4x4x4:2:spot:sim')."""
    out = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        bits = part.split(":")
        preset, count, spot, sim = bits[0], 1, None, None
        for b in bits[1:]:
            if b == "spot":
                spot = True
            elif b in ("sim", "process"):
                sim = b == "sim"
            elif b.isdigit() and int(b) > 0:
                count = int(b)
            else:
                raise UserError(f"bad node pool spec {part!r}: expected PRESET[:COUNT][:spot][:sim|:process]")
        load_shape(preset)  # fail early on an unknown preset
        out.append(NodePoolSpec(preset=preset, count=count, spot=spot, simulate=sim))
    if not out:
        raise UserError("empty node pool spec")
    return out


@dataclass(frozen=True)
class FakeNodePool:
    name: str
    shape: Preset
    spot: bool
    simulate: bool

    @property
    def node_names(self) -> list[str]:
        return [node_name(self.name, i) for i in range(self.shape.hosts)]


def expand_pools(specs: list[NodePoolSpec], simulate: bool) -> list[FakeNodePool]:
    """Pools named '<preset>-np-<i>' (i counted per preset) unless the spec names them."""
    pools: list[FakeNodePool] = []
    per_preset: dict[str, int] = {}
    for s in specs:
        shape = load_shape(s.preset)
        for j in range(s.count):
            if j < len(s.names):
                name = s.names[j]
            else:
                i = per_preset.get(s.preset, 0)
                name = f"{s.preset}-np-{i}"
                per_preset[s.preset] = i + 1
            spot = shape.spot if s.spot is None else s.spot
            sim = simulate if s.simulate is None else s.simulate
            pools.append(FakeNodePool(name=name, shape=shape, spot=spot, simulate=sim))
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise UserError(f"duplicate node pool names: {names}")
    return pools


def _h(s: str, n: int, alphabet: str = "0123456789abcdef") -> str:
    d = int(hashlib.sha1(s.encode()).hexdigest(), 16)
    out = ""
    for _ in range(n):
        d, r = divmod(d, len(alphabet))
        out += alphabet[r]
    return out


_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"


def _uuidish(name: str, salt: str) -> str:
    h = _h(f"{salt}/{name}", 32)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def node_name(pool: str, i: int) -> str:
    """GKE's shape: gke-<cluster>-<pool>-<instance group hash>-<instance suffix>. The suffix is a
    bijection of the index (7919 is coprime with 27**4), so names never collide within a pool."""
    n = (int(_h(pool, 8), 16) + i * 7919) % len(_SUFFIX) ** 4
    suffix = ""
    for _ in range(4):
        n, r = divmod(n, len(_SUFFIX))
        suffix += _SUFFIX[r]
    return f"gke-reslice-{pool}-{_h(pool, 8)}-{suffix}"


def node_labels(pool: FakeNodePool, name: str) -> dict[str, str]:
    s = pool.shape
    lbls = {
        "cloud.google.com/gke-nodepool": pool.name,
        "cloud.google.com/gke-tpu-accelerator": s.accelerator,
        "cloud.google.com/gke-tpu-topology": s.topology,
        "cloud.google.com/machine-family": s.machine_type.split("-")[0],
        "node.kubernetes.io/instance-type": s.machine_type,
        "beta.kubernetes.io/instance-type": s.machine_type,
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "cloud.google.com/gke-os-distribution": "cos",
    }
    if pool.spot:
        lbls["cloud.google.com/gke-spot"] = "true"
    # Pools created with a compact placement policy carry its name (xpk names them like
    # tpu7x-128-4x4x4-placement-policy). The name is the user's, so the fake pools carry one only
    # when the preset names it, exactly as the renderer's pods then select it.
    if s.placement_policy:
        lbls["cloud.google.com/placement-policy-name"] = s.placement_policy
    return lbls


TPU_TAINT = {"key": objects.TPU_RESOURCE, "value": "present", "effect": "NoSchedule"}


def node_object(pool: FakeNodePool, i: int, when: str | None = None) -> dict[str, Any]:
    name = node_name(pool.name, i)
    when = when or rfc3339.stamp()
    chips = str(pool.shape.chips_per_host)
    # cpu/memory are not the machine type's real figures: large enough that only google.com/tpu
    # ever limits placement, which is true of TPU hosts in practice.
    resources = {
        "cpu": "200",
        "memory": "800Gi",
        "ephemeral-storage": "100Gi",
        "pods": "110",
        objects.TPU_RESOURCE: chips,
    }
    ready = {
        "type": "Ready",
        "status": "True",
        "lastHeartbeatTime": when,
        "lastTransitionTime": when,
        "reason": "KubeletReady",
        "message": "kubelet is posting ready status",
    }
    pressure = [
        {
            "type": t,
            "status": "False",
            "lastHeartbeatTime": when,
            "lastTransitionTime": when,
            "reason": f"KubeletHasSufficient{r}",
            "message": f"kubelet has sufficient {m}",
        }
        for t, r, m in (
            ("MemoryPressure", "Memory", "memory available"),
            ("DiskPressure", "Disk", "disk space available"),
            ("PIDPressure", "PID", "PID available"),
        )
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": node_labels(pool, name)},
        "spec": {"providerID": f"gce://reslice/local/{name}", "taints": [dict(TPU_TAINT)]},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [*pressure, ready],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": _uuidish(name, "boot"),
                "containerRuntimeVersion": "process://reslice-embedded",
                "kernelVersion": "6.6.0-reslice",
                "kubeProxyVersion": "",
                "kubeletVersion": "v1.33.0-reslice-embedded",
                "machineID": _h(name, 32),
                "operatingSystem": "linux",
                "osImage": "Container-Optimized OS from Google",
                "systemUUID": _uuidish(name, "system"),
            },
        },
    }


def devices_per_chip(accelerator: str | None) -> int:
    """JAX devices per chip: Ironwood exposes its two TensorCores as two devices (docs/platform.md §1)."""
    return 2 if accelerator == "tpu7x" else 1
