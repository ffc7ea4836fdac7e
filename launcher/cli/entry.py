"""The `reslice` console entry point (`pyproject.toml`, `python -m launcher`).

The command line needs the `controller` extra (typer, rich, pyyaml, kubernetes,
google-cloud-storage): `reslice` has no unconditional dependencies, each image installs exactly its
extra. A bare `pip install reslice` then says so in one line, exit 2, instead of an ImportError's
traceback."""

from __future__ import annotations

import sys

# The controller extra's distributions, by their top-level module.
CLI_DISTRIBUTIONS = {
    "typer": "typer",
    "click": "click",
    "rich": "rich",
    "yaml": "pyyaml",
    "kubernetes": "kubernetes",
    "google": "google-cloud-storage",
}


def main() -> None:
    try:
        from launcher.cli.app import main as cli_main
    except ModuleNotFoundError as e:
        missing = (e.name or "").split(".")[0]
        if missing not in CLI_DISTRIBUTIONS:
            raise
        print(
            f"reslice: error: this install lacks {CLI_DISTRIBUTIONS[missing]}, which the command line needs:"
            " pip install 'reslice[controller]' (in a checkout: pip install '.[controller]')",
            file=sys.stderr,
        )
        sys.exit(2)
    cli_main()
