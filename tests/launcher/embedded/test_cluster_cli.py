"""`reslice cluster ...` end to end: up (a detached process), status, faults through the HTTP
routes, down; and user errors as one line on stderr with exit code 2."""

import pytest
from kubernetes import client, config

from launcher.cli.app import main
from launcher.embedded.cli import read_info
from tests.launcher.embedded.cluster_helpers import GROUP, HOSTS, VERSION, rendered, wait_for


def run(capsys, *args) -> tuple[int, str, str]:
    code = 0
    try:
        main(["cluster", *args])
    except SystemExit as e:
        code = e.code or 0
    out, err = capsys.readouterr()
    return code, out, err


def test_cluster_up_status_faults_down(tmp_path, capsys):
    d = str(tmp_path / "c")
    # The default node pools: two slices of tpu7x-2x2x2, room for a 2-slice run.
    code, out, err = run(capsys, "up", "--mode", "simulate", "--state-dir", d)
    assert code == 0, err
    assert f"export KUBECONFIG={d}/kubeconfig" in out
    info = read_info(tmp_path / "c")
    try:
        code, _, err = run(capsys, "up", "--state-dir", d)
        assert code == 2 and err.count("\n") == 1 and "already running" in err

        api = config.new_client_from_config(config_file=info["kubeconfig"])
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        assert len(core.list_node().items) == 2 * HOSTS
        custom.create_namespaced_custom_object(
            GROUP, VERSION, "default", "jobsets", rendered("cli", "unused", max_restarts=0)
        )

        def running_pods():
            pods = [p for p in core.list_namespaced_pod("default").items if p.status.phase == "Running"]
            return pods if len(pods) == 2 * HOSTS else None

        pods = wait_for(running_pods, what="the 2 slices' pods running")

        code, out, _ = run(capsys, "status", "--state-dir", d)
        assert code == 0
        assert "tpu7x-2x2x2-np-0" in out and "tpu7x-2x2x2-np-1" in out and "simulate" in out
        assert all(n.metadata.name in out for n in core.list_node().items)
        assert all(p.metadata.name in out for p in pods)

        crashed = pods[1].metadata.name
        code, out, _ = run(capsys, "crash-host", crashed, "--state-dir", d)
        assert code == 0 and f"Crashed the host of default/{crashed}" in out
        # Rebooted at once: its kubelet reports the container it cannot find (a simulated pool's too).
        assert wait_for(lambda: core.read_namespaced_pod(crashed, "default").status.phase == "Failed")

        victim = pods[0].metadata.name
        code, out, _ = run(capsys, "kill-pod", victim, "--state-dir", d)
        assert code == 0 and f"Killed default/{victim} (exit code 137)" in out
        p = core.read_namespaced_pod(victim, "default")
        assert p.status.phase == "Failed" and p.status.container_statuses[0].state.terminated.exit_code == 137

        code, out, _ = run(capsys, "preempt", "np-1", "--grace", "0.5", "--wait", "--state-dir", d)
        assert code == 0 and "Preempting tpu7x-2x2x2-np-1" in out
        assert [n.metadata.labels["cloud.google.com/gke-nodepool"] for n in core.list_node().items] == [
            "tpu7x-2x2x2-np-0"
        ] * HOSTS
        code, out, _ = run(capsys, "remove", "np-0", "--state-dir", d)
        assert code == 0 and core.list_node().items == []
        code, out, _ = run(capsys, "restore", "np-0", "--state-dir", d)
        assert code == 0 and f"{HOSTS} node(s) created" in out and len(core.list_node().items) == HOSTS

        node = core.list_node().items[0].metadata.name
        code, out, _ = run(capsys, "drain", node, "--state-dir", d)
        assert code == 0 and f"Drained {node}" in out and core.read_node(node).spec.unschedulable
        code, out, _ = run(capsys, "uncordon", node, "--state-dir", d)
        assert code == 0 and not core.read_node(node).spec.unschedulable
        uid = core.read_node(node).metadata.uid
        code, out, _ = run(capsys, "repair", node, "--state-dir", d)
        assert code == 0 and f"Repaired {node}" in out and core.read_node(node).metadata.uid != uid
        code, out, _ = run(capsys, "partition", node, "--state-dir", d)
        assert code == 0 and f"Partitioned {node}" in out
        code, out, _ = run(capsys, "heal", node, "--state-dir", d)
        assert code == 0 and f"Healed {node}" in out

        for args, text in (
            (("preempt", "np-1"), "has no nodes"),  # preempted already
            (("preempt", "nope"), "unknown node pool 'nope'"),
            (("kill-pod", "no-such-pod"), "pod default/no-such-pod not found"),
            (("crash-host", "no-such-pod"), "pod default/no-such-pod not found"),
            (("crash-host", "no-such-pod", "--down", "-1"), "--down -1: expected a finite number of seconds"),
            (("drain", "no-such-node"), "node no-such-node not found"),
            (("repair", "no-such-node"), "unknown node 'no-such-node'"),
            (("partition", "no-such-node"), "unknown node 'no-such-node'"),
        ):
            code, out, err = run(capsys, *args, "--state-dir", d)
            assert code == 2 and text in err and err.count("\n") == 1 and "Traceback" not in err
    finally:
        code, out, _ = run(capsys, "down", "--state-dir", d)
    assert code == 0 and "stopped" in out
    assert read_info(tmp_path / "c") is None
    code, _, err = run(capsys, "status", "--state-dir", d)
    assert code == 2 and "no embedded cluster is running" in err


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (("up", "--nodepools", "tpu9-1x1:2"), "unknown preset 'tpu9-1x1'"),
        (("up", "--nodepools", "tpu7x-2x2x1:zero"), "bad node pool spec"),
        (("up", "--mode", "vm"), "--mode must be process or simulate"),
        (("up", "--runtime", "docker"), "--runtime must be process or podman, got 'docker'"),
        (("up", "--share", "."), "--share is for --runtime podman"),
        (("up", "--runtime", "podman", "--share", "nosuch"), "--share: no such directory"),
    ],
)
def test_cluster_up_user_errors(tmp_path, capsys, args, text):
    code, out, err = run(capsys, *args, "--state-dir", str(tmp_path))
    assert code == 2 and text in err and err.count("\n") == 1
    assert out == "" and not (tmp_path / "cluster.json").exists()


