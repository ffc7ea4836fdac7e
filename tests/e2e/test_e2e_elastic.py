"""Capacity loss and return, end to end, with a gs:// run directory: the real controller shrinks a
run to the largest feasible smaller shape at the same global batch, then grows it back, and the
losses match an uninterrupted run step for step."""

import pytest

from launcher.core.record import Knobs
from launcher.core.words import RunState
from tests.e2e.harness import (
    MULTI_HOST,
    MULTI_HOST_BATCH,
    Harness,
    assert_same_samples_and_losses,
    kept_steps,
    shared_reference,
    wait_for,
)
from tests.support.fake_gcs import fake_gcs

pytestmark = pytest.mark.e2e
STEPS = 25  # lose a slice after step 5, grow back after step 10, finish


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return shared_reference(tmp_path_factory, MULTI_HOST_BATCH)


def test_shrink_on_capacity_loss_then_grow_back_on_gcs(tmp_path, reference):
    with fake_gcs(buckets=["runs"]) as gcs:
        h = Harness(tmp_path, pools=2, preset=MULTI_HOST, gcs_env=gcs.env)
        try:
            knobs = Knobs(unschedulable_grace_s=20, grow_window_s=1, app_backoff_s=1)
            h.launch(
                "elastic", slices=2, steps=STEPS, run_dir="gs://runs/elastic", knobs=knobs,
                global_batch=MULTI_HOST_BATCH,
            )  # fmt: skip
            h.start_controller("elastic")
            h.wait_step("elastic", 5, timeout=300)
            survivor = h.pool(0)
            h.cluster.remove(h.pool(1))  # capacity gone: nodes deleted, running pods fail
            wait_for(lambda: len(h.record("elastic").segments) >= 2, 60, "the shrink to a new segment")
            h.cluster.restore(h.pool(1))
            wait_for(lambda: len(h.record("elastic").segments) >= 3, 90, "the grow back")
            rec = h.wait_state("elastic", {RunState.FINISHED}, timeout=240)
            rundir = h.rundir("elastic")
            metrics, ledger = rundir.metrics(), rundir.ledger()
            objects = gcs.list_objects("runs", "elastic/")
        finally:
            h.close()

    assert any(o.startswith("elastic/checkpoints/") for o in objects)
    assert "elastic/events.jsonl" in objects and any(o.startswith("elastic/metrics/") for o in objects)
    first, shrunk, grown = rec.segments
    # Acceptance 3: the largest feasible smaller shape, at the same global batch.
    assert (first.slices, shrunk.slices, grown.slices) == (2, 1, 2)
    assert first.end_kind == "capacity-lost" and "capacity lost" in first.end_reason
    for seg in rec.segments:
        assert seg.devices * seg.micro_batch * seg.grad_accum == MULTI_HOST_BATCH
    assert (shrunk.devices, shrunk.micro_batch, shrunk.grad_accum) == (8, 4, 1)
    # The one-slice segment named the pool that survived (no exclusive placement's follower wait);
    # the segments of two slices left placement to JobSet.
    assert (first.pool, shrunk.pool, grown.pool) == (None, survivor, None)
    assert shrunk.nodepools == (survivor,)
    # Acceptance 4: grew back after the stability window, from a checkpoint of its own.
    assert shrunk.end_kind == "grow" and "capacity returned" in shrunk.end_reason
    assert shrunk.end_step > shrunk.start_step
    kept = kept_steps(metrics)
    assert sorted(kept) == list(range(1, STEPS + 1))
    assert {m["segment"] for m in kept.values()} == {0, 1, 2}
    assert_same_samples_and_losses(kept, reference)
    for m in kept.values():
        assert m["devices"] * m["micro_batch"] * m["grad_accum"] == MULTI_HOST_BATCH
    acts = [e["reason"] for e in ledger if e.get("kind") == "act"]
    assert any(f"shrinking {MULTI_HOST} x2 -> {MULTI_HOST} x1" in a for a in acts)
    assert any(f"growing {MULTI_HOST} x1 -> {MULTI_HOST} x2" in a for a in acts)
