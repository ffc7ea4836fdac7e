"""Which node pools of a cluster can host a slice of a preset, and why the others cannot. Pure.

A node pool is one slice (JobSet's exclusive placement on `cloud.google.com/gke-nodepool`). It can
host one when every node carries the labels the pods select (`Preset.node_selector()`, the single
source), it has exactly the preset's hosts, no node has a NoSchedule/NoExecute taint the pods do not
tolerate, each node's allocatable cpu and memory hold what one trainer pod requests, and every node
is healthy now (`signals/nodes.node_problem`, the controller's own rule). All but health last until
someone changes the pool (or the requests); health comes and goes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from launcher.core.podfit import quantity, tolerates
from launcher.core.presets import LABEL_ACCELERATOR, LABEL_NODEPOOL, LABEL_TOPOLOGY, Preset
from launcher.core.signals.nodes import BAD_TAINTS, node_problem


@dataclass(frozen=True)
class Pool:
    name: str
    nodes: int
    problems: tuple[str, ...] = ()  # lasting: the pool cannot host a slice as it is
    unhealthy: tuple[str, ...] = ()  # passing: NotReady, cordoned, preempted, being deleted
    # Lasting too, but the run's to fix: a request above the nodes' allocatable leaves its pods
    # Pending on this pool forever (the scheduler's NodeResourcesFit), which the controller would
    # take for lost capacity.
    too_small: tuple[str, ...] = ()

    @property
    def whole(self) -> bool:
        return not self.problems and not self.too_small

    @property
    def usable(self) -> bool:
        return self.whole and not self.unhealthy

    def why_not(self) -> str:
        return f"{self.name}: {', '.join(self.problems + self.too_small + self.unhealthy)}"


def _labels(node: dict) -> dict[str, str]:
    return node["metadata"].get("labels") or {}


def taint_text(taint: dict) -> str:
    value = f"={taint['value']}" if taint.get("value") else ""
    return f"{taint.get('key')}{value}:{taint.get('effect')}"


def untolerated(node: dict, tolerations: list[dict]) -> list[dict]:
    """Taints that keep the pods off the node for good (the passing ones are node_problem's)."""
    return [
        t
        for t in (node.get("spec") or {}).get("taints") or []
        if t.get("effect") in ("NoSchedule", "NoExecute")
        and t.get("key") not in BAD_TAINTS
        and not tolerates(tolerations, t)
    ]


def near_miss(labels: dict[str, str], selector: dict[str, str]) -> str | None:
    """How a pool of the preset's accelerator and topology differs from what the pods select."""
    if any(labels.get(k) != selector.get(k) for k in (LABEL_ACCELERATOR, LABEL_TOPOLOGY)):
        return None
    return ", ".join(
        f"{k}={labels[k]} (the pods select {v})" if k in labels else f"no label {k}={v}"
        for k, v in selector.items()
        if labels.get(k) != v
    )


def over_allocatable(nodes: list[dict], requests: Mapping[str, str]) -> list[str]:
    """What one pod requests (cpu, memory) beyond the smallest allocatable of `nodes`. Other pods'
    requests are not counted: they come and go, the allocatable stays."""
    out = []
    for resource, wanted in sorted(requests.items()):
        have = [a for n in nodes if (a := ((n.get("status") or {}).get("allocatable") or {}).get(resource))]
        try:
            need, least = quantity(wanted), min(have, key=quantity, default=None)
            if least is not None and need > quantity(least):
                out.append(f"the pods request {resource} {wanted}, its nodes have {least} allocatable")
        except ValueError:  # a form not parsed here: the scheduler decides, do not guess
            continue
    return out


def pools_for(
    preset: Preset, nodes: Iterable[dict], tolerations: list[dict], requests: Mapping[str, str] | None = None
) -> tuple[list[Pool], list[str]]:
    """(the pools whose nodes carry the selected labels, with what keeps each from hosting a slice;
    near misses: pools of the same accelerator and topology that lack another selected label).
    `requests`: one trainer pod's cpu/memory requests, checked against each node's allocatable."""
    selector = preset.node_selector()
    groups: dict[str, list[dict]] = {}
    for node in nodes:
        if name := _labels(node).get(LABEL_NODEPOOL):
            groups.setdefault(name, []).append(node)
    pools, near = [], []
    for name, members in sorted(groups.items()):
        matching = [n for n in members if all(_labels(n).get(k) == v for k, v in selector.items())]
        if not matching:
            if diff := near_miss(_labels(members[0]), selector):
                near.append(f"{name}: {diff}")
            continue
        problems = []
        if len(matching) < len(members):
            problems.append(f"{len(members) - len(matching)} of its {len(members)} nodes lack the labels")
        if len(members) != preset.hosts:
            problems.append(f"{len(members)} node(s), a slice has {preset.hosts}")
        taints = sorted({taint_text(t) for n in matching for t in untolerated(n, tolerations)})
        problems += [f"taint {t} not tolerated" for t in taints]
        unhealthy = [f"{n['metadata']['name']} {why}" for n in matching if (why := node_problem(n))]
        small = over_allocatable(matching, requests or {})
        pools.append(Pool(name, len(members), tuple(problems), tuple(unhealthy), tuple(small)))
    return pools, near


def names(pools: list[Pool], most: int = 6) -> str:
    shown = ", ".join(p.name for p in pools[:most])
    return shown + (f" and {len(pools) - most} more" if len(pools) > most else "")


def create_command(preset: Preset) -> str:
    """The gcloud command for one more pool of `preset` (GKE's TPU node pool flags)."""
    sel, policy = preset.node_selector(), preset.placement_policy
    if preset.generation == "tpu7x" and preset.multi_host:
        # Multi-host Ironwood pools take a workload policy instead of --tpu-topology (GKE Ironwood doc).
        shape = f"--placement-policy={policy or 'WORKLOAD_POLICY'} (topology {preset.topology})"
    else:
        # The pods select the policy's node label only when the run names one (--placement-policy).
        shape = f"--tpu-topology={preset.topology}" + (f" --placement-policy={policy}" if policy else "")
    spot = " --spot" if sel.get("cloud.google.com/gke-spot") == "true" else ""
    return (
        f"gcloud container node-pools create NAME --cluster=CLUSTER --machine-type={preset.machine_type}"
        f" --num-nodes={preset.hosts} {shape}{spot} --scopes=storage-full,gke-default"
    )
