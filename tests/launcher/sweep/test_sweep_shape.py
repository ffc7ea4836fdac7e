"""A sweep measures every factor on the one shape it names: a run the controller puts on another
shape (its node pool lost, it shrank) is stopped at once and reported as not measured. Through the
real controller and the sweep driver on the embedded cluster (simulate mode: the shapes are the
controller's decisions, no trainer needed)."""

from __future__ import annotations

import io
import threading
from pathlib import Path

from rich.console import Console

from launcher.adapters.kube import Kube
from launcher.cli.spec_options import for_cluster
from launcher.core.record import Knobs, RunRecord, Segment
from launcher.core.spec import RunSpec
from launcher.core.words import EndKind, RunState
from launcher.embedded.cluster import EmbeddedCluster
from launcher.sweep.driver import SweepOutcome, run_sweep
from launcher.sweep.spec import make_sweep, off_shape
from tests.support.wait import wait_for

PRESET = "tpu7x-2x2x2"


def _segment(index: int, preset: str, slices: int, **kw: object) -> Segment:
    return Segment(index, preset, slices, 16 * slices, 2, 1, f"r-{index}", 0.0, "launch", **kw)  # type: ignore[arg-type]


def test_off_shape_names_the_first_segment_on_another_shape() -> None:
    rec = RunRecord(spec=RunSpec(run="r", run_dir="/d", global_batch=64), preset=PRESET, slices=2)
    assert off_shape(rec, PRESET, 2) is None
    lost = "capacity lost: node pools lost: p; shrinking tpu7x-2x2x2 x2 -> tpu7x-2x2x2 x1"
    rec = rec.with_segment(
        _segment(0, PRESET, 2, ended_at=1.0, end_kind=EndKind.CAPACITY_LOST, end_reason=lost)
    )
    assert off_shape(rec, PRESET, 2) is None  # ended, but no segment on another shape yet
    rec = rec.with_segment(_segment(1, PRESET, 1))
    assert off_shape(rec, PRESET, 2) == (
        f"not measured: its segment 1 would run on {PRESET} x1, not the sweep's {PRESET} x2 ({lost})"
    )


def test_a_run_that_would_shrink_is_stopped_and_not_measured(tmp_path: Path) -> None:
    with EmbeddedCluster(f"{PRESET}:2", mode="simulate") as cluster:
        kube = Kube(cluster.api_client(), "default")
        sweep = make_sweep(
            name="sh", preset=PRESET, slices=2, config="tiny", factors="1.0", steps=20, warmup=5,
            sweep_dir=str(tmp_path / "sweeps" / "sh"),
        )  # fmt: skip
        template = for_cluster(
            RunSpec(run="sh", run_dir=sweep.sweep_dir, global_batch=sweep.global_batch), True
        )
        done: list[SweepOutcome] = []
        out = io.StringIO()

        def sweep_in_thread() -> None:
            done.append(
                run_sweep(
                    kube,
                    sweep,
                    template,
                    Knobs(unschedulable_grace_s=5),
                    console=Console(file=out, width=1000),
                    live=False,
                    resync_s=0.5,
                    lease_s=4,
                )
            )

        t = threading.Thread(target=sweep_in_thread, daemon=True)
        t.start()
        run = "sh-f1"
        # Segment 0 on the sweep's shape, both slices running; then one slice's node pool goes.
        wait_for(lambda: (got := kube.get_record(run)) and got[0].segments and got[0].segments[0].running_at,
                 60, "segment 0 running")  # fmt: skip
        cluster.remove(f"{PRESET}-np-0")
        t.join(timeout=60)
        assert done, out.getvalue()
        [result] = done[0].results
        rec = kube.get_record(run)[0]
        left = [j for j in kube.jobsets(run) if not j["metadata"].get("deletionTimestamp")]
    assert not result.measured and not done[0].complete
    assert result.reason.startswith(f"not measured: its segment 1 would run on {PRESET} x1, not the sweep's")
    assert rec.state == RunState.STOPPED and rec.reason == result.reason
    assert [(s.preset, s.slices) for s in rec.segments] == [(PRESET, 2), (PRESET, 1)]
    assert left == []  # the other shape's JobSet deleted with the run's stop
    assert f"{run}: {RunState.STOPPED}: {result.reason}" in out.getvalue()
