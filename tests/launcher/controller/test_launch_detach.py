"""`reslice launch --detach` through the command line against the embedded cluster: segment 0's
JobSet exists when the command returns, the output says who watches the run, and a finished run
cannot be launched again (one line, exit 2, nothing created). Stopping a run retries a record write
that lost a race (kubernetes.utils.retry.retry_on_conflict)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kubernetes import client

from launcher.adapters.kube import Kube
from launcher.controller.launch import stop_run
from launcher.controller.lease import lease_name
from launcher.core.words import RunState
from launcher.embedded.cluster import EmbeddedCluster, NodePoolSpec
from tests.support.cli import run_cli

PRESET = "tpu7x-2x2x2"


@pytest.fixture
def cluster():
    with EmbeddedCluster(nodepools=[NodePoolSpec(PRESET, count=2)], mode="simulate") as c:
        yield c


def launch(capsys, cluster: EmbeddedCluster, run: str, run_dir: Path) -> tuple[int, str, str]:
    return run_cli(
        capsys, "launch", "-p", PRESET, "-n", "2", "--run", run, "-b", "32", "--run-dir", str(run_dir),
        "--kubeconfig", str(cluster.kubeconfig), "--detach",
    )  # fmt: skip


def hold_lease(kube: Kube, name: str, holder: str) -> None:
    now = datetime.now(UTC)
    spec = client.V1LeaseSpec(
        holder_identity=holder, lease_duration_seconds=600, acquire_time=now, renew_time=now
    )
    kube.coordination.create_namespaced_lease(
        "default", client.V1Lease(metadata=client.V1ObjectMeta(name=name), spec=spec)
    )


def test_detach_creates_segment_0_and_says_nothing_watches_yet(capsys, cluster, tmp_path):
    kube = Kube(cluster.api_client())
    code, out, err = launch(capsys, cluster, "solo", tmp_path / "solo")
    assert code == 0, err
    assert [j["metadata"]["name"] for j in kube.jobsets("solo")] == ["solo-0"]
    rec = kube.get_record("solo")[0]
    assert [s.index for s in rec.segments] == [0] and rec.segments[0].slices == 2
    out = " ".join(out.split())
    assert "segment 0 submitted" in out and "no controller watches this run yet" in out
    assert "reslice watch solo" in out and "kubectl apply -k manifests/controller" in out
    # The lease was released: a controller started later owns the run at once.
    assert kube.lease_holder(lease_name("solo")) is None


def test_detach_names_the_controller_that_is_running(capsys, cluster, tmp_path):
    kube = Kube(cluster.api_client())
    hold_lease(kube, lease_name("other-run"), "reslice-controller-7d9f-abc")
    code, out, _ = launch(capsys, cluster, "second", tmp_path / "second")
    assert code == 0 and kube.jobsets("second")
    assert "a controller is active in namespace default (reslice-controller-7d9f-abc)" in " ".join(
        out.split()
    )


def test_detach_leaves_the_run_to_the_controller_holding_its_lease(capsys, cluster, tmp_path):
    kube = Kube(cluster.api_client())
    hold_lease(kube, lease_name("owned"), "incluster-1")
    code, out, _ = launch(capsys, cluster, "owned", tmp_path / "owned")
    assert code == 0 and "controller incluster-1 holds the run's lease" in " ".join(out.split())
    assert kube.jobsets("owned") == []  # the holder submits it, never two controllers at once


def test_launching_a_finished_run_again_is_refused(capsys, cluster, tmp_path):
    kube = Kube(cluster.api_client())
    run_dir = tmp_path / "done"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"run": "done"}))
    (run_dir / "status.json").write_text(json.dumps({"state": "finished", "step": 30, "total_steps": 30}))
    before = {p.name: p.read_text() for p in run_dir.iterdir()}
    code, _, err = launch(capsys, cluster, "done", run_dir)
    assert code == 2 and err.count("\n") == 1, err
    assert "run 'done' already finished" in err and "--run" in err and "--run-dir" in err
    assert kube.get_record("done") is None and kube.jobsets("done") == []
    assert {p.name: p.read_text() for p in run_dir.iterdir()} == before


def test_the_embedded_cluster_is_known_by_its_server_not_by_how_it_was_found(capsys, cluster, tmp_path):
    # Reached through --kubeconfig (as through $KUBECONFIG): still the embedded cluster's local
    # defaults, a short grace and no image to pull.
    code, _, err = launch(capsys, cluster, "local", tmp_path / "local")
    assert code == 0, err
    (js,) = Kube(cluster.api_client()).jobsets("local")
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 30
    assert {c["imagePullPolicy"] for c in pod["containers"]} == {"Never"}


class RacedKube(Kube):
    """A Kube whose first record write loses a race: just before it, another writer (a controller's
    pass) rewrites the record through the API, so the write's resourceVersion is stale (409)."""

    def __init__(self, api_client) -> None:
        super().__init__(api_client)
        self.writes = 0

    def update_record(self, rec, resource_version: str) -> str:
        self.writes += 1
        if self.writes == 1:
            other, rv = self.get_record(rec.name)
            super().update_record(replace(other, reason="another writer's pass"), rv)
        return super().update_record(rec, resource_version)


def test_stop_retries_on_conflict_and_stops_the_run(capsys, cluster, tmp_path):
    code, _, err = launch(capsys, cluster, "busy", tmp_path / "busy")
    assert code == 0, err
    kube = RacedKube(cluster.api_client())
    assert stop_run(kube, "busy") == ["busy-0"]
    assert kube.writes == 2  # the 409, then the write on the record read again
    rec = kube.get_record("busy")[0]
    assert (rec.state, rec.reason) == (RunState.STOPPED, "stopped by the user") and kube.jobsets("busy") == []
