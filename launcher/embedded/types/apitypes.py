"""The Go types of every kind the embedded API serves, by plural (`KINDS`), for `gotypes.decode`.

Transcribed from k8s.io/api (core/v1, batch/v1, apps/v1, coordination/v1, rbac/v1), apimachinery's
meta/v1 and JobSet's api/jobset/v1alpha2 (v0.12): every field the embedded cluster's controllers,
scheduler, kubelet and store read, and the common fields around them. A field not listed is not
type-checked (it is kept as sent; a real server would check it too, or drop it when unknown).

The groups with many types have their own module (metatypes, coretypes, batchtypes, jobsettypes);
the few kinds of apps/v1, coordination/v1, rbac/v1, scheduling/v1 and policy/v1 are written here.
Imported by `decoding.py` (the decode step of every write).
"""

from __future__ import annotations

from launcher.embedded.types.batchtypes import JOB_SPEC, JOB_STATUS
from launcher.embedded.types.coretypes import (
    EVENT,
    NODE,
    OBJECT_REFERENCE,
    POD_SPEC,
    POD_STATUS,
    POD_TEMPLATE_SPEC,
    SERVICE,
)
from launcher.embedded.types.gotypes import Bytes, IntOrString, Map, Slice, Struct
from launcher.embedded.types.jobsettypes import JOBSET
from launcher.embedded.types.metatypes import (
    I32,
    I64,
    LABEL_SELECTOR,
    LABELS,
    MICRO,
    RESOURCES,
    STRINGS,
    TIME,
    B,
    S,
    condition_type,
    kind_type,
)

_RULE = Struct(
    "PolicyRule",
    verbs=STRINGS,
    apiGroups=STRINGS,
    resources=STRINGS,
    resourceNames=STRINGS,
    nonResourceURLs=STRINGS,
)
_SUBJECTS = Slice(Struct("Subject", kind=S, apiGroup=S, name=S, namespace=S))
_ROLE_REF = Struct("RoleRef", apiGroup=S, kind=S, name=S)

KINDS: dict[str, Struct] = {
    "pods": kind_type("Pod", spec=POD_SPEC, status=POD_STATUS),
    "nodes": NODE,
    "namespaces": kind_type(
        "Namespace",
        spec=Struct("NamespaceSpec", finalizers=STRINGS),
        status=Struct("NamespaceStatus", phase=S, conditions=Slice(condition_type("NamespaceCondition"))),
    ),
    "events": EVENT,
    "configmaps": kind_type("ConfigMap", data=LABELS, binaryData=Map(Bytes()), immutable=B),
    "services": SERVICE,
    "leases": kind_type(
        "Lease",
        spec=Struct(
            "LeaseSpec",
            holderIdentity=S,
            leaseDurationSeconds=I32,
            acquireTime=MICRO,
            renewTime=MICRO,
            leaseTransitions=I32,
            strategy=S,
            preferredHolder=S,
        ),
    ),
    "jobs": kind_type("Job", spec=JOB_SPEC, status=JOB_STATUS),
    "jobsets": JOBSET,
    "serviceaccounts": kind_type(
        "ServiceAccount",
        secrets=Slice(OBJECT_REFERENCE),
        imagePullSecrets=Slice(Struct("LocalObjectReference", name=S)),
        automountServiceAccountToken=B,
    ),
    "deployments": kind_type(
        "Deployment",
        spec=Struct(
            "DeploymentSpec",
            replicas=I32,
            selector=LABEL_SELECTOR,
            template=POD_TEMPLATE_SPEC,
            strategy=Struct(
                "DeploymentStrategy",
                type=S,
                rollingUpdate=Struct(
                    "RollingUpdateDeployment", maxUnavailable=IntOrString(), maxSurge=IntOrString()
                ),
            ),
            minReadySeconds=I32,
            revisionHistoryLimit=I32,
            paused=B,
            progressDeadlineSeconds=I32,
        ),
        status=Struct(
            "DeploymentStatus",
            observedGeneration=I64,
            replicas=I32,
            updatedReplicas=I32,
            readyReplicas=I32,
            availableReplicas=I32,
            unavailableReplicas=I32,
            conditions=Slice(condition_type("DeploymentCondition", lastUpdateTime=TIME)),
            collisionCount=I32,
        ),
    ),
    "roles": kind_type("Role", rules=Slice(_RULE)),
    "clusterroles": kind_type(
        "ClusterRole",
        rules=Slice(_RULE),
        aggregationRule=Struct("AggregationRule", clusterRoleSelectors=Slice(LABEL_SELECTOR)),
    ),
    "rolebindings": kind_type("RoleBinding", subjects=_SUBJECTS, roleRef=_ROLE_REF),
    "clusterrolebindings": kind_type("ClusterRoleBinding", subjects=_SUBJECTS, roleRef=_ROLE_REF),
    "priorityclasses": kind_type(
        "PriorityClass", value=I32, globalDefault=B, description=S, preemptionPolicy=S
    ),
    "resourcequotas": kind_type(
        "ResourceQuota",
        spec=Struct(
            "ResourceQuotaSpec",
            hard=RESOURCES,
            scopes=STRINGS,
            scopeSelector=Struct(
                "ScopeSelector",
                matchExpressions=Slice(
                    Struct("ScopedResourceSelectorRequirement", scopeName=S, operator=S, values=STRINGS)
                ),
            ),
        ),
        status=Struct("ResourceQuotaStatus", hard=RESOURCES, used=RESOURCES),
    ),
    "poddisruptionbudgets": kind_type(
        "PodDisruptionBudget",
        spec=Struct(
            "PodDisruptionBudgetSpec",
            minAvailable=IntOrString(),
            maxUnavailable=IntOrString(),
            selector=LABEL_SELECTOR,
            unhealthyPodEvictionPolicy=S,
        ),
        status=Struct(
            "PodDisruptionBudgetStatus",
            observedGeneration=I64,
            disruptedPods=Map(S),
            disruptionsAllowed=I32,
            currentHealthy=I32,
            desiredHealthy=I32,
            expectedPods=I32,
        ),
    ),
}
