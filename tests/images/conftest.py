"""The image tests' engine: podman with the project's containers.conf (dev.py), and the images
`dev.py images` builds. `dev.py test` builds them before pytest and says so (RESLICE_IMAGES_BUILT,
or RESLICE_IMAGES_SKIP with why there is no engine); run alone (`pytest tests/images`), the first
image test builds them (podman's layer cache: seconds once built). Where no engine can be set up
(no apt, not root), every image test skips with dev.py's one line. Used by tests/images/test_*.py."""

from __future__ import annotations

import fcntl
import os

import pytest

import dev


@pytest.fixture(scope="session")
def images() -> dict[str, str]:
    """Dockerfile -> image tag, every image built and current."""
    if why := os.environ.get("RESLICE_IMAGES_SKIP"):
        pytest.skip(why)
    if not os.environ.get("RESLICE_IMAGES_BUILT"):
        dev.PODMAN_CONF.parent.mkdir(parents=True, exist_ok=True)
        # xdist workers: one builds, the others wait and find podman's cache warm.
        with open(dev.PODMAN_CONF.parent / "build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                dev.build_images()
            except dev.EngineUnavailable as e:
                pytest.skip(f"no container engine: {e}")
            except SystemExit as e:
                pytest.fail(str(e.code), pytrace=False)
    return {dockerfile: tag for tag, dockerfile in dev.IMAGES}
