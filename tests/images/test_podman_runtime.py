"""The embedded cluster's podman runtime (`reslice demo --runtime podman`): the kubelet runs each
trainer pod as `podman run` of the trainer image. A run of 2 slices of tpu7x-2x2x2 (4 trainer
containers) loses a slice and is shrunk onto the other at the same global batch, and finishes with
the segments, and the per-step losses, of the same run under the process runtime. While it runs,
the pod's log (pods/log, as `kubectl logs` reads it) is the trainer's output, and its
containerStatuses name the image and its digest — the one the running container was created from."""

from __future__ import annotations

import pytest
from kubernetes import client

import dev
from launcher.core.record import Knobs
from launcher.core.words import EndKind, PodRuntime, RunState
from tests.controller.harness import MULTI_HOST, MULTI_HOST_BATCH, Harness, kept_steps, wait_for
from tests.images.container import podman

pytestmark = pytest.mark.e2e
STEPS, INTERVAL, LOSE_AT = 12, 2, 2
STARTED = "trainer: start-up: {"


def shrink(tmp_path, runtime: str) -> dict:
    """The run under `runtime`: its record, kept steps, and one trainer pod's status and log
    (read from segment 0 while it trains)."""
    h = Harness(tmp_path, pools=2, preset=MULTI_HOST, runtime=runtime, shared=(tmp_path,))
    try:
        knobs = Knobs(unschedulable_grace_s=20, grow_window_s=1, app_backoff_s=1)
        h.launch(
            "shrink", slices=2, steps=STEPS, interval=INTERVAL, knobs=knobs, global_batch=MULTI_HOST_BATCH
        )
        h.start_controller("shrink")
        h.wait_step("shrink", LOSE_AT, timeout=300)
        core = client.CoreV1Api(h.cluster.api_client())
        pod = next(p for p in h.run_pods("shrink") if (p["status"].get("containerStatuses") or []))
        name = pod["metadata"]["name"]
        # Every trainer process prints its start-up report at its first step.
        wait_for(lambda: STARTED in core.read_namespaced_pod_log(name, "default"), 60, "the log")
        log = core.read_namespaced_pod_log(name, "default")
        status = core.read_namespaced_pod(name, "default").status.container_statuses[0]
        running = podman("ps", "--filter", f"label=io.kubernetes.pod.uid={pod['metadata']['uid']}",
                         "--format", "{{.ID}} {{.ImageID}}").stdout.split()  # fmt: skip
        h.cluster.remove(h.pool(1))
        rec = h.wait_state("shrink", {RunState.FINISHED}, timeout=300)
        return {"rec": rec, "kept": kept_steps(h.rundir("shrink").metrics()), "log": log,
                "status": status, "running": running}  # fmt: skip
    finally:
        h.close()


def test_podman_runtime_shrinks_as_the_process_runtime_does(images, tmp_path, monkeypatch):
    image = images["docker/Dockerfile"]
    monkeypatch.setenv("CONTAINERS_CONF", str(dev.PODMAN_CONF))  # the kubelet's podman commands
    processes = shrink(tmp_path / "process", PodRuntime.PROCESS)
    containers = shrink(tmp_path / "podman", PodRuntime.PODMAN)

    def segments(run: dict) -> list[tuple]:
        return [(s.slices, s.devices, s.micro_batch, s.grad_accum, s.end_kind) for s in run["rec"].segments]

    assert segments(containers) == segments(processes)
    assert segments(containers) == [(2, 32, 1, 1, EndKind.CAPACITY_LOST), (1, 16, 2, 1, EndKind.FINISHED)]
    assert sorted(containers["kept"]) == sorted(processes["kept"]) == list(range(1, STEPS + 1))
    for step, m in containers["kept"].items():
        ref = processes["kept"][step]
        assert m["data/sample_digest"] == ref["data/sample_digest"], step
        assert abs(m["learning/loss"] - ref["learning/loss"]) <= 1e-5, (step, m["learning/loss"], ref)

    # kubectl logs: the trainer's own output, from inside the container.
    for run in (processes, containers):
        assert "trainer: all 4 processes at the start barrier" in run["log"], run["log"][-2000:]
        assert STARTED in run["log"], run["log"][-2000:]

    # The status names the image and its digest (containerd's form: repo@sha256:...), and the
    # container that runs is the one in the status, created from that image.
    status = containers["status"]
    digest = podman("image", "inspect", "--format", "{{.Digest}}", image).stdout.strip()
    image_id = podman("image", "inspect", "--format", "{{.Id}}", image).stdout.strip()
    assert digest.startswith("sha256:") and len(digest) == len("sha256:") + 64
    assert status.image == f"localhost/{image}"
    assert status.image_id == f"localhost/{image.split(':')[0]}@{digest}"
    cid, running_image = containers["running"]
    assert status.container_id.startswith("podman://") and status.container_id.removeprefix(
        "podman://"
    ).startswith(cid)
    assert image_id.startswith(running_image)
    assert processes["status"].image_id == "" and processes["status"].container_id.startswith("process://")
