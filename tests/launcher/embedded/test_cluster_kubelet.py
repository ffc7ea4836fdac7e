"""The kubelet in process mode, seen through the official client: the downward API, ConfigMap
references and $(VAR) expansion, followed logs, the grace period enforced with SIGKILL on a
graceful deletion; and the cluster surviving an API server restart."""

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from tests.launcher.embedded.cluster_helpers import HOSTS, rendered, running, terminal, wait_for

TPU_TOLERATION = {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}


def bare_pod(
    name: str, script: str, grace: int = 30, env: list | None = None, args: list | None = None
) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "probe"}, "annotations": {"note": "hi"}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": grace,
            "nodeSelector": {"cloud.google.com/gke-tpu-topology": "2x2x1"},
            "tolerations": [TPU_TOLERATION],
            "containers": [
                {
                    "name": "main",
                    "image": "python:3.11",
                    "command": ["python3", "-c", script],
                    "args": args or [],
                    "env": env or [],
                    "resources": {"limits": {"google.com/tpu": "2"}},
                }
            ],
        },
    }


def test_downward_api_configmaps_expansion_and_logs(tmp_path):
    with running("tpu7x-2x2x1:1", log_dir=tmp_path / "logs") as kube:
        kube.core.create_namespaced_config_map(
            "default", {"metadata": {"name": "cfg"}, "data": {"mode": "fast"}}
        )
        env = [
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "NOTE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['note']"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}},
            {"name": "GREETING", "value": "$(APP)-$(MODE)-$$(APP)"},
        ]
        script = (
            "import os, sys, time\n"
            "keys = 'POD NS UID APP NOTE NODE IP MODE GREETING JAX_NUM_CPU_DEVICES JAX_PLATFORMS'.split()\n"
            "for k in keys: print(k, os.environ.get(k), flush=True)\n"
            "print('ARGS', *sys.argv[1:], flush=True)\n"
            "time.sleep(0.5); print('bye', flush=True)\n"
        )
        kube.core.create_namespaced_pod(
            "default", bare_pod("probe", script, env=env, args=["$(POD)", "$(NOPE)"])
        )
        # Follow the log while the process runs: the stream ends when the container does.
        wait_for(lambda: kube.core.read_namespaced_pod("probe", "default").status.phase == "Running")
        streamed = "".join(
            watch.Watch().stream(kube.core.read_namespaced_pod_log, "probe", "default", follow=True)
        )
        assert streamed.rstrip().endswith("bye")
        pod = wait_for(
            lambda: (p := kube.core.read_namespaced_pod("probe", "default")).status.phase == "Succeeded" and p
        )
        got = dict(
            ln.split(" ", 1)
            for ln in kube.core.read_namespaced_pod_log("probe", "default").splitlines()
            if " " in ln
        )
        assert got["POD"] == "probe" and got["NS"] == "default" and got["UID"] == pod.metadata.uid
        assert got["APP"] == "probe" and got["NOTE"] == "hi" and got["NODE"] == pod.spec.node_name
        assert got["IP"] == "127.0.0.1" == pod.status.pod_ip
        assert got["MODE"] == "fast" and got["GREETING"] == "probe-fast-$(APP)"
        assert got["JAX_NUM_CPU_DEVICES"] == "4" and got["JAX_PLATFORMS"] == "cpu"  # 2 chips x 2 devices
        assert got["ARGS"] == "probe $(NOPE)"  # undefined references stay as written
        assert [c.type for c in pod.status.conditions if c.status == "True"] == [
            "PodScheduled",
            "Initialized",
        ]
        assert {c.type: c.reason for c in pod.status.conditions}["Ready"] == "PodCompleted"
        assert kube.core.read_namespaced_pod_log("probe", "default", tail_lines=1).strip() == "bye"
    # The cluster is gone; the log it was given a folder for is not (a failed test's reader's).
    (kept,) = (tmp_path / "logs").glob("default_probe_*/main.log")
    assert kept.read_text().rstrip().endswith("bye")


