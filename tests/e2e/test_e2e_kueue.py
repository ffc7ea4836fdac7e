"""Kueue end to end (docs/gke.md "Kueue"): each slice JobSet of an in-place run is its own Kueue
Workload, created suspended and admitted by unsuspending it; launcher/embedded/kueue.py plays
Kueue's part through the API. One run shows the lot: launched while Kueue admits only one of its two
slices, it starts on that one (world 0, which names the other, is never published) and grows when
the second is admitted (late, as through a ProvisioningRequest admission check); evicted at step
>= 10 (suspended again, its pods deleted), the second slice leaves and the run goes on on the first
within 30 s, the first slice's pods the same throughout; admitted again, it rejoins. The losses
match an uninterrupted run step for step, at the same global batch."""

import threading
import time

import pytest

from contract.words import RestartMode
from launcher.controller.launch import create_run, prepare
from launcher.core import world
from launcher.core.labels import LABEL_SLICE, world_configmap_name
from launcher.core.record import Knobs
from launcher.core.spec import RunSpec
from launcher.core.words import EndKind, LedgerKind, RunState, WaitReason
from launcher.embedded.kueue import Kueue
from tests.e2e.harness import (
    MULTI_HOST,
    MULTI_HOST_BATCH,
    TRAINER_SETTINGS,
    Harness,
    assert_same_samples_and_losses,
    kept_steps,
    paced,
    shared_reference,
    wait_for,
)

pytestmark = pytest.mark.e2e
# Four world changes before the final step. Paced by the clock (0.4 s after every step): a world
# on one slice must not finish the run before the next grow however fast its steps are, and
# waiting costs no CPU, while a two-slice step's collectives cost the most of any.
STEPS, PACE_S = 30, 0.4
RUN = "kq"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return shared_reference(tmp_path_factory, MULTI_HOST_BATCH)


def launch_queued(h: Harness, mode: RestartMode = RestartMode.IN_PLACE, grow_window_s: float = 1) -> None:
    """As Harness.launch, with a Kueue LocalQueue: the JobSets are rendered suspended."""
    settings = tuple(
        s.format(steps=STEPS, interval=5 if mode == RestartMode.RECREATE else 20) for s in TRAINER_SETTINGS
    ) + paced(PACE_S)
    spec = RunSpec(
        run=RUN, run_dir=str(h.tmp / RUN), global_batch=MULTI_HOST_BATCH, config="tiny", overrides=settings,
        grace_period_s=20, heartbeat_timeout_s=10, max_restarts=3, image_pull_policy="Never",
        restart_mode=mode, queue="team-a",
        world_api=h.cluster.api_client().configuration.host if mode == RestartMode.IN_PLACE else None,
    )  # fmt: skip
    knobs = Knobs(unschedulable_grace_s=20, grow_window_s=grow_window_s, app_backoff_s=1)
    rec, _ = prepare(spec, MULTI_HOST, 2, knobs)
    create_run(h.kube, rec)


def uids(h: Harness, slice_id: str) -> set[str]:
    return {
        p["metadata"]["uid"]
        for p in h.run_pods(RUN)
        if p["metadata"]["labels"].get(LABEL_SLICE) == slice_id and not p["metadata"].get("deletionTimestamp")
    }


def trained(h: Harness, segment: int | None = None) -> int:
    steps = [m["step"] for m in h.rundir(RUN).metrics() if segment is None or m.get("segment") == segment]
    return max(steps, default=0)


def first_step_at(h: Harness, segment: int) -> float:
    return min(m["time"] for m in h.rundir(RUN).metrics() if m.get("segment") == segment)


