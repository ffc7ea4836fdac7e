"""MaxText, elastic, end to end (docs/maxtext.md): real MaxText 0.2.5
(.venv-maxtext) launched by reslice (`trainer="maxtext"`) on the embedded cluster on 2 multi-host
slices (tpu7x-2x2x2 x2: 4 processes of 8 CPU devices), one slice's node pool removed after step 10:
the run shrinks to 1 slice at the same global batch, grows back when the pool returns, and finishes,
with per-step losses within 1e-5 of an uninterrupted MaxText run of the same config, on grain
ArrayRecord data this test writes. Twice: on a local run directory, and on a gs:// one (the real
fake-gcs-server binary, every pod's MaxText writing its checkpoints there through Orbax, the
entrypoint its status and metrics, the controller reading them with the GCS client): `-k gcs`.

Not collected by the default run (tests/conftest.py): `python3 dev.py test tests/maxtext_e2e`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.adapters.rundir import RunDir
from launcher.controller.launch import create_run, prepare
from launcher.core.record import Knobs
from launcher.core.spec import RunSpec
from launcher.core.words import RunState
from tests.e2e.harness import MULTI_HOST, Harness, kept_steps, wait_for
from tests.maxtext_e2e.common import MODEL, VENV, VOCAB, single_process_env, site_packages
from tests.support.fake_gcs import fake_gcs

pytestmark = pytest.mark.e2e
STEPS, PERIOD, GLOBAL_BATCH, LOSE_AT = 30, 5, 32, 10
RECORDS, SEED = 2000, 7


def run_keys(data: Path) -> tuple[str, ...]:
    """The run's --set keys: the model, grain data (pre-tokenized ArrayRecord: MaxText still builds a
    tokenizer for its pad id, the package's own), the run's length and checkpoint period."""
    tokenizer = site_packages() / "maxtext" / "assets" / "tokenizers" / "tokenizer.default"
    return (
        *MODEL,
        "dataset_type=grain", "grain_file_type=arrayrecord", f"grain_train_files={data}",
        "grain_worker_count=0", "tokenize_train_data=false", f"tokenizer_path={tokenizer}",
        f"steps={STEPS}", f"checkpoint_period={PERIOD}",
    )  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "train.array_record"
    script = Path(__file__).parent / "make_data.py"
    site_packages()
    subprocess.run(
        [str(VENV / "bin" / "python"), str(script), str(path), str(RECORDS), str(VOCAB), str(SEED)],
        check=True,
        timeout=120,
    )
    return path


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data) -> dict[int, dict]:
    """The uninterrupted run: the entrypoint and MaxText alone, 1 process of 8 devices, the same
    global batch, the keys the renderer gives a 1-slice rung of 8 devices."""
    run_dir = tmp_path_factory.mktemp("reference")
    devices = 8
    env = {**os.environ, **single_process_env(run_dir, devices, GLOBAL_BATCH)}
    keys = [
        *run_keys(data), f"learning_rate_schedule_steps={STEPS}", "grain_use_elastic_iterator=true",
        "packing=false", f"per_device_batch_size={GLOBAL_BATCH // devices}", "gradient_accumulation_steps=1",
        "dcn_data_parallelism=1", f"ici_fsdp_parallelism={devices}", f"base_output_directory={run_dir}",
        "run_name=maxtext", "enable_checkpointing=true", "async_checkpointing=true",
        "enable_autocheckpoint=true", "skip_jax_distributed_system=false",
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "maxtext_entry", "--", *keys],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    print(f"reference run: exit {done.returncode} in {time.monotonic() - started:.1f} s")
    assert done.returncode == 0, done.stderr[-3000:]
    return kept_steps(RunDir(str(run_dir)).metrics())


@pytest.mark.timeout(3600)  # with the reference run: ~20 min on 2 busy cores (docs/maxtext.md)
def test_maxtext_shrinks_and_grows_at_the_same_global_batch_with_the_losses_of_an_uninterrupted_run(
    tmp_path, data, reference
):
    elastic(tmp_path, data, reference, str(tmp_path / "mt"), {})


@pytest.mark.timeout(3600)
def test_maxtext_on_a_gcs_run_directory_shrinks_and_grows_with_the_losses_of_an_uninterrupted_run(
    tmp_path, data, reference
):
    with fake_gcs(buckets=["runs"]) as gcs:
        saved = {k: os.environ.get(k) for k in gcs.env}
        gcs.apply()  # this process reads the run directory back (launcher.adapters.rundir: STORAGE_EMULATOR_HOST)
        try:
            elastic(tmp_path, data, reference, f"gs://runs/{tmp_path.name}/mt", gcs.env)
            objects = gcs.list_objects("runs", f"{tmp_path.name}/mt/")
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    assert not (tmp_path / "mt").exists()  # nothing of the run on local disk
    assert f"{tmp_path.name}/mt/status.json" in objects
    assert any(n.startswith(f"{tmp_path.name}/mt/maxtext/metrics/") for n in objects)  # MaxText's own lines


def elastic(tmp_path: Path, data: Path, reference: dict[int, dict], run_dir: str, gcs_env: dict) -> None:
    """Launch, lose a slice after step LOSE_AT, restore it, finish; check segments and losses."""
    assert sorted(reference) == list(range(1, STEPS + 1))
    started = time.monotonic()
    h = Harness(tmp_path, pools=2, preset=MULTI_HOST, gcs_env=gcs_env)  # the pods inherit gcs_env
    try:
        spec = RunSpec(
            run="mt", run_dir=run_dir, global_batch=GLOBAL_BATCH, config="base",
            overrides=run_keys(data), trainer="maxtext", grace_period_s=60, max_restarts=3,
            image_pull_policy="Never",
        )  # fmt: skip
        rec, _ = prepare(
            spec, MULTI_HOST, 2, Knobs(unschedulable_grace_s=20, grow_window_s=1, app_backoff_s=1)
        )
        create_run(h.kube, rec)
        h.start_controller("mt")
        h.wait_step("mt", LOSE_AT, timeout=900)
        lost_after = h.rundir("mt").latest_committed_step()
        # MaxText writes a step's metrics line one step late, after the next step trained: a slice
        # lost right after the commit would take the committed step's record with it, on any
        # storage (docs/maxtext.md). Its record reaches the run directory first.
        wait_for(
            lambda: set(range(1, lost_after + 1)) <= {m["step"] for m in h.rundir("mt").metrics()},
            300,
            f"the records of steps 1-{lost_after} in the run directory",
        )
        h.cluster.remove(h.pool(1))  # capacity gone: nodes deleted, the slice's pods killed
        wait_for(lambda: len(h.record("mt").segments) >= 2, 300, "the shrink to a new segment")
        h.cluster.restore(h.pool(1))
        wait_for(lambda: len(h.record("mt").segments) >= 3, 900, "the grow back")
        rec = h.wait_state("mt", {RunState.FINISHED}, timeout=900)
        # What a user sees: `reslice status` against the embedded cluster, the real CLI.
        env = {**os.environ, "KUBECONFIG": str(h.cluster.kubeconfig), "COLUMNS": "110"}
        shown = subprocess.run(
            [sys.executable, "-m", "launcher", "status", "mt"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        print(f"$ reslice status mt\n{shown.stdout}{shown.stderr}")
        rundir = h.rundir("mt")
        metrics, ledger, status = rundir.metrics(), rundir.ledger(), rundir.status()
        committed = rundir.committed_steps()
    finally:
        h.close()
    wall = time.monotonic() - started

    first, shrunk, grown = rec.segments
    table = [
        (s.index, f"{s.preset} x{s.slices}", s.devices, s.micro_batch, s.grad_accum, s.start_step, s.end_step,
         s.end_kind, s.restarts)
        for s in rec.segments
    ]  # fmt: skip
    print(f"elastic run: {wall:.1f} s; lost after committed step {lost_after}; segments {table}")
    assert (first.slices, shrunk.slices, grown.slices) == (2, 1, 2)
    assert first.end_kind == "capacity-lost" and shrunk.end_kind == "grow" and grown.end_kind == "finished"
    for seg in rec.segments:
        assert seg.devices * seg.micro_batch * seg.grad_accum == GLOBAL_BATCH
    assert (shrunk.devices, shrunk.micro_batch, shrunk.grad_accum) == (16, 2, 1)
    assert shrunk.start_step >= LOSE_AT and shrunk.end_step > shrunk.start_step
    assert rec.app_failures == 0 and rec.state == RunState.FINISHED
    # The controller read MaxText's own layout: maxtext/checkpoints/<k> is step k + 1.
    assert committed[-1] == STEPS and status["state"] == "finished" and status["step"] == STEPS
    assert shown.returncode == 0 and f"latest committed checkpoint: step {STEPS} of {STEPS}" in shown.stdout
    assert RunDir(run_dir).exists(f"maxtext/checkpoints/{STEPS - 1}/commit_success.txt")
    acts = [e["reason"] for e in ledger if e.get("kind") == "act"]
    assert any("shrinking tpu7x-2x2x2 x2 -> tpu7x-2x2x2 x1" in a for a in acts)
    assert any("growing tpu7x-2x2x2 x1 -> tpu7x-2x2x2 x2" in a for a in acts)

    kept = kept_steps(metrics)
    assert {m["segment"] for m in kept.values()} == {0, 1, 2}
    # MaxText logs a step's metrics one step late and stops before logging the step it saved on
    # SIGTERM (the grow): that step, where the next segment resumed, has no record anywhere; every
    # other step has one.
    missing = sorted(set(range(1, STEPS + 1)) - set(kept))
    assert set(missing) <= {shrunk.start_step, grown.start_step} and len(missing) <= 1, missing
    diffs = {step: abs(m["learning/loss"] - reference[step]["learning/loss"]) for step, m in kept.items()}
    print(
        "max |loss - reference| per step:",
        json.dumps({s: float(f"{d:.3g}") for s, d in sorted(diffs.items())}),
    )
    print(f"max over {len(diffs)} steps: {max(diffs.values()):.3g}")
    assert max(diffs.values()) <= 1e-5, diffs
    for m in kept.values():
        assert m["devices"] * m["micro_batch"] * m["grad_accum"] == GLOBAL_BATCH
