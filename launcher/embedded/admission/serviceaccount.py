"""The ServiceAccount admission plugin's token mount, in outside mode (kubernetes
`plugin/pkg/admission/serviceaccount/admission.go`: `shouldAutomount`, `mountServiceAccountToken`,
`TokenVolumeSource`): a created pod gets a projected volume `kube-api-access-<5 letters>` (a bound
token of TOKEN_EXPIRATION_S, the `kube-root-ca.crt` ConfigMap's `ca.crt`, the pod's namespace)
mounted read-only at /var/run/secrets/kubernetes.io/serviceaccount in every container that mounts nothing
there, unless the pod, or else its ServiceAccount, says `automountServiceAccountToken: false`.

Pure; the store calls `mount_token` on pod create when its cluster is in outside mode.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
VOLUME_PREFIX = "kube-api-access-"
# serviceaccount.WarnOnlyBoundTokenExpirationSeconds (pkg/serviceaccount/claims.go).
TOKEN_EXPIRATION_S = 60 * 60 + 7
ROOT_CA_CONFIGMAP = "kube-root-ca.crt"
_DEFAULT_MODE = 0o644  # v1.ProjectedVolumeSourceDefaultMode


def token_volume_source() -> dict[str, Any]:
    return {
        "defaultMode": _DEFAULT_MODE,
        "sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_EXPIRATION_S}},
            {"configMap": {"name": ROOT_CA_CONFIGMAP, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {
                "downwardAPI": {
                    "items": [
                        {
                            "path": "namespace",
                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                        }
                    ]
                }
            },
        ],
    }


def should_automount(spec: Mapping[str, Any], account: Mapping[str, Any] | None) -> bool:
    """The pod's preference, then its ServiceAccount's, else yes."""
    if (pod := spec.get("automountServiceAccountToken")) is not None:
        return bool(pod)
    if account is not None and (sa := account.get("automountServiceAccountToken")) is not None:
        return bool(sa)
    return True


def mount_token(pod: dict[str, Any], account: Mapping[str, Any] | None, suffix: str) -> None:
    """Add the token volume (named with `suffix`, five random letters) and its mounts to `pod`."""
    spec = pod.setdefault("spec", {})
    if not should_automount(spec, account):
        return
    volumes = spec.setdefault("volumes", [])
    name = next(
        (v["name"] for v in volumes if str(v.get("name", "")).startswith(VOLUME_PREFIX)),
        VOLUME_PREFIX + suffix,
    )
    needed = False
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        mounts = c.setdefault("volumeMounts", [])
        if not any(m.get("mountPath") == MOUNT_PATH for m in mounts):
            mounts.append({"name": name, "readOnly": True, "mountPath": MOUNT_PATH})
            needed = True
    if needed and not any(v.get("name") == name for v in volumes):
        volumes.append({"name": name, "projected": token_volume_source()})
