"""The kinds the embedded API serves, as discovery describes them."""

from __future__ import annotations

from dataclasses import dataclass

VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class Resource:
    group: str  # "" for core
    version: str
    kind: str
    plural: str
    namespaced: bool
    subresources: tuple[str, ...] = ()
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    # Field labels usable in a fieldSelector besides metadata.name / metadata.namespace.
    field_labels: tuple[str, ...] = ()
    # Custom resources (CRDs) take no strategic merge patch, as on a real server.
    custom: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """`pods`, `jobs.batch`: how error messages name the resource."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        """`Pod`, `Job.batch`: how a 422 Invalid names the kind (schema.GroupKind.String())."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources


_EVENT_FIELDS = (
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
)

_ALL = (
    Resource("", "v1", "Namespace", "namespaces", False, ("status",), ("ns",), (), ("status.phase",)),
    Resource(
        "",
        "v1",
        "Pod",
        "pods",
        True,
        ("status", "log", "eviction"),
        ("po",),
        ("all",),
        ("spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.hostNetwork", "status.phase"),
    ),
    Resource("", "v1", "Node", "nodes", False, ("status",), ("no",), (), ("spec.unschedulable",)),
    Resource("", "v1", "Event", "events", True, (), ("ev",), (), _EVENT_FIELDS),
    Resource("", "v1", "ConfigMap", "configmaps", True, (), ("cm",)),
    Resource("", "v1", "Service", "services", True, ("status",), ("svc",), ("all",)),
    Resource("coordination.k8s.io", "v1", "Lease", "leases", True),
    Resource("batch", "v1", "Job", "jobs", True, ("status",), (), ("all",), ("status.successful",)),
    Resource("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets", True, ("status",), (), (), (), custom=True),
    # Stored, not acted on: what the in-cluster controller's manifests create (no Deployment
    # controller runs here; the RBAC rules are checked against the audit log, see ApiServer.audit).
    Resource("", "v1", "ServiceAccount", "serviceaccounts", True, (), ("sa",)),
    Resource("apps", "v1", "Deployment", "deployments", True, ("status",), ("deploy",), ("all",)),
    Resource("rbac.authorization.k8s.io", "v1", "Role", "roles", True),
    Resource("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", True),
    Resource("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", False),
    Resource("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", False),
    # Stored, not enforced: what `reslice preflight` reads (no Priority or ResourceQuota admission,
    # no quota controller filling status.used here; docs/embedded.md).
    Resource("scheduling.k8s.io", "v1", "PriorityClass", "priorityclasses", False, (), ("pc",)),
    Resource("", "v1", "ResourceQuota", "resourcequotas", True, ("status",), ("quota",)),
    # Honoured by the eviction subresource (launcher/embedded/api/eviction.py).
    Resource("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", True, ("status",), ("pdb",)),
)

RESOURCES: dict[str, Resource] = {r.plural: r for r in _ALL}

# Group -> version -> plural -> Resource, for routing and discovery.
GROUPS: dict[str, dict[str, dict[str, Resource]]] = {}
for _r in _ALL:
    GROUPS.setdefault(_r.group, {}).setdefault(_r.version, {})[_r.plural] = _r


def lookup(group: str, version: str, plural: str) -> Resource | None:
    return GROUPS.get(group, {}).get(version, {}).get(plural)
