"""Kubeconfig files and API clients for an embedded API server URL: plain HTTP on loopback without
credentials, or in outside mode HTTPS with the cluster's CA and the admin's bearer token."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

DEFAULT_NAME = "reslice-embedded"


@dataclass(frozen=True)
class Credentials:
    """What a client of an outside-mode server needs: the CA that signed its certificate, and a token."""

    ca_file: Path
    token: str


def kubeconfig_dict(
    url: str, name: str = DEFAULT_NAME, namespace: str = "default", credentials: Credentials | None = None
) -> dict[str, Any]:
    cluster: dict[str, Any] = {"server": url}
    user: dict[str, Any] = {}
    if credentials is not None:
        cluster["certificate-authority-data"] = base64.b64encode(credentials.ca_file.read_bytes()).decode()
        user["token"] = credentials.token
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}],
        "current-context": name,
        "preferences": {},
    }


def write_kubeconfig(
    path: Path | str,
    url: str,
    name: str = DEFAULT_NAME,
    namespace: str = "default",
    credentials: Credentials | None = None,
) -> Path:
    """Write a kubeconfig whose current context points at `url`; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    doc = kubeconfig_dict(url, name, namespace, credentials)
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    if credentials is not None:
        tmp.chmod(0o600)  # it holds the admin's token
    tmp.replace(path)  # a reader never sees half a file
    return path


def api_client(url: str, credentials: Credentials | None = None) -> client.ApiClient:
    """A `kubernetes.client.ApiClient` for `url`, independent of the process-wide default config."""
    config = client.Configuration()
    config.host = url
    if credentials is None:
        config.verify_ssl = False
    else:
        config.ssl_ca_cert = str(credentials.ca_file)
        config.api_key = {"authorization": credentials.token}
        config.api_key_prefix = {"authorization": "Bearer"}
    return client.ApiClient(config)