def test_a_crashed_cluster_comes_back_with_its_pods_lost(tmp_path, capsys):
    """SIGKILL the cluster process: its pods' processes are orphaned. `up` again on the same state:
    the objects are back, and pods that were Running report their containers lost (137)."""
    import os
    import signal

    d = str(tmp_path / "c")
    assert run(capsys, "up", "--nodepools", "tpu7x-2x2x2:2", "--state-dir", d)[0] == 0
    info = read_info(tmp_path / "c")
    api = config.new_client_from_config(config_file=info["kubeconfig"])
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", "jobsets", rendered("crash", "import time; time.sleep(60)", max_restarts=0)
    )
    pods = wait_for(
        lambda: (
            len(p := [x for x in core.list_namespaced_pod("default").items if x.status.phase == "Running"])
            == 2 * HOSTS
            and p
        )
    )
    os.kill(info["pid"], signal.SIGKILL)
    for p in pods:  # the orphans: what a crashed node leaves behind, cleaned up by hand here
        os.kill(int(p.status.container_statuses[0].container_id.removeprefix("process://")), signal.SIGKILL)
    wait_for(
        lambda: read_info(tmp_path / "c") is None or read_info(tmp_path / "c")["pid"] != info["pid"],
        what="crash",
    )
    try:
        assert run(capsys, "up", "--nodepools", "tpu7x-2x2x2:2", "--state-dir", d)[0] == 0
        info = read_info(tmp_path / "c")
        api = config.new_client_from_config(config_file=info["kubeconfig"])
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        js = wait_for(
            lambda: (
                (j := custom.get_namespaced_custom_object(GROUP, VERSION, "default", "jobsets", "crash-0"))[
                    "status"
                ].get("terminalState")
                and j
            )
        )
        assert js["status"]["terminalState"] == "Failed"
        lost = core.read_namespaced_pod(pods[0].metadata.name, "default")
        term = lost.status.container_statuses[0].state.terminated
        assert (lost.status.phase, term.exit_code, term.reason) == ("Failed", 137, "ContainerStatusUnknown")
    finally:
        run(capsys, "down", "--state-dir", d)


def test_demo_under_podman_without_podman_is_one_line_and_exit_1(tmp_path, capsys, monkeypatch):
    """The command is right, the machine cannot run it: exit 1, one line naming the fix, and no
    work directory, cluster or run made."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    workdir = tmp_path / "demo"
    code = 0
    try:
        main(["demo", "--runtime", "podman", "--workdir", str(workdir)])
    except SystemExit as e:
        code = e.code or 0
    out, err = capsys.readouterr()
    assert code == 1 and err.count("\n") == 1, (code, err)
    assert "--runtime podman: podman is not installed" in err and "dev.py images" in err
    assert out == "" and not workdir.exists()
