"""What kube-controller-manager puts in every namespace for its pods' API access, in outside mode:
the `default` ServiceAccount (the serviceaccount-controller, `pkg/controller/serviceaccount/
serviceaccounts_controller.go`) and the `kube-root-ca.crt` ConfigMap holding the cluster's CA
(the root-ca-cert-publisher, `pkg/controller/certificates/rootcacertpublisher/publisher.go`), both
made again when deleted. A pod's projected token volume reads that ConfigMap for its `ca.crt`.

Run by `cluster.EmbeddedCluster` in outside mode only.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from launcher.embedded.controllers.runtime import ControllerLoop
from launcher.embedded.types import objects
from launcher.embedded.types.errors import ApiError

DEFAULT_ACCOUNT = "default"
ROOT_CA_CONFIGMAP = "kube-root-ca.crt"


class NamespaceAccess(ControllerLoop):
    name = "serviceaccount-controller"

    def __init__(self, store: Any, ca_pem: bytes, events: Any = None) -> None:
        super().__init__(store, events)
        from launcher.embedded.store.store import RESOURCES

        self.res = {k: RESOURCES[k] for k in ("namespaces", "serviceaccounts", "configmaps")}
        self.ca = ca_pem.decode()

    def resync(self) -> None:
        for ns in self.store.list(self.res["namespaces"])[0]:
            self.enqueue(objects.meta(ns)["name"])

    def keys_for(self, event: str, res: Any, obj: Mapping[str, Any]) -> list[Hashable]:
        meta = objects.meta(obj)
        if res.plural == "namespaces" and event != "DELETED":
            return [meta["name"]]
        if event == "DELETED" and (
            (res.plural == "serviceaccounts" and meta.get("name") == DEFAULT_ACCOUNT)
            or (res.plural == "configmaps" and meta.get("name") == ROOT_CA_CONFIGMAP)
        ):
            return [meta.get("namespace")]
        return []

    def reconcile(self, key: Hashable) -> float | None:
        ns = str(key)
        try:
            namespace = self.store.get(self.res["namespaces"], None, ns)
        except ApiError as e:
            if e.code == 404:
                return None
            raise
        if objects.meta(namespace).get("deletionTimestamp"):
            return None  # a namespace going away gets nothing new
        self._ensure("serviceaccounts", ns, {"metadata": {"name": DEFAULT_ACCOUNT}})
        self._ensure("configmaps", ns, {"metadata": {"name": ROOT_CA_CONFIGMAP}, "data": {"ca.crt": self.ca}})
        return None

    def _ensure(self, plural: str, ns: str, obj: dict[str, Any]) -> None:
        try:
            self.store.create(self.res[plural], obj, ns)
        except ApiError as e:
            if e.code not in (403, 404, 409):  # there already; the namespace terminating or gone
                raise
