"""A run's spec from the command line, in one place: the checks of the options that render, launch,
preflight and sweep share, the `RunSpec` they build, and the spec as the cluster it lands on needs it.
Called by the command modules (`launcher.cli.commands.planning`, `.launching`, `.sweeping`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from launcher.adapters.preset_files import load_catalog
from launcher.core import images, inputs
from launcher.core.errors import UserError
from launcher.core.spec import RunSpec
from launcher.core.words import TrainerProfile


def check_run_options(
    *,
    overrides: list[str] | None,
    slices: int | None,
    global_batch: int | None,
    max_micro_batch: int,
    max_grad_accum: int | None,
    image: str,
    namespace: str,
    **spec_options: Any,
) -> None:
    """The checks every command that builds a spec runs first, in this order: overrides, then the
    shape's numbers, then the spec's options (`inputs.spec_options`: grace period, restarts, queue...)."""
    inputs.overrides(overrides)
    inputs.shape_options(slices, global_batch, max_micro_batch, max_grad_accum)
    inputs.spec_options(image_ref=image, ns=namespace, **spec_options)


def run_spec(
    *,
    preset: str,
    overrides: list[str] | None = None,
    placement_policy: list[str] | None = None,
    **fields: Any,
) -> RunSpec:
    """The `RunSpec` of a run, from options already checked (`check_run_options`): `--set` as a
    tuple, `--placement-policy` as (preset, policy) pairs, every other field as given."""
    return RunSpec(
        **fields,
        overrides=tuple(overrides or ()),
        placement_policies=placement_policies(preset, placement_policy),
    )


def trainer_config(trainer: str, config: str | None) -> str:
    """The `--config` a profile runs when none is given, after checking the profile's name."""
    from launcher.core.maxtext import check_trainer

    check_trainer(trainer)
    if config is not None:
        return config
    return "base" if trainer == TrainerProfile.MAXTEXT else RunSpec.config


def trainer_image(trainer: str, image: str | None) -> str:
    """The `--image` a profile runs when none is given: its own image (launcher.core.maxtext.IMAGES)."""
    from launcher.core.maxtext import default_image

    return default_image(trainer, image)


def placement_policies(preset: str, values: list[str] | None) -> tuple[tuple[str, str], ...]:
    """`--placement-policy NAME` (the requested preset) or `PRESET=NAME`, as (preset, policy) pairs."""
    out = {}
    for v in values or []:
        name, _, policy = v.rpartition("=") if "=" in v else (preset, "", v)
        if not name.strip() or not policy.strip():
            raise UserError(f"--placement-policy {v!r}: expected NAME or PRESET=NAME")
        out[name.strip()] = policy.strip()
    known = load_catalog()
    for name in out:
        if name not in known:
            raise UserError(f"--placement-policy {name}=...: unknown preset {name!r}")
    return tuple(out.items())


def for_cluster(
    spec: RunSpec, embedded: bool, grace_period: int | None = None, *, pulled: bool = True
) -> RunSpec:
    """The spec as it must run where it runs. On the embedded cluster the trainers are processes on
    this machine: short grace period and heartbeat timeout, and no image to pull. On another, an
    image name without a registry is refused (images.registry_error) when the run will pull it
    (`pulled`; preflight reports the image in its own row)."""
    if not embedded and pulled and (err := images.registry_error(spec.image)):
        raise UserError(err)
    if embedded:
        return replace(
            spec, grace_period_s=grace_period or 30, heartbeat_timeout_s=10, image_pull_policy="Never"
        )
    if grace_period is not None:
        return replace(spec, grace_period_s=grace_period)
    return spec
