"""The chaos benchmark's invariant checks (bench/chaos.py): each passes a good run and names what a
broken one got wrong; the fault schedule is the seed's alone."""

from bench import chaos
from bench.chaos import Seg


def test_finished_needs_the_final_step_committed_and_every_step_kept():
    assert chaos.finished_problems("Finished", [5, 10], list(range(1, 11)), 10) == []
    assert chaos.finished_problems("Running", [5, 10], list(range(1, 11)), 10) == [
        "state Running, not Finished"
    ]
    assert chaos.finished_problems("Finished", [5], list(range(1, 11)), 10) == [
        "last committed checkpoint 5, not 10"
    ]
    assert chaos.finished_problems("Finished", [10], [1, 2, 4, 5, 6, 7, 8, 9, 10], 10) == [
        "kept steps are not 1..10 (missing [3])"
    ]


def test_segments_are_consecutive():
    good = [Seg(0, 0.0, 10.0, None, 5), Seg(1, 11.0, 20.0, 5, 10), Seg(2, 21.0, 30.0, 10, 15)]
    assert chaos.segment_problems(good) == []
    assert chaos.segment_problems([good[0], good[2]]) == ["segment indexes [0, 2]"]
    early = [good[0], Seg(1, 9.0, 20.0, 5, 10)]
    assert chaos.segment_problems(early) == ["segment 1 submitted before segment 0 ended"]
    behind = [good[0], Seg(1, 11.0, 20.0, 0, 10)]
    assert chaos.segment_problems(behind) == ["segment 1 resumed at 0, behind segment 0"]
    assert chaos.segment_problems([Seg(0, 0.0, None, None, None)]) == ["segment 0 never ended"]


def test_two_jobsets_of_a_run_never_exist_at_once():
    ok = [("ADDED", "r-0"), ("MODIFIED", "r-0"), ("DELETED", "r-0"), ("ADDED", "r-1"), ("DELETED", "r-1")]
    assert chaos.overlap_problems(ok) == []
    bad = [("ADDED", "r-0"), ("ADDED", "r-1"), ("DELETED", "r-0")]
    assert chaos.overlap_problems(bad) == ["r-1 created while r-0 existed"]


def test_step_named_checkpoints_are_committed():
    names = ["10", "15", "15.orbax-checkpoint-tmp-1", "5"]
    assert chaos.checkpoint_problems(names, [5, 10, 15]) == []
    assert chaos.checkpoint_problems(names, [5, 10]) == ["checkpoint 15 is not committed"]


def test_losses_and_samples_match_the_reference_run():
    ref = {
        1: {"learning/loss": 2.0, "data/sample_digest": "a"},
        2: {"learning/loss": 1.5, "data/sample_digest": "b"},
    }
    same = {1: {"learning/loss": 2.000001, "data/sample_digest": "a"}, 2: dict(ref[2])}
    assert chaos.loss_problems(same, ref) == []
    off = {
        1: {"learning/loss": 2.0001, "data/sample_digest": "a"},
        2: {"learning/loss": 1.5, "data/sample_digest": "c"},
    }
    assert chaos.loss_problems(off, ref) == [
        "step 1: loss 2.0001000 vs 2.0000000",
        "step 2: sample digest differs",
    ]
    assert chaos.loss_problems({3: ref[1]}, ref) == ["step 3: not in the reference run"]


def test_the_schedule_is_the_seeds():
    assert chaos.schedule(7, 5) == chaos.schedule(7, 5)
    assert chaos.schedule(7, 5) != chaos.schedule(8, 5)
    for seed in range(20):
        faults = [f for f, _ in chaos.schedule(seed, 6)]
        assert set(faults) <= set(chaos.FAULTS)
        assert all(faults.count(f) <= 1 for f in chaos.ONCE)
    # Instant reboots (crash-host --down 0: upstream's Failed pod, a host disruption) are among
    # the faults 20 seeds of 4 draw, as are hosts down a while.
    drawn = {f for seed in range(20) for f, _ in chaos.schedule(seed, 4)}
    assert {"reboot-host", "crash-host"} <= drawn


def test_in_place_a_jobset_per_slice_never_more_than_the_slices() -> None:
    ok = [("ADDED", "c-s0"), ("ADDED", "c-s1"), ("DELETED", "c-s1"), ("ADDED", "c-s1")]
    assert chaos.slice_jobset_problems(ok, 2) == []
    bad = [("ADDED", "c-s0"), ("ADDED", "c-s1"), ("ADDED", "c-s2")]
    assert chaos.slice_jobset_problems(bad, 2) == ["c-s2 created while c-s0, c-s1 existed"]


def test_in_place_one_world_trains_at_a_time() -> None:
    def m(segment: int, t: float) -> dict:
        return {"segment": segment, "time": t}

    assert chaos.world_overlap_problems([m(0, 1.0), m(0, 2.0), m(1, 3.0), m(2, 5.0), m(1, 4.0)]) == []
    (problem,) = chaos.world_overlap_problems([m(0, 1.0), m(0, 3.5), m(1, 3.0)])
    assert problem.startswith("world 0 recorded a step 0.500 s after world 1's first")


def test_a_segment_is_launched_once():
    ok = [("ADDED", "r-0"), ("DELETED", "r-0"), ("ADDED", "r-1")]
    assert chaos.relaunch_problems(ok) == []
    again = [("ADDED", "r-0"), ("DELETED", "r-0"), ("ADDED", "r-0")]
    assert chaos.relaunch_problems(again) == ["r-0 created twice"]


def test_each_world_is_published_once_and_in_order():
    # The same write seen again (a MODIFIED of another field) is one publication.
    assert chaos.world_publication_problems([(0, 1.0), (0, 1.0), (1, 2.0), (3, 4.0)]) == []
    assert chaos.world_publication_problems([(0, 1.0), (1, 2.0), (1, 2.5)]) == ["world 1 published twice"]
    assert chaos.world_publication_problems([(0, 1.0), (2, 2.0), (1, 3.0)]) == [
        "world 1 published after world 2"
    ]


def test_what_a_seed_leaves_in_dev_shm_is_named():
    before = {"reslice-test-x", "other"}
    after = before | {"reslice-chaos-s0-0-123", "reslice-uid-1", "reslice-uid-9", "reslice-other-s0-0-5"}
    # Its snapshot folders and its pods' Memory volumes; not another run's, nor what was there.
    assert chaos.shm_problems(before, after, {"uid-1"}) == [
        "/dev/shm/reslice-chaos-s0-0-123 left behind",
        "/dev/shm/reslice-uid-1 left behind",
    ]
    assert chaos.shm_problems(before, before, {"uid-1"}) == []


def test_the_faults_include_kueue_evictions_and_controller_kills():
    drawn = {f for seed in range(20) for f, _ in chaos.schedule(seed, 4)}
    assert {"kueue-evict", "kill-controller", "reboot-host"} <= drawn
