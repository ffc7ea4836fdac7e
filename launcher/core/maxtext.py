"""The MaxText trainer profile (docs/maxtext.md): what the JobSet's container runs for a rung, as
plain lists and dicts. Pure; `launcher.core.render` calls it for a spec with `trainer="maxtext"`, and
`launcher.adapters.rundir` reads where each profile's checkpoints are (`checkpoint_layout`).

The container runs `python -m maxtext_entry -- [CONFIG.yml] key=value ...`: the run's overrides,
then the keys reslice owns, which come from the rung (batch plan, shape) and the run (directory,
steps). MaxText's global batch is devices × per_device_batch_size × gradient_accumulation_steps, so
the rung's plan is taken with one device per data-parallel rank.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

from launcher.core import images
from launcher.core.errors import UserError
from launcher.core.plan import Plan
from launcher.core.presets import Shape
from launcher.core.words import TrainerProfile

PROFILES = tuple(TrainerProfile)
# Each profile's image when `--image` is not given: what docker/Dockerfile and
# docker/maxtext.Dockerfile build (docs/gke.md), as `python3.11 dev.py images` tags them (images.py).
IMAGES: dict[str, str] = {TrainerProfile.RESLICE: images.TRAINER, TrainerProfile.MAXTEXT: images.MAXTEXT}
ENTRYPOINT = ("python", "-m", "maxtext_entry", "--")
# MaxText writes <base_output_directory>/<run_name>/{checkpoints,tensorboard,...}: under the run
# directory, apart from what reslice's files are (run.json, events.jsonl, status.json, metrics/).
RUN_NAME = "maxtext"
DEFAULT_CHECKPOINT_PERIOD = 100
# MaxText commits `<run_dir>/maxtext/checkpoints/<k>/` with k 0-based: the state after k + 1 steps,
# which is reslice's step k + 1 (docs/maxtext.md). reslice's trainer: `checkpoints/<step>/`.
CHECKPOINTS = f"{RUN_NAME}/checkpoints"

_PARALLELISM: tuple[str, ...] = (
    "data",
    "fsdp",
    "fsdp_transpose",
    "sequence",
    "context",
    "context_usp_ulysses",
)
_PARALLELISM += ("context_autoregressive", "tensor", "tensor_sequence", "autoregressive", "pipeline")
_PARALLELISM += ("expert", "diloco")
DCN_KEYS = tuple(f"dcn_{a}_parallelism" for a in _PARALLELISM)
ICI_KEYS = tuple(f"ici_{a}_parallelism" for a in _PARALLELISM)
FILLED_ICI = "ici_fsdp_parallelism"  # the ICI axis that takes the devices the others leave

# Keys reslice sets and a run may not: the plan, the shape, the run directory, the distributed
# start and the files the entrypoint reads. `metrics_file` and `hardware` are the entrypoint's
# (maxtext_entry): every process writes its own local metrics file, and only the entrypoint knows
# whether it runs on CPU (the embedded cluster) or TPU.
OWNED = frozenset(
    {
        "per_device_batch_size",
        "gradient_accumulation_steps",
        "base_output_directory",
        "run_name",
        "enable_checkpointing",
        "async_checkpointing",
        "enable_autocheckpoint",
        "skip_jax_distributed_system",
        "metrics_file",
        "hardware",
        "num_slices",
        "dcn_parallelism",
        "ici_parallelism",
        FILLED_ICI,
        *DCN_KEYS,
    }
)


@lru_cache(maxsize=1)
def known_keys() -> frozenset[str]:
    text = (Path(__file__).parent / "maxtext_keys.txt").read_text()
    return frozenset(line for line in text.splitlines() if line and not line.startswith("#"))


def checkpoint_layout(trainer: str) -> tuple[str, int]:
    """Where a profile's checkpoints are in the run directory, and what to add to a checkpoint's
    name to get reslice's 1-based step: what the controller and the report read (launcher.adapters.rundir)."""
    return (CHECKPOINTS, 1) if trainer == TrainerProfile.MAXTEXT else ("checkpoints", 0)


