"""Pod status as the kubelet writes it, pure: Running with its conditions and container states, and
the terminal status (exit codes as a container runtime reports them, phase, the node-shutdown
reason and message), and a container restarted in place with its lastState and restartCount."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from launcher.embedded.types import objects

SHUTDOWN_REASON = "Terminated"
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."
LOST_MESSAGE = "The container could not be located when the pod was terminated"
# kubernetes/kubernetes pkg/kubelet/kubelet_pods.go convertToAPIContainerStatuses: a container last
# seen Running that the runtime no longer has (the host rebooted), in `lastState` (two spaces as upstream).
VANISHED_MESSAGE = (
    "The container could not be located when the pod was deleted.  The container used to be Running"
)


def running_status(
    pod: Mapping[str, Any],
    started: str,
    ids: Mapping[str, str],
    pod_ip: str = "127.0.0.1",
    images: Mapping[str, tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """`images`: container → (image, imageID) as the runtime resolved them (the podman runtime);
    without, the spec's image and no ID (the process runtime runs no image)."""
    images = images or {}
    st = copy.deepcopy(dict(pod.get("status") or {}))
    conds = st.setdefault("conditions", [])
    for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"):
        objects.set_condition(conds, t, "True", "", "", started, probe_fields=True)
    for c in conds:
        if c["type"] != "DisruptionTarget" and c.get("status") == "True":
            c.pop("reason", None)
            c.pop("message", None)
    st.update(
        {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": pod_ip,
            "podIPs": [{"ip": pod_ip}],
            "startTime": st.get("startTime") or started,
            "containerStatuses": [
                {
                    "name": c["name"],
                    "state": {"running": {"startedAt": started}},
                    "lastState": {},
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "image": images.get(c["name"], (c.get("image", ""), ""))[0],
                    "imageID": images.get(c["name"], ("", ""))[1],
                    "containerID": ids.get(c["name"], ""),
                }
                for c in (pod.get("spec") or {}).get("containers") or []
            ],
        }
    )
    return st


def exit_code(returncode: int) -> int:
    """A process killed by signal N exits 128+N in a container (SIGKILL → 137, SIGTERM → 143)."""
    return 128 - returncode if returncode < 0 else returncode


def terminated_status(
    pod: Mapping[str, Any],
    codes: Mapping[str, int],
    started: str,
    finished: Mapping[str, str],
    ids: Mapping[str, str],
    shutdown: bool,
    when: str,
    lost: bool = False,
) -> dict[str, Any]:
    """`lost`: the containers vanished with a previous kubelet (the cluster restarted) or never
    started (the pod was deleted first): exit code 137, reason ContainerStatusUnknown, as the
    kubelet reports a container it cannot find when the pod terminates."""
    st = copy.deepcopy(dict(pod.get("status") or {}))
    conds = st.setdefault("conditions", [])
    for t in ("PodReadyToStartContainers",):
        objects.set_condition(conds, t, "False", "", "", when, probe_fields=True)
    for t in ("Ready", "ContainersReady"):
        objects.set_condition(conds, t, "False", "PodCompleted", "", when, probe_fields=True)
    for c in conds:
        if c["type"] == "PodReadyToStartContainers":
            c.pop("reason", None)
            c.pop("message", None)
        elif c["type"] in ("Ready", "ContainersReady"):
            c.pop("message", None)
    statuses = []
    before = {cs.get("name"): cs for cs in st.get("containerStatuses") or []}
    for c in (pod.get("spec") or {}).get("containers") or []:
        code = int(codes.get(c["name"], 137))
        prev = before.get(c["name"]) or {}
        statuses.append(
            {
                "name": c["name"],
                "state": {
                    "terminated": {
                        "exitCode": code,
                        "reason": "ContainerStatusUnknown"
                        if lost
                        else ("Completed" if code == 0 else "Error"),
                        **({"message": LOST_MESSAGE} if lost else {}),
                        # A container restarted in place started after the pod did.
                        "startedAt": ((prev.get("state") or {}).get("running") or {}).get("startedAt")
                        or started
                        or when,
                        "finishedAt": finished.get(c["name"], when),
                        "containerID": ids.get(c["name"], ""),
                    }
                },
                "lastState": prev.get("lastState") or {},  # earlier in-place restarts stay counted
                "ready": False,
                "started": False,
                "restartCount": int(prev.get("restartCount") or 0),
                "image": prev.get("image") or c.get("image", ""),  # as the runtime resolved it
                "imageID": prev.get("imageID") or "",
                "containerID": ids.get(c["name"], ""),
            }
        )
    st["containerStatuses"] = statuses
    ok = all(s["state"]["terminated"]["exitCode"] == 0 for s in statuses)
    st["phase"] = "Succeeded" if ok and not shutdown else "Failed"
    if shutdown:
        st["reason"], st["message"] = SHUTDOWN_REASON, SHUTDOWN_MESSAGE
    return st


