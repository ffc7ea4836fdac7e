"""Containers for the image tests: `podman run` in the background under a name of its own, as the
kubelet runs a pod's container, stopped with `podman stop` (SIGTERM, then SIGKILL after the grace
period) and always removed. Used by tests/images/test_*.py."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import dev

ROOT = Path(__file__).resolve().parents[2]
# The images' own persistent compile cache (their jaxlib is not the host's): the second run of a
# test loads its executables instead of compiling them.
JAX_CACHE = ROOT / ".cache" / "jax-images"


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["podman", *args], env=dev.podman_env(), capture_output=True, text=True, timeout=timeout
    )


def jax_cpu_env(devices: int) -> dict[str, str]:
    """JAX on `devices` simulated CPU devices with the images' compile cache (mounted at /jax-cache)."""
    return {
        "JAX_PLATFORMS": "cpu",
        "JAX_NUM_CPU_DEVICES": str(devices),
        "JAX_COMPILATION_CACHE_DIR": "/jax-cache",
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
        "OPENBLAS_NUM_THREADS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }


class Container:
    """`podman run --rm IMAGE ARGS...` in the background; output to `log`."""

    def __init__(
        self,
        image: str,
        args: Sequence[str],
        log: Path,
        *,
        env: Mapping[str, str] | None = None,
        volumes: Mapping[Path, str] | None = None,
        network: str = "none",
    ) -> None:
        self.name = f"reslice-test-{uuid.uuid4().hex[:10]}"
        self.log = log
        # No network unless the test needs one (the controller: the API server on the host's):
        # loopback alone, as hermetic as a run can be, and no bridge to set up.
        argv = ["podman", "run", "--rm", "--name", self.name, "--network", network]
        for k, v in (env or {}).items():
            argv += ["-e", f"{k}={v}"]
        for host, inside in (volumes or {}).items():
            argv += ["-v", f"{host}:{inside}"]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [*argv, image, *args], env=dev.podman_env(), stdout=out, stderr=subprocess.STDOUT
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace_s: int) -> int:
        """SIGTERM to the container's process, SIGKILL after `grace_s`; the container's exit code."""
        podman("stop", "-t", str(grace_s), self.name, timeout=grace_s + 60)
        return self.wait(60)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.close()
            raise AssertionError(
                f"{self.name} still running after {timeout} s:\n{self.output()[-4000:]}"
            ) from None

    def exec(self, *args: str) -> str:
        done = podman("exec", self.name, *args, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def close(self) -> None:
        if self.proc.poll() is None:
            podman("rm", "-f", "-t", "0", self.name, timeout=60)
            self.proc.wait(timeout=60)
