"""The typer option types, defaults and output helpers that the `reslice` command modules share
(`launcher.cli.commands.planning`, `.launching`, `.inspecting`, `.sweeping`): one definition per option,
so that a flag reads the same in every command that takes it."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.console import Console

from launcher.core import images
from launcher.core.spec import RunSpec

# Piped output (CI logs, tests) gets a wide fixed width instead of rich's 80-column default.
console = Console(width=None if sys.stdout.isatty() else 160)

DEFAULT_INIT_TIMEOUT = RunSpec.init_timeout_s


def print_json(obj: object) -> None:
    """Indented JSON on stdout, for every command's --json."""
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


PresetOpt = Annotated[str, typer.Option("--preset", "-p", help="Topology preset (see `reslice presets`).")]
SlicesOpt = Annotated[int | None, typer.Option("--slices", "-n", help="Slices (default: the preset's).")]
GlobalBatchOpt = Annotated[int, typer.Option("--global-batch", "-b", help="Sequences per optimizer step.")]
MaxMicroOpt = Annotated[int, typer.Option("--max-micro-batch", help="Largest per-device micro-batch.")]
MaxAccumOpt = Annotated[int | None, typer.Option("--max-grad-accum", help="Most micro-steps per step.")]
# What render, launch and sweep share (a run's spec).
RunOpt = Annotated[str, typer.Option("--run", help="Run name (DNS-1035).")]
ConfigOpt = Annotated[
    str | None,
    typer.Option("--config", "-c", help="Trainer config name or path (default: tiny; maxtext: base)."),
]
TrainerOpt = Annotated[
    str, typer.Option("--trainer", help="Trainer profile: reslice (trainer/) or maxtext (docs/maxtext.md).")
]
RestartModeOpt = Annotated[
    str,
    typer.Option(
        "--restart-mode",
        help="How a shape change reaches the pods: recreate (a new JobSet) or in-place (one JobSet per "
        "slice; surviving slices keep their pods and follow a new world; docs/contract.md).",
    ),
]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Trainer override key=value.")]
ImageOpt = Annotated[
    str | None,
    typer.Option(
        "--image",
        help=f"Trainer image (default: {images.TRAINER}; --trainer maxtext: {images.MAXTEXT}).",
    ),
]
NamespaceOpt = Annotated[str, typer.Option("--namespace", help="Namespace of the run.")]
GracePeriodOpt = Annotated[
    int | None,
    typer.Option(
        "--grace-period",
        help="Seconds from SIGTERM to SIGKILL (default: the capacity's notice, 15 s on spot).",
    ),
]
MaxRestartsOpt = Annotated[
    int, typer.Option("--max-restarts", help="JobSet restarts per segment (preemptions do not count).")
]
InitTimeoutOpt = Annotated[
    int,
    typer.Option(
        "--init-timeout", help="Seconds jax.distributed waits for the last host to join (JAX's default: 300)."
    ),
]
QueueOpt = Annotated[str | None, typer.Option("--queue", help="Kueue LocalQueue.")]
TasTopologyOpt = Annotated[
    str | None,
    typer.Option(
        "--tas-topology",
        metavar="LEVEL",
        help="Kueue topology-aware scheduling (with --queue): each slice's pods in one domain of this "
        "level of the cluster's Topology (a node label key). docs/gke.md.",
    ),
]
TasPreferredOpt = Annotated[
    bool,
    typer.Option("--tas-preferred", help="Ask --tas-topology as a preference, not a requirement."),
]
PriorityClassOpt = Annotated[str | None, typer.Option("--priority-class")]
ServiceAccountOpt = Annotated[
    str | None,
    typer.Option(
        "--service-account",
        help="Kubernetes ServiceAccount of the trainer pods. Not a Google identity: host-network pods "
        "write gs:// as the node's service account (docs/gke.md).",
    ),
]
CoordinatorPortOpt = Annotated[
    int,
    typer.Option(
        "--coordinator-port", help="JAX coordinator port on the host network (not 8431, 8080, 8470-8482)."
    ),
]
PlacementOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--placement-policy",
        help="The placement (workload) policy the node pools carry: NAME for the requested preset, or "
        "PRESET=NAME (repeatable). Default: none is selected.",
    ),
]
CpuRequestOpt = Annotated[
    str | None, typer.Option("--cpu-request", help="Trainer cpu request (default: from the machine type).")
]
MemoryRequestOpt = Annotated[
    str | None,
    typer.Option(
        "--memory-request", help="Trainer memory request, e.g. 200Gi (default: from the machine type)."
    ),
]


SaveSecondsOpt = Annotated[
    float | None,
    typer.Option(
        "--save-seconds",
        help="Measured seconds from SIGTERM to a committed emergency checkpoint (a step plus the save). "
        "Checked against each shape's termination notice (15 s on spot).",
    ),
]
ShortNoticeOpt = Annotated[
    int | None,
    typer.Option(
        "--short-notice-interval",
        help="Checkpoint every N steps on capacity whose notice cannot hold an emergency save "
        "(without it, such a launch is refused).",
    ),
]

KubeconfigOpt = Annotated[str | None, typer.Option("--kubeconfig", help="Kubeconfig (default: $KUBECONFIG).")]
# launch and sweep: the free checks before anything is created.
PreflightOpt = Annotated[
    bool,
    typer.Option(
        "--preflight/--no-preflight",
        help="Refuse a cluster that cannot run it (no JobSet, no node pools of the shape...); "
        "--no-preflight e.g. for node pools that autoscale from zero.",
    ),
]
