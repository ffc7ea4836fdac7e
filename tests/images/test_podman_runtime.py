"""The embedded cluster's podman runtime (`reslice demo --runtime podman`): the kubelet runs each
trainer pod as `podman run` of the trainer image. A run of 2 slices of v5p-2x2x2 (4 trainer
containers) loses a slice and is shrunk onto the other at the same global batch, and finishes with
the segments, and the per-step losses, of the same run under the process runtime. While it runs,
the pod's log (pods/log, as `kubectl logs` reads it) is the trainer's output, and its
containerStatuses name the image and its digest — the one the running container was created from."""

from __future__ import annotations

import copy

import pytest
from kubernetes import client

import dev
from launcher.core.record import Knobs
from launcher.core.words import EndKind, PodRuntime, RunState
from launcher.embedded.cluster import EmbeddedCluster, NodePoolSpec
from tests.e2e.harness import MULTI_HOST, MULTI_HOST_BATCH, Harness, kept_steps, wait_for
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
    assert segments(containers) == [(2, 16, 2, 1, EndKind.CAPACITY_LOST), (1, 8, 4, 1, EndKind.FINISHED)]
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


# A container that counts its starts in an emptyDir (which outlives a restart in place), writes
# its pod's name (downward API) to a hostPath file, fails its first start, and exits 42 on SIGTERM
# (or, given `stubborn`, ignores it).
SCRIPT = """
import os, pathlib, signal, sys, time
starts = pathlib.Path('/scratch/starts')
n = int(starts.read_text()) + 1 if starts.exists() else 1
starts.write_text(str(n))
pathlib.Path('/host/' + os.environ['POD'] + '.txt').write_text(os.environ['POD'])
print('start', n, 'of', os.environ['POD'], 'on', os.environ['HOSTNAME'], flush=True)
if n == 1:
    sys.exit(3)
signal.signal(signal.SIGTERM, signal.SIG_IGN if sys.argv[1] == 'stubborn' else lambda *_: sys.exit(42))
time.sleep(300)
"""


def pod(name: str, image: str, host_dir: str, mode: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "OnFailure",
            "terminationGracePeriodSeconds": 30,
            "tolerations": [{"key": "google.com/tpu", "operator": "Exists"}],
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", SCRIPT],
                    "args": ["$(MODE)"],
                    "env": [
                        {"name": "MODE", "value": mode},
                        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    ],
                    "volumeMounts": [
                        {"name": "scratch", "mountPath": "/scratch"},
                        {"name": "shm", "mountPath": "/dev/shm"},
                        {"name": "host", "mountPath": "/host"},
                    ],
                }
            ],
            "volumes": [
                {"name": "scratch", "emptyDir": {}},
                {"name": "shm", "emptyDir": {"medium": "Memory"}},
                {"name": "host", "hostPath": {"path": host_dir, "type": "DirectoryOrCreate"}},
            ],
        },
    }


def test_podman_pods_restart_in_place_and_end_with_their_exit_codes(images, tmp_path, monkeypatch):
    """restartPolicy OnFailure restarts the failed container in place (the emptyDir kept); a node
    preemption's SIGTERM ends a container that handles it with its own exit code (42) and one that
    ignores it with SIGKILL (137) after the grace period."""
    monkeypatch.setenv("CONTAINERS_CONF", str(dev.PODMAN_CONF))
    pools = [NodePoolSpec("tpu7x-2x2x1", count=1)]
    with EmbeddedCluster(nodepools=pools, runtime=PodRuntime.PODMAN, workdir=tmp_path) as cluster:
        core = client.CoreV1Api(cluster.api_client())
        for name in ("polite", "stubborn"):
            core.create_namespaced_pod(
                "default", pod(name, images["docker/Dockerfile"], str(tmp_path / "host"), name)
            )

        def restarted(name: str) -> bool:
            statuses = core.read_namespaced_pod(name, "default").status.container_statuses or []
            return bool(statuses) and statuses[0].restart_count == 1 and statuses[0].state.running is not None

        wait_for(lambda: restarted("polite") and restarted("stubborn"), 120, "both pods restarted in place")

        def log(name: str) -> str:
            return core.read_namespaced_pod_log(name, "default")

        wait_for(lambda: "start 2" in log("polite") and "start 2" in log("stubborn"), 60, "the second starts")
        logs = {n: log(n) for n in ("polite", "stubborn")}
        # The terminal statuses, as the store commits them: the preemption then removes the node
        # and PodGC its pods.
        final: dict[str, dict] = {}

        def on_change(event: str, res, obj: dict) -> None:
            if res.plural == "pods" and (obj.get("status") or {}).get("phase") == "Failed":
                final[obj["metadata"]["name"]] = copy.deepcopy(obj["status"])

        unsubscribe = cluster.store.subscribe(on_change)
        try:
            cluster.preempt("tpu7x-2x2x1-np-0", grace_s=2)
            cluster.store.flush(10)
        finally:
            unsubscribe()
    assert sorted(final) == ["polite", "stubborn"]
    for name, status in final.items():
        cs = status["containerStatuses"][0]
        assert status["reason"] == "Terminated", status
        assert cs["restartCount"] == 1 and cs["lastState"]["terminated"]["exitCode"] == 3
        assert cs["state"]["terminated"]["exitCode"] == {"polite": 42, "stubborn": 137}[name]
        assert logs[name].splitlines()[:2] == [f"start 1 of {name} on {name}", f"start 2 of {name} on {name}"]
        assert (tmp_path / "host" / f"{name}.txt").read_text() == name
