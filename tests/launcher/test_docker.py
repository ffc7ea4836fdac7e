"""No Docker engine runs here: check what can be checked without one."""

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_every_copy_source_exists():
    copies = [args.split()[:-1] for op, args in instructions() if op == "COPY"]
    assert copies, "the Dockerfile copies nothing"
    for sources in copies:
        for src in sources:
            assert (ROOT / src).exists(), f"COPY source {src} does not exist"


def test_base_user_and_entrypoint():
    ops = instructions()
    assert ops[0] == ("FROM", "python:3.11-slim")
    users = [args for op, args in ops if op == "USER"]
    assert users and users[-1] not in {"root", "0"}
    entry = [args for op, args in ops if op == "ENTRYPOINT"]
    assert entry == ['["python", "-m", "trainer"]']
    # The locked TPU dependencies are installed with hash checking.
    assert any(op == "RUN" and re.search(r"--require-hashes -r requirements/tpu\.lock", a) for op, a in ops)


def test_entry_module_imports():
    assert importlib.util.find_spec("trainer") is not None
    assert (ROOT / "trainer" / "__main__.py").exists(), "python -m trainer needs trainer/__main__.py"
    assert "libtpu" in (ROOT / "requirements" / "tpu.lock").read_text()
