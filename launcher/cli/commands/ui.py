"""`reslice ui`: the read-only web page over the runs of a namespace (launcher/ui, docs/ui.md).
Mounted by `launcher.cli.app`. The web stack (starlette, uvicorn, plotly: the `ui` extra) is
imported only here, inside the command, so that its absence is one line and exit 2."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from launcher.cli.options import KubeconfigOpt, NamespaceOpt, console
from launcher.core import inputs
from launcher.core.errors import UserError

NO_UI = "this install has no web stack for `reslice ui` (the `ui` extra: `pip install '.[ui]'`)"
WEB_STACK = {"starlette", "uvicorn"}


def require_web_stack() -> None:
    """UserError (one line, exit 2) where the `ui` extra is not installed: `reslice ui` and
    `reslice demo --ui` check before they start anything."""
    try:
        import launcher.ui.server  # noqa: F401
    except ModuleNotFoundError as e:
        if e.name not in WEB_STACK:
            raise
        raise UserError(NO_UI) from e


def ui(
    port: Annotated[int, typer.Option("--port", help="Port (0: any free one).")] = 8470,
    host: Annotated[
        str,
        typer.Option(
            "--host", help="Address to bind. Any but the loopback one needs the access token printed."
        ),
    ] = "127.0.0.1",
    sweeps_dir: Annotated[
        Path, typer.Option("--sweeps-dir", help="Where the sweeps' directories are (local).")
    ] = Path("sweeps"),
    namespace: NamespaceOpt = "default",
    kubeconfig: KubeconfigOpt = None,
) -> None:
    """A live, read-only web page of the runs: segments, loss across shapes, goodput, decisions."""
    inputs.namespace(namespace)
    require_web_stack()
    from launcher.cli.connect import connect
    from launcher.ui.server import UiServer
    from launcher.ui.sources import one_line

    server = UiServer(lambda: connect(kubeconfig, namespace).kube, host, port, sweeps_dir.resolve())
    try:  # once now, to say so at start; the page keeps trying, and says why until it connects
        connect(kubeconfig, namespace)
    except Exception as e:
        console.print(
            f"reslice ui: {one_line(e)} (the page says so until the cluster answers)", soft_wrap=True
        )
    console.print(f"reslice ui: serving the runs of namespace {namespace} at {server.url}", soft_wrap=True)
    if server.token:
        console.print(
            "reslice ui: bound beyond this machine: requests without that token get 401", soft_wrap=True
        )
    server.serve()