def default_image(trainer: str, image: str | None) -> str:
    """`--image` as given, else the profile's image (an unknown profile is refused later, by
    `check_trainer`, with its own message)."""
    return image if image is not None else IMAGES.get(trainer, IMAGES[TrainerProfile.RESLICE])


def image_name(image: str) -> str:
    """`reslice-maxtext` from `REGISTRY/PATH/reslice-maxtext:TAG[@sha256:...]`."""
    last = image.split("@", 1)[0].rsplit("/", 1)[-1]
    return last.split(":", 1)[0]


def probe_command(trainer: str, run_dir: str) -> list[str]:
    """What the write probe's pod runs in the profile's image: each image has only its own program
    (the MaxText image has no `trainer` package)."""
    if trainer == TrainerProfile.MAXTEXT:
        return ["python", "-m", "maxtext_entry", "--probe-write", run_dir]
    return ["python", "-m", "trainer", "--probe-write", run_dir]


def check_trainer(trainer: str) -> None:
    if trainer not in PROFILES:
        raise UserError(f"--trainer {trainer!r}: expected one of {', '.join(PROFILES)}")


def config_args(config: str) -> list[str]:
    """MaxText's first argument: `base` is the installed package's configs/base.yml (no argument);
    else an absolute .yml path in the image (MaxText resolves a relative one against `src/`)."""
    if config == "base":
        return []
    if config.startswith("/") and config.endswith((".yml", ".yaml")):
        return [config]
    raise UserError(
        f"--config {config!r}: for --trainer maxtext, give 'base' (MaxText's configs/base.yml) "
        "or an absolute path of a .yml file in the image"
    )


def parse_overrides(overrides: tuple[str, ...] | list[str]) -> dict[str, str]:
    """`--set key=value` as MaxText keys, later wins; an unknown or reslice-owned key is a UserError."""
    keys = known_keys()
    out: dict[str, str] = {}
    for kv in overrides:
        key, sep, value = kv.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserError(f"--set {kv!r}: expected key=value")
        if key not in keys:
            raise UserError(f"--set {kv!r}: {key!r} is not a MaxText 0.2.5 configuration key")
        if key in OWNED:
            raise UserError(
                f"--set {kv!r}: reslice sets {key} for every segment (from the batch plan, the shape "
                "or the run); see docs/maxtext.md"
            )
        out[key] = value.strip()
    return out


