"""The Job controller (batch/v1), the part of it JobSet relies on: Indexed and NonIndexed Jobs,
`podFailurePolicy`, `backoffLimit`, `backoffLimitPerIndex` with `maxFailedIndexes` and the `FailIndex`
action, `suspend`, and the status and conditions the upstream
controller (Kubernetes 1.31+) writes: `FailureTarget` then `Failed` once no pod is left running,
`SuccessCriteriaMet` then `Complete`.

It also does what JobSet's pod webhooks do for exclusive placement, because on a real cluster they
act on the pods this controller creates: the leader pod (completion index 0) gets required pod
affinity to its own Job and anti-affinity to every other Job over the topology key; a follower is
admitted only once its leader is scheduled, with a nodeSelector for the leader's topology domain.

This module is the I/O half, run by `cluster.EmbeddedCluster` on the runtime's work queues: it
reads a Job and its pods, calls the pure `jobactions.decide` and applies the `JobActions` (pods
created and deleted, the status written, events, the job-tracking finalizer released). The rules
live in `jobactions.py` (status, conditions), `jobfailures.py` (failure policy, backoff, per-index
limits) and `jobpods.py` (the pods it creates).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any, cast

from launcher.embedded.controllers.clock import REAL, Clock
from launcher.embedded.controllers.jobactions import decide, wire_status
from launcher.embedded.controllers.jobpods import (
    TRACKING_FINALIZER,
    exclusive_topology,
    finished,
    leader_node,
)
from launcher.embedded.controllers.runtime import Batched, ControllerLoop, EventRecorder
from launcher.embedded.types import objects

SYNC_BATCH_S = 1.0  # upstream syncJobBatchPeriod


class JobController(ControllerLoop):
    name = "job-controller"

    def __init__(self, store: Any, events: Any = None, clock: Clock = REAL) -> None:
        super().__init__(store, events, clock)
        from launcher.embedded.store.store import RESOURCES

        self.jobs = RESOURCES["jobs"]
        self.pods = RESOURCES["pods"]
        self.nodes = RESOURCES["nodes"]
        self.recorder = EventRecorder(store, "job-controller")
        self._terminal: dict[str, dict[str, dict[str, Any]]] = {}  # job uid → pod uid → pod
        self._job_keys: dict[str, tuple[str, str]] = {}  # job uid → (ns, name)
        self._generations: dict[str, int | None] = {}  # job uid → last generation seen
        self._suspended_out: dict[str, set[str]] = {}  # job uid → pods deleted by its suspension

    def resync(self) -> None:
        jobs, _ = self.store.list(self.jobs)
        for j in jobs:
            self._job_keys[objects.meta(j)["uid"]] = objects.key_of(j)
            self.enqueue(("job", *objects.key_of(j)))

    def keys_for(self, event: str, res: Any, obj: Mapping[str, Any]) -> list[Hashable]:
        # As upstream (syncJobBatchPeriod), pod events and the Job's own status writes are batched:
        # a slice of 768 pods starting up costs a few syncs, not one per pod update, each
        # re-reading every pod. A new Job or a spec change syncs at once.
        if res.plural == "jobs":
            uid = objects.meta(obj)["uid"]
            if event == "DELETED":
                self._terminal.pop(uid, None)
                self._job_keys.pop(uid, None)
                self._generations.pop(uid, None)
                self._suspended_out.pop(uid, None)
                # Its pods that already finished may have had their events before the deletion
                # and will get no more: release them now (upstream's orphan-pod cleanup).
                return [("orphans", objects.meta(obj).get("namespace"), uid)]
            self._job_keys[uid] = objects.key_of(obj)
            generation = objects.meta(obj).get("generation")
            status_only = event == "MODIFIED" and self._generations.get(uid) == generation
            self._generations[uid] = generation
            key = ("job", *objects.key_of(obj))
            return [Batched(key, SYNC_BATCH_S) if status_only else key]
        if res.plural == "pods" and event != "DELETED":
            owner = objects.controller_uid(obj)
            if owner in self._job_keys:
                return [Batched(("job", *self._job_keys[owner]), SYNC_BATCH_S)]
            if TRACKING_FINALIZER in (objects.meta(obj).get("finalizers") or []):
                return [("orphan", *objects.key_of(obj))]
        return []

    def _leader_domain(self, job: Mapping[str, Any], pods: list[Mapping[str, Any]]) -> str | None:
        topo = exclusive_topology(job)
        node = leader_node(pods) if topo else None
        if topo is None or node is None:
            return None
        try:
            return objects.labels(self.store.get(self.nodes, None, node)).get(topo)
        except Exception:
            return None

    def _release(self, pods: list[Mapping[str, Any]]) -> None:
        """Remove the tracking finalizer (the pod may now leave the API)."""
        for p in pods:
            fins = [f for f in objects.meta(p).get("finalizers") or [] if f != TRACKING_FINALIZER]
            ns, name = objects.key_of(p)
            try:
                self.store.patch(self.pods, ns, name, {"metadata": {"finalizers": fins}}, "merge")
            except Exception as e:
                if getattr(e, "code", None) != 404:
                    raise

    def reconcile(self, key: Hashable) -> float | None:
        kind, ns, name = cast("tuple[str, str, str]", key)  # keys_for enqueues (kind, namespace, name)
        if kind == "orphan":
            return self._reconcile_orphan(ns, name)
        if kind == "orphans":  # name is the deleted Job's uid
            pods, _ = self.store.list(
                self.pods, namespace=ns, label_selector=f"{objects.CONTROLLER_UID}={name}"
            )
            self._release(
                [
                    p
                    for p in pods
                    if TRACKING_FINALIZER in (objects.meta(p).get("finalizers") or []) and finished(p)
                ]
            )
            return None
        try:
            job = self.store.get(self.jobs, ns, name)
        except Exception as e:
            if getattr(e, "code", None) == 404:
                return None
            raise
        uid = objects.meta(job)["uid"]
        pods, _ = self.store.list(self.pods, namespace=ns, label_selector=f"{objects.CONTROLLER_UID}={uid}")
        pods = [p for p in pods if objects.controller_uid(p) == uid]
        tracked = [p for p in pods if TRACKING_FINALIZER in (objects.meta(p).get("finalizers") or [])]
        if objects.pod_deleting(job):
            self._release([p for p in tracked if finished(p)])  # a Job being deleted lets its pods go
            return None
        ledger = self._terminal.setdefault(uid, {})
        release = [p for p in tracked if finished(p)]
        for p in release:
            if objects.pod_terminal(p):
                ledger[objects.meta(p)["uid"]] = p
        out = self._suspended_out.setdefault(uid, set())
        out.update(
            objects.meta(p)["uid"]
            for p in pods
            if (job.get("spec") or {}).get("suspend") and objects.pod_deleting(p)
        )
        actions = decide(job, pods, ledger, self._leader_domain(job, pods), objects.now(), out)
        if (job.get("spec") or {}).get("suspend"):
            out.update(objects.meta(p)["uid"] for p in pods if objects.meta(p)["name"] in actions.delete)
        for pname in actions.delete:
            try:
                self.store.delete(self.pods, ns, pname)
                self.recorder.event(job, "Normal", "SuccessfulDelete", f"Deleted pod: {pname}")
            except Exception as e:
                if getattr(e, "code", None) != 404:
                    raise
        for pod in actions.create:
            created = self.store.create(self.pods, pod, ns)
            self.recorder.event(
                job, "Normal", "SuccessfulCreate", f"Created pod: {objects.meta(created)['name']}"
            )
        status = wire_status(actions.status)
        if status != (job.get("status") or {}):
            job = dict(job)
            job["status"] = status
            self.store.update(self.jobs, job, subresource="status")
        self._release(release)
        for etype, reason, msg in actions.events:
            self.recorder.event(job, etype, reason, msg)
        return actions.requeue_after

    def _reconcile_orphan(self, ns: str, name: str) -> float | None:
        try:
            pod = self.store.get(self.pods, ns, name)
        except Exception as e:
            if getattr(e, "code", None) == 404:
                return None
            raise
        owner = objects.controller_uid(pod)
        if owner in self._job_keys:
            self.enqueue(("job", *self._job_keys[owner]))
            return None
        if finished(pod):
            self._release([pod])
        return None
