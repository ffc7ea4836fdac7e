"""The Go types of JobSet (jobset.x-k8s.io/v1alpha2, kubernetes-sigs/jobset v0.12 api/jobset/v1alpha2),
as its webhooks decode it, for `gotypes.decode`.

Imported by `apitypes.py` (KINDS); `admission.py` decodes a whole JobSet with `JOBSET`.
"""

from __future__ import annotations

from launcher.embedded.types.batchtypes import JOB_TEMPLATE_SPEC
from launcher.embedded.types.gotypes import Slice, Struct
from launcher.embedded.types.metatypes import CONDITION, I32, INT, STRINGS, B, S, kind_type

# ---- JobSet (jobset.x-k8s.io/v1alpha2), as its webhooks decode it ------------------------------------------

_JS = "v1alpha2"
JOBSET = kind_type(
    "JobSet",
    _JS,
    spec=Struct(
        "JobSetSpec",
        _JS,
        replicatedJobs=Slice(
            Struct(
                "ReplicatedJob",
                _JS,
                name=S,
                groupName=S,
                template=JOB_TEMPLATE_SPEC,
                replicas=I32,
                dependsOn=Slice(Struct("DependsOn", _JS, name=S, status=S)),
            )
        ),
        network=Struct("Network", _JS, enableDNSHostnames=B, subdomain=S, publishNotReadyAddresses=B),
        successPolicy=Struct("SuccessPolicy", _JS, operator=S, targetReplicatedJobs=STRINGS),
        failurePolicy=Struct(
            "FailurePolicy",
            _JS,
            maxRestarts=I32,
            restartStrategy=S,
            rules=Slice(
                Struct(
                    "FailurePolicyRule",
                    _JS,
                    name=S,
                    action=S,
                    onJobFailureReasons=STRINGS,
                    onJobFailureMessagePatterns=STRINGS,
                    targetReplicatedJobs=STRINGS,
                )
            ),
        ),
        startupPolicy=Struct("StartupPolicy", _JS, startupPolicyOrder=S),
        suspend=B,
        coordinator=Struct("Coordinator", _JS, replicatedJob=S, jobIndex=INT, podIndex=INT),
        managedBy=S,
        ttlSecondsAfterFinished=I32,
    ),
    status=Struct(
        "JobSetStatus",
        _JS,
        conditions=Slice(CONDITION),
        restarts=I32,
        restartsCountTowardsMax=I32,
        terminalState=S,
        replicatedJobsStatus=Slice(
            Struct(
                "ReplicatedJobStatus",
                _JS,
                name=S,
                ready=I32,
                succeeded=I32,
                failed=I32,
                active=I32,
                suspended=I32,
            )
        ),
    ),
)
