"""The write probe: a short-lived pod that writes the run directory from the target node pools.

The pod runs `python -m trainer --probe-write RUN_DIR` (trainer/state/storage.py), or for the MaxText
profile `python -m maxtext_entry --probe-write RUN_DIR` (maxtext_entry/probe.py: the same write
through the entrypoint's storage layer, and whether MaxText is there), with the run's image
and the trainer pods' placement (`render.placement`: nodeSelector, tolerations, host network,
service account, priority class), so it writes with the identity the trainers will have: on GKE
the node's service account and scopes. It requests no TPU chips, so it also runs beside a live run,
and a little cpu and memory, as the trainer pods request some: a namespace quota on requests.cpu or
requests.memory admits the trainers and would refuse a pod that states none.
It is labelled `reslice.dev/preflight=<run>` (not the run label: no controller counts it) and
deleted once it has ended or the wait timed out. `probe_pod` and `probe_check` are pure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from launcher.adapters.kube import Kube, Refused
from launcher.core.capacity.checks import FAIL, OK, Check
from launcher.core.labels import CONTAINER
from launcher.core.maxtext import probe_command
from launcher.core.presets import Preset
from launcher.core.render import placement
from launcher.core.spec import RunSpec
from launcher.core.words import PodPhase

LABEL_PROBE = "reslice.dev/preflight"
PROBE_ROW = "write probe"
# One Python process writing one small object: requests (for quotas and the scheduler), no limits.
PROBE_REQUESTS = {"cpu": "100m", "memory": "256Mi"}


def probe_pod(spec: RunSpec, preset: Preset, pin: dict[str, str] | None = None) -> dict:
    """The probe pod for the run (`pin`: extra node labels to select, on the embedded cluster only)."""
    where = placement(spec, preset)
    where["nodeSelector"] = {**where["nodeSelector"], **(pin or {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": f"{spec.run}-write-probe-"[:58], "labels": {LABEL_PROBE: spec.run}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            **where,
            "containers": [
                {
                    "name": CONTAINER,
                    "image": spec.image,
                    "imagePullPolicy": spec.image_pull_policy,
                    "command": probe_command(spec.trainer, spec.run_dir),
                    "env": [{"name": k, "value": v} for k, v in spec.env],
                    "resources": {"requests": dict(PROBE_REQUESTS)},
                }
            ],
        },
    }


@dataclass(frozen=True)
class Outcome:
    pod: str
    phase: str  # Succeeded | Failed | Pending | Running | Refused
    node: str | None = None
    exit_code: int | None = None
    log: str = ""
    waiting: str = ""  # why it has not run: the scheduler's message, a container's waiting reason
    waited_s: float = 0.0


def waiting_reason(pod: dict) -> str:
    """Why a pod that has not finished is stuck, in the API's words (empty if nothing says)."""
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason") not in (None, "ContainerCreating"):
            return f"{waiting['reason']}: {waiting.get('message', '')}".strip(": ")
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"unschedulable: {cond.get('message', '')}"
    return ""


def _exit_code(pod: dict) -> int | None:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if (term := (cs.get("state") or {}).get("terminated")) is not None:
            return term.get("exitCode")
    return None


def probe_check(o: Outcome, run_dir: str) -> Check:
    """The probe's row: the trainer's own line names the fix when it could not write."""
    last = next((ln.strip() for ln in reversed(o.log.splitlines()) if ln.strip()), "")
    said = last.removeprefix("trainer: ").removeprefix("maxtext_entry: ").removeprefix("config error: ")
    if o.phase == "Refused":
        return Check(
            PROBE_ROW, FAIL, f"the API server refused the probe pod: {o.waiting}", "see the rows above"
        )
    if o.phase == PodPhase.SUCCEEDED and o.exit_code == 0:
        return Check(PROBE_ROW, OK, f"pod {o.pod} on {o.node} wrote and deleted an object under {run_dir}")
    if o.phase == PodPhase.FAILED:
        if "No module named" in said:
            return Check(
                PROBE_ROW, FAIL, f"the image does not hold the run's program ({said})",
                "give the profile's image (docker/Dockerfile: reslice's trainer; docker/maxtext.Dockerfile: MaxText)",
            )  # fmt: skip
        if "--probe-write" in said and ("usage error" in said or "expected key=value" in said):
            return Check(
                PROBE_ROW, FAIL, f"the image's trainer has no --probe-write ({said})",
                "rebuild and push the image from this checkout (docker/Dockerfile)",
            )  # fmt: skip
        found, _, fix = said.partition("; fix: ")
        where = f"pod {o.pod} on {o.node}, exit {o.exit_code}"
        return Check(PROBE_ROW, FAIL, f"{where}: {found or 'no output'}", fix or f"kubectl logs {o.pod}")
    why = o.waiting or f"still {o.phase}"
    fix = (
        "see the node pool rows above" if why.startswith("unschedulable") else f"kubectl describe pod {o.pod}"
    )
    if why.startswith(("ErrImagePull", "ImagePullBackOff", "InvalidImageName")):
        fix = "check --image, and that the node service account may pull it (roles/artifactregistry.reader)"
    return Check(PROBE_ROW, FAIL, f"pod {o.pod} did not finish in {o.waited_s:.0f} s: {why}", fix)


def run_probe(
    kube: Kube,
    pod: dict,
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Outcome:
    """Create the probe pod, wait until it ends or `timeout_s` passes, read it, delete it."""
    start = clock()
    try:
        created = kube.create_pod(pod)
    except Refused as e:
        return Outcome(pod["metadata"]["generateName"] + "…", "Refused", waiting=str(e))
    name = created["metadata"]["name"]
    try:
        seen = created
        while True:
            seen = kube.pod(name) or seen
            phase = (seen.get("status") or {}).get("phase", "Pending")
            if phase in (PodPhase.SUCCEEDED, PodPhase.FAILED) or clock() - start > timeout_s:
                break
            sleep(0.5)
        ended = phase in (PodPhase.SUCCEEDED, PodPhase.FAILED)
        return Outcome(
            pod=name,
            phase=phase,
            node=(seen.get("spec") or {}).get("nodeName"),
            exit_code=_exit_code(seen),
            log=kube.pod_log(name, CONTAINER) if ended or phase == PodPhase.RUNNING else "",
            waiting="" if ended else waiting_reason(seen),
            waited_s=clock() - start,
        )
    finally:
        kube.delete_pod(name)
