"""The Go types every API group's types are built of, for `gotypes.decode`: the scalars (string,
bool, int32/int64, Time, MicroTime, quantities), meta/v1 (ObjectMeta, OwnerReference,
LabelSelector, Condition), a kind's envelope (`kind_type`), DeleteOptions and what the API server
decodes of a custom resource. Transcribed from k8s.io/apimachinery pkg/apis/meta/v1.

Imported by `coretypes.py`, `batchtypes.py`, `jobsettypes.py` and `apitypes.py`; `bodies.py`
decodes DeleteOptions and `decoding.py` ObjectMeta with it.
"""

from __future__ import annotations

from launcher.embedded.types.gotypes import Any_, Bool, GoType, Int, Map, Quantity, Slice, Str, Struct, Time

S, B, ANY = Str(), Bool(), Any_()
I32, I64, INT = Int(32), Int(64), Int(64, "int")
TIME, MICRO = Time(), Time("v1.MicroTime")
STRINGS, LABELS = Slice(S), Map(S)
RESOURCES = Map(Quantity(), "v1.ResourceList")

OWNER_REFERENCE = Struct(
    "OwnerReference", apiVersion=S, kind=S, name=S, uid=S, controller=B, blockOwnerDeletion=B
)
OBJECT_META = Struct(
    "ObjectMeta",
    name=S,
    generateName=S,
    namespace=S,
    selfLink=S,
    uid=S,
    resourceVersion=S,
    generation=I64,
    creationTimestamp=TIME,
    deletionTimestamp=TIME,
    deletionGracePeriodSeconds=I64,
    labels=LABELS,
    annotations=LABELS,
    ownerReferences=Slice(OWNER_REFERENCE),
    finalizers=STRINGS,
    managedFields=Slice(ANY),
)
LABEL_SELECTOR = Struct(
    "LabelSelector",
    matchLabels=LABELS,
    matchExpressions=Slice(Struct("LabelSelectorRequirement", key=S, operator=S, values=STRINGS)),
)
CONDITION = Struct(
    "Condition", type=S, status=S, observedGeneration=I64, lastTransitionTime=TIME, reason=S, message=S
)


def kind_type(name: str, package: str = "v1", **fields: GoType) -> Struct:
    return Struct(name, package, apiVersion=S, kind=S, metadata=OBJECT_META, **fields)


def condition_type(name: str, **times: GoType) -> Struct:
    return Struct(name, type=S, status=S, reason=S, message=S, lastTransitionTime=TIME, **times)


DELETE_OPTIONS = Struct(
    "DeleteOptions",
    kind=S,
    apiVersion=S,
    gracePeriodSeconds=I64,
    preconditions=Struct("Preconditions", uid=S, resourceVersion=S),
    orphanDependents=B,
    propagationPolicy=S,
    dryRun=STRINGS,
)

# What the API server itself decodes of a custom resource (the rest is the CRD schema's business).
CUSTOM_RESOURCE = Struct("Unstructured", "unstructured", apiVersion=S, kind=S)
