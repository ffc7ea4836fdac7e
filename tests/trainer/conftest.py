"""Trainer test fixtures.

In-process JAX tests get 8 simulated CPU devices (set before the backend starts; subprocess runs
set ``JAX_NUM_CPU_DEVICES`` themselves). The uninterrupted reference run is made once per session
(across xdist's workers) and shared by every assertion that compares against it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import jax
import pytest

from tests.support.fake_gcs import FakeGCS, fake_gcs
from tests.support.once import once
from tests.trainer import runs

# If something started the backend first this cannot apply; ``cpu8`` reports it where it matters.
with contextlib.suppress(RuntimeError):
    jax.config.update("jax_num_cpu_devices", 8)


@pytest.fixture(scope="session")
def cpu8() -> list:
    devices = jax.devices()
    if len(devices) != 8:
        pytest.fail(
            f"the JAX backend started with {len(devices)} devices before tests/trainer could ask for 8"
        )
    return devices


@pytest.fixture(scope="session")
def gcs() -> Iterator[FakeGCS]:
    with fake_gcs(buckets=["reslice"]) as server:
        yield server


def _reference_run(run_dir: Path) -> dict:
    rc, out = runs.run(runs.env_for(str(run_dir), 8), run_dir / "trainer.log")
    assert rc == 0, out[-4000:]
    return {"dir": run_dir, "records": runs.parse_metrics(runs.metrics_files(run_dir)), "output": out}


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The uninterrupted run: 8 devices, micro-batch 2, no accumulation, 40 steps; one run for the
    whole session, whichever worker asks first (tests/support/once.py). Its directory is read, never
    written: the tests that resume into it check that it is left as it was."""
    return once(tmp_path_factory, "trainer-reference", _reference_run)
