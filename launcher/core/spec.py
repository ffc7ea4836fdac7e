"""RunSpec: everything about a run that does not change between segments, its defaults (the one
source of them: the command line reads them from here), and what follows from it on a preset.
Built by cli/spec_options.py, carried in the run record (core/record.py), rendered by
core/render.py."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from contract.words import RestartMode
from launcher.core import images, inputs
from launcher.core.errors import UserError
from launcher.core.presets import Preset
from launcher.core.words import TrainerProfile

# Ports TPU hosts already use on the host network: 8431 (runtime metrics), 8080 (multislice
# coordinator), 8470-8482 (TPU runtime; libtpu's TPU_PROCESS_PORT 8476 on tpu7x; JAX's own Cloud
# TPU coordinator default 8482). docs/platform.md §2.
RESERVED_PORTS = frozenset({8431, 8080, *range(8470, 8483)})
DEFAULT_COORDINATOR_PORT = 8490


@dataclass(frozen=True)
class RunSpec:
    """Everything about a run that does not change between segments."""

    run: str
    run_dir: str
    global_batch: int
    image: str = images.TRAINER
    config: str = "tiny"
    overrides: tuple[str, ...] = ()
    namespace: str = "default"
    max_micro_batch: int = 16
    max_grad_accum: int | None = None
    # Devices per data-parallel rank (the trainer config's mesh.tensor): the batch plan's divisor is
    # devices / model_parallel (docs/contract.md). Learned from the config by `launch`.
    model_parallel: int = 1
    # JSON of the trainer config's model, moe and mesh sections (launcher.core.hbm), "" when unknown:
    # the controller then never shrinks onto a rung whose HBM estimate exceeds its preset's HBM.
    trainer_config: str = ""
    # Seconds from SIGTERM to SIGKILL. None: the termination notice the shape's capacity gives
    # (Preset.notice_s: presets.SPOT_NOTICE_S on spot), since a longer grace period is not honoured
    # there anyway.
    grace_period_s: int | None = None
    max_restarts: int = 10
    ttl_after_finished_s: int = 3600
    queue: str | None = None
    # Kueue topology-aware scheduling (with a queue only): the topology level (a node label key) each
    # slice's pods must share (render.tas_annotations), or only prefer to with `tas_preferred`.
    tas_topology: str | None = None
    tas_preferred: bool = False
    priority_class: str | None = None
    image_pull_policy: str = "IfNotPresent"
    service_account: str | None = None
    coordinator_port: int = DEFAULT_COORDINATOR_PORT
    megascale_port: int = 8080
    heartbeat_timeout_s: int | None = None
    # How long jax.distributed waits for the last process to join: the pods of a 768-host slice
    # are scheduled and pull the image over minutes (docs/contract.md).
    init_timeout_s: int = 900
    env: tuple[tuple[str, str], ...] = field(default=())
    # (preset name, policy): the placement policy each preset's node pools were created with.
    placement_policies: tuple[tuple[str, str], ...] = ()
    cpu_request: str | None = None  # None: the preset's (from its machine type)
    memory_request: str | None = None
    # Measured seconds from SIGTERM to a committed emergency checkpoint (a step plus the save), and
    # the checkpoint interval for segments on capacity whose notice is shorter than that.
    save_seconds: float | None = None
    short_notice_interval: int | None = None
    # The trainer profile: "reslice" (trainer/) or "maxtext" (launcher.core.maxtext, docs/maxtext.md).
    trainer: str = TrainerProfile.RESLICE.value
    # How a shape change reaches the pods: "recreate" (a new segment's JobSet) or "in-place" (one
    # JobSet per slice; the survivors' supervisors follow a new world, docs/contract.md).
    restart_mode: str = RestartMode.RECREATE.value
    # In-place only: the API server URL the pods read their world from instead of the in-cluster
    # one (`RESLICE_WORLD_API`): the embedded cluster's, whose kubelets mount no service account.
    world_api: str | None = None


def run_preset(spec: RunSpec, preset: Preset) -> Preset:
    """`preset` as this run selects it: with the placement policy the run names for it, if any."""
    policy = dict(spec.placement_policies).get(preset.name)
    return replace(preset, placement_policy=policy) if policy else preset


def grace_period(spec: RunSpec, preset: Preset) -> int:
    return spec.grace_period_s if spec.grace_period_s is not None else preset.notice_s


def short_notice(spec: RunSpec, preset: Preset) -> bool:
    """Whether an emergency save cannot finish between SIGTERM and SIGKILL on this capacity (a
    grace period longer than the capacity's notice is not honoured, so the shorter one counts).
    Preemptions there lose the work since the last periodic checkpoint."""
    window = min(grace_period(spec, preset), preset.notice_s)
    return spec.save_seconds is not None and spec.save_seconds > window


def trainer_overrides(spec: RunSpec, preset: Preset) -> list[str]:
    """The run's `--set` overrides, plus a shorter checkpoint interval on short-notice capacity."""
    extra = []
    if short_notice(spec, preset) and spec.short_notice_interval is not None:
        extra.append(f"checkpoint.interval={spec.short_notice_interval}")
    return [*spec.overrides, *extra]


def coordinator_port_error(port: int) -> str | None:
    if not 1024 <= port <= 65535:
        return f"coordinator port {port} is outside 1024-65535"
    if port in RESERVED_PORTS:
        return (
            f"coordinator port {port} is one TPU hosts use on the host network "
            "(8431, 8080, 8470-8482): choose another, e.g. 8490"
        )
    return None


def restart_mode_error(restart_mode: str, trainer: str) -> str | None:
    """Why a run of `trainer` cannot restart by `restart_mode`, or None. In place, the pods'
    entrypoint must follow worlds, which only reslice's trainer does (its supervisor,
    trainer/supervisor.supervise_world): MaxText's entrypoint has none yet."""
    modes = [m.value for m in RestartMode]
    if restart_mode not in modes:
        return f"--restart-mode {restart_mode!r}: expected one of {', '.join(modes)}"
    if restart_mode == RestartMode.IN_PLACE and trainer == TrainerProfile.MAXTEXT:
        return (
            "--restart-mode in-place needs a trainer whose pods follow worlds (reslice's supervisor);"
            " the maxtext profile's entrypoint has none: use --restart-mode recreate"
        )
    return None


def launch_restart_mode(restart_mode: str, slices: int, trainer: str) -> tuple[str, str | None]:
    """The restart mode a launch on `slices` slices runs by, and the note that says why it is not
    the one asked for (None when it is). In place on one slice restarts by recreate: a run's ladder
    never has more slices than asked, so on one slice no slice survives a shape change to keep its
    pods. A mode the trainer cannot use is left as asked, for `check` to name."""
    if restart_mode == RestartMode.IN_PLACE and slices == 1 and not restart_mode_error(restart_mode, trainer):
        return (
            RestartMode.RECREATE,
            "one slice: no slice survives a shape change to keep its pods; restarting by recreate",
        )
    return restart_mode, None


def check(spec: RunSpec) -> None:
    """A launch request's spec, checked in one place (controller/launch.prepare, which `reslice
    launch`, the sweep and the demo go through): the options a person gives, each against what the
    cluster and the trainer accept. One UserError naming the first bad option; nothing is created
    before it."""
    inputs.overrides(list(spec.overrides))
    inputs.spec_options(
        image_ref=spec.image,
        ns=spec.namespace,
        grace_period=spec.grace_period_s,
        max_restarts=spec.max_restarts,
        init_timeout=spec.init_timeout_s,
        queue=spec.queue,
        tas_topology=spec.tas_topology,
        tas_preferred=spec.tas_preferred,
        priority_class=spec.priority_class,
        service_account=spec.service_account,
        cpu_request=spec.cpu_request,
        memory_request=spec.memory_request,
    )
    if err := coordinator_port_error(spec.coordinator_port) or restart_mode_error(
        spec.restart_mode, spec.trainer
    ):
        raise UserError(err)
    inputs.seconds("--save-seconds", spec.save_seconds, positive=True)
    inputs.integer("--short-notice-interval", spec.short_notice_interval, high=inputs.MAX_STEPS)
