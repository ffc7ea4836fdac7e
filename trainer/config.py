"""Trainer configuration: named configs, YAML files, ``--set`` overrides and the contract environment.

Resolution order (later wins): the named config or YAML file, ``RESLICE_SET`` overrides, ``--set``
overrides, then the batch plan and run directory from the contract environment (docs/contract.md).

A YAML file is a mapping of sections (``model``, ``moe``, ``optim``, ``data``, ``eval``, ``train``,
``mesh``, ``checkpoint``, ``metrics``) plus optional ``base: <named config>`` and ``run_dir``; a
section it names overrides only the keys it gives. An override is ``section.key=value``; the value is
parsed as YAML and must fit the key's type: a scalar, or for the lists of sources (``data.sources``,
``eval.sources``) a YAML or JSON list of mappings.

Every user-facing mistake raises :class:`ConfigError`, which ``__main__`` turns into one line on
stderr and exit code 2.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from contract import envvars


class ConfigError(Exception):
    """A configuration or launch-contract error: reported in one line, exit code 2, never retried."""


class AttentionKind(StrEnum):
    """``model.attention``: how attention is computed (not what it computes: every kind gives the same
    numbers within rounding, tests/trainer/test_attention.py)."""

    AUTO = "auto"  # SPLASH on a TPU backend (sequence and head multiples of 128), BLOCKED elsewhere
    SPLASH = "splash"  # the Pallas TPU splash kernel (interpret mode off a TPU: tests only)
    BLOCKED = "blocked"  # query blocks of model.attention_block (0: DENSE)
    DENSE = "dense"  # the whole T × T scores at once (jax.nn.dot_product_attention)


class Remat(StrEnum):
    """``model.remat``: what a block keeps for the backward pass, least HBM first (the names and
    policies: trainer/model/remat.py)."""

    FULL = "full"  # its input only: the whole block recomputed
    SAVE_ATTENTION = "save_attention"  # the attention's inputs and output: its kernel never rerun
    SAVE_ALL_BUT_MLP_IN = "save_all_but_mlp_in"  # every named matmul output but the widest two
    SAVE_DOTS = "save_dots"  # every matmul output without a batch dimension (JAX's policy)
    OFFLOAD = "offload"  # every named output, moved to the host's memory and back
    NONE = "none"  # no rematerialisation: everything the backward pass reads is kept


class Transport(StrEnum):
    """``moe.transport``: how an MoE layer's rows cross the expert axis."""

    AUTO = "auto"  # RAGGED on a TPU or GPU backend, DENSE elsewhere (XLA:CPU compiles no ragged op)
    RAGGED = "ragged"  # jax.lax.ragged_all_to_all
    DENSE = "dense"  # a dense all-to-all of fixed-size chunks, the same dispatch plan


class TokenDtype(StrEnum):
    """``data.dtype``: the token files' integer type."""

    AUTO = "auto"  # the smaller that holds every id of model.vocab_size
    UINT16 = "uint16"
    UINT32 = "uint32"


class ExpertMatmul(StrEnum):
    """``moe.expert_matmul``: how a shard's experts run over the rows it received."""

    RAGGED = "ragged"  # one grouped matmul (jax.lax.ragged_dot) over rows sorted by expert
    DENSE = "dense"  # every local expert over every row, masked: E_local × the FLOPs (a baseline)


@dataclass
class ModelConfig:
    vocab_size: int = 256
    seq_len: int = 32
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    head_dim: int = 16
    d_ff: int = 128  # feed-forward width of the dense layers
    dense_layers: int = 0  # the first N layers use a dense MLP instead of MoE
    rope_theta: float = 10000.0
    init_std: float = 0.02
    dtype: str = "float32"  # activation/compute dtype; parameters are always float32
    remat: str = "none"  # what a block keeps for the backward pass (trainer/model/remat.py Remat)
    attention_block: int = 0  # queries per attention block (0: all at once, T × T scores)
    loss_chunk: int = 0  # positions per loss chunk (0: all at once, the whole B × T × V logits)
    # The recipe (docs/recipe.md). Off by default, so that the configs before them train bitwise as
    # they did; the pretraining configs (olmo-7b, olmoe-1b) turn them on.
    kv_heads: int = 0  # key/value heads (grouped-query attention); 0: n_heads
    qk_norm: bool = False  # RMSNorm on the whole query and key projections, before RoPE (OLMo 2/3)
    reordered_norm: bool = False  # x + norm(f(x)) instead of x + f(norm(x)) (OLMo 2/3's block)
    # Attention stays within a document: segment ids from the EOS tokens (data.eos_id).
    document_attention: bool = False
    logit_z_loss: float = 0.0  # weight of the output logits' z-loss, logsumexp(logits)² per target
    # Sliding-window attention (docs/recipe.md): a local layer's query attends to the keys of the
    # last ``sliding_window`` positions, itself included (OLMo-core's window; 0: every layer global).
    # ``global_every`` N > 0: layers N-1, 2N-1, ... and the last attend globally, the rest locally
    # (OLMo 3: window 4096, N = 4); 0 with a window: every layer local.
    sliding_window: int = 0
    global_every: int = 0
    # How attention is computed (AttentionKind); not part of the run's identity, like attention_block.
    attention: str = "auto"
    # The splash kernel's query/key block (every block size of its forward and backward passes):
    # 0 chooses for the shape (trainer/model/attention.py splash_block).
    splash_block: int = 0


