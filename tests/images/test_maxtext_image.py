"""The MaxText image (docker/maxtext.Dockerfile) as a pod runs it: `python -m maxtext_entry -- KEYS`
in the container, MaxText 0.2.5 pre-training in the same interpreter on 4 simulated CPU devices,
tests/maxtext_e2e's tiny model on synthetic data, the run directory a volume. It trains every step,
commits the last checkpoint and writes the run's metrics and status there, as on a TPU VM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.adapters.rundir import read_jsonl
from tests.images.container import JAX_CACHE, Container, jax_cpu_env
from tests.maxtext_e2e.common import MODEL, VOCAB

pytestmark = pytest.mark.e2e
STEPS, DEVICES = 4, 4
RUN_DIR = "/run-dir"
# tests/maxtext_e2e's tiny model, its compile cache in the images' one (mounted at /jax-cache).
TINY = [k for k in MODEL if not k.startswith("jax_cache_dir=")] + ["jax_cache_dir=/jax-cache/maxtext"]


def keys() -> list[str]:
    """launcher/maxtext.py's keys for 1 slice of 4 devices at global batch 4, synthetic data."""
    return [
        *TINY, "dataset_type=synthetic", f"steps={STEPS}", f"learning_rate_schedule_steps={STEPS}",
        "per_device_batch_size=1", "gradient_accumulation_steps=1", "dcn_data_parallelism=1",
        f"ici_fsdp_parallelism={DEVICES}", f"base_output_directory={RUN_DIR}", "run_name=maxtext",
        "checkpoint_period=100", "enable_checkpointing=true", "async_checkpointing=true",
        "enable_autocheckpoint=true", "skip_jax_distributed_system=false",
    ]  # fmt: skip


def test_maxtext_pretrains_on_cpu_in_the_image(images, tmp_path):
    assert f"vocab_size={VOCAB}" in TINY
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    JAX_CACHE.mkdir(parents=True, exist_ok=True)
    env = {
        **jax_cpu_env(DEVICES),
        "RESLICE_RUN_DIR": RUN_DIR,
        "RESLICE_GLOBAL_BATCH": str(DEVICES),
        "RESLICE_NUM_PROCESSES": "1",
        "JAX_COORDINATOR_ADDRESS": "127.0.0.1",
        "JOB_INDEX": "0",
        "JOB_COMPLETION_INDEX": "0",
        "PROCESSES_IN_JOB": "1",
        "JAX_PROCESS_COUNT": "1",
    }
    volumes = {run_dir: RUN_DIR, JAX_CACHE: "/jax-cache"}
    maxtext = Container(images["docker/maxtext.Dockerfile"], ["--", *keys()], tmp_path / "maxtext.log",
                        env=env, volumes=volumes)  # fmt: skip
    try:
        rc = maxtext.wait(600)
    finally:
        maxtext.close()
    out = maxtext.output()
    assert rc == 0, out[-4000:]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "finished" and status["step"] == STEPS, status
    records = [r for f in sorted((run_dir / "metrics").glob("*.jsonl")) for r in read_jsonl(f.read_text())]
    assert sorted(r["step"] for r in records) == list(range(1, STEPS + 1))
    assert all(r["learning/loss"] > 0 for r in records), records[-1]
    saved = Path(run_dir / "maxtext" / "checkpoints")
    assert (saved / str(STEPS - 1) / "commit_success.txt").exists(), sorted(p.name for p in saved.iterdir())
