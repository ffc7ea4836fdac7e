"""`reslice`: the command line. Thin: parse, call one function, print. The console entry point
(`pyproject.toml`, `python -m launcher`); the commands live in `launcher.commands`, mounted here in
the order `reslice --help` lists them.

User errors (UserError, bad options) print one line on stderr and exit 2, with no traceback.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import typer

from launcher.commands import inspecting, launching, planning, sweeping
from launcher.embedded.cli import app as cluster_app
from launcher.errors import ClusterNotReady, UserError, environment_error

app = typer.Typer(
    help="Elastic JAX pretraining on GKE TPU slices.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(cluster_app, name="cluster")
for command in (
    planning.presets,
    planning.plan,
    planning.render,
    launching.launch,
    launching.preflight,
    launching.demo,
    launching.watch,
    inspecting.status,
    inspecting.runs,
    inspecting.stop,
    inspecting.report,
    sweeping.sweep,
):
    app.command()(command)
app.command("sweep-report")(sweeping.sweep_report)


@functools.cache
def _command() -> Callable[..., Any]:
    """The click command of `app`, built once: building it is most of the cost of a refused input
    (56 ms), which the bad-input suite pays for hundreds of cases in one process."""
    return typer.main.get_command(app)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: one line and exit 2 for every user error."""
    try:
        # Without standalone mode, typer returns a command's exit code instead of exiting.
        code = _command()(args=argv, prog_name="reslice", standalone_mode=False)
    except UserError as e:
        print(f"reslice: error: {e}", file=sys.stderr)
        sys.exit(2)
    except ClusterNotReady as e:
        print(f"reslice: {e}", file=sys.stderr)
        sys.exit(1)
    except typer.TyperException as e:  # usage errors: missing or malformed options (exit code 2)
        print(f"reslice: error: {' '.join(e.format_message().split())}", file=sys.stderr)
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        print("reslice: aborted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:
        known = environment_error(e)
        if known is None:
            raise
        print(f"reslice: {'error: ' if known[0] == 2 else ''}{known[1]}", file=sys.stderr)
        sys.exit(known[0])
    if isinstance(code, int) and code:
        sys.exit(code)


if __name__ == "__main__":
    main()