def _positive_int(key: str, value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise UserError(f"--set {key}={value}: {key} must be a positive integer") from None
    if n < 1:
        raise UserError(f"--set {key}={value}: {key} must be a positive integer")
    return n


def run_steps(keys: dict[str, str]) -> int:
    """The run's length. Required: MaxText's default (150,001) is nobody's run, and the schedule,
    the final checkpoint and the entrypoint's "finished" all hang on it."""
    if "steps" not in keys:
        raise UserError("--trainer maxtext needs the run's length: --set steps=N")
    return _positive_int("steps", keys["steps"])


def data_keys(keys: dict[str, str]) -> dict[str, str]:
    """Grain input that resumes by step on any number of processes: grain's ElasticIterator
    (`grain_use_elastic_iterator`), whose state is one global index (step × global batch) and whose
    step s reads the elements [s·G, (s+1)·G) of the seeded, shuffled dataset, whatever the process
    count (docs/maxtext.md, Data order). MaxText's default grain iterator keeps a state per process
    and cannot be restored on another count. What ElasticIterator forbids is refused here, before
    a segment starts, rather than by MaxText at every restart."""
    if keys.get("dataset_type", "synthetic") != "grain":
        return {}
    why = "a run that changes its process count needs grain_use_elastic_iterator, which"
    if keys.get("grain_use_elastic_iterator", "true").lower() != "true":
        raise UserError(
            "--set grain_use_elastic_iterator=false: reslice resumes grain input on other shapes by step"
        )
    if keys.get("grain_file_type", "arrayrecord") != "arrayrecord":
        raise UserError(f"--set grain_file_type={keys['grain_file_type']}: {why} reads only arrayrecord")
    if keys.get("packing", "false").lower() != "false":
        raise UserError(f"--set packing={keys['packing']}: {why} forbids packing (a many-to-one transform)")
    if keys.get("use_truncation", "true").lower() != "true":
        raise UserError(
            f"--set use_truncation={keys['use_truncation']}: {why} needs truncation, not chunking"
        )
    if keys.get("grain_train_mixture_config_path") or ";" in keys.get("grain_train_files", ""):
        raise UserError(
            f"--set grain_train_files/grain_train_mixture_config_path: {why} reads one file pattern"
        )
    return {"grain_use_elastic_iterator": "true", "packing": "false"}


def batch_keys(plan: Plan) -> dict[str, int]:
    if plan.model_parallel != 1:
        raise UserError("--trainer maxtext plans one device per data-parallel rank (MaxText counts devices)")
    return {"per_device_batch_size": plan.micro_batch, "gradient_accumulation_steps": plan.grad_accum}


def parallelism_keys(shape: Shape, keys: dict[str, str]) -> dict[str, int]:
    """Slices over DCN (data parallelism), each slice's devices over ICI: the ICI axes a run sets
    stay, FSDP takes the rest. Every axis explicit: base.yml's -1 would let MaxText choose."""
    per_slice = shape.preset.devices
    chosen = {k: _positive_int(k, keys[k]) for k in ICI_KEYS if k in keys}
    used = math.prod(chosen.values())
    if per_slice % used:
        raise UserError(
            f"{shape}: the ICI parallelism set ({', '.join(f'{k}={v}' for k, v in chosen.items())}) "
            f"does not divide the {per_slice} devices of a slice"
        )
    dcn = {k: 1 for k in DCN_KEYS}
    dcn["dcn_data_parallelism"] = shape.slices
    return {**dcn, FILLED_ICI: per_slice // used}


def maxtext_keys(
    run_dir: str, overrides: tuple[str, ...], shape: Shape, plan: Plan, checkpoint_period: int | None
) -> dict[str, object]:
    """Every key=value of one segment's MaxText command line, the run's overrides first.

    `checkpoint_period`: the short-notice interval when the capacity needs one, else the run's own
    (`--set checkpoint_period=N`, default 100)."""
    keys = parse_overrides(overrides)
    steps = run_steps(keys)
    period = checkpoint_period or _positive_int(
        "checkpoint_period", keys.get("checkpoint_period", str(DEFAULT_CHECKPOINT_PERIOD))
    )
    return {
        **keys,
        **data_keys(keys),
        "steps": steps,
        # The schedule's length defaults to `steps`: pinned, so that a run's learning rate at a step
        # never depends on how the steps were reached.
        "learning_rate_schedule_steps": keys.get("learning_rate_schedule_steps", steps),
        **batch_keys(plan),
        **parallelism_keys(shape, keys),
        "base_output_directory": run_dir,
        "run_name": RUN_NAME,
        "checkpoint_period": period,
        "enable_checkpointing": "true",
        "async_checkpointing": "true",
        # A SIGTERM saves at the next preemption sync point only with autocheckpoint on and JAX's
        # distributed runtime started (measured, docs/maxtext.md).
        "enable_autocheckpoint": "true",
        "skip_jax_distributed_system": "false",
    }


def command(config: str, keys: dict[str, object]) -> list[str]:
    return [*ENTRYPOINT, *config_args(config), *(f"{k}={v}" for k, v in keys.items())]


def distributed_env(host0: str, shape: Shape, job_index_path: str) -> list[dict]:
    """What MaxText's CPU start (`initialize_jax_for_cpu`) reads; on TPU it reads none of it and
    JAX's own Cloud TPU discovery applies. The coordinator is a host name without a port: MaxText
    resolves it and appends its fixed port 1234."""
    return [
        {"name": "JAX_COORDINATOR_ADDRESS", "value": host0},
        {"name": "JOB_INDEX", "valueFrom": {"fieldRef": {"fieldPath": job_index_path}}},
        {"name": "PROCESSES_IN_JOB", "value": str(shape.preset.hosts)},
        {"name": "JAX_PROCESS_COUNT", "value": str(shape.hosts)},
    ]
