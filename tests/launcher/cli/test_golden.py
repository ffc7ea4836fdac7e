"""The golden JobSets in manifests/examples/ are what the CLI renders today (regenerate.sh)."""

import shlex
from pathlib import Path

import pytest
import yaml

from launcher.cli.app import main
from tests.support.schemas import jobset_errors, validate_job_template

EXAMPLES = Path(__file__).resolve().parents[3] / "manifests" / "examples"
COMMANDS = [
    shlex.split(line)
    for line in (EXAMPLES / "regenerate.sh").read_text().splitlines()
    if line.startswith("reslice render")
]


def test_four_goldens_are_listed():
    names = {argv[argv.index("--output") + 1] for argv in COMMANDS}
    assert names == {
        "tpu7x-4x4x4-1slice.yaml",
        "tpu7x-4x4x4-4slices.yaml",
        "tpu7x-8x8x48-1slice.yaml",
        "tpu7x-4x4x4-2slices-inplace.yaml",
    }


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: a[a.index("--output") + 1])
def test_golden_matches_render(argv, tmp_path):
    out = argv.index("--output") + 1
    golden = EXAMPLES / argv[out]
    argv = [*argv[1:out], str(tmp_path / "fresh.yaml")]
    with pytest.raises(SystemExit) as exc:
        main(argv)
        raise SystemExit(0)
    assert exc.value.code == 0
    fresh = (tmp_path / "fresh.yaml").read_text()
    assert fresh == golden.read_text(), f"{golden.name} is stale: run manifests/examples/regenerate.sh"
    jobsets = [doc for doc in yaml.safe_load_all(fresh) if doc["kind"] == "JobSet"]
    assert jobsets  # an in-place run renders one per slice, after its world access
    for js in jobsets:
        assert jobset_errors(js) == []
        validate_job_template(js)