def test_kueue_admits_evicts_and_readmits_a_slice_in_place(tmp_path, reference):
    h = Harness(tmp_path, pools=2, preset=MULTI_HOST)
    kueue = Kueue(h.cluster.api_client(), held={f"{RUN}-s1"})  # no quota for slice 1 yet
    loop = threading.Thread(target=kueue.run, args=(h.stop,), daemon=True)
    loop.start()
    h.threads.append(loop)
    epochs: set[int | None] = set()

    def published() -> int | None:
        epoch = world.published_epoch(h.kube.world(world_configmap_name(RUN)))
        epochs.add(epoch)
        return epoch

    try:
        launch_queued(h)
        h.start_controller(RUN)
        # World 0 names slice 1, which Kueue does not admit: never published; after the grace
        # period the run starts on slice 0, slice 1's JobSet left in the queue.
        wait_for(lambda: published() is not None, 120, "a world published")
        assert epochs == {None, 1}, epochs
        wait_for(lambda: trained(h, segment=1) > 0, 240, "training on the admitted slice")
        first = uids(h, "0")
        assert len(first) == 2

        kueue.release(f"{RUN}-s1")  # admitted late (its admission check Ready)
        wait_for(lambda: trained(h, segment=2) > 0 and trained(h) >= 10, 300, "2 slices, step 10")
        assert uids(h, "0") == first

        evicted_at = time.time()
        kueue.evict(f"{RUN}-s1")  # preempted by a higher-priority Workload
        wait_for(lambda: trained(h, segment=3) > 0, 120, "training on slice 0 again")
        went_on_s = first_step_at(h, 3) - evicted_at
        assert uids(h, "0") == first

        kueue.release(f"{RUN}-s1")
        rec = h.wait_state(RUN, {RunState.FINISHED}, timeout=400)
        assert uids(h, "0") in (first, set())  # finished pods may be gone (ttl); never others
        metrics, ledger = h.rundir(RUN).metrics(), h.rundir(RUN).ledger()
    finally:
        h.close()
    assert went_on_s <= 30, f"the run went on {went_on_s:.1f} s after the eviction"
    worlds = [s.slice_ids for s in rec.segments]
    assert worlds[:5] == [("0", "1"), ("0",), ("0", "1"), ("0",), ("0", "1")], worlds
    kinds = [s.end_kind for s in rec.segments[:4]]
    assert kinds == [EndKind.EVICTED, EndKind.GROW, EndKind.EVICTED, EndKind.GROW], kinds
    assert rec.segments[0].running_at is None  # world 0 never ran
    waits = {e.get("wait") for e in ledger if e.get("kind") == LedgerKind.WAIT}
    assert WaitReason.ADMISSION in waits
    for seg in rec.segments:
        assert seg.devices * seg.micro_batch * seg.grad_accum == MULTI_HOST_BATCH
    kept = kept_steps(metrics)
    assert sorted(kept) == list(range(1, STEPS + 1))
    assert {m["segment"] for m in kept.values()} >= {1, 2, 3, 4}
    assert_same_samples_and_losses(kept, reference)
    assert rec.segments[-1].end_step == STEPS


def test_kueue_evicts_a_recreate_segment_which_shrinks_and_grows_back(tmp_path, reference):
    """Recreate: the segment's one JobSet is the Workload. Evicted at step >= 10, the segment ends
    and the next is smaller, at the same global batch; once it has trained and the larger shape
    has fitted for the grow window, the run grows back to 2 slices (Kueue admits each segment)."""
    h = Harness(tmp_path, pools=2, preset=MULTI_HOST)
    kueue = Kueue(h.cluster.api_client())
    loop = threading.Thread(target=kueue.run, args=(h.stop,), daemon=True)
    loop.start()
    h.threads.append(loop)
    try:
        launch_queued(h, RestartMode.RECREATE, grow_window_s=4)
        h.start_controller(RUN)
        wait_for(lambda: trained(h, segment=0) >= 10, 300, "step 10")
        kueue.evict(f"{RUN}-0")
        rec = h.wait_state(RUN, {RunState.FINISHED}, timeout=400)
        metrics = h.rundir(RUN).metrics()
    finally:
        h.close()
    assert kueue.admitted[:3] == [f"{RUN}-0", f"{RUN}-1", f"{RUN}-2"], kueue.admitted
    shapes = [(s.slices, s.end_kind) for s in rec.segments[:3]]
    assert shapes == [(2, EndKind.EVICTED), (1, EndKind.GROW), (2, EndKind.FINISHED)], shapes
    for seg in rec.segments:
        assert seg.devices * seg.micro_batch * seg.grad_accum == MULTI_HOST_BATCH
    kept = kept_steps(metrics)
    assert sorted(kept) == list(range(1, STEPS + 1))
    assert {m["segment"] for m in kept.values()} >= {0, 1, 2}
    assert_same_samples_and_losses(kept, reference)
