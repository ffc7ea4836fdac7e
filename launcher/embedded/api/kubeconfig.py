"""Kubeconfig files and API clients for an embedded API server URL (plain HTTP on loopback, no auth)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

DEFAULT_NAME = "reslice-embedded"


def kubeconfig_dict(url: str, name: str = DEFAULT_NAME, namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": url}}],
        "users": [{"name": name, "user": {}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}],
        "current-context": name,
        "preferences": {},
    }


def write_kubeconfig(
    path: Path | str, url: str, name: str = DEFAULT_NAME, namespace: str = "default"
) -> Path:
    """Write a kubeconfig whose current context points at `url`; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(yaml.safe_dump(kubeconfig_dict(url, name, namespace), sort_keys=False), encoding="utf-8")
    tmp.replace(path)  # a reader never sees half a file
    return path


def api_client(url: str) -> client.ApiClient:
    """A `kubernetes.client.ApiClient` for `url`, independent of the process-wide default config."""
    config = client.Configuration()
    config.host = url
    config.verify_ssl = False
    return client.ApiClient(config)
