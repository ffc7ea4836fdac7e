"""`reslice`: the command line. Thin: parse, call one function, print. The console entry point
(`pyproject.toml`, `python -m launcher`); the commands live in `launcher.cli.commands`, mounted here in
the order `reslice --help` lists them. `cluster` (launcher.embedded) is resolved only when it is used or
listed: the embedded cluster is a development extra that neither image carries, and
`reslice watch --all` (the controller image) never imports it.

User errors (UserError, bad options) print one line on stderr and exit 2, with no traceback.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import typer
from typer import _click as click  # typer's own click: TyperGroup's methods are typed with it
from typer.core import TyperGroup

from launcher.cli.commands import inspecting, launching, planning, sweeping, ui
from launcher.core.errors import ClusterNotReady, UserError, environment_error

NO_EMBEDDED = (
    "this install has no embedded cluster (launcher.embedded is a development extra: "
    "`pip install '.[embedded]'` in a checkout, or `python3.11 dev.py demo`); "
    "set KUBECONFIG to use a real cluster"
)
CLUSTER_HELP = "An embedded Kubernetes cluster with fake TPU node pools, on this machine."


def _embedded_missing(e: ModuleNotFoundError) -> bool:
    return e.name == "launcher.embedded" or (e.name or "").startswith("launcher.embedded.")


def _cluster_command() -> click.Command:
    """`reslice cluster` as launcher.embedded.cli defines it, or, where launcher.embedded is not
    installed, a command that says so (exit 2) whatever its arguments."""
    try:
        from launcher.embedded.cli import app as cluster_app
    except ModuleNotFoundError as e:
        if not _embedded_missing(e):
            raise
        absent = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

        @absent.command(
            "cluster",
            help=f"{CLUSTER_HELP} (Not installed here.)",
            context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        )
        def cluster(ctx: typer.Context) -> None:
            raise UserError(NO_EMBEDDED)

        return typer.main.get_command(absent)
    mount = typer.Typer()
    mount.add_typer(cluster_app, name="cluster")
    return typer.main.get_group(mount).commands["cluster"]


class _Commands(TyperGroup):
    """The top-level group, with `cluster` listed last and loaded on first use (or on a name it
    does not know, so that a typo is still told about `cluster`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*super().list_commands(ctx), *(() if "cluster" in self.commands else ("cluster",))]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and "cluster" not in self.commands:
            self.add_command(_cluster_command(), "cluster")
        return super().get_command(ctx, cmd_name)


app = typer.Typer(
    cls=_Commands,
    help="Elastic JAX pretraining on GKE TPU slices.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
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
    ui.ui,
    sweeping.sweep,
):
    app.command()(command)
app.command("sweep-report")(sweeping.sweep_report)


@functools.cache
def _command() -> Callable[..., Any]:
    """The click command of `app`, built once: building it is most of the cost of a refused input,
    which the bad-input suite pays for hundreds of cases in one process."""
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
    except ModuleNotFoundError as e:  # `demo`, or no kubeconfig, where launcher.embedded is not installed
        if not _embedded_missing(e):
            raise
        print(f"reslice: error: {NO_EMBEDDED}", file=sys.stderr)
        sys.exit(2)
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
