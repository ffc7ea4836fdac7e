"""One ladder (issue 43, item 4): the run record keeps what the HBM estimate needs of the trainer
config, and the controller's passes decide on the ladder `plan` shows, so a rung whose estimate does
not fit is never chosen: olmo-7b at global batch 64 fits 2 slices of v6e-4x4, one, and 2 of v6e-2x4 (its
fallback), not one v6e-2x4 (32 GiB of HBM a chip). The embedded cluster in simulate mode (no trainer runs): only
the controller's loop and the cluster's scheduler are under test."""

import json

from launcher.adapters.kube import Kube
from launcher.adapters.rundir import RunDir
from launcher.controller.launch import create_run, prepare
from launcher.controller.loop import Controller
from launcher.core.accounting import build_report
from launcher.core.plan import HBM_SECTIONS
from launcher.core.record import Knobs
from launcher.core.spec import RunSpec
from launcher.core.words import LedgerKind, RunState, WaitReason
from launcher.embedded.cluster import EmbeddedCluster, NodePoolSpec
from tests.support.wait import wait_for

SPEC = dict(global_batch=64, config="olmo-7b")
REQUESTED, FALLBACK = "v6e-4x4", "v6e-2x4"


def test_the_record_keeps_the_hbm_sections_and_launch_plans_as_plan_does(tmp_path) -> None:
    spec = RunSpec(run="seven", run_dir=str(tmp_path / "seven"), **SPEC)
    rec, ladder = prepare(spec, REQUESTED, 2, Knobs())
    kept = json.loads(rec.spec.trainer_config)
    assert sorted(kept) == sorted(HBM_SECTIONS) and kept["model"]["d_model"] == 4096
    by_shape = {str(r.shape): r for r in ladder}
    assert by_shape[f"{REQUESTED} x1"].feasible and by_shape[f"{FALLBACK} x2"].feasible
    smallest = by_shape[f"{FALLBACK} x1"]
    assert not smallest.feasible and "HBM" in smallest.plan.reason


def test_the_controller_never_shrinks_olmo_7b_onto_a_rung_that_cannot_hold_it(tmp_path) -> None:
    # Only the smallest rung's capacity exists: the requested segment's pods cannot be scheduled,
    # so the capacity rule looks down the ladder at once (no room for the shape) and finds only a
    # rung the HBM estimate rules out.
    with EmbeddedCluster(nodepools=[NodePoolSpec(FALLBACK, count=1)], mode="simulate") as cluster:
        kube = Kube(cluster.api_client(), "default")
        spec = RunSpec(run="seven", run_dir=str(tmp_path / "seven"), **SPEC)
        rec, _ = prepare(spec, REQUESTED, 2, Knobs(unschedulable_grace_s=1))
        create_run(kube, rec)
        ctl = Controller(kube)

        def waits_for_capacity() -> bool:
            ctl.pass_once(["seven"])
            got = kube.get_record("seven")[0]
            # Never a segment on the rung that does not fit, whatever the pass decided.
            assert all(s.preset == REQUESTED for s in got.segments), got.segments
            return any(e.get("wait") == WaitReason.ONLY_INFEASIBLE for e in RunDir(spec.run_dir).ledger())

        wait_for(waits_for_capacity, 60, "the controller to wait, saying why")
        for _ in range(3):  # and it keeps waiting
            ctl.pass_once(["seven"])
        got = kube.get_record("seven")[0]
        assert [s.preset for s in got.segments] == [REQUESTED] and got.state == RunState.RUNNING
        waits = [
            e for e in RunDir(spec.run_dir).ledger() if e.get("kind") == LedgerKind.WAIT and e.get("wait")
        ]
        assert f"{FALLBACK} x1" in waits[-1]["reason"] and "HBM" in waits[-1]["reason"]
        assert sorted(j["metadata"]["name"] for j in kube.jobsets("seven")) == ["seven-0"]
        # `reslice status` says why the run waits (its --json: the report's `waiting`).
        report = build_report(got, [], RunDir(spec.run_dir).ledger(), got.created_at + 60)
        assert report.as_dict()["waiting"]["wait"] == WaitReason.ONLY_INFEASIBLE
