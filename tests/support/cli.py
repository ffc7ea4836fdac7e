"""Run the `reslice` command line in-process, as a user would, and capture what it prints."""

import pytest

from launcher.cli.app import main


def run_cli(capsys, *argv: str) -> tuple[int | str | None, str, str]:
    """(exit code, stdout, stderr) of `reslice ARGV...`."""
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
        raise SystemExit(0)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err
