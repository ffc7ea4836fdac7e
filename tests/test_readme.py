"""The README's two commands are what CI runs, and they work as printed (issue: `python3.11 dev.py demo`
crashed on a fresh clone while the suite passed, because nothing ran the README's commands)."""

import re
from pathlib import Path

import dev

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    """The commands of the README's first bash block, comments dropped."""
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block, "the README has no bash block"
    return [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.split("#")[0].strip()]


def test_ci_runs_the_readme_commands_as_printed():
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    ci = [line for line in ci if line.startswith("python")]
    assert readme_commands() == ci == ["python3.11 dev.py demo", "python3.11 dev.py test"]


def test_demo_arguments_are_read_with_none_given():
    assert dev._podman_demo([]) is False
    assert dev._podman_demo(["--steps", "30"]) is False
    assert dev._podman_demo(["--runtime", "podman"]) is True
    assert dev._podman_demo(["--runtime=podman"]) is True
    assert dev._podman_demo(["--runtime"]) is False
