"""Which cluster a command talks to: the configured one, or the embedded one on this machine."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.adapters.kube import Kube, is_embedded, load_api_client
from launcher.core.errors import UserError


@dataclass
class Connection:
    kube: Kube
    embedded: bool  # the embedded cluster: trainer processes run on this machine


def connect(
    kubeconfig: str | None = None,
    namespace: str = "default",
    *,
    start_embedded: str | None = None,
) -> Connection:
    """In-cluster credentials or a kubeconfig when there is one; otherwise the embedded cluster
    running on this machine, started with node pools `start_embedded` (e.g. "tpu7x-2x2x2:2") if
    none runs and that is given."""
    api = load_api_client(kubeconfig)
    if api is not None:
        return Connection(Kube(api, namespace), embedded=is_embedded(api))
    from launcher.embedded import cli as embedded

    d = embedded.state_dir(None)
    info = embedded.read_info(d)
    if info is None:
        if start_embedded is None:
            raise UserError(
                "no cluster configured: set KUBECONFIG, or start the embedded one with `reslice cluster up`"
            )
        embedded.up(nodepools=start_embedded, directory=d, mode="process", port=0, timeout=60.0)
        info = embedded.read_info(d)
        if info is None:
            raise UserError(f"the embedded cluster did not start (see {d / 'cluster.log'})")
    api = load_api_client(info["kubeconfig"])
    if api is None:  # a path given: None is only for no kubeconfig at all
        raise UserError(f"the embedded cluster wrote no kubeconfig (see {d / 'cluster.log'})")
    is_embedded(api)  # a cluster whose state directory outlived it is unreachable: exit 1, one line
    return Connection(Kube(api, namespace), embedded=True)
