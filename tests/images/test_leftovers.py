"""What each image's /app holds: what its Dockerfile copies and nothing of the package's install
(setuptools builds in the source tree: build/, reslice.egg-info), nor of the build context
(.dockerignore: a host's egg-info, caches, tests)."""

from __future__ import annotations

import pytest

from tests.images.container import podman

APP = {
    "docker/Dockerfile": ["README.md", "contract", "pyproject.toml", "requirements", "trainer"],
    "docker/controller.Dockerfile": [
        "README.md",
        "contract",
        "launcher",
        "presets",
        "pyproject.toml",
        "requirements",
    ],
    "docker/maxtext.Dockerfile": ["contract", "maxtext_entry", "requirements"],
}


@pytest.mark.parametrize("dockerfile", sorted(APP))
def test_app_holds_what_the_dockerfile_copies_and_no_build_leftovers(images, dockerfile):
    image = images[dockerfile]
    listing = podman("run", "--rm", "--entrypoint", "ls", image, "-A", "/app")
    assert listing.returncode == 0, listing.stderr
    assert sorted(listing.stdout.split()) == APP[dockerfile]
    # Anywhere below /app: no build tree, egg-info or byte-code the host had.
    found = podman("run", "--rm", "--entrypoint", "find", image, "/app", "-name", "*.egg-info",
                   "-o", "-name", "build", "-o", "-name", "__pycache__")  # fmt: skip
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == []
