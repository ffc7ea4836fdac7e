"""The Go types of batch/v1 (k8s.io/api/batch/v1), for `gotypes.decode`: JobSpec (podFailurePolicy,
backoffLimitPerIndex, successPolicy...), JobStatus, JobTemplateSpec.

Imported by `apitypes.py` (KINDS) and `jobsettypes.py` (a replicated Job's template).
"""

from __future__ import annotations

from launcher.embedded.types.coretypes import POD_TEMPLATE_SPEC
from launcher.embedded.types.gotypes import Slice, Struct
from launcher.embedded.types.metatypes import (
    I32,
    I64,
    LABEL_SELECTOR,
    OBJECT_META,
    STRINGS,
    TIME,
    B,
    S,
    condition_type,
)

# ---- batch/v1 -------------------------------------------------------------------------------------------

JOB_SPEC = Struct(
    "JobSpec",
    parallelism=I32,
    completions=I32,
    activeDeadlineSeconds=I64,
    podFailurePolicy=Struct(
        "PodFailurePolicy",
        rules=Slice(
            Struct(
                "PodFailurePolicyRule",
                action=S,
                onExitCodes=Struct(
                    "PodFailurePolicyOnExitCodesRequirement",
                    containerName=S,
                    operator=S,
                    values=Slice(I32),
                ),
                onPodConditions=Slice(Struct("PodFailurePolicyOnPodConditionsPattern", type=S, status=S)),
            )
        ),
    ),
    successPolicy=Struct(
        "SuccessPolicy", rules=Slice(Struct("SuccessPolicyRule", succeededIndexes=S, succeededCount=I32))
    ),
    backoffLimit=I32,
    backoffLimitPerIndex=I32,
    maxFailedIndexes=I32,
    selector=LABEL_SELECTOR,
    manualSelector=B,
    template=POD_TEMPLATE_SPEC,
    ttlSecondsAfterFinished=I32,
    completionMode=S,
    suspend=B,
    podReplacementPolicy=S,
    managedBy=S,
)
JOB_STATUS = Struct(
    "JobStatus",
    conditions=Slice(condition_type("JobCondition", lastProbeTime=TIME)),
    startTime=TIME,
    completionTime=TIME,
    active=I32,
    succeeded=I32,
    failed=I32,
    terminating=I32,
    completedIndexes=S,
    failedIndexes=S,
    uncountedTerminatedPods=Struct("UncountedTerminatedPods", succeeded=STRINGS, failed=STRINGS),
    ready=I32,
)
JOB_TEMPLATE_SPEC = Struct("JobTemplateSpec", metadata=OBJECT_META, spec=JOB_SPEC)