@dataclass
class MoEConfig:
    num_experts: int = 8
    top_k: int = 2
    d_expert: int = 64
    shared_expert_dim: int = 0  # 0: no shared expert
    # Receive-buffer rows per expert shard = int(local_tokens * top_k * factor); <= 0: dropless.
    ragged_buffer_factor: float = 0.0
    transport: str = "auto"  # auto | ragged | dense
    expert_matmul: str = "ragged"  # ragged | dense (ExpertMatmul): how a shard runs its experts
    load_balance_weight: float = 0.01
    z_loss_weight: float = 0.001
    # The load-balancing loss is computed over groups of this many consecutive sequences of the
    # global batch (global across devices). A group never straddles micro-batches, so the loss and
    # its gradient are the same for every (devices, micro-batch, grad-accum) layout.
    balance_group: int = 1


@dataclass
class OptimConfig:
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    decay_steps: int = 0  # 0: train.steps
    schedule: str = "cosine"  # cosine | wsd (warm-up, stable, linear decay)
    decay_fraction: float = 0.1  # wsd: the last fraction of decay_steps decays to lr * min_lr_ratio
    # False: step 0 trains at lr 0 (optax's warm-up); true: step s < warmup_steps at lr·(s+1)/warmup.
    warmup_nonzero_start: bool = False
    # Weight decay on the embedding, and on norm scales and biases (OLMo-core's AdamW options).
    decay_embeddings: bool = False
    decay_norm_and_bias: bool = False
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    clip_norm: float = 1.0


@dataclass
class DataConfig:
    source: str = "synthetic"  # synthetic | files
    path: str = ""  # token files for source=files: a file, a glob or a directory / gs:// prefix
    # A mixture of token files: [{name, path, weight}, ...] (path as data.path); when given, it is
    # the training data (data.source and data.path unused). Weights are relative.
    sources: list[dict[str, Any]] = field(default_factory=list)
    # Token file dtype: uint16 | uint32 | auto (uint16 when every id of model.vocab_size fits, as
    # OLMo-core and `python -m trainer.tokenize` choose).
    dtype: str = "auto"
    eos_id: int = -1  # -1: no document boundaries
    seed: int = 1234
    num_records: int = 1 << 20  # synthetic corpus size (records of seq_len + 1 tokens)
    zipf_exponent: float = 1.1  # skew of the synthetic unigram distribution
    copy_prob: float = 0.75  # probability that the next synthetic token follows the successor map
    workers: int = 0  # grain worker processes; 0: a prefetch thread in the trainer process
    prefetch: int = 2  # batches read ahead


@dataclass
class EvalConfig:
    """Held-out evaluation (trainer/evaluate.py): the same fixed batches of each source every time."""

    sources: list[dict[str, Any]] = field(default_factory=list)  # [{name, path}, ...]; [] = no eval
    interval: int = 0  # evaluate after every N steps and after the last; 0: after the last only
    batches: int = 1  # global batches per source (train.global_batch sequences each)


@dataclass
class TrainConfig:
    steps: int = 60
    global_batch: int = 16
    micro_batch: int = 0  # 0: global_batch / (devices * grad_accum)
    grad_accum: int = 1
    seed: int = 0  # parameter initialisation
    # Fault rehearsal: raise an error before this step, in every incarnation (0: never). An
    # application failure on purpose, so crash-loop handling can be tested end to end.
    crash_at_step: int = 0
    # After a SIGTERM, exit 143 without a checkpoint when no step has finished for this long (a
    # peer is gone and the step in flight will never finish). 0: 3 x the longest step after the
    # first, which waits for every peer to start, with a floor (trainer/elastic/watchdog.py stall_s).
    stall_timeout_s: float = 0.0
    # Keep compiled executables in <run_dir>/compile_cache (JAX's persistent cache), so that a
    # segment on a shape the run has seen loads its train step instead of compiling it.
    compile_cache: bool = True
    # Test hook: sleep this long after compiling, before the start barrier, as a process whose
    # compile is that much slower than its peers' (0: never). Set it on one process only.
    debug_start_delay_s: float = 0.0
    # Test hook: sleep this long after every step, as a slower accelerator's step would take (0:
    # never). A test of a world change paces its run by the clock instead of by more steps, whose
    # collectives the simulated devices pay for in CPU; a SIGTERM cuts the sleep short.
    debug_step_pause_s: float = 0.0
    # Stages: start from another run's committed checkpoint (its run directory: the latest one; or
    # one checkpoints/<step> directory), at step 0 with this run's own schedule, data and optimizer.
    init_from: str = ""
    init_optimizer: bool = True  # with init_from: the Adam moments too (false: fresh moments)
    # A jax.profiler trace of these steps (numbered as the metrics records, from 1) into
    # <run_dir>/profile/ (trainer/telemetry/profile.py): a list [5, 6], one step 5, or a range
    # "5-8" (inclusive). Not part of the run's identity: a trace changes no step.
    profile_steps: list[int] = field(default_factory=list)