def rebooted_status(pod: Mapping[str, Any], when: str) -> dict[str, Any]:
    """What the kubelet, back after its host rebooted, first reports for a pod whose containers it
    last saw Running and its runtime no longer has (kubernetes/kubernetes pkg/kubelet/kubelet_pods.go,
    `convertToAPIContainerStatuses`): each container waiting (the default, ContainerCreating) with
    `lastState.terminated` {ContainerStatusUnknown, 137, VANISHED_MESSAGE} and its restartCount one
    more (the pod was not deleted); `getPhase` counts such a container stopped, so a
    `restartPolicy: Never` pod is `Failed` (any other is started again). `state.terminated` comes
    after, with TerminatePod (`terminated_status(..., lost=True)`)."""
    st = copy.deepcopy(dict(pod.get("status") or {}))
    conds = st.setdefault("conditions", [])
    for t in ("Ready", "ContainersReady"):
        objects.set_condition(conds, t, "False", "ContainersNotReady", "", when, probe_fields=True)
    before = {cs.get("name"): cs for cs in st.get("containerStatuses") or []}
    statuses = []
    for c in (pod.get("spec") or {}).get("containers") or []:
        prev = before.get(c["name"]) or {}
        statuses.append(
            {
                **prev,
                "name": c["name"],
                "state": {"waiting": {"reason": "ContainerCreating"}},
                "lastState": {
                    "terminated": {
                        "exitCode": 137,
                        "reason": "ContainerStatusUnknown",
                        "message": VANISHED_MESSAGE,
                        "startedAt": None,
                        "finishedAt": None,
                    }
                },
                "ready": False,
                "started": False,
                "restartCount": int(prev.get("restartCount") or 0) + 1,
                "containerID": "",
            }
        )
    st["containerStatuses"] = statuses
    never = (pod.get("spec") or {}).get("restartPolicy") == "Never"
    st["phase"] = "Failed" if never else "Running"
    return st


def crashed_status(
    pod: Mapping[str, Any], codes: Mapping[str, int], finished: Mapping[str, str], backoff_s: float, when: str
) -> dict[str, Any]:
    """Containers the kubelet will restart in place (restartPolicy OnFailure/Always): the exit goes
    to lastState; while the crash back-off runs they wait in CrashLoopBackOff, not ready."""
    st = copy.deepcopy(dict(pod.get("status") or {}))
    name = objects.meta(pod).get("name")
    for cs in st.get("containerStatuses") or []:
        if cs.get("name") not in codes:
            continue
        code = int(codes[cs["name"]])
        began = ((cs.get("state") or {}).get("running") or {}).get("startedAt") or when
        cs["lastState"] = {
            "terminated": {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": began,
                "finishedAt": finished.get(cs["name"], when),
                "containerID": cs.get("containerID", ""),
            }
        }
        if backoff_s > 0:
            msg = f"back-off {int(backoff_s)}s restarting failed container={cs['name']} pod={name}"
            cs["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message": msg}}
            cs["ready"] = cs["started"] = False
    return st


def restarted_status(
    pod: Mapping[str, Any], names: Iterable[str], ids: Mapping[str, str], when: str
) -> dict[str, Any]:
    """The restarted containers run again, each restartCount one higher."""
    st = copy.deepcopy(dict(pod.get("status") or {}))
    names = set(names)
    for cs in st.get("containerStatuses") or []:
        if cs.get("name") in names:
            cs["restartCount"] = int(cs.get("restartCount") or 0) + 1
            cs["state"] = {"running": {"startedAt": when}}
            cs["ready"] = cs["started"] = True
            cs["containerID"] = ids.get(cs["name"], cs.get("containerID", ""))
    return st


def config_error_status(
    pod: Mapping[str, Any], msg: str, reason: str = "CreateContainerConfigError"
) -> dict[str, Any]:
    """CreateContainerConfigError (or ErrImageNeverPull, ...): every container waiting with the
    message; the pod stays Pending."""
    st = copy.deepcopy(dict(pod.get("status") or {}))
    st["containerStatuses"] = [
        {
            "name": c["name"],
            "state": {"waiting": {"reason": reason, "message": msg}},
            "ready": False,
            "started": False,
            "restartCount": 0,
            "image": c.get("image", ""),
            "imageID": "",
        }
        for c in (pod.get("spec") or {}).get("containers") or []
    ]
    return st


def disrupted_status(pod: Mapping[str, Any], reason: str, message: str) -> dict[str, Any]:
    """The DisruptionTarget condition the kubelet adds before terminating a pod (node shutdown)."""
    st = copy.deepcopy(dict(pod.get("status") or {}))
    objects.set_condition(
        st.setdefault("conditions", []), "DisruptionTarget", "True", reason, message, probe_fields=True
    )
    return st
