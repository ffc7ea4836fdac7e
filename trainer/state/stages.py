"""Stages: a run that starts from another run's committed checkpoint (``train.init_from``).

Called by trainer.loop.run: ``check_source`` before anything is written (a bad source is a config
error, exit 2), ``initial_state`` when the run has no checkpoint of its own yet. Once the stage has
committed a checkpoint of its own, its resumes restore that, as any run's do; its identity names
the source (trainer.config.identity), so neither the source run's checkpoints nor another stage's
are ever resumed as its own.

The new run starts at step 0 with its own schedule, data and optimizer settings. It takes the
source's parameters and, with ``train.init_optimizer``, its Adam moments and Adam's own step count
(the moments' bias correction continues where the source left it, as OLMo-core's optimizer state
does when a stage loads it); the run's step and the learning-rate schedule's count start again at 0.
Only committed steps are read (docs/contract.md), locally or on gs://, never written.
"""

from __future__ import annotations

import json
from typing import Any

import orbax.checkpoint as ocp
from etils import epath

from trainer.config import Config, ConfigError
from trainer.state.checkpoint import COMMIT_FILE

# The model settings that decide the state's shapes: a source must agree on them. Everything else
# (sequence length, RoPE, dtype, document attention, losses, optimizer, data) is the stage's own.
_SHAPE_KEYS = (
    "vocab_size", "d_model", "n_layers", "n_heads", "head_dim", "d_ff", "dense_layers", "kv_heads",
    "qk_norm", "reordered_norm",
)  # fmt: skip
_MOE_SHAPE_KEYS = ("num_experts", "d_expert", "shared_expert_dim")


def _committed(directory: epath.Path) -> list[int]:
    if not directory.exists():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit() and (p / COMMIT_FILE).exists())


def source(init_from: str) -> tuple[epath.Path, int]:
    """(the checkpoints directory, the step) that ``init_from`` names: a run directory's latest
    committed step, or one committed ``checkpoints/<step>`` directory. ConfigError otherwise."""
    path = epath.Path(init_from.rstrip("/"))
    where = f"train.init_from={init_from}"
    if path.name.isdigit() and not (path / "checkpoints").exists():
        if not (path / COMMIT_FILE).exists():
            raise ConfigError(f"{where}: not a committed checkpoint (no {COMMIT_FILE} in it)")
        return path.parent, int(path.name)
    steps = _committed(path / "checkpoints")
    if not steps:
        raise ConfigError(f"{where}: no committed checkpoint in {path / 'checkpoints'}")
    return path / "checkpoints", steps[-1]


def check_source(cfg: Config) -> None:
    """Before anything is written: a run that will start from ``train.init_from`` (it has no
    committed checkpoint of its own) has a readable, compatible source."""
    if not cfg.train.init_from or _committed(epath.Path(cfg.run_dir) / "checkpoints"):
        return
    directory, step = source(cfg.train.init_from)
    meta = _read_meta(directory, step)
    _check_shapes(cfg, meta, f"{directory}/{step}")


def _manager(directory: epath.Path) -> ocp.CheckpointManager:
    # Read-only: nothing of the source run is created, cleaned up or deleted.
    options = ocp.CheckpointManagerOptions(read_only=True, create=False, cleanup_tmp_directories=False)
    return ocp.CheckpointManager(directory, options=options, item_names=("state", "meta"))


def _read_meta(directory: epath.Path, step: int) -> dict[str, Any]:
    """The step's ``meta/metadata`` JSON (docs/contract.md), read as a file: ``check_source`` runs
    before ``jax.distributed.initialize``, which Orbax's manager would pre-empt by starting JAX."""
    path = directory / str(step) / "meta" / "metadata"
    try:
        meta = json.loads(path.read_text())
    except Exception as e:
        raise ConfigError(f"train.init_from: {path} is not readable JSON ({type(e).__name__})") from None
    if not isinstance(meta, dict) or "identity" not in meta:
        raise ConfigError(f"train.init_from: {directory}/{step} is not a trainer checkpoint (no identity)")
    return meta


def _check_shapes(cfg: Config, meta: dict[str, Any], where: str) -> None:
    saved, model, moe = meta["identity"], vars(cfg.model), vars(cfg.moe)
    # A key the source's identity leaves out (a newer key at its default) is at the default.
    defaults = {"kv_heads": 0, "qk_norm": False, "reordered_norm": False}
    for section, keys, ours in (("model", _SHAPE_KEYS, model), ("moe", _MOE_SHAPE_KEYS, moe)):
        for key in keys:
            theirs = saved.get(section, {}).get(key, defaults.get(key))
            if theirs != ours[key]:
                raise ConfigError(
                    f"train.init_from: {where} has {section}.{key}={theirs!r}, this run {ours[key]!r}:"
                    " a stage keeps its source's model shape"
                )


def _is_counter(node: dict, key: Any) -> bool:
    """A step counter that the stage restarts: the optimizer's step and the schedule's count, not
    Adam's count (a sibling of its moments ``mu``/``nu``)."""
    return key in ("step", "count") and not (key == "count" and "mu" in node)


def _merge(fresh: Any, restored: Any, keep_optimizer: bool, top: bool = True) -> Any:
    """``fresh`` (the stage's initial state, ``plain``) with the source's values: under key 0 the
    model's parameters, under key 1 the optimizer's (its moments with ``keep_optimizer``)."""
    out = {}
    for key, value in fresh.items():
        if top and key in (1, "1") and not keep_optimizer:
            out[key] = value
        elif isinstance(value, dict):
            out[key] = (
                fresh[key] if _is_counter(fresh, key) else _merge(value, restored[key], keep_optimizer, False)
            )
        else:
            out[key] = restored[key]
    return out


def initial_state(cfg: Config, fresh: dict, abstract: dict) -> dict:
    """The stage's step-0 state: ``fresh`` (its own initial state) with the source's parameters
    (and Adam moments), restored into ``abstract``'s shardings (this run's mesh)."""
    directory, step = source(cfg.train.init_from)
    meta = _read_meta(directory, step)
    _check_shapes(cfg, meta, f"{directory}/{step}")
    manager = _manager(directory)
    try:
        restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
    except Exception as e:
        reason = " ".join(str(e).split())[:200]
        raise ConfigError(
            f"train.init_from: {directory}/{step} does not restore into this model ({reason})"
        ) from None
    finally:
        manager.close()
    what = "parameters and Adam moments" if cfg.train.init_optimizer else "parameters (fresh Adam moments)"
    print(f"trainer: stage start: {what} from {directory}/{step}, at step 0", flush=True)
    return _merge(fresh, restored["state"], cfg.train.init_optimizer)
