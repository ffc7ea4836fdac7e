"""Pod status as the kubelet writes it, pure: Running with its conditions and container states, and
the terminal status (exit codes as a container runtime reports them, phase, the node-shutdown
reason and message)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from launcher.embedded import objects as o

SHUTDOWN_REASON = "Terminated"
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."
LOST_MESSAGE = "The container could not be located when the pod was terminated"


def running_status(pod: Mapping[str, Any], started: str, ids: Mapping[str, str]) -> dict[str, Any]:
    st = copy.deepcopy(dict(pod.get("status") or {}))
    conds = st.setdefault("conditions", [])
    for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"):
        o.set_condition(conds, t, "True", "", "", started, probe_fields=True)
    for c in conds:
        if c["type"] != "DisruptionTarget" and c.get("status") == "True":
            c.pop("reason", None)
            c.pop("message", None)
    st.update(
        {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "startTime": st.get("startTime") or started,
            "containerStatuses": [
                {
                    "name": c["name"],
                    "state": {"running": {"startedAt": started}},
                    "lastState": {},
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "image": c.get("image", ""),
                    "imageID": "",
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
        o.set_condition(conds, t, "False", "", "", when, probe_fields=True)
    for t in ("Ready", "ContainersReady"):
        o.set_condition(conds, t, "False", "PodCompleted", "", when, probe_fields=True)
    for c in conds:
        if c["type"] == "PodReadyToStartContainers":
            c.pop("reason", None)
            c.pop("message", None)
        elif c["type"] in ("Ready", "ContainersReady"):
            c.pop("message", None)
    statuses = []
    for c in (pod.get("spec") or {}).get("containers") or []:
        code = int(codes.get(c["name"], 137))
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
                        "startedAt": started or when,
                        "finishedAt": finished.get(c["name"], when),
                        "containerID": ids.get(c["name"], ""),
                    }
                },
                "lastState": {},
                "ready": False,
                "started": False,
                "restartCount": 0,
                "image": c.get("image", ""),
                "imageID": "",
                "containerID": ids.get(c["name"], ""),
            }
        )
    st["containerStatuses"] = statuses
    ok = all(s["state"]["terminated"]["exitCode"] == 0 for s in statuses)
    st["phase"] = "Succeeded" if ok and not shutdown else "Failed"
    if shutdown:
        st["reason"], st["message"] = SHUTDOWN_REASON, SHUTDOWN_MESSAGE
    return st
