"""The in-cluster controller as its Deployment runs it: `reslice watch --all --health-port P` in its
own process, with the trainer's packages unimportable (the slim controller image has none of them).
It drives a run, answers the kubelet's probes, and reports not-ready but alive while the API server
is gone."""

import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from launcher.embedded.cluster import EmbeddedCluster, NodePoolSpec
from launcher.kube import Kube
from launcher.launch import create_run, prepare
from launcher.record import Policy
from launcher.render import RunSpec
from tests.support.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
# The `trainer` extra of pyproject.toml (and libtpu, which jax[tpu] brings): not in the controller image.
TRAINER_ONLY = "jax,jaxlib,libtpu,flax,optax,orbax,grain,gcsfs,tensorboardX,trainer"


def blocked(log: Path, *args: str) -> dict:
    """`python -m ARGS...` with the trainer-only packages blocked: keyword arguments for subprocess."""
    return {
        "args": [sys.executable, "-m", "tests.support.noimport", str(log), TRAINER_ONLY, *args],
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


def test_controller_process_drives_a_run_serves_probes_and_never_imports_the_trainer(tmp_path):
    log, out = tmp_path / "imports.log", tmp_path / "controller.out"
    port = free_port()
    cluster = EmbeddedCluster(nodepools=[NodePoolSpec("tpu7x-2x2x1", count=1)], mode="simulate").start()
    proc = None
    try:
        kube = Kube(cluster.api_client(), "default")
        spec = RunSpec(run="hc", run_dir=str(tmp_path / "hc"), global_batch=8, grace_period_s=1)
        create_run(kube, prepare(spec, "tpu7x-2x2x1", 1, Policy())[0])
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
