"""Kueue's part in the embedded cluster, played through the API as Kueue plays it on GKE: a queued
JobSet (the `kueue.x-k8s.io/queue-name` label) is its own Workload, created suspended and admitted by
unsuspending it, and evicted or preempted by suspending it again. Only that, no quota arithmetic:
which JobSets are held (no quota, a pending admission check) is what the caller says.

Upstream (kubernetes-sigs/kueue, docs/gke.md "Kueue" cites the same):
- a JobSet of a queue is created suspended (pkg/controller/jobframework/defaults.go
  ApplyDefaultForSuspend; reslice renders it so, launcher/core/render.py);
- admission unsuspends it (jobframework/reconciler.go startJob -> pkg/controller/jobs/jobset/
  jobset_controller.go RunWithPodSetsInfo: `spec.suspend = false`, the admitted podsets' node
  selectors merged into the templates: here what `placement` names); JobSet copies them into its
  Jobs' templates as it resumes them (jobset pkg/controllers/jobset_controller.go resumeJob;
  controllers/jobsetactions.resumed_template);
- eviction or preemption suspends it (reconciler.go stopJob with StopReasonWorkloadEvicted ->
  JobSet.Suspend: `spec.suspend = true`, and RestorePodSetsInfo takes the merged selector out); the JobSet controller then suspends its Jobs and the Job
  controller deletes their pods (the embedded ones do as upstream's: controllers/jobsetactions.py,
  controllers/job.py). The Workload is requeued and admitted again when it fits;
- under a ProvisioningRequest admission check (pkg/controller/admissionchecks/provisioning/
  controller.go) the Workload is admitted only once the check is Ready: a held JobSet released
  later is that case.

Used by the e2e tests (tests/e2e/test_e2e_kueue.py) through the official client.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from launcher.core.labels import API_VERSION, LABEL_QUEUE

GROUP, VERSION = API_VERSION.split("/")
CONFLICT = 409
CONFLICT_TRIES = 5


@dataclass
class Kueue:
    """Admits every suspended JobSet of a queue in `namespace` except the `held` ones (by name).
    `placement`: JobSet name -> the node selector its admission merges into every replicated Job's
    pod template (an admitted flavor's labels, or the domain TAS assigned), restored on eviction."""

    api: client.ApiClient
    namespace: str = "default"
    held: set[str] = field(default_factory=set)
    placement: dict[str, dict[str, str]] = field(default_factory=dict)
    admitted: list[str] = field(default_factory=list)  # names, in the order admitted (again)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _merged: dict[str, dict[str, str]] = field(default_factory=dict)  # what an admission merged in

    def _objects(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def _suspend(self, name: str, suspend: bool) -> None:
        """One Update, as Kueue's: `RunWithPodSetsInfo` unsuspends and merges the admitted podsets'
        node selector into the templates; `stopJob` suspends and `RestorePodSetsInfo` takes it out.
        An Update that lost a race with the JobSet controller (409 Conflict: the object changed
        since it was read) is made again on the newer object, as Kueue's reconciler does when
        controller-runtime requeues its error."""
        with self._lock:
            selector = self.placement.get(name, {}) if not suspend else {}
            undo = self._merged.pop(name, {}) if suspend else {}
            if selector:
                self._merged[name] = selector
        for attempt in range(CONFLICT_TRIES):
            # The client types custom objects `object`: a JobSet's JSON is a dict.
            js: Any = self._objects().get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "jobsets", name
            )
            for rjob in js["spec"].get("replicatedJobs") or []:
                pod = rjob["template"]["spec"]["template"].setdefault("spec", {})
                nodes = {k: v for k, v in (pod.get("nodeSelector") or {}).items() if k not in undo}
                if nodes or selector:
                    pod["nodeSelector"] = {**nodes, **selector}
            js["spec"]["suspend"] = suspend
            try:
                self._objects().replace_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, "jobsets", name, js
                )
                return
            except client.ApiException as e:
                if e.status != CONFLICT or attempt == CONFLICT_TRIES - 1:
                    raise

    def hold(self, name: str) -> None:
        """Admit the JobSet no more (no quota for it, or its admission check pending)."""
        with self._lock:
            self.held.add(name)

    def release(self, name: str) -> None:
        """Let the next reconcile admit it (quota freed, or its ProvisioningRequest provisioned)."""
        with self._lock:
            self.held.discard(name)

    def evict(self, name: str) -> None:
        """Evict (preempt) the admitted JobSet: held, and suspended again."""
        self.hold(name)
        self._suspend(name, True)

    def reconcile(self) -> list[str]:
        """Admit every queued JobSet that is suspended and not held; the names admitted."""
        listed: Any = self._objects().list_namespaced_custom_object(  # typed `object`, as above
            GROUP, VERSION, self.namespace, "jobsets", label_selector=LABEL_QUEUE
        )
        items = listed["items"]
        out = []
        for js in items:
            name = js["metadata"]["name"]
            with self._lock:
                held = name in self.held
            if (
                (js.get("spec") or {}).get("suspend")
                and not held
                and not js["metadata"].get("deletionTimestamp")
            ):
                self._suspend(name, False)
                out.append(name)
        self.admitted += out
        return out

    def run(self, stop: threading.Event, every_s: float = 0.2) -> None:
        """Reconcile until `stop` is set (Kueue's own loop is watch-driven; a short poll is as good here)."""
        while not stop.wait(every_s):
            try:
                self.reconcile()
            except client.ApiException:  # a JobSet deleted between the list and the patch
                continue