@dataclass
class MeshConfig:
    """Mesh axis sizes (trainer.model.mesh); 0: automatic. data × fsdp × expert × tensor = devices."""

    data: int = 0  # across slices; 0: 1
    fsdp: int = 0  # 0: the devices left by the other axes
    tensor: int = 0  # model-parallel degree (heads, MLP hidden, vocab); 0: 1
    expert: int = 0  # 0: the largest divisor of the devices left by data × tensor that divides num_experts
    shard_over_data: bool = False  # shard parameters and optimizer state over data too (ZeRO across slices)


@dataclass
class CheckpointConfig:
    interval: int = 20  # save every N optimizer steps (and always at the last step and on SIGTERM)
    keep: int = 3
    async_save: bool = True
    # Test hook: sleep this long before every save, as a process that reaches the save later than
    # its peers, which wait for it in Orbax's first save barrier (0: never). Set it on one process.
    debug_save_delay_s: float = 0.0
    # In-memory snapshots of an in-place run (trainer/state/snapshot.py), every N steps: 0, automatic
    # (every step on simulated CPU devices, every 10 on an accelerator); < 0: none.
    memory_interval: int = 0


@dataclass
class MetricsConfig:
    flush_seconds: float = 10.0  # how often a gs:// metrics object is rewritten
    log_every: int = 10  # print a progress line to stdout every N steps


