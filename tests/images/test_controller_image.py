"""The controller image (docker/controller.Dockerfile) as its Deployment runs it: `reslice watch
--all` in the container as uid 65532, against the embedded cluster's API server started here (the
container on the host's network, the kubeconfig and the run directory mounted). It submits a run's
first segment, and when a slice's node pool goes away it shrinks the run onto the other slice."""

from __future__ import annotations

import json

import pytest

from launcher.adapters.kube import Kube
from launcher.adapters.rundir import RunDir
from launcher.controller.launch import create_run, prepare
from launcher.core.record import Knobs
from launcher.core.spec import RunSpec
from launcher.embedded.cluster import EmbeddedCluster, NodePoolSpec
from tests.images.container import Container, podman
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e
PRESET = "tpu7x-2x2x2"  # multi-host: 2 slices of it are a multislice run


def test_watch_in_the_image_runs_as_65532_and_shrinks_a_run(images, tmp_path):
    image = images["docker/controller.Dockerfile"]
    user = podman("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip()
    assert user == "65532:65532"
    run_dir = tmp_path / "shrink"
    run_dir.mkdir()
    run_dir.chmod(0o777)  # the controller writes its ledger there as uid 65532
    pools = [NodePoolSpec(PRESET, count=2)]
    with EmbeddedCluster(nodepools=pools, mode="simulate") as cluster:
        kube = Kube(cluster.api_client(), "default")
        spec = RunSpec(run="shrink", run_dir=str(run_dir), global_batch=32, grace_period_s=1)
        create_run(kube, prepare(spec, PRESET, 2, Knobs(unschedulable_grace_s=5))[0])
        # What launch wrote (run.json, events.jsonl) is root's: the controller appends as 65532.
        for path in run_dir.rglob("*"):
            path.chmod(0o777 if path.is_dir() else 0o666)
        kubeconfig = cluster.kubeconfig
        kubeconfig.chmod(0o644)
        args = ["watch", "--all", "--kubeconfig", "/kube/config", "--resync", "0.5"]
        volumes = {kubeconfig: "/kube/config:ro", run_dir: str(run_dir)}
        controller = Container(image, args, tmp_path / "controller.log", volumes=volumes, network="host")
        try:
            wait_for(lambda: kube.jobsets("shrink") or not controller.running(), 120, "segment 0")
            assert controller.running(), controller.output()[-4000:]
            assert controller.exec("id", "-u").strip() == "65532"
            cluster.remove(f"{PRESET}-np-1")
            wait_for(lambda: len(kube.get_record("shrink")[0].segments) >= 2, 90, "the shrink")
            rec = kube.get_record("shrink")[0]
            rc = controller.stop(grace_s=30)
        finally:
            controller.close()
    assert rc == 0, controller.output()[-4000:]
    first, shrunk = rec.segments[:2]
    assert (first.slices, shrunk.slices) == (2, 1)
    assert first.end_kind == "capacity-lost", json.dumps(first.__dict__, default=str)
    assert shrunk.devices * shrunk.micro_batch * shrunk.grad_accum == 32
    acts = [e["reason"] for e in RunDir(str(run_dir)).ledger() if e.get("kind") == "act"]
    assert any(f"shrinking {PRESET} x2 -> {PRESET} x1" in a for a in acts), acts