def test_dump_stacks_signals_the_running_pods_which_write_their_stacks_and_go_on(tmp_path):
    # What a failing end-to-end test does before it stops the cluster (tests/e2e/harness.py):
    # SIGUSR1 to each running pod, whose trainer writes its threads' stacks to its log.
    script = (
        "import faulthandler, signal, time\n"
        "faulthandler.register(signal.SIGUSR1, all_threads=True)\n"
        "def waiting_here():\n"
        "    print('up', flush=True); time.sleep(3); print('bye', flush=True)\n"
        "waiting_here()\n"
    )
    with running("tpu7x-2x2x1:1", log_dir=tmp_path / "logs") as kube:
        kube.core.create_namespaced_pod("default", bare_pod("stuck", script))
        log = lambda: kube.core.read_namespaced_pod_log("stuck", "default")  # noqa: E731
        wait_for(lambda: "up" in log(), 30)
        assert kube.cluster.dump_stacks() == 1
        wait_for(lambda: "in waiting_here" in log(), 10)
        assert "(most recent call first)" in log()
        pod = wait_for(
            lambda: (
                (p := kube.core.read_namespaced_pod("stuck", "default")).status.phase == "Succeeded" and p
            ),
            30,
        )
        assert pod.status.container_statuses[0].state.terminated.exit_code == 0
        assert log().rstrip().endswith("bye")
        assert kube.cluster.dump_stacks() == 0  # nothing running


def test_missing_configmap_is_a_create_container_config_error():
    with running("tpu7x-2x2x1:1") as kube:
        env = [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k"}}}]
        kube.core.create_namespaced_pod("default", bare_pod("nocfg", "print(1)", env=env))

        def waiting():
            p = kube.core.read_namespaced_pod("nocfg", "default")
            st = (p.status.container_statuses or [None])[0]
            return st and st.state.waiting and st.state.waiting

        w = wait_for(waiting, what="CreateContainerConfigError")
        assert (w.reason, w.message) == ("CreateContainerConfigError", 'configmap "absent" not found')
        assert kube.core.read_namespaced_pod("nocfg", "default").status.phase == "Pending"
        kube.core.create_namespaced_config_map(
            "default", {"metadata": {"name": "absent"}, "data": {"k": "v"}}
        )
        wait_for(
            lambda: kube.core.read_namespaced_pod("nocfg", "default").status.phase == "Succeeded",
            what="retry",
        )


def test_graceful_deletion_sigterm_then_sigkill_after_the_grace_period():
    with running("tpu7x-2x2x1:1") as kube:
        stubborn = (
            "import signal, time\n"
            "signal.signal(signal.SIGTERM, lambda *_: print('got SIGTERM, ignoring', flush=True))\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n"
        )
        kube.core.create_namespaced_pod("default", bare_pod("stubborn", stubborn, grace=1))
        wait_for(lambda: "ready" in kube.core.read_namespaced_pod_log("stubborn", "default"))
        seen = []
        w = watch.Watch()
        kube.core.delete_namespaced_pod("stubborn", "default")
        # Still there, terminating, while the grace period runs.
        p = kube.core.read_namespaced_pod("stubborn", "default")
        assert p.metadata.deletion_timestamp is not None and p.metadata.deletion_grace_period_seconds == 1
        for ev in w.stream(kube.core.list_namespaced_pod, "default", timeout_seconds=10):
            seen.append((ev["type"], ev["object"]))
            if ev["type"] == "DELETED":
                w.stop()
        last = next(p for t, p in reversed(seen) if t == "MODIFIED" and p.status.phase == "Failed")
        term = last.status.container_statuses[0].state.terminated
        assert (term.exit_code, term.reason) == (137, "Error")  # SIGKILL after ignoring SIGTERM
        assert [e.message for e in kube.events("Killing")] == ["Stopping container main"]
        with pytest.raises(ApiException) as e:
            kube.core.read_namespaced_pod("stubborn", "default")
        assert e.value.status == 404


def test_cluster_survives_an_api_server_restart(tmp_path):
    script = "import time; print('ready', flush=True); time.sleep(60)"
    with running("tpu7x-2x2x2:2", state_dir=tmp_path / "state") as kube:
        old_rv = kube.create_jobset(rendered("rs", script, max_restarts=0))["metadata"]["resourceVersion"]
        pods = wait_for(
            lambda: len(p := [x for x in kube.pods() if x.status.phase == "Running"]) == 2 * HOSTS and p
        )
        kube.cluster.restart_apiserver(downtime_s=0.2)
        # Same objects (reloaded from the state dir), history gone: an old resourceVersion is 410.
        assert sorted(p.metadata.name for p in kube.pods()) == sorted(p.metadata.name for p in pods)
        with pytest.raises(ApiException) as e:
            for _ in watch.Watch().stream(
                kube.core.list_namespaced_pod, "default", resource_version=old_rv, timeout_seconds=2
            ):
                pass
        assert e.value.status == 410
        # The controllers still act: a killed pod fails the JobSet (maxRestarts 0).
        kube.cluster.kill_pod("default", pods[0].metadata.name)
        assert terminal(kube, "rs-0")["status"]["terminalState"] == "Failed"
        assert isinstance(kube.core.read_namespaced_pod(pods[0].metadata.name, "default"), client.V1Pod)
