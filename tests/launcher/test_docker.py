"""No Docker engine runs here: check what can be checked without one. What the images are for is
tested by behaviour elsewhere: the controller image's command runs without the trainer's packages
(tests/controller/test_incluster.py) and its Deployment applies (tests/controller/test_manifests.py)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = ("docker/Dockerfile", "docker/controller.Dockerfile")


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    text = (ROOT / dockerfile).read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_every_copy_source_exists(dockerfile):
    """A missing source fails `docker build` only on the machine that builds the image."""
    copies = [args.split()[:-1] for op, args in instructions(dockerfile) if op == "COPY"]
    assert copies, "the Dockerfile copies nothing"
    for sources in copies:
        for src in sources:
            assert (ROOT / src).exists(), f"{dockerfile}: COPY source {src} does not exist"


def test_entry_module_imports():
    assert importlib.util.find_spec("trainer") is not None
    assert (ROOT / "trainer" / "__main__.py").exists(), "python -m trainer needs trainer/__main__.py"
    assert "libtpu" in (ROOT / "requirements" / "tpu.lock").read_text()
