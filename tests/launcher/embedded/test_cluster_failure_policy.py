"""The renderer's failure policy on real processes: exit 42 restarts without spending maxRestarts,
exit 2 fails the JobSet at once, other exits restart and count until ReachedMaxRestarts, and
BlockingRecreate creates the next attempt only once every old pod is gone. (Disruptions — the
DisruptionTarget rule — are exercised by the fault tests.)"""

import threading

from kubernetes import watch

from tests.launcher.embedded.cluster_helpers import condition, rendered, running, terminal, wait_for


def per_attempt(codes: list[int], term_delay: float = 0.0) -> str:
    """Host 0 of slice 1 exits codes[attempt]; every other host exits 0 when that is 0, else runs
    until SIGTERM (and then takes term_delay seconds to exit 143, like a trainer saving a
    checkpoint). One failing pod, so the Job's failure message names a known pod."""
    return (
        "import os, signal, sys, time\n"
        "a = int(os.environ['RESLICE_RESTART_ATTEMPT']); s = int(os.environ['RESLICE_SLICE_INDEX'])\n"
        "h = int(os.environ['JOB_COMPLETION_INDEX'])\n"
        f"code = {codes!r}[min(a, {len(codes) - 1})]\n"
        f"signal.signal(signal.SIGTERM, lambda *_: (time.sleep({term_delay}), sys.exit(143)))\n"
        "if (s, h) == (1, 0) or code == 0:\n"
        f"    time.sleep({0.5 if term_delay else 0} if code else 0)  # let slice 0 arm its handler\n"
        "    sys.exit(code)\n"
        "time.sleep(60)\n"
    )


def total(events) -> int:
    return sum(e.count or 1 for e in events)


def test_exit_42_restarts_without_counting_toward_max_restarts():
    with running("tpu7x-2x2x2:2") as kube:
        kube.create_jobset(rendered("pre", per_attempt([42, 42, 0]), max_restarts=0))
        js = terminal(kube, "pre-0")
        st = js["status"]
        assert st["terminalState"] == "Completed"
        assert st["restarts"] == 2 and st.get("restartsCountTowardsMax", 0) == 0
        ev = kube.events("RestartJobSetAndIgnoreMaxRestartsFailurePolicyAction", "JobSet")
        assert total(ev) == 2 and ev[0].type == "Warning"
        assert (
            ev[0].message
            == "applying RestartJobSetAndIgnoreMaxRestarts failure policy action (first failed job: pre-0-slice-1)"
        )
        job_ev = kube.events("PodFailurePolicy", "Job")
        assert total(job_ev) == 2
        assert all("failed with exit code 42 matching FailJob rule at index 1" in e.message for e in job_ev)
        assert condition(js, "RestartingJobSet")["status"] == "False"
        assert {p.metadata.labels["jobset.sigs.k8s.io/restart-attempt"] for p in kube.pods()} == {"2"}


def test_exit_2_fails_the_jobset_at_once():
    with running("tpu7x-2x2x2:2") as kube:
        kube.create_jobset(rendered("cfg", per_attempt([2]), max_restarts=5))
        js = terminal(kube, "cfg-0")
        failed = condition(js, "Failed")
        assert js["status"]["terminalState"] == "Failed" and js["status"]["restarts"] == 0
        assert failed["reason"] == "FailJobSetFailurePolicyAction"
        assert (
            failed["message"] == "applying FailJobSet failure policy action (first failed job: cfg-0-slice-1)"
        )
        # Upstream emits a reconcile's events once its status update succeeded (jobset_controller.go,
        # updateJobSetStatus): the event may come after the terminal state is seen.
        (ev,) = wait_for(lambda: kube.events("FailJobSetFailurePolicyAction", "JobSet"), 10, "the event")
        assert (ev.type, ev.message) == ("Warning", failed["message"])
        job = kube.batch.read_namespaced_job("cfg-0-slice-1", "default")
        jc = next(c for c in job.status.conditions if c.type == "Failed")
        assert jc.reason == "PodFailurePolicy"
        assert jc.message.startswith("Container trainer for pod default/cfg-0-slice-1-0-")
        assert jc.message.endswith("failed with exit code 2 matching FailJob rule at index 2")

        # The failed Job stops its other host, and the finished JobSet deletes its still-active Job:
        # those pods are stopped and go away (a reconcile or two after the terminal state).
        def stopped() -> bool:
            others = [p for p in kube.pods() if not p.metadata.name.startswith("cfg-0-slice-1-0-")]
            return all(p.metadata.deletion_timestamp or p.status.phase != "Running" for p in others)

        wait_for(stopped, 10, "the other pods stopped or deleted")


