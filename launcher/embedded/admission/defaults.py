"""What a real API server does to a built-in object on create, before it is stored.

Defaulting (SetDefaults_* in the Go API packages, plus the admission plugins every cluster runs:
ServiceAccount, Priority, DefaultTolerationSeconds; JobSet's pod mutating webhook, installed with
JobSet on every cluster reslice targets) and the strategies' PrepareForCreate (status is reset: a
created Pod is Pending, a created Job has an empty status). Controllers written against a real
cluster see these fields, so the embedded one sets them too.
"""

from __future__ import annotations

from typing import Any

from launcher.embedded.types.resources import Resource

# kube-apiserver --default-not-ready-toleration-seconds / --default-unreachable-toleration-seconds
# (the DefaultTolerationSeconds admission plugin): their default unless the cluster was started
# otherwise.
DEFAULT_TOLERATION_S = 300
_DEFAULT_TOLERATION_KEYS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
# JobSet v0.12.0 pkg/constants PriorityKey, set by pkg/webhooks/pod_webhook.go Default().
PRIORITY_LABEL = "jobset.sigs.k8s.io/priority"
_JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
_NODE_SELECTOR_STRATEGY = "alpha.jobset.sigs.k8s.io/node-selector"


def _container(c: dict[str, Any]) -> None:
    image = c.get("image", "")
    tagged = ":" in image.rsplit("/", 1)[-1] or "@" in image
    latest = not tagged or image.endswith(":latest")
    c.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    c.setdefault("resources", {})
    for port in c.get("ports") or []:
        port.setdefault("protocol", "TCP")


def pod_spec(spec: dict[str, Any]) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        _container(c)


def _pod(pod: dict[str, Any], toleration_s: int = DEFAULT_TOLERATION_S) -> None:
    spec = pod.setdefault("spec", {})
    pod_spec(spec)
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("priority", 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    spec.setdefault("serviceAccountName", "default")
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    tolerations = spec.setdefault("tolerations", [])
    tolerated = {(t.get("key"), t.get("effect")) for t in tolerations}
    for key in _DEFAULT_TOLERATION_KEYS:
        if (key, "NoExecute") not in tolerated and (key, None) not in tolerated:
            tolerations.append(
                {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": toleration_s}
            )
    jobset_pod_labels(pod)
    pod["status"] = {"phase": "Pending", "qosClass": qos_class(spec)}


def jobset_pod_labels(pod: dict[str, Any]) -> None:
    """The JobSet pod webhook's label: the pod's priority (after Priority admission), so that
    exclusive placement only repels Jobs of the same priority. Only pods a JobSet made (the
    jobset-name annotation), and not under the node-selector placement strategy."""
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    if _JOBSET_NAME not in ann or _NODE_SELECTOR_STRATEGY in ann:
        return
    priority = (pod.get("spec") or {}).get("priority")
    if priority is not None:
        pod["metadata"].setdefault("labels", {})[PRIORITY_LABEL] = str(priority)


def qos_class(spec: dict[str, Any]) -> str:
    """Guaranteed / Burstable / BestEffort from the cpu and memory requests and limits."""
    containers = spec.get("containers") or []
    any_set, all_guaranteed = False, bool(containers)
    for c in containers:
        res = c.get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        for name in ("cpu", "memory"):
            limit, request = limits.get(name), requests.get(name, limits.get(name))
            any_set = any_set or limit is not None or request is not None
            if limit is None or str(limit) != str(request):
                all_guaranteed = False
    if all_guaranteed:
        return "Guaranteed"
    return "Burstable" if any_set else "BestEffort"


def _job(job: dict[str, Any]) -> None:
    meta, spec = job["metadata"], job.setdefault("spec", {})
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
    spec.setdefault("parallelism", 1)
    spec.setdefault("backoffLimit", 2147483647 if spec.get("backoffLimitPerIndex") is not None else 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault(
        "podReplacementPolicy", "Failed" if spec.get("podFailurePolicy") else "TerminatingOrFailed"
    )
    template = spec.setdefault("template", {})
    pod_spec(template.setdefault("spec", {}))
    if not spec.get("manualSelector"):
        # The job strategy generates the selector from the uid and labels the pod template with it.
        uid, name = meta["uid"], meta["name"]
        spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
        labels = template.setdefault("metadata", {}).setdefault("labels", {})
        labels.update(
            {
                "batch.kubernetes.io/controller-uid": uid,
                "batch.kubernetes.io/job-name": name,
                "controller-uid": uid,
                "job-name": name,
            }
        )
    job["status"] = {}


def _namespace(ns: dict[str, Any]) -> None:
    ns["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = ns["metadata"]["name"]
    ns.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
    ns["status"] = {"phase": "Active"}


def _service(svc: dict[str, Any]) -> None:
    spec = svc.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    for port in spec.get("ports") or []:
        port.setdefault("protocol", "TCP")
        if "port" in port:
            port.setdefault("targetPort", port["port"])
    svc["status"] = {"loadBalancer": {}}


# Fields Go serializes even when empty (no `omitempty`): a real server always sends them, and the
# python client (37.x, pydantic models) refuses an object without them.
_CONTAINER_STATUS_ZERO = {"name": "", "image": "", "imageID": "", "ready": False, "restartCount": 0}
_NODE_INFO_FIELDS = (
    "machineID",
    "systemUUID",
    "bootID",
    "kernelVersion",
    "osImage",
    "containerRuntimeVersion",
    "kubeletVersion",
    "kubeProxyVersion",
    "operatingSystem",
    "architecture",
)


def normalize(res: Resource, obj: dict[str, Any]) -> None:
    """Fill in the always-serialized fields a writer left out (every write, status included)."""
    status = obj.get("status")
    if res.plural == "pods" and isinstance(status, dict):
        for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
            for cs in status.get(key) or []:
                for field, zero in _CONTAINER_STATUS_ZERO.items():
                    cs.setdefault(field, zero)
                if (terminated := (cs.get("state") or {}).get("terminated")) is not None:
                    terminated.setdefault("exitCode", 0)
    elif res.plural == "nodes":
        info = obj.setdefault("status", {}).setdefault("nodeInfo", {})
        for field in _NODE_INFO_FIELDS:
            info.setdefault(field, "")
    elif res.plural == "events":
        obj.setdefault("involvedObject", {})


_ON_CREATE = {"jobs": _job, "namespaces": _namespace, "services": _service}


def on_create(res: Resource, obj: dict[str, Any], toleration_s: int = DEFAULT_TOLERATION_S) -> None:
    """Default `obj` in place; metadata (uid, name, namespace) is already set."""
    if res.plural == "pods":
        _pod(obj, toleration_s)
    elif fn := _ON_CREATE.get(res.plural):
        fn(obj)
    elif res.custom and res.has_status:
        obj.pop("status", None)  # a CRD's status can only be written through /status
