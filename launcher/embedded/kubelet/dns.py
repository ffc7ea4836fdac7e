"""The cluster's DNS for process pods in outside mode: one hosts file, which every such pod sees as
its /etc/hosts (`podns.py`), naming each JobSet pod the kubelet started by the names kube-dns
gives it through the JobSet's headless Service (`<hostname>.<subdomain>`, and the same in the
namespace's `svc.cluster.local` domain) at that pod's own loopback address (`podenv.AddressMap`,
also its status.podIP). The host's own /etc/hosts comes first, so its names still resolve.

A pod's entries are written when it starts and replace an earlier pod's of the same name (a slice
restarted: its new pods' addresses). The file is rewritten in place: a pod's bind mount holds its
inode, which a rename would leave behind. Called by `processes.ProcessRunner`.
"""

from __future__ import annotations

import threading
from pathlib import Path

_HEADER = "# reslice embedded cluster: the JobSet pods of this cluster (kubelet/dns.py)"


def names(hostname: str, subdomain: str, namespace: str) -> tuple[str, ...]:
    """The names a JobSet pod is found by from another pod (its search path and the FQDN)."""
    short = f"{hostname}.{subdomain}"
    return (
        short,
        f"{short}.{namespace}",
        f"{short}.{namespace}.svc",
        f"{short}.{namespace}.svc.cluster.local",
    )


def render(base: str, entries: dict[str, str]) -> str:
    """The hosts file: the host's lines, then one line per name (sorted, so rewrites are stable)."""
    lines = [base.rstrip("\n"), _HEADER] + [f"{address}\t{name}" for name, address in sorted(entries.items())]
    return "\n".join(lines) + "\n"


class ClusterDns:
    def __init__(self, path: Path, base: Path = Path("/etc/hosts")) -> None:
        self.path = path
        try:
            self.base = base.read_text()
        except OSError:
            self.base = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
        self._entries: dict[str, str] = {}
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(self.base, {}))

    def add(self, hostname: str, subdomain: str, namespace: str, address: str) -> None:
        with self._lock:
            for name in names(hostname, subdomain, namespace):
                self._entries[name] = address
            text = render(self.base, self._entries).encode()
            with open(self.path, "r+b") as f:  # the same inode: the pods' bind mounts see it
                f.write(text)
                f.truncate()
