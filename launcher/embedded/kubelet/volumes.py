"""A process pod's projected volumes in outside mode, as the kubelet's projected volume plugin makes
them (kubernetes `pkg/volume/projected/projected.go`): a folder of the pod's holding each source's
files — a service-account token (`serviceAccountToken`: asked for the pod's ServiceAccount, bound
to the pod, for its `expirationSeconds`; TokenRequest upstream), ConfigMap keys (`configMap`), the
downward API's fields (`downwardAPI`) — with the volume's file mode. `processes.ProcessRunner` then
mounts it where the container's `volumeMounts` say (`podns.py`).

The token is refreshed as the kubelet's token manager refreshes it (`pkg/kubelet/token/
token_manager.go` requiresRefresh: once older than REFRESH_AT of its lifetime), written beside and
then renamed over the old one, so a reader never sees half a token.

`files` is pure; `project` does the I/O.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.embedded.kubelet import podenv
from launcher.embedded.kubelet.dns import ClusterDns
from launcher.embedded.kubelet.podrun import PodRun
from launcher.embedded.types import objects

REFRESH_AT = 0.8  # of a token's lifetime
_DEFAULT_EXPIRATION_S = 3600  # ServiceAccountTokenProjection's default expirationSeconds

# (namespace, service account, pod, expiration seconds) -> a token for it; raises LookupError (its
# message the API's) when the ServiceAccount is not there: the pod then waits, as upstream's does
# on a failed TokenRequest.
Issue = Callable[[str, str, Mapping[str, Any], int], str]
ConfigMapGet = Callable[[str, str], Mapping[str, Any] | None]


@dataclass(frozen=True)
class PodAccess:
    """What outside mode's kubelet gives every process pod: tokens for its ServiceAccount, the
    cluster's DNS, and its own mount namespace (podns.py) to see them where a node puts them."""

    issue: Issue
    dns: ClusterDns


def _token_source(src: Mapping[str, Any]) -> tuple[str, int]:
    token = src["serviceAccountToken"]
    return token.get("path", "token"), int(token.get("expirationSeconds") or _DEFAULT_EXPIRATION_S)


def files(
    volume: Mapping[str, Any], pod: Mapping[str, Any], configmap: ConfigMapGet, token: Callable[[int], str]
) -> dict[str, str]:
    """The projected volume's files (relative path -> content); raises podenv.ContainerConfigError
    for a ConfigMap or key that is not there (the pod waits, as upstream's FailedMount)."""
    ns = objects.meta(pod).get("namespace") or "default"
    out: dict[str, str] = {}
    for src in volume["projected"].get("sources") or []:
        if "serviceAccountToken" in src:
            path, expiration = _token_source(src)
            out[path] = token(expiration)
        elif "configMap" in src:
            ref = src["configMap"]
            cm = configmap(ns, ref["name"])
            if cm is None:
                if ref.get("optional"):
                    continue
                raise podenv.ContainerConfigError(f'configmap "{ref["name"]}" not found', "ContainerCreating")
            data = cm.get("data") or {}
            for item in ref.get("items") or [{"key": k, "path": k} for k in data]:
                if item["key"] not in data:
                    raise podenv.ContainerConfigError(
                        f"configmap references non-existent config key: {item['key']}", "ContainerCreating"
                    )
                out[item["path"]] = data[item["key"]]
        elif "downwardAPI" in src:
            for item in src["downwardAPI"].get("items") or []:
                out[item["path"]] = podenv.field_value(pod, item["fieldRef"]["fieldPath"])
    return out


def _write(path: Path, text: str, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)


def _refresh(run: PodRun, path: Path, mode: int, mint: Callable[[int], str], expiration: int) -> None:
    """Rewrite the token at REFRESH_AT of its lifetime, and again after, while the pod runs here."""

    def again() -> None:
        if run.done.is_set():
            return
        try:
            _write(path, mint(expiration), mode)
        except Exception:  # the ServiceAccount gone meanwhile: the old token runs out, as upstream
            return
        _refresh(run, path, mode, mint, expiration)

    timer = threading.Timer(expiration * REFRESH_AT, again)
    timer.daemon = True
    timer.start()


def project(
    run: PodRun, pod: Mapping[str, Any], folder: Path, access: PodAccess, configmap: ConfigMapGet
) -> dict[str, Path]:
    """Write every projected volume of `pod` under `folder`: volume name -> its folder."""
    spec = pod.get("spec") or {}
    ns = objects.meta(pod).get("namespace") or "default"
    account = spec.get("serviceAccountName") or "default"

    def mint(expiration: int) -> str:
        try:
            return access.issue(ns, account, pod, expiration)
        except LookupError as e:
            raise podenv.ContainerConfigError(f"failed to fetch token: {e}", "ContainerCreating") from None

    made: dict[str, Path] = {}
    for volume in spec.get("volumes") or []:
        if "projected" not in volume:
            continue
        mode = int(volume["projected"].get("defaultMode") or 0o644)
        where = folder / volume["name"]
        for rel, text in files(volume, pod, configmap, mint).items():
            _write(where / rel, text, mode)
        for src in volume["projected"].get("sources") or []:
            if "serviceAccountToken" in src:
                rel, expiration = _token_source(src)
                _refresh(run, where / rel, mode, mint, expiration)
        made[volume["name"]] = where
    return made
