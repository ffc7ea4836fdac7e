"""The Go types of the kinds the embedded API serves, for `gotypes.decode`.

Transcribed from k8s.io/api (core/v1, batch/v1, apps/v1, coordination/v1, rbac/v1), apimachinery's
meta/v1 and JobSet's api/jobset/v1alpha2 (v0.12): every field the embedded cluster's controllers,
scheduler, kubelet and store read, and the common fields around them. A field not listed is not
type-checked (it is kept as sent; a real server would check it too, or drop it when unknown).
"""

from __future__ import annotations

from launcher.embedded.gotypes import (
    Any_,
    Bool,
    Bytes,
    GoType,
    Int,
    IntOrString,
    Map,
    Quantity,
    Slice,
    Str,
    Struct,
    Time,
)

S, B, ANY = Str(), Bool(), Any_()
I32, I64, INT = Int(32), Int(64), Int(64, "int")
TIME, MICRO = Time(), Time("v1.MicroTime")
STRINGS, LABELS = Slice(S), Map(S)
RESOURCES = Map(Quantity(), "v1.ResourceList")

# ---- meta/v1 --------------------------------------------------------------------------------------

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


def _kind(name: str, package: str = "v1", **fields: GoType) -> Struct:
    return Struct(name, package, apiVersion=S, kind=S, metadata=OBJECT_META, **fields)


def _condition(name: str, **times: GoType) -> Struct:
    return Struct(name, type=S, status=S, reason=S, message=S, lastTransitionTime=TIME, **times)


# ---- core/v1: pods ----------------------------------------------------------------------------------

_SELINUX = Struct("SELinuxOptions", user=S, role=S, type=S, level=S)
_SECCOMP = Struct("SeccompProfile", type=S, localhostProfile=S)
_SECURITY_CONTEXT = Struct(
    "SecurityContext",
    capabilities=Struct("Capabilities", add=STRINGS, drop=STRINGS),
    privileged=B,
    seLinuxOptions=_SELINUX,
    runAsUser=I64,
    runAsGroup=I64,
    runAsNonRoot=B,
    readOnlyRootFilesystem=B,
    allowPrivilegeEscalation=B,
    procMount=S,
    seccompProfile=_SECCOMP,
)
_POD_SECURITY_CONTEXT = Struct(
    "PodSecurityContext",
    seLinuxOptions=_SELINUX,
    runAsUser=I64,
    runAsGroup=I64,
    runAsNonRoot=B,
    supplementalGroups=Slice(I64),
    fsGroup=I64,
    sysctls=Slice(Struct("Sysctl", name=S, value=S)),
    fsGroupChangePolicy=S,
    seccompProfile=_SECCOMP,
)
_ENV_VAR = Struct(
    "EnvVar",
    name=S,
    value=S,
    valueFrom=Struct(
        "EnvVarSource",
        fieldRef=Struct("ObjectFieldSelector", apiVersion=S, fieldPath=S),
        resourceFieldRef=Struct("ResourceFieldSelector", containerName=S, resource=S, divisor=Quantity()),
        configMapKeyRef=Struct("ConfigMapKeySelector", name=S, key=S, optional=B),
        secretKeyRef=Struct("SecretKeySelector", name=S, key=S, optional=B),
    ),
)
_ENV_FROM = Struct(
    "EnvFromSource",
    prefix=S,
    configMapRef=Struct("ConfigMapEnvSource", name=S, optional=B),
    secretRef=Struct("SecretEnvSource", name=S, optional=B),
)
CONTAINER = Struct(
    "Container",
    name=S,
    image=S,
    command=STRINGS,
    args=STRINGS,
    workingDir=S,
    ports=Slice(Struct("ContainerPort", name=S, hostPort=I32, containerPort=I32, protocol=S, hostIP=S)),
    envFrom=Slice(_ENV_FROM),
    env=Slice(_ENV_VAR),
    resources=Struct("ResourceRequirements", limits=RESOURCES, requests=RESOURCES, claims=Slice(ANY)),
    volumeMounts=Slice(Struct("VolumeMount", name=S, readOnly=B, mountPath=S, subPath=S)),
    imagePullPolicy=S,
    terminationMessagePath=S,
    terminationMessagePolicy=S,
    restartPolicy=S,
    securityContext=_SECURITY_CONTEXT,
    stdin=B,
    tty=B,
)
_NODE_SELECTOR_TERM = Struct(
    "NodeSelectorTerm",
    matchExpressions=Slice(Struct("NodeSelectorRequirement", key=S, operator=S, values=STRINGS)),
    matchFields=Slice(Struct("NodeSelectorRequirement", key=S, operator=S, values=STRINGS)),
)
_POD_AFFINITY_TERM = Struct(
    "PodAffinityTerm",
    labelSelector=LABEL_SELECTOR,
    namespaces=STRINGS,
    topologyKey=S,
    namespaceSelector=LABEL_SELECTOR,
    matchLabelKeys=STRINGS,
    mismatchLabelKeys=STRINGS,
)
_WEIGHTED_POD_AFFINITY_TERM = Struct(
    "WeightedPodAffinityTerm", weight=I32, podAffinityTerm=_POD_AFFINITY_TERM
)