def test_other_exits_restart_and_count_until_max_restarts():
    with running("tpu7x-2x2x2:2") as kube:
        kube.create_jobset(rendered("app", per_attempt([1, 3, 1]), max_restarts=2))
        js = terminal(kube, "app-0")
        st = js["status"]
        assert st["terminalState"] == "Failed"
        assert (st["restarts"], st["restartsCountTowardsMax"]) == (2, 2)
        failed = condition(js, "Failed")
        assert failed["reason"] == "ReachedMaxRestarts"
        assert (
            failed["message"]
            == "jobset failed due to reaching max number of restarts (first failed job: app-0-slice-1)"
        )
        assert total(kube.events("RestartJobSetFailurePolicyAction", "JobSet")) == 2
        assert condition(js, "RestartingJobSet")["status"] == "False"
        job_ev = kube.events("BackoffLimitExceeded", "Job")
        assert job_ev and all(e.message == "Job has reached the specified backoff limit" for e in job_ev)


def test_blocking_recreate_waits_until_every_old_pod_is_gone():
    with running("tpu7x-2x2x2:2") as kube:
        seen: list[tuple[str, str, str, bool]] = []
        stop = threading.Event()
        w = watch.Watch()

        def record():
            try:
                for ev in w.stream(kube.core.list_namespaced_pod, "default", timeout_seconds=30):
                    p = ev["object"]
                    labels = p.metadata.labels
                    seen.append(
                        (
                            ev["type"],
                            p.metadata.name,
                            labels["jobset.sigs.k8s.io/restart-attempt"],
                            bool(p.metadata.deletion_timestamp),
                        )
                    )
            except Exception:
                if not stop.is_set():  # the stream ends when the cluster stops
                    raise

        t = threading.Thread(target=record, daemon=True)
        t.start()
        # Attempt 0: slice 1 crashes; slice 0 takes 1 s to exit after SIGTERM. Attempt 1 succeeds.
        kube.create_jobset(rendered("blk", per_attempt([1, 0], term_delay=1.0)))
        # While the old pods terminate, the restart shows as a condition (JobSet v0.12).
        restarting = wait_for(
            lambda: (c := condition(kube.jobset("blk-0"), "RestartingJobSet")) and c["status"] == "True" and c
        )
        assert restarting["reason"] == "FailurePolicy_appFailure"  # the renderer's rule for crashes
        assert (
            restarting["message"]
            == "applying RestartJobSet failure policy action (first failed job: blk-0-slice-1)"
        )
        assert (
            kube.batch.list_namespaced_job(
                "default", label_selector="jobset.sigs.k8s.io/restart-attempt=1"
            ).items
            == []
        )
        js = terminal(kube, "blk-0")
        assert js["status"]["terminalState"] == "Completed" and js["status"]["restarts"] == 1
        kube.cluster.settle()

        def delivered() -> bool:  # the watch has caught up: its pods are those the API lists now
            last = {name: typ for typ, name, _, _ in list(seen)}
            live = {name for name, typ in last.items() if typ != "DELETED"}
            return live == {p.metadata.name for p in kube.core.list_namespaced_pod("default").items}

        wait_for(delivered, what="the watch to deliver what the store committed")
        stop.set()
        old_gone = max(i for i, (typ, _, att, _) in enumerate(seen) if typ == "DELETED" and att == "0")
        new_first = min(i for i, (typ, _, att, _) in enumerate(seen) if typ == "ADDED" and att == "1")
        assert old_gone < new_first, seen
        # And the slow one really was terminating in between (a deletionTimestamp, then a while).
        assert any(att == "0" and deleting for _, _, att, deleting in seen[:old_gone])
