"""The kubelet of every fake node: runs bound pods and reports their status.

Process mode runs each container through the cluster's container runtime (`runtimes.py`): its
command as a local process in its own process group (the process runtime, the default), or its
image with `podman run` (the podman runtime), output captured to a log file; simulate mode runs nothing and moves pods through phases on command
(`finish`) or after a fixed time — for controller tests with thousands of pods. The mode is chosen
per node pool.

Termination: a pod with a deletionTimestamp gets SIGTERM, then SIGKILL after its grace period, its
terminal status is written, and it is deleted with grace 0 (the graceful-deletion handshake). The
node-shutdown path (`shutdown`) is the kubelet's graceful node shutdown on a spot preemption: a
DisruptionTarget condition first, then the same SIGTERM/grace/SIGKILL, and the pod ends Failed with
reason Terminated — left in the API, as the real kubelet leaves it. A host crash (`crash`) kills
the processes and reports nothing while the host is down (its node cut off: `partitioned`); back
after the reboot, the kubelet does what upstream's does (`_rebooted`): a `restartPolicy: Never` pod
`Failed`, its container's `lastState.terminated` and then `state.terminated` ContainerStatusUnknown,
exit 137 (docs/embedded.md "Faults").

Here: the pod lifecycle (start, restart in place, signal, finalize; status writes). Processes and
logs: `runtimes.py` (`processes.py`, `podman.py`); a run's state: `podrun.py`; the statuses: `podstatus.py`. Run by
`cluster.EmbeddedCluster`; `faults.py` calls `kill`, `crash`, `disrupt` and `terminate`.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

from launcher.core import rfc3339
from launcher.core.words import PodRuntime
from launcher.embedded.controllers.runtime import ControllerLoop, EventRecorder, log
from launcher.embedded.kubelet import podenv
from launcher.embedded.kubelet.podrun import PodRun, crash_backoff_s
from launcher.embedded.kubelet.podstatus import (
    config_error_status,
    crashed_status,
    disrupted_status,
    exit_code,
    rebooted_status,
    restarted_status,
    running_status,
    terminated_status,
)
from launcher.embedded.kubelet.runtimes import make_runtime
from launcher.embedded.kubelet.volumes import PodAccess
from launcher.embedded.types import objects


class Kubelet(ControllerLoop):
    """Serves every node of the cluster; `simulated(node)` picks the mode per node pool."""

    name = "kubelet"

    def __init__(
        self,
        store: Any,
        log_dir: Path,
        simulated: Callable[[str], bool],
        sim_duration_s: float | None = None,
        sim_term_exit_code: int = 143,
        cwd: Path | None = None,
        events: Any = None,
        runtime: str = PodRuntime.PROCESS,
        shared: tuple[Path, ...] = (),
        access: PodAccess | None = None,
    ) -> None:
        super().__init__(store, events)
        from launcher.embedded.store.store import RESOURCES

        self.pods = RESOURCES["pods"]
        self.nodes = RESOURCES["nodes"]
        self.simulated = simulated
        self.sim_duration_s = sim_duration_s
        self.sim_term_exit_code = sim_term_exit_code
        self.runtime = make_runtime(runtime, store, log_dir, cwd or Path.cwd(), shared, access)
        self.recorder = EventRecorder(store, "kubelet")
        self._runs: dict[str, PodRun] = {}  # pod uid → run
        self._runs_lock = threading.Lock()
        self._known_nodes: set[str] = set()
        self._crashed: set[str] = set()  # pod uids whose host crashed: nothing reports them
        # Nodes cut off from the API server (a partition): their kubelet neither reads nor writes
        # the API; their processes keep running. Healing resyncs them.
        self.partitioned: set[str] = set()
        # Node -> seconds its kubelet takes to pull a pod's image before starting it (a fresh GKE node
        # pulls a multi-GB jax[tpu] image: minutes); the pod stays Pending, bound, meanwhile. Set by
        # tests (a slice whose replacement pods take minutes to run); none by default.
        self.pull_delay_s: dict[str, float] = {}
        self._pulling: dict[str, float] = {}  # pod uid -> monotonic time its pull ends

    # -- wiring --------------------------------------------------------------------------------
    def resync(self) -> None:
        nodes, _ = self.store.list(self.nodes)
        self._known_nodes = {objects.meta(n)["name"] for n in nodes}
        pods, _ = self.store.list(self.pods)
        for p in pods:
            if (p.get("spec") or {}).get("nodeName"):
                self.enqueue((objects.meta(p)["uid"], *objects.key_of(p)))

    def keys_for(self, event: str, res: Any, obj: Mapping[str, Any]) -> list[Hashable]:
        if res.plural == "nodes":
            name = objects.meta(obj)["name"]
            if event == "DELETED":
                self._known_nodes.discard(name)
            else:
                self._known_nodes.add(name)
            return []
        if res.plural != "pods":
            return []
        uid = objects.meta(obj).get("uid")
        if not (obj.get("spec") or {}).get("nodeName") and uid not in self._runs:
            return []
        return [(uid, *objects.key_of(obj))]

    def log_stream(self, namespace: str, name: str, container: str, follow: bool) -> Iterator[bytes]:
        """The API server's log source: a container's log, followed while its pod runs here."""

        def run_of(ns: str, pod: str) -> PodRun | None:
            return next((r for r in self.runs() if (r.namespace, r.name) == (ns, pod)), None)

        return self.runtime.log_stream(namespace, name, container, follow, run_of)

    def stop(self) -> None:
        super().stop()
        with self._runs_lock:
            runs = list(self._runs.values())
        for r in runs:
            with r.lock:
                r.terminating = True  # a kubelet going away restarts nothing in place
            if not r.simulate and self._end_backoff(r):
                continue
            self._signal(r, signal.SIGKILL)
        for r in runs:
            r.done.wait(5)
        self.runtime.stop()

    # -- reconcile -----------------------------------------------------------------------------
    def reconcile(self, key: Hashable) -> float | None:
        uid, ns, name = cast("tuple[str, str, str]", key)  # keys_for enqueues (uid, namespace, name)
        try:
            pod = self.store.get(self.pods, ns, name)
        except Exception as e:
            if getattr(e, "code", None) != 404:
                raise
            pod = None
        if pod is not None and objects.meta(pod).get("uid") != uid:
            pod = None
        if uid in self._crashed:
            self._reconcile_crashed(uid, pod)
            return None
        with self._runs_lock:
            run = self._runs.get(uid)
        if pod is None:
            # Removed from the API (force delete, PodGC): nothing is left to report to.
            if run is not None:
                run.cause = run.cause or "gone"
                self._signal(run, signal.SIGKILL)
            self.runtime.forget(ns, name)
            return None
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or node in self.partitioned:
            return None
        if objects.pod_terminal(pod):
            if run is not None and not run.done.is_set():
                self._signal(run, signal.SIGKILL)
            if objects.pod_deleting(pod):
                self._delete_now(ns, name, uid)
            return None
        if objects.pod_deleting(pod):
            grace = float(objects.meta(pod).get("deletionGracePeriodSeconds") or 0)
            if run is None:
                # Never started here: nothing to stop, but the kubelet still reports a terminal
                # phase before its grace-0 delete (Kubernetes >= 1.27). Without it the Job
                # controller never releases the pod's tracking finalizer and the pod stays
                # Terminating: a follower bound just as its Job was deleted held up BlockingRecreate.
                self._lost(pod)
                self._delete_now(ns, name, uid)
            else:
                if not run.terminating:
                    for c in (pod.get("spec") or {}).get("containers") or []:
                        self.recorder.event(
                            pod, "Normal", "Killing", f"Stopping container {c['name']}", host=node
                        )
                self.terminate(run, grace, cause="delete")
            return None
        if run is None:
            if node not in self._known_nodes:
                return None
            if objects.pod_phase(pod) == "Running":
                self._lost(pod)  # ran under an earlier kubelet (cluster restarted): its processes are gone
            else:
                self._start(pod, node)
        return None

    def _reconcile_crashed(self, uid: str, pod: dict[str, Any] | None) -> None:
        """A pod whose host crashed: nothing reports it while the host is down (its node cut off,
        `partitioned`); once the host is back, its kubelet does what upstream's does after a reboot
        (`_rebooted`), and completes a deletion that waited for it."""
        if pod is None:
            self._crashed.discard(uid)
            return None
        node = (pod.get("spec") or {}).get("nodeName") or ""
        if node in self.partitioned:
            return None
        self._crashed.discard(uid)
        if not objects.pod_terminal(pod):
            if objects.pod_deleting(pod):
                self._lost(pod)
            else:
                self._rebooted(pod, node)
        if objects.pod_deleting(pod):
            self._delete_now(*objects.key_of(pod), uid)
        return None

    def _rebooted(self, pod: dict[str, Any], node: str) -> None:
        """Back after the reboot, the kubelet finds the pod's container gone from the runtime: two
        status writes as upstream's (podstatus.rebooted_status, then TerminatePod's `state.terminated`
        for a pod now Failed); a pod that restarts its containers is started again."""
        m = objects.meta(pod)
        run = PodRun(m["uid"], m.get("namespace") or "default", m["name"], node, True)
        when = rfc3339.stamp()
        self._write(run, lambda p: rebooted_status(p, when))
        if (pod.get("spec") or {}).get("restartPolicy") != "Never":
            # Started again as a new run (its restartCount and lastState start over: a simplification).
            self._start(self.store.get(self.pods, run.namespace, run.name), node)
            return
        codes = {c["name"]: 137 for c in (pod.get("spec") or {}).get("containers") or []}
        start = (pod.get("status") or {}).get("startTime") or ""
        self._write(run, lambda p: terminated_status(p, codes, start, {}, {}, False, when, lost=True))

    def _lost(self, pod: dict[str, Any]) -> None:
        """Failed, every container 137 ContainerStatusUnknown: what the kubelet reports for
        containers it cannot find when the pod terminates (status manager's TerminatePod)."""
        m = objects.meta(pod)
        run = PodRun(m["uid"], m.get("namespace") or "default", m["name"], pod["spec"]["nodeName"], True)
        codes = {c["name"]: 137 for c in (pod.get("spec") or {}).get("containers") or []}
        start = (pod.get("status") or {}).get("startTime") or ""
        self._write(
            run, lambda p: terminated_status(p, codes, start, {}, {}, False, rfc3339.stamp(), lost=True)
        )

    # -- starting ------------------------------------------------------------------------------
    def _start(self, pod: dict[str, Any], node: str) -> None:
        m = objects.meta(pod)
        if self._pulling_image(pod, node):
            return
        run = PodRun(m["uid"], m.get("namespace") or "default", m["name"], node, self.simulated(node))
        run.started_at = rfc3339.stamp()
        run.restart_policy = (pod.get("spec") or {}).get("restartPolicy") or "Always"
        with self._runs_lock:
            self._runs[run.uid] = run
        if run.simulate:
            self._write(run, lambda p: running_status(p, run.started_at, {}))
            if self.sim_duration_s is not None:
                t = threading.Timer(self.sim_duration_s, self.finish_run, args=(run, 0))
                t.daemon = True
                t.start()
            return
        try:
            node_obj = self.store.get(self.nodes, None, node)
            self.runtime.spawn(run, pod, node_obj)
        except podenv.ContainerConfigError as e:
            self._config_error(run, pod, str(e), e.reason)
            return
        except Exception as e:
            log.exception("start %s/%s", run.namespace, run.name)
            for c in (pod.get("spec") or {}).get("containers") or []:
                run.exit_codes.setdefault(c["name"], 128)
            self.recorder.event(pod, "Warning", "Failed", f"Error: {e}", host=node)
            self._finalize(run)
            return
        ids = dict(run.ids)
        self._write(run, lambda p: running_status(p, run.started_at, ids, run.pod_ip, run.images))
        for c in run.procs:
            self.recorder.event(pod, "Normal", "Started", f"Started container {c}", host=node)
        for c in run.procs:
            self.runtime.watch(run, c, self._on_exit)

    def _pulling_image(self, pod: dict[str, Any], node: str) -> bool:
        """Whether the pod's image is still being pulled (`pull_delay_s`): the first time, a
        `Pulling` event as upstream's kubelet records one, and the pod is looked at again when the
        pull is done."""
        uid = objects.meta(pod)["uid"]
        delay = self.pull_delay_s.get(node, 0.0)
        if delay <= 0 and uid not in self._pulling:
            return False
        now = time.monotonic()
        if uid not in self._pulling:
            self._pulling[uid] = now + delay
            for c in (pod.get("spec") or {}).get("containers") or []:
                self.recorder.event(
                    pod, "Normal", "Pulling", f'Pulling image "{c.get("image", "")}"', host=node
                )
            key = (uid, *objects.key_of(pod))
            t = threading.Timer(delay, self.enqueue, args=(key,))
            t.daemon = True
            t.start()
            return True
        if now < self._pulling[uid]:
            return True
        del self._pulling[uid]
        return False

    def _restart_in_place(self, run: PodRun, names: list[str]) -> bool:
        """restartPolicy Always (any exit) or OnFailure (a non-zero exit): the kubelet restarts the
        container in the same pod, after the crash back-off; the pod stays Running. False when
        nothing restarts."""
        with run.lock:
            if run.terminating or run.cause is not None or run.done.is_set():
                return False
            again = [
                c
                for c in names
                if c in run.exit_codes
                and (
                    run.restart_policy == "Always"
                    or (run.restart_policy == "OnFailure" and run.exit_codes[c])
                )
            ]
            if not again:
                return False
            codes = {c: run.exit_codes.pop(c) for c in again}
            finished = {c: run.finished_at.pop(c, rfc3339.stamp()) for c in again}
            run.backoff.update(codes)
            run.restarts += 1
            delay = crash_backoff_s(run.restarts)
        self._write(run, lambda p: crashed_status(p, codes, finished, delay, rfc3339.stamp()))
        if delay > 0:
            t = threading.Timer(delay, self._relaunch, args=(run, again))
            t.daemon = True
            t.start()
        else:
            self._relaunch(run, again)
        return True

    def _relaunch(self, run: PodRun, names: list[str]) -> None:
        with run.lock:
            if run.terminating or run.done.is_set():
                return  # terminate() accounted for the waiting containers
            for c in names:
                run.backoff.pop(c, None)
        with run.relaunching:
            if not run.simulate:
                for c in names:
                    self.runtime.launch(run, c)
                    self.runtime.watch(run, c, self._on_exit)
            ids = dict(run.ids)
            self._write(run, lambda p: restarted_status(p, names, ids, rfc3339.stamp()))

    def _config_error(self, run: PodRun, pod: Mapping[str, Any], msg: str, reason: str) -> None:
        """CreateContainerConfigError: the pod stays Pending; retried on the next event."""
        with self._runs_lock:
            self._runs.pop(run.uid, None)
        self._write(run, lambda p: config_error_status(p, msg, reason))
        self.recorder.event(pod, "Warning", "Failed", f"Error: {msg}", host=run.node)
        self.enqueue((run.uid, run.namespace, run.name), after=2.0)

    def _on_exit(self, run: PodRun, cname: str, rc: int) -> None:
        with run.relaunching:  # a restarted container's Running status is written before its exit's
            pass
        with run.lock:
            run.exit_codes[cname] = exit_code(rc)
            run.finished_at[cname] = rfc3339.stamp()
        if self._restart_in_place(run, [cname]):
            return
        with run.lock:
            last = len(run.exit_codes) == len(run.procs) and not run.backoff
        if last:
            self._finalize(run)

    # -- stopping ------------------------------------------------------------------------------
    def _signal(self, run: PodRun, sig: int) -> None:
        if run.simulate:
            if sig == signal.SIGKILL:
                self.finish_run(run, 137)
            return
        self.runtime.signal(run, sig)

    def terminate(self, run: PodRun, grace: float, cause: str) -> None:
        """SIGTERM now, SIGKILL after `grace` seconds (idempotent; a shorter grace wins)."""
        with run.lock:
            if run.done.is_set():
                return
            run.cause = run.cause or cause
            first = not run.terminating
            run.terminating = True
            deadline = time.monotonic() + max(grace, 0.0)
            if deadline < run.deadline:
                run.deadline = deadline
                if run.kill_timer is not None:
                    run.kill_timer.cancel()
                run.kill_timer = threading.Timer(max(grace, 0.0), self._signal, args=(run, signal.SIGKILL))
                run.kill_timer.daemon = True
                run.kill_timer.start()
        if run.simulate:
            self.finish_run(run, self.sim_term_exit_code if grace > 0 else 137)
            return
        if self._end_backoff(run):
            return
        if first:
            self._signal(run, signal.SIGTERM)

    def _end_backoff(self, run: PodRun) -> bool:
        """Containers waiting out a crash back-off end with their last exit; True when that was the
        pod's last running container (it is finalized)."""
        with run.lock:
            waiting, run.backoff = dict(run.backoff), {}
            run.exit_codes.update(waiting)
            last = bool(waiting) and len(run.exit_codes) == len(run.procs)
        if last:
            self._finalize(run)
        return last

    def kill(self, uid: str) -> bool:
        """Hard kill (SIGKILL) of a running pod's processes: it ends Failed with exit code 137."""
        with self._runs_lock:
            run = self._runs.get(uid)
        if run is None or run.done.is_set():
            return False
        self._signal(run, signal.SIGKILL)
        return True

    def crash(self, uid: str) -> bool:
        """The pod's host crashes: its processes die (SIGKILL) and nothing reports them until the
        host is back (`_reconcile_crashed`: at once, unless the caller cut its node off first)."""
        with self._runs_lock:
            run = self._runs.get(uid)
        if run is None or run.done.is_set():
            return False
        with run.lock:
            run.cause = "crash"
        self._crashed.add(uid)
        self._signal(run, signal.SIGKILL)
        run.done.wait(10)  # the processes are gone before the host comes back
        self.enqueue((uid, run.namespace, run.name))
        return True

    def finish_run(self, run: PodRun, code: int) -> None:
        """Simulate mode: every container of the pod exits with `code`."""
        with run.lock:
            if run.done.is_set() or run.exit_codes:
                return
            when = rfc3339.stamp()
            for c in self._container_names(run):
                run.exit_codes[c] = code
                run.finished_at[c] = when
            run.backoff = {}
        if self._restart_in_place(run, list(run.exit_codes)):
            return
        self._finalize(run)

    def _container_names(self, run: PodRun) -> list[str]:
        try:
            pod = self.store.get(self.pods, run.namespace, run.name)
            return [c["name"] for c in (pod.get("spec") or {}).get("containers") or []]
        except Exception:
            return ["main"]

    def runs(self) -> list[PodRun]:
        with self._runs_lock:
            return list(self._runs.values())

    def _finalize(self, run: PodRun) -> None:
        if run.kill_timer is not None:
            run.kill_timer.cancel()
        ids = dict(run.ids)
        if run.cause not in ("gone", "crash"):
            self._write(
                run,
                lambda p: terminated_status(
                    p,
                    run.exit_codes,
                    run.started_at,
                    run.finished_at,
                    ids,
                    run.cause == "shutdown",
                    rfc3339.stamp(),
                ),
            )
            if run.cause == "delete":
                self._delete_now(run.namespace, run.name, run.uid)
        with self._runs_lock:
            self._runs.pop(run.uid, None)
        run.done.set()

    # -- API writes ----------------------------------------------------------------------------
    def _write(self, run: PodRun, mutate: Callable[[dict[str, Any]], dict[str, Any]]) -> bool:
        """Read-modify-write of the pod status, retried on conflict."""
        if run.node in self.partitioned:
            return False  # the API is out of reach; the status is reported after healing (resync)
        for _ in range(20):
            try:
                pod = self.store.get(self.pods, run.namespace, run.name)
                if objects.meta(pod).get("uid") != run.uid:
                    return False
                pod["status"] = mutate(pod)
                self.store.update(self.pods, pod, subresource="status")
                return True
            except Exception as e:
                code = getattr(e, "code", None)
                if code == 404:
                    return False
                if code != 409:
                    log.exception("status of %s/%s", run.namespace, run.name)
                    return False
                time.sleep(0.01)
        return False

    def _delete_now(self, ns: str, name: str, uid: str) -> None:
        try:
            pod = self.store.get(self.pods, ns, name)
            if objects.meta(pod).get("uid") == uid:
                self.store.delete(self.pods, ns, name, grace_period_seconds=0)
        except Exception as e:
            if getattr(e, "code", None) != 404:
                log.exception("delete %s/%s", ns, name)

    def disrupt(self, uid: str, reason: str, message: str) -> None:
        """Add a DisruptionTarget condition to a running pod (before terminating it)."""
        with self._runs_lock:
            run = self._runs.get(uid)
        if run is None:
            return
        self._write(run, lambda p: disrupted_status(p, reason, message))