def _pod_affinity(name: str) -> Struct:
    return Struct(
        name,
        requiredDuringSchedulingIgnoredDuringExecution=Slice(_POD_AFFINITY_TERM),
        preferredDuringSchedulingIgnoredDuringExecution=Slice(_WEIGHTED_POD_AFFINITY_TERM),
    )


AFFINITY = Struct(
    "Affinity",
    nodeAffinity=Struct(
        "NodeAffinity",
        requiredDuringSchedulingIgnoredDuringExecution=Struct(
            "NodeSelector", nodeSelectorTerms=Slice(_NODE_SELECTOR_TERM)
        ),
        preferredDuringSchedulingIgnoredDuringExecution=Slice(
            Struct("PreferredSchedulingTerm", weight=I32, preference=_NODE_SELECTOR_TERM)
        ),
    ),
    podAffinity=_pod_affinity("PodAffinity"),
    podAntiAffinity=_pod_affinity("PodAntiAffinity"),
)
TOLERATION = Struct("Toleration", key=S, operator=S, value=S, effect=S, tolerationSeconds=I64)
POD_SPEC = Struct(
    "PodSpec",
    volumes=Slice(Struct("Volume", name=S)),
    initContainers=Slice(CONTAINER),
    containers=Slice(CONTAINER),
    ephemeralContainers=Slice(ANY),
    restartPolicy=S,
    terminationGracePeriodSeconds=I64,
    activeDeadlineSeconds=I64,
    dnsPolicy=S,
    nodeSelector=LABELS,
    serviceAccountName=S,
    serviceAccount=S,
    automountServiceAccountToken=B,
    nodeName=S,
    hostNetwork=B,
    hostPID=B,
    hostIPC=B,
    shareProcessNamespace=B,
    securityContext=_POD_SECURITY_CONTEXT,
    imagePullSecrets=Slice(Struct("LocalObjectReference", name=S)),
    hostname=S,
    subdomain=S,
    affinity=AFFINITY,
    schedulerName=S,
    tolerations=Slice(TOLERATION),
    priorityClassName=S,
    priority=I32,
    runtimeClassName=S,
    enableServiceLinks=B,
    preemptionPolicy=S,
    overhead=RESOURCES,
    setHostnameAsFQDN=B,
    schedulingGates=Slice(Struct("PodSchedulingGate", name=S)),
)
_CONTAINER_STATE = Struct(
    "ContainerState",
    waiting=Struct("ContainerStateWaiting", reason=S, message=S),
    running=Struct("ContainerStateRunning", startedAt=TIME),
    terminated=Struct(
        "ContainerStateTerminated",
        exitCode=I32,
        signal=I32,
        reason=S,
        message=S,
        startedAt=TIME,
        finishedAt=TIME,
        containerID=S,
    ),
)
_CONTAINER_STATUS = Struct(
    "ContainerStatus",
    name=S,
    state=_CONTAINER_STATE,
    lastState=_CONTAINER_STATE,
    ready=B,
    restartCount=I32,
    image=S,
    imageID=S,
    containerID=S,
    started=B,
    allocatedResources=RESOURCES,
)
POD_STATUS = Struct(
    "PodStatus",
    observedGeneration=I64,
    phase=S,
    conditions=Slice(_condition("PodCondition", lastProbeTime=TIME, observedGeneration=I64)),
    message=S,
    reason=S,
    nominatedNodeName=S,
    hostIP=S,
    hostIPs=Slice(Struct("HostIP", ip=S)),
    podIP=S,
    podIPs=Slice(Struct("PodIP", ip=S)),
    startTime=TIME,
    initContainerStatuses=Slice(_CONTAINER_STATUS),
    containerStatuses=Slice(_CONTAINER_STATUS),
    ephemeralContainerStatuses=Slice(_CONTAINER_STATUS),
    qosClass=S,
)
POD_TEMPLATE_SPEC = Struct("PodTemplateSpec", metadata=OBJECT_META, spec=POD_SPEC)

# ---- core/v1: the rest --------------------------------------------------------------------------------

