"""The in-cluster controller as its Deployment runs it: `reslice watch --all --health-port P` in its
own process, with what the slim controller image lacks unimportable (the trainer's packages,
matplotlib, jsonschema, launcher.embedded). It drives a run, answers the kubelet's probes, and
reports not-ready but alive while the API server is gone."""

import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from launcher.adapters.kube import Kube
from launcher.controller.launch import create_run, prepare
from launcher.core.record import Knobs
from launcher.core.spec import RunSpec
from launcher.embedded.cluster import EmbeddedCluster, NodePoolSpec
from tests.support.wait import wait_for

ROOT = Path(__file__).resolve().parents[3]
# Not in the controller image (requirements/controller.lock, pyproject.toml's `controller` extra): the
# `trainer` extra (and libtpu, which jax[tpu] brings), the `plots`, `embedded` and `ui` extras, the
# embedded cluster's code (docker/controller.Dockerfile leaves it out), and kubernetes-validate (dev
# only), which the kubernetes client tries and copes without.
NOT_IN_IMAGE = (
    "jax,jaxlib,libtpu,flax,optax,orbax,grain,gcsfs,tensorboardX,trainer,"
    "matplotlib,jsonschema,starlette,uvicorn,plotly,launcher.embedded,?kubernetes_validate"
)


def blocked(log: Path, *args: str) -> dict:
    """`python -m ARGS...` with what the image lacks blocked: keyword arguments for subprocess."""
    return {
        "args": [sys.executable, "-m", "tests.support.noimport", str(log), NOT_IN_IMAGE, *args],
        "cwd": ROOT,
        "env": {**os.environ, "PYTHONPATH": str(ROOT)},
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def probe(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:  # not listening yet
        return 0, str(e)


def test_the_blocker_catches_a_trainer_import(tmp_path):
    """Without this, an empty log below could mean a blocker that blocks nothing."""
    log = tmp_path / "imports.log"
    done = subprocess.run(**blocked(log, "trainer", "--help"), capture_output=True, timeout=60)
    assert done.returncode != 0
    assert "import trainer" in log.read_text().splitlines()


@pytest.mark.parametrize("command", [("cluster", "up", "--nodepools", "tpu7x-2x2x1:1"), ("demo",)])
def test_without_the_embedded_cluster_its_commands_say_it_is_not_installed(tmp_path, command):
    """The commands that import launcher.embedded refuse in one line, exit 2, creating nothing,
    where it is not installed — which also shows that the blocker blocks it (the test below:
    `watch --all` never tries)."""
    log, workdir = tmp_path / "imports.log", tmp_path / "demo"
    argv = ("launcher", *command, *(("--workdir", str(workdir)) if command == ("demo",) else ()))
    done = subprocess.run(**blocked(log, *argv), capture_output=True, timeout=60, text=True)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("reslice: error: this install has no embedded cluster")
    assert len(done.stderr.splitlines()) == 1
    assert log.read_text().splitlines() == ["import launcher.embedded"]
    assert not workdir.exists()


def test_launch_against_a_real_cluster_needs_no_embedded_cluster(tmp_path):
    """A user's install without the `embedded` extra: `reslice launch` runs preflight's free checks
    (launcher/preflight/gate.py's refuse_unready: node pools, taints, requests against allocatable, quota)
    and submits segment 0 against a cluster reached through its kubeconfig, without trying to
    import launcher.embedded. One process: `reslice preflight` adds only the write probe to those
    checks, and lint-imports holds both statically."""
    log = tmp_path / "imports.log"
    cluster = EmbeddedCluster(nodepools=[NodePoolSpec("tpu7x-2x2x1", count=1)], mode="simulate").start()
    try:
        argv = ("launch", "-p", "tpu7x-2x2x1", "-n", "1", "-b", "8", "--kubeconfig", str(cluster.kubeconfig),
                "--run", "nx", "--run-dir", str(tmp_path / "nx"), "--cpu-request", "1e0", "--detach")  # fmt: skip
        done = subprocess.run(**blocked(log, "launcher", *argv), capture_output=True, timeout=120, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        assert log.read_text() == "", f"launch tried to import:\n{log.read_text()}"
        assert [j["metadata"]["name"] for j in Kube(cluster.api_client(), "default").jobsets("nx")] == [
            "nx-0"
        ]
    finally:
        cluster.stop()


def test_controller_process_drives_a_run_serves_probes_and_imports_nothing_the_image_lacks(tmp_path):
    log, out = tmp_path / "imports.log", tmp_path / "controller.out"
    port = free_port()
    cluster = EmbeddedCluster(nodepools=[NodePoolSpec("tpu7x-2x2x1", count=1)], mode="simulate").start()
    proc = None
    try:
        kube = Kube(cluster.api_client(), "default")
        spec = RunSpec(run="hc", run_dir=str(tmp_path / "hc"), global_batch=8, grace_period_s=1)
        create_run(kube, prepare(spec, "tpu7x-2x2x1", 1, Knobs())[0])
        with out.open("wb") as sink:
            argv = ("watch", "--all", "--kubeconfig", str(cluster.kubeconfig), "--resync", "0.5")
            proc = subprocess.Popen(
                **blocked(log, "launcher", *argv, "--health-port", str(port)),
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        wait_for(lambda: kube.jobsets("hc"), 60, "the controller process to submit segment 0")
        wait_for(lambda: probe(port, "/readyz") == (200, "ok\n"), 30, "ready")
        assert probe(port, "/healthz") == (200, "ok\n")

        cluster.stop()  # the API server goes away: the loop keeps turning (alive), cannot read (not ready)
        _, body = wait_for(
            lambda: (got := probe(port, "/readyz"))[0] == 503 and got, 30, "not ready without an API"
        )
        assert "the last reconcile pass failed" in body
        assert probe(port, "/healthz") == (200, "ok\n")

        proc.send_signal(signal.SIGTERM)  # what the kubelet sends on a rollout
        assert proc.wait(timeout=30) == 0, out.read_text()
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        cluster.stop()
    assert f"/healthz and /readyz on port {port}" in out.read_text()
    assert log.read_text() == "", f"the controller imported what its image lacks:\n{log.read_text()}"
