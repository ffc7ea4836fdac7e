"""What the real-MaxText tests share: the tiny model, where .venv-maxtext's MaxText is, and a
loopback address of its own for MaxText's coordinator (port 1234) in a process outside a pod."""

from __future__ import annotations

import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-maxtext"
VOCAB = 256
# docs/maxtext.md's tiny model, in float32: in bf16 another device layout sums in another order and
# the losses drift by 1e-3 across process counts (measured); in float32 by < 1e-6.
MODEL = (
    "max_target_length=32", "base_emb_dim=64", "base_num_query_heads=2", "base_num_kv_heads=2",
    "base_mlp_dim=128", "base_num_decoder_layers=2", "head_dim=32", f"vocab_size={VOCAB}",
    "attention=dot_product", "dtype=float32", "weight_dtype=float32", "matmul_precision=highest",
    "enable_tensorboard=false", "log_period=1", f"jax_cache_dir={ROOT / '.cache' / 'jax-maxtext'}",
)  # fmt: skip


def site_packages() -> Path:
    found = sorted(VENV.glob("lib/python3.*/site-packages/maxtext"))
    assert found, f"no MaxText in {VENV}: `python3 dev.py maxtext` (dev.py test sets it up when named)"
    return found[-1].parent


def own_address() -> str:
    """As a pod gets one from the embedded kubelet: two runs never share MaxText's port 1234."""
    return f"127.{random.randrange(1, 254)}.{random.randrange(256)}.{random.randrange(1, 255)}"


def single_process_env(run_dir: Path, devices: int, global_batch: int) -> dict[str, str]:
    """The entrypoint's environment for 1 process of `devices` CPU devices, as a pod's."""
    return {
        "JAX_PLATFORMS": "cpu",
        "JAX_NUM_CPU_DEVICES": str(devices),
        "RESLICE_RUN_DIR": str(run_dir),
        "RESLICE_GLOBAL_BATCH": str(global_batch),
        "RESLICE_NUM_PROCESSES": "1",
        "JAX_COORDINATOR_ADDRESS": own_address(),
        "JOB_INDEX": "0",
        "JOB_COMPLETION_INDEX": "0",
        "PROCESSES_IN_JOB": "1",
        "JAX_PROCESS_COUNT": "1",
    }
