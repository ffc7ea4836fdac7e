"""The JobSet controller (jobset.x-k8s.io/v1alpha2, the behaviour of kubernetes-sigs/jobset v0.12):
the I/O half, run by `cluster.EmbeddedCluster` on the runtime's work queues. It reads a JobSet,
its child Jobs and its Service, calls the pure `jobsetactions.decide` and applies the
`JobSetActions` (Jobs created, deleted in the foreground and suspended, the Service created, the
status written, events). The child Jobs' shape is `jobsetjobs.py`.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any, cast

from launcher.embedded.controllers.jobsetactions import decide
from launcher.embedded.controllers.jobsetjobs import subdomain
from launcher.embedded.controllers.runtime import ControllerLoop, EventRecorder
from launcher.embedded.types import objects

# The upstream release whose behaviour this controller follows; `/embedded/v1/info` reports it, as
# the embedded cluster has no jobset-controller-manager Deployment whose image tag would say it
# (an outside-mode cluster has one: `installed_deployment`).
EMULATED_VERSION = "v0.12.0"
JOBSET_NAMESPACE, JOBSET_DEPLOYMENT = "jobset-system", "jobset-controller-manager"


def installed_deployment() -> tuple[dict[str, Any], dict[str, Any]]:
    """(the Deployment, its status) as JobSet's release manifest installs them
    (kubernetes-sigs/jobset config/components/manager: `jobset-controller-manager` in
    `jobset-system`, its container `manager` running `registry.k8s.io/jobset/jobset:<release>`):
    what `reslice preflight` reads on a real cluster to learn the release. Stored, not run (no
    Deployment controller here): the controller above stands for it."""
    labels = {"control-plane": "controller-manager"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": JOBSET_DEPLOYMENT, "namespace": JOBSET_NAMESPACE, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {"name": "manager", "image": f"registry.k8s.io/jobset/jobset:{EMULATED_VERSION}"}
                    ]
                },
            },
        },
    }
    return deployment, {"replicas": 1, "readyReplicas": 1, "availableReplicas": 1, "updatedReplicas": 1}


class JobSetController(ControllerLoop):
    name = "jobset-controller"

    def __init__(self, store: Any, events: Any = None) -> None:
        super().__init__(store, events)
        from launcher.embedded.store.store import RESOURCES

        self.jobsets = RESOURCES["jobsets"]
        self.jobs = RESOURCES["jobs"]
        self.services = RESOURCES.get("services")
        self.recorder = EventRecorder(store, "jobset-controller")
        self._keys: dict[str, tuple[str, str]] = {}  # jobset uid → (ns, name)

    def resync(self) -> None:
        items, _ = self.store.list(self.jobsets)
        for js in items:
            self._keys[objects.meta(js)["uid"]] = objects.key_of(js)
            self.enqueue(objects.key_of(js))

    def keys_for(self, event: str, res: Any, obj: Mapping[str, Any]) -> list[Hashable]:
        if res.plural == "jobsets":
            if event == "DELETED":
                self._keys.pop(objects.meta(obj)["uid"], None)
                return []
            self._keys[objects.meta(obj)["uid"]] = objects.key_of(obj)
            return [objects.key_of(obj)]
        if res.plural == "jobs":
            owner = objects.controller_uid(obj)
            if owner in self._keys:
                return [self._keys[owner]]
        return []

    def reconcile(self, key: Hashable) -> float | None:
        ns, name = cast("tuple[str, str]", key)  # keys_for enqueues (namespace, name)
        try:
            js = self.store.get(self.jobsets, ns, name)
        except Exception as e:
            if getattr(e, "code", None) == 404:
                return None
            raise
        if objects.pod_deleting(js):
            return None
        managed_by = (js.get("spec") or {}).get("managedBy")
        if managed_by and managed_by != "jobset.sigs.k8s.io/jobset-controller":
            return None
        uid = objects.meta(js)["uid"]
        jobs, _ = self.store.list(self.jobs, namespace=ns, label_selector=f"{objects.JOBSET_NAME}={name}")
        jobs = [j for j in jobs if objects.controller_uid(j) == uid]
        svc_exists = True
        if self.services is not None and objects.meta(js).get("name"):
            try:
                self.store.get(self.services, ns, subdomain(js))
            except Exception as e:
                if getattr(e, "code", None) != 404:
                    raise
                svc_exists = False
        actions = decide(js, jobs, svc_exists, objects.now())
        if actions.delete_jobset:
            self.store.delete(self.jobsets, ns, name, propagation="Foreground")
            return None
        for jname in actions.delete_jobs:
            try:
                self.store.delete(self.jobs, ns, jname, propagation="Foreground")
            except Exception as e:
                if getattr(e, "code", None) != 404:
                    raise
        if actions.service is not None and self.services is not None:
            try:
                self.store.create(self.services, actions.service, ns)
            except Exception as e:
                if getattr(e, "code", None) != 409:
                    raise
        for job in actions.create_jobs:
            try:
                self.store.create(self.jobs, job, ns)
            except Exception as e:
                if getattr(e, "code", None) != 409:
                    self.recorder.event(js, "Warning", "JobCreationFailed", str(e))
                    raise
        for jname, suspend in actions.suspend_jobs.items():
            patch: dict = {"suspend": suspend}
            if (template := actions.resume_templates.get(jname)) is not None:
                patch["template"] = template  # upstream's resumeJob: one Update with the unsuspend
            self.store.patch(self.jobs, ns, jname, {"spec": patch}, "merge")
        status = dict(actions.status)
        if not status.get("conditions"):
            status.pop("conditions", None)  # omitempty, as the API serializes it
        if status != (js.get("status") or {}):
            js = dict(js)
            js["status"] = status
            self.store.update(self.jobsets, js, subresource="status")
        for etype, reason, msg in actions.events:
            self.recorder.event(js, etype, reason, msg)
        return actions.requeue_after