_OBJECT_REFERENCE = Struct(
    "ObjectReference", kind=S, namespace=S, name=S, uid=S, apiVersion=S, resourceVersion=S, fieldPath=S
)
NODE = _kind(
    "Node",
    spec=Struct(
        "NodeSpec",
        podCIDR=S,
        podCIDRs=STRINGS,
        providerID=S,
        unschedulable=B,
        taints=Slice(Struct("Taint", key=S, value=S, effect=S, timeAdded=TIME)),
    ),
    status=Struct(
        "NodeStatus",
        capacity=RESOURCES,
        allocatable=RESOURCES,
        phase=S,
        conditions=Slice(_condition("NodeCondition", lastHeartbeatTime=TIME)),
        addresses=Slice(Struct("NodeAddress", type=S, address=S)),
        nodeInfo=Struct(
            "NodeSystemInfo",
            machineID=S,
            systemUUID=S,
            bootID=S,
            kernelVersion=S,
            osImage=S,
            containerRuntimeVersion=S,
            kubeletVersion=S,
            kubeProxyVersion=S,
            operatingSystem=S,
            architecture=S,
        ),
        images=Slice(ANY),
        volumesInUse=STRINGS,
    ),
)
EVENT = _kind(
    "Event",
    involvedObject=_OBJECT_REFERENCE,
    reason=S,
    message=S,
    source=Struct("EventSource", component=S, host=S),
    firstTimestamp=TIME,
    lastTimestamp=TIME,
    count=I32,
    type=S,
    eventTime=MICRO,
    series=Struct("EventSeries", count=I32, lastObservedTime=MICRO),
    action=S,
    related=_OBJECT_REFERENCE,
    reportingComponent=S,
    reportingInstance=S,
)
_SERVICE_PORT = Struct(
    "ServicePort", name=S, protocol=S, appProtocol=S, port=I32, targetPort=IntOrString(), nodePort=I32
)
SERVICE = _kind(
    "Service",
    spec=Struct(
        "ServiceSpec",
        ports=Slice(_SERVICE_PORT),
        selector=LABELS,
        clusterIP=S,
        clusterIPs=STRINGS,
        type=S,
        externalIPs=STRINGS,
        sessionAffinity=S,
        externalName=S,
        publishNotReadyAddresses=B,
        ipFamilies=STRINGS,
        ipFamilyPolicy=S,
        internalTrafficPolicy=S,
    ),
    status=Struct(
        "ServiceStatus",
        loadBalancer=Struct(
            "LoadBalancerStatus", ingress=Slice(Struct("LoadBalancerIngress", ip=S, hostname=S))
        ),
        conditions=Slice(CONDITION),
    ),
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
    conditions=Slice(_condition("JobCondition", lastProbeTime=TIME)),
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

# ---- JobSet (jobset.x-k8s.io/v1alpha2), as its webhooks decode it ------------------------------------------

_JS = "v1alpha2"
JOBSET = _kind(
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

# ---- every kind, by plural ------------------------------------------------------------------------------

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
    "pods": _kind("Pod", spec=POD_SPEC, status=POD_STATUS),
    "nodes": NODE,
    "namespaces": _kind(
        "Namespace",
        spec=Struct("NamespaceSpec", finalizers=STRINGS),
        status=Struct("NamespaceStatus", phase=S, conditions=Slice(_condition("NamespaceCondition"))),
    ),
    "events": EVENT,
    "configmaps": _kind("ConfigMap", data=LABELS, binaryData=Map(Bytes()), immutable=B),
    "services": SERVICE,
    "leases": _kind(
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
    "jobs": _kind("Job", spec=JOB_SPEC, status=JOB_STATUS),
    "jobsets": JOBSET,
    "serviceaccounts": _kind(
        "ServiceAccount",
        secrets=Slice(_OBJECT_REFERENCE),
        imagePullSecrets=Slice(Struct("LocalObjectReference", name=S)),
        automountServiceAccountToken=B,
    ),
    "deployments": _kind(
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
            conditions=Slice(_condition("DeploymentCondition", lastUpdateTime=TIME)),
            collisionCount=I32,
        ),
    ),
    "roles": _kind("Role", rules=Slice(_RULE)),
    "clusterroles": _kind(
        "ClusterRole",
        rules=Slice(_RULE),
        aggregationRule=Struct("AggregationRule", clusterRoleSelectors=Slice(LABEL_SELECTOR)),
    ),
    "rolebindings": _kind("RoleBinding", subjects=_SUBJECTS, roleRef=_ROLE_REF),
    "clusterrolebindings": _kind("ClusterRoleBinding", subjects=_SUBJECTS, roleRef=_ROLE_REF),
    "priorityclasses": _kind("PriorityClass", value=I32, globalDefault=B, description=S, preemptionPolicy=S),
    "resourcequotas": _kind(
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
    "poddisruptionbudgets": _kind(
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
