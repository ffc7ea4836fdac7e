"""A controller killed in the middle of a shrink, and another taking over:
the run completes, two JobSets of the run never exist at once, and the ledger shows the takeover.

The first controller dies at the worst moment of the shrink: it has recorded the next segment in
the run record and has not created its JobSet yet (a crash point, as if SIGKILLed there)."""

import pytest

from tests.e2e.harness import MULTI_HOST, MULTI_HOST_BATCH, Harness, JobSetCensus, kept_steps

pytestmark = pytest.mark.e2e


def test_controller_killed_mid_shrink(tmp_path):
    h = Harness(tmp_path, pools=2, preset=MULTI_HOST)
    census = JobSetCensus(h.cluster, "takeover").start()
    first = second = None
    try:
        h.launch("takeover", slices=2, steps=20, interval=5, global_batch=MULTI_HOST_BATCH)
        first = h.controller_process(
            "takeover", tmp_path / "controller-1.log", crash_point="after-record:start-segment:1"
        )
        h.wait_step("takeover", 5, timeout=300)  # a cold compile cache, 4 processes, a loaded machine
        h.cluster.remove(h.pool(1))
        assert first.wait(timeout=90) == 137, "the first controller should die at its crash point"
        rec = h.record("takeover")
        assert [s.slices for s in rec.segments] == [2, 1] and rec.segments[1].jobset_uid is None
        assert {j["metadata"]["name"] for j in h.kube.jobsets("takeover")} <= {"takeover-0"}
        second = h.controller_process("takeover", tmp_path / "controller-2.log")
        assert second.wait(timeout=180) == 0, (tmp_path / "controller-2.log").read_text()[-2000:]
        rec = h.record("takeover")
        ledger = h.rundir("takeover").ledger()
        metrics = h.rundir("takeover").metrics()
    finally:
        census.stop()
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
        h.close()

    assert rec.state == "Finished"
    assert census.most == 1, f"{census.most} JobSets of the run existed at once"
    assert census.names == {"takeover-0", "takeover-1"}
    assert [s.slices for s in rec.segments] == [2, 1]
    submits = [e for e in ledger if e.get("action") == "start-segment"]
    assert [e["segment"] for e in submits] == [0, 1], "a segment was submitted twice"
    creates = [e for e in ledger if e.get("action") == "create-jobset"]
    takeovers = [e for e in ledger if e.get("kind") == "takeover"]
    assert len(takeovers) == 1 and len(creates) == 1
    first_id, second_id = submits[0]["controller"], takeovers[0]["holder"]
    assert first_id != second_id and takeovers[0]["previous"] == first_id
    assert submits[1]["controller"] == first_id and creates[0]["controller"] == second_id
    assert sorted(kept_steps(metrics)) == list(range(1, 21))
