"""The Go types of core/v1 (k8s.io/api/core/v1) the embedded API serves, for `gotypes.decode`: the
Pod (spec, containers, affinity, tolerations, status), PodTemplateSpec, Node, Event and Service.
Every field the embedded controllers, scheduler, kubelet and store read, and the common fields
around them; a field not listed is not type-checked (it is kept as sent).

Imported by `apitypes.py` (KINDS) and `batchtypes.py` (a Job's pod template).
"""

from __future__ import annotations

from launcher.embedded.types.gotypes import IntOrString, Quantity, Slice, Struct
from launcher.embedded.types.metatypes import (
    ANY,
    CONDITION,
    I32,
    I64,
    LABEL_SELECTOR,
    LABELS,
    MICRO,
    OBJECT_META,
    RESOURCES,
    STRINGS,
    TIME,
    B,
    S,
    condition_type,
    kind_type,
)

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
    conditions=Slice(condition_type("PodCondition", lastProbeTime=TIME, observedGeneration=I64)),
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

OBJECT_REFERENCE = Struct(
    "ObjectReference", kind=S, namespace=S, name=S, uid=S, apiVersion=S, resourceVersion=S, fieldPath=S
)
NODE = kind_type(
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
        conditions=Slice(condition_type("NodeCondition", lastHeartbeatTime=TIME)),
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
EVENT = kind_type(
    "Event",
    involvedObject=OBJECT_REFERENCE,
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
    related=OBJECT_REFERENCE,
    reportingComponent=S,
    reportingInstance=S,
)
_SERVICE_PORT = Struct(
    "ServicePort", name=S, protocol=S, appProtocol=S, port=I32, targetPort=IntOrString(), nodePort=I32
)
SERVICE = kind_type(
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