@dataclass
class Config:
    name: str = "custom"
    run_dir: str = "runs/local"
    model: ModelConfig = field(default_factory=ModelConfig)
    moe: MoEConfig = field(default_factory=MoEConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SECTIONS = ("model", "moe", "optim", "data", "eval", "train", "mesh", "checkpoint", "metrics")

# Named configs are overrides of the dataclass defaults (which are the `tiny` config).
NAMED: dict[str, dict[str, dict[str, Any]]] = {
    # < 1 M parameters; tens of ms per step on 8 simulated CPU devices. Dropless by default so that
    # losses do not depend on the expert-parallel layout (see sizes.buffer_rows).
    "tiny": {},
    "small": {
        "model": {"vocab_size": 2048, "seq_len": 128, "d_model": 256, "n_layers": 4, "n_heads": 8,
                  "head_dim": 32, "d_ff": 768, "dense_layers": 1},
        "moe": {"num_experts": 16, "top_k": 2, "d_expert": 256, "shared_expert_dim": 256,
                "ragged_buffer_factor": 1.25},
        "optim": {"lr": 1e-3, "warmup_steps": 50},
        "train": {"steps": 500, "global_batch": 32},
        "checkpoint": {"interval": 100},
    },
    # OLMo-core's olmo3_7B (d_model 4096, 32 layers, 32 heads, SwiGLU 11008, vocab padded to 100352, QK-norm,
    # reordered norms, a 4096-token window in 3 of every 4 layers; 7,298,617,344 parameters: docs/recipe.md),
    # 8192-token sequences, 512 × 8192 = 4.19 M tokens per step: FSDP over the slice, every block
    # rematerialised, attention in query blocks and the loss in chunks, so that a step fits the
    # HBM of one Ironwood device on a quarter slice (presets/tpu7x-4x4x4.yaml; `python -m trainer
    # --config olmo-7b --hbm`).
    "olmo-7b": {
        "model": {"vocab_size": 100352, "seq_len": 8192, "d_model": 4096, "n_layers": 32, "n_heads": 32,
                  "head_dim": 128, "d_ff": 11008, "dense_layers": 32, "rope_theta": 500000.0,
                  "dtype": "bfloat16", "remat": "full", "attention_block": 512, "loss_chunk": 1024,
                  "qk_norm": True, "reordered_norm": True, "document_attention": True, "logit_z_loss": 1e-5,
                  "sliding_window": 4096, "global_every": 4},
        # OLMo-core's OLMo 3 scripts exempt only the embedding from weight decay (docs/recipe.md).
        "optim": {"lr": 3e-4, "warmup_steps": 2000, "weight_decay": 0.1, "warmup_nonzero_start": True,
                  "decay_norm_and_bias": True},
        "data": {"eos_id": 100257},  # dolma2's <|endoftext|>
        "train": {"steps": 100_000, "global_batch": 512},
        "checkpoint": {"interval": 500, "keep": 3},
    },
    # OLMoE-1B-7B-like: ~1.3 B active of ~6.9 B parameters. For TPU; tests only build it abstractly.
    "olmoe-1b": {
        "model": {"vocab_size": 50304, "seq_len": 4096, "d_model": 2048, "n_layers": 16, "n_heads": 16,
                  "head_dim": 128, "d_ff": 8192, "dense_layers": 0, "dtype": "bfloat16", "remat": "full",
                  "attention_block": 512, "loss_chunk": 1024, "document_attention": True},
        "moe": {"num_experts": 64, "top_k": 8, "d_expert": 1024, "ragged_buffer_factor": 1.0625},
        "optim": {"lr": 4e-4, "warmup_steps": 2000, "weight_decay": 0.1, "warmup_nonzero_start": True},
        "data": {"source": "files", "dtype": "uint32", "eos_id": 50279},  # gpt-neox-olmo-dolma-v1_5's EOS
        "train": {"steps": 100_000, "global_batch": 512},
        "checkpoint": {"interval": 500, "keep": 3},
    },
}  # fmt: skip


def _section(cfg: Config, name: str) -> Any:
    if name not in SECTIONS:
        raise ConfigError(f"unknown config section {name!r} (sections: {', '.join(SECTIONS)})")
    return getattr(cfg, name)


# YAML 1.1 (PyYAML) reads `1e-3` and `1e2` as strings: its float needs a dot and a signed exponent.
# The contract's own example is `optim.lr=1e-3`, so a number field also takes this decimal form.
_NUMBER = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def _number(value: Any) -> Any:
    """`value` as a float when it is a string in decimal or scientific notation, else unchanged."""
    if isinstance(value, str) and _NUMBER.match(value.strip()):
        return float(value.strip())
    return value


def _coerce(key: str, value: Any, current: Any) -> Any:
    """Convert a parsed value to the type of the field it replaces, refusing lossy conversions."""
    if isinstance(current, list):
        return step_list(key, value) if key in _STEP_LISTS else source_list(key, value)
    if isinstance(value, (dict, list)):
        raise ConfigError(f"{key}: value must be a scalar, got {type(value).__name__}")
    if isinstance(current, (int, float)) and not isinstance(current, bool):
        value = _number(value)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{key}: expected a finite number, got {value!r}")
    if isinstance(current, bool):
        if isinstance(value, bool):
            return value
    elif isinstance(current, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif isinstance(current, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif isinstance(current, str):
        return value if isinstance(value, str) else str(value)
    raise ConfigError(f"{key}: expected {type(current).__name__}, got {value!r}")


_STEP_LISTS = {"train.profile_steps"}  # the list keys of steps (the others are of sources)
_STEP_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


def step_list(key: str, value: Any) -> list[int]:
    """Steps, numbered from 1, sorted and unique: a list ``[5, 6]``, one step ``5``, a range
    ``"5-8"`` (inclusive), or nothing (``[]``, empty)."""
    if isinstance(value, int) and not isinstance(value, bool):
        steps = [value]
    elif isinstance(value, str) and (m := _STEP_RANGE.match(value)) and int(m[1]) <= int(m[2]):
        steps = list(range(int(m[1]), int(m[2]) + 1))
    elif isinstance(value, str) and not value.strip():
        steps = []
    elif isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        steps = list(value)
    else:
        raise ConfigError(f"{key}: expected steps as [5, 6], 5 or 5-8, got {value!r}")
    if any(s < 1 for s in steps):
        raise ConfigError(f"{key}: steps are numbered from 1, got {value!r}")
    return sorted(set(steps))


_SOURCE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def source_list(key: str, value: Any) -> list[dict[str, Any]]:
    """``data.sources`` ([{name, path, weight}]) or ``eval.sources`` ([{name, path}]), checked:
    names unique and fit for a metrics key (``data/tokens/<name>``), paths non-empty strings,
    weights positive finite numbers (relative: the mixture divides by their sum)."""
    weighted = key == "data.sources"
    allowed = {"name", "path", "weight"} if weighted else {"name", "path"}
    if not isinstance(value, list):
        raise ConfigError(f"{key}: expected a list of {{{', '.join(sorted(allowed))}}}, got {value!r}")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"{key}[{i}]"
        if not isinstance(item, Mapping):
            raise ConfigError(f"{where}: expected a mapping with {', '.join(sorted(allowed))}, got {item!r}")
        unknown = set(item) - allowed
        if unknown:
            raise ConfigError(
                f"{where}: unknown key {sorted(unknown)[0]!r} (known: {', '.join(sorted(allowed))})"
            )
        name, path = item.get("name"), item.get("path")
        if not isinstance(name, str) or not _SOURCE_NAME.match(name):
            raise ConfigError(f"{where}: name must be 1-64 letters, digits, '_', '.' or '-', got {name!r}")
        if not isinstance(path, str) or not path.strip():
            raise ConfigError(f"{where} ({name}): path must be a file, a glob or a directory / gs:// prefix")
        entry: dict[str, Any] = {"name": name, "path": path.strip()}
        if weighted:
            weight = _number(item.get("weight", 1.0))
            if (
                isinstance(weight, bool)
                or not isinstance(weight, (int, float))
                or not (math.isfinite(weight) and weight > 0)
            ):
                raise ConfigError(
                    f"{where} ({name}): weight must be a positive number, got {item.get('weight')!r}"
                )
            entry["weight"] = float(weight)
        if any(o["name"] == name for o in out):
            raise ConfigError(f"{key}: source name {name!r} appears twice")
        out.append(entry)
    return out


def set_value(cfg: Config, key: str, value: Any) -> None:
    if key == "run_dir":
        cfg.run_dir = _coerce(key, value, cfg.run_dir)
        return
    section, _, name = key.partition(".")
    obj = _section(cfg, section)
    if not name or name not in {f.name for f in fields(obj)}:
        known = ", ".join(f"{section}.{f.name}" for f in fields(obj))
        raise ConfigError(f"unknown config key {key!r} (known: {known})")
    setattr(obj, name, _coerce(key, value, getattr(obj, name)))


def apply_mapping(cfg: Config, data: Mapping[str, Any], origin: str) -> None:
    for sec, values in data.items():
        if sec in ("base", "name"):
            continue
        if sec == "run_dir":
            set_value(cfg, "run_dir", values)
            continue
        if not isinstance(values, Mapping):
            raise ConfigError(f"{origin}: section {sec!r} must be a mapping")
        for k, v in values.items():
            set_value(cfg, f"{sec}.{k}", v)


def parse_override(text: str) -> tuple[str, Any]:
    """``section.key=value`` -> (key, value); the value is YAML: a scalar (``1e-3``, ``true``, ``abc``)
    or, for a list key, a list (``[{name: web, path: gs://b/web, weight: 3}]``, JSON too)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} is not of the form section.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override {text!r}: cannot parse value: {str(e).splitlines()[0]}") from None
    return key.strip(), value


def load(name_or_path: str) -> Config:
    """A named config (``tiny``, ``small``, ``olmoe-1b``) or a YAML file."""
    cfg = Config()
    if name_or_path in NAMED:
        apply_mapping(cfg, NAMED[name_or_path], name_or_path)
        cfg.name = name_or_path
        return cfg
    path = Path(name_or_path)
    if not path.is_file():
        raise ConfigError(
            f"config {name_or_path!r} is neither a named config ({', '.join(NAMED)}) nor a file"
        )
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config {path}: invalid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"config {path}: top level must be a mapping")
    base = data.get("base")
    if base is not None:
        if base not in NAMED:
            raise ConfigError(f"config {path}: unknown base {base!r}")
        apply_mapping(cfg, NAMED[base], base)
    apply_mapping(cfg, data, str(path))
    cfg.name = str(data.get("name", path.stem))
    return cfg


def _env_int(env: Mapping[str, str], key: str) -> int | None:
    raw = env.get(key)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not an integer") from None


def resolve(config: str | None, overrides: Sequence[str], env: Mapping[str, str]) -> Config:
    """Build the effective config from the CLI and the contract environment."""
    name = config or env.get(envvars.CONFIG) or "tiny"
    cfg = load(name)
    env_set = env.get(envvars.SET)
    env_overrides: list[str] = []
    if env_set:
        try:
            env_overrides = json.loads(env_set)
        except json.JSONDecodeError:
            raise ConfigError(f"RESLICE_SET is not a JSON list: {env_set!r}") from None
        if not isinstance(env_overrides, list) or not all(isinstance(o, str) for o in env_overrides):
            raise ConfigError("RESLICE_SET must be a JSON list of 'key=value' strings")
    for text in [*env_overrides, *overrides]:
        set_value(cfg, *parse_override(text))
    for key, target in (
        (envvars.GLOBAL_BATCH, "train.global_batch"),
        (envvars.MICRO_BATCH, "train.micro_batch"),
        (envvars.GRAD_ACCUM, "train.grad_accum"),
    ):
        value = _env_int(env, key)
        if value is not None:
            set_value(cfg, target, value)
    if env.get(envvars.RUN_DIR):
        cfg.run_dir = env[envvars.RUN_DIR]
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    m, e, t, o = cfg.model, cfg.moe, cfg.train, cfg.optim
    checks = [
        (m.vocab_size > 0 and m.seq_len > 0 and m.d_model > 0 and m.n_layers > 0, "model sizes must be positive"),
        (m.n_heads > 0 and m.head_dim > 0 and m.head_dim % 2 == 0, "model.head_dim must be positive and even (RoPE)"),
        (m.kv_heads >= 0 and m.n_heads % (m.kv_heads or m.n_heads) == 0,
         "model.kv_heads must divide model.n_heads (0: n_heads)"),
        (m.logit_z_loss >= 0, "model.logit_z_loss must be >= 0"),
        (o.schedule in ("cosine", "wsd"), "optim.schedule must be cosine or wsd"),
        (0 < o.decay_fraction <= 1, "optim.decay_fraction must be in (0, 1]"),
        (o.schedule != "wsd" or wsd_decay_start(cfg) >= o.warmup_steps,
         "optim.schedule=wsd: the decay (optim.decay_fraction of the decay steps) must start after the warm-up"),
        (0 <= m.dense_layers <= m.n_layers, "model.dense_layers must be in [0, model.n_layers]"),
        (m.dtype in ("float32", "bfloat16"), "model.dtype must be float32 or bfloat16"),
        (m.remat in tuple(Remat), f"model.remat must be one of {', '.join(Remat)}, got {m.remat!r}"),
        (m.attention_block >= 0 and (not m.attention_block or m.seq_len % m.attention_block == 0),
         "model.attention_block must divide model.seq_len (0: whole)"),
        (m.loss_chunk >= 0 and (not m.loss_chunk or m.seq_len % m.loss_chunk == 0),
         "model.loss_chunk must divide model.seq_len (0: whole)"),
        (m.attention in tuple(AttentionKind), f"model.attention must be one of {', '.join(AttentionKind)}, got {m.attention!r}"),
        (m.attention != AttentionKind.SPLASH or m.seq_len % 128 == 0,
         "model.attention=splash needs model.seq_len to be a multiple of 128 (the kernel's tiles): use blocked"),
        (m.splash_block >= 0 and (not m.splash_block or (m.seq_len % m.splash_block == 0 and m.splash_block % 128 == 0)),
         "model.splash_block must be a multiple of 128 that divides model.seq_len (0: chosen for the shape)"),
        (m.sliding_window >= 0 and m.global_every >= 0, "model.sliding_window and model.global_every must be >= 0 (0: none)"),
        (not m.global_every or m.sliding_window > 0, "model.global_every needs model.sliding_window > 0"),
        (e.expert_matmul in tuple(ExpertMatmul), f"moe.expert_matmul must be one of {', '.join(ExpertMatmul)}, got {e.expert_matmul!r}"),
        (e.num_experts > 0 and 0 < e.top_k <= e.num_experts, "moe.top_k must be in [1, moe.num_experts]"),
        (e.d_expert > 0 and e.shared_expert_dim >= 0, "moe.d_expert must be positive"),
        (e.transport in tuple(Transport), "moe.transport must be auto, ragged or dense"),
        (e.balance_group > 0, "moe.balance_group must be positive"),
        (cfg.data.source in ("synthetic", "files"), "data.source must be synthetic or files"),
        (cfg.data.source != "files" or bool(cfg.data.path), "data.path is required for data.source=files"),
        (cfg.data.dtype in tuple(TokenDtype), "data.dtype must be uint16, uint32 or auto"),
        (not (cfg.data.sources and cfg.data.path), "data.path and data.sources exclude each other (a one-file mixture: data.sources=[{name: ..., path: ..., weight: 1}])"),
        (not (cfg.data.dtype == TokenDtype.UINT16 and m.vocab_size > 1 << 16 and _reads_token_files(cfg)),
         f"data.dtype=uint16 cannot hold model.vocab_size={m.vocab_size} token ids (> 65,536): use uint32"),
        (-1 <= cfg.data.eos_id < m.vocab_size, "data.eos_id must be -1 (none) or a token id below model.vocab_size"),
        (cfg.eval.interval >= 0 and cfg.eval.batches > 0, "eval.interval must be >= 0 and eval.batches positive"),
        (cfg.data.workers >= 0 and cfg.data.prefetch >= 0, "data.workers and data.prefetch must be >= 0"),
        (cfg.train.stall_timeout_s >= 0, "train.stall_timeout_s must be >= 0 (0: automatic)"),
        (cfg.train.debug_start_delay_s >= 0, "train.debug_start_delay_s must be >= 0"),
        (cfg.train.debug_step_pause_s >= 0, "train.debug_step_pause_s must be >= 0"),
        (cfg.checkpoint.debug_save_delay_s >= 0, "checkpoint.debug_save_delay_s must be >= 0"),
        (t.steps > 0 and t.global_batch > 0, "train.steps and train.global_batch must be positive"),
        (0 <= t.seed < 2**32, f"train.seed must be in [0, 2**32), got {t.seed}"),
        (t.micro_batch >= 0 and t.grad_accum > 0, "train.grad_accum must be positive"),
        (min(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor, cfg.mesh.expert) >= 0, "mesh sizes must be >= 0 (0: automatic)"),
        (cfg.checkpoint.interval > 0 and cfg.checkpoint.keep > 0, "checkpoint.interval and keep must be positive"),
        (cfg.optim.warmup_steps >= 0 and cfg.optim.lr > 0, "optim.lr must be positive"),
        (0 <= o.min_lr_ratio <= 1, "optim.min_lr_ratio must be in [0, 1]"),
        (0 <= o.b1 < 1 and 0 <= o.b2 < 1, "optim.b1 and optim.b2 must be in [0, 1)"),
        (o.eps > 0 and o.weight_decay >= 0 and o.clip_norm >= 0, "optim.eps must be positive, weight_decay and clip_norm >= 0"),
        (o.decay_steps >= 0, "optim.decay_steps must be >= 0 (0: train.steps)"),
        (m.rope_theta > 0 and m.init_std > 0, "model.rope_theta and model.init_std must be positive"),
        (e.load_balance_weight >= 0 and e.z_loss_weight >= 0, "moe loss weights must be >= 0"),
        (0 <= cfg.data.copy_prob <= 1, "data.copy_prob must be in [0, 1]"),
        (cfg.data.num_records > 0 and cfg.data.zipf_exponent > 0, "data.num_records and zipf_exponent must be positive"),
        (cfg.metrics.flush_seconds > 0 and cfg.metrics.log_every > 0, "metrics.flush_seconds and log_every must be positive"),
        (t.crash_at_step >= 0 and cfg.mesh.expert >= 0, "train.crash_at_step and mesh.expert must be >= 0"),
        (all(1 <= s <= t.steps for s in t.profile_steps),
         f"train.profile_steps must be steps from 1 to train.steps={t.steps}, got {t.profile_steps}"),
    ]  # fmt: skip
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def token_dtype(cfg: Config) -> str:
    """The token files' dtype: data.dtype, or for ``auto`` the smaller that holds every token id."""
    if cfg.data.dtype != TokenDtype.AUTO:
        return cfg.data.dtype
    return TokenDtype.UINT16 if cfg.model.vocab_size <= 1 << 16 else TokenDtype.UINT32


def layer_windows(m: ModelConfig) -> list[int]:
    """Each layer's attention window in tokens, 0 for a global layer (model.sliding_window and
    model.global_every): OLMo-core's ``SlidingWindowAttentionConfig(pattern=[W] * (N - 1) + [-1],
    force_full_attention_on_last_layer=True)``."""
    if not m.sliding_window:
        return [0] * m.n_layers
    n, every = m.n_layers, m.global_every

    def is_global(i: int) -> bool:
        return bool(every) and (i == n - 1 or i % every == every - 1)

    return [0 if is_global(i) else m.sliding_window for i in range(n)]


def _reads_token_files(cfg: Config) -> bool:
    return bool(cfg.data.sources or cfg.eval.sources) or cfg.data.source == "files"


def decay_steps(cfg: Config) -> int:
    return cfg.optim.decay_steps or cfg.train.steps


def wsd_decay_start(cfg: Config) -> int:
    """The first step of a WSD schedule's decay: the last ``decay_fraction`` of the decay steps."""
    total = decay_steps(cfg)
    return total - max(1, round(cfg.optim.decay_fraction * total))


def schedule_point(cfg: Config) -> dict[str, Any]:
    """What a checkpoint's meta records of a WSD schedule's decay (``{}`` for cosine): a resume
    compares it with its own to decide whether the steps already trained are unaffected."""
    if cfg.optim.schedule != "wsd":
        return {}
    return {"decay_start": wsd_decay_start(cfg), "decay_end": decay_steps(cfg)}


def schedule_change(step: int, saved: dict[str, Any], current: dict[str, Any]) -> str | None:
    """Why a checkpoint at ``step`` cannot resume under a moved WSD decay, or None when it can.

    Before both decay starts the two schedules give every step the same learning rate (warm-up,
    then the stable peak), so the steps already trained are what the new schedule would have
    trained: a run may then grow (``train.steps``) or move its decay. Past either start they differ.
    """
    if saved == current:
        return None
    if not saved or not current:  # cosine on one side: the hash already refused it
        return f"schedule {saved or 'cosine'} -> {current or 'cosine'}"
    first = min(saved["decay_start"], current["decay_start"])
    if step <= first:
        return None
    return (
        f"trained to step {step}, past the decay start {first} (WSD decay {saved['decay_start']}-"
        f"{saved['decay_end']} -> {current['decay_start']}-{current['decay_end']}): train.steps and the "
        "decay can change only while a run is in its stable phase"
    )


# How a refused resume can go on, said in the refusal's line: an extended run (``train.steps``
# raised) whose decay follows ``train.steps`` (``optim.decay_steps=0``) is refused, since the steps
# already trained would have had other learning rates; pinning the checkpoint's decay length gives
# them theirs back, and the steps past it train at the floor.


def kept_schedule(saved_hash: str | None, saved: dict[str, Any], current: dict[str, Any]) -> str | None:
    """For a resume refused for its config hash (``saved``: the checkpoint's identity, ``current``:
    this run's): the pin that keeps the cosine schedule, when the decay's length is all that
    differs. None when anything else differs too (no pin helps), or for WSD (``kept_decay``)."""
    optim = saved.get("optim")
    before = optim.get("decay_steps") if isinstance(optim, dict) else None
    if not isinstance(before, int) or "decay_steps" not in current.get("optim", {}):
        return None
    if identity_hash({**current, "optim": {**current["optim"], "decay_steps": before}}) != saved_hash:
        return None
    return (
        f"the cosine decay follows train.steps when optim.decay_steps=0: --set optim.decay_steps={before}"
        " keeps this run's schedule"
    )


def kept_decay(saved: dict[str, Any], current: dict[str, Any]) -> str | None:
    """For a resume refused by ``schedule_change`` (``saved``, ``current``: ``schedule_point``s):
    the pin that keeps the WSD decay, when its end moved. Its start moves with its end at the same
    ``optim.decay_fraction``, which the schedule point does not hold: the line says so."""
    if not saved or not current or saved["decay_end"] == current["decay_end"]:
        return None
    return (
        f"the decay follows train.steps when optim.decay_steps=0: --set optim.decay_steps={saved['decay_end']}"
        " keeps this run's decay at the same optim.decay_fraction"
    )


# Keys added after checkpoints existed: at their default they are left out of the identity, so a run
# checkpointed before they existed resumes under the same hash (what the key does at its default is
# what the trainer did before it). Set, they are in it like any other key.
_NEW_KEYS = {
    "model": (
        "kv_heads",
        "qk_norm",
        "reordered_norm",
        "document_attention",
        "logit_z_loss",
        "sliding_window",
        "global_every",
    ),
    "optim": (
        "schedule",
        "decay_fraction",
        "warmup_nonzero_start",
        "decay_embeddings",
        "decay_norm_and_bias",
    ),
    "data": ("eos_id", "sources"),
}


def _drop_defaults(section: str, values: dict[str, Any]) -> dict[str, Any]:
    default = dataclasses.asdict(Config())[section]
    return {k: v for k, v in values.items() if k not in _NEW_KEYS.get(section, ()) or v != default[k]}


def identity(cfg: Config) -> dict[str, Any]:
    """What a checkpoint must agree on to be resumed: model, optimizer and data, not the layout.

    Left out on purpose: the batch plan (checked separately, global batch explicitly), the mesh, the
    buffer factor, transport and expert matmul (they change which rows drop or how, not the state),
    remat, the attention kind and its blocks, and loss chunks (how a step is computed), loader workers, steps, and a WSD schedule's
    decay point (``schedule_point``: a resume may move it while the trained steps are unaffected).
    """
    moe = dataclasses.asdict(cfg.moe)
    for k in ("ragged_buffer_factor", "transport", "expert_matmul"):
        moe.pop(k)
    data = dataclasses.asdict(cfg.data)
    for k in ("workers", "prefetch"):
        data.pop(k)
    if data["dtype"] == TokenDtype.AUTO:  # what it resolves to; "uint16" was the default before "auto"
        data["dtype"] = str(TokenDtype.UINT16 if cfg.model.vocab_size <= 1 << 16 else TokenDtype.UINT32)
    optim = dataclasses.asdict(cfg.optim)
    if cfg.optim.schedule == "wsd":  # where the decay starts: schedule_point, checked on resume
        optim.pop("decay_steps")
        optim.pop("decay_fraction")
    else:
        optim["decay_steps"] = decay_steps(cfg)
    model = dataclasses.asdict(cfg.model)
    # How the step is computed, not the model.
    for k in ("remat", "attention_block", "loss_chunk", "attention", "splash_block"):
        model.pop(k)
    out = {
        "model": _drop_defaults("model", model),
        "moe": moe,
        "optim": _drop_defaults("optim", optim),
        "data": _drop_defaults("data", data),
        "init_seed": cfg.train.seed,
    }
    if cfg.train.init_from:  # a stage: its checkpoints are not the source run's, nor another stage's
        out["init"] = {"from": cfg.train.init_from, "optimizer": cfg.train.init_optimizer}
    return out


def config_hash(cfg: Config) -> str:
    return identity_hash(identity(cfg))


def identity_hash(ident: dict[str, Any]) -> str:
    """The config hash of an identity (``identity``, or one read back from a checkpoint's meta)."""
    blob = json.dumps(ident, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def environ() -> dict[str, str]:
    return dict(os.environ)
