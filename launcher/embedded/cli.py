"""`reslice cluster ...`: run an embedded cluster in the background and rehearse faults on it.

    reslice cluster up --nodepools tpu7x-2x2x2:2,tpu7x-2x2x1:1     # prints: export KUBECONFIG=...
    reslice cluster status
    reslice cluster preempt tpu7x-2x2x2-np-0 --grace 15
    reslice cluster down

`up` starts `python -m launcher.embedded` detached, with its pid, URL and kubeconfig in the state
directory; every other command finds the cluster there. Faults travel as POSTs to the cluster's
/embedded/v1/ routes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from launcher.core.errors import UserError

app = typer.Typer(
    help="An embedded Kubernetes cluster with fake TPU node pools, on this machine.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(width=None if sys.stdout.isatty() else 160)

StateDir = Annotated[
    Path | None,
    typer.Option(
        "--state-dir", help="Cluster state directory [env RESLICE_CLUSTER_DIR, ~/.reslice/cluster]."
    ),
]


def state_dir(d: Path | None) -> Path:
    return Path(
        d or os.environ.get("RESLICE_CLUSTER_DIR") or Path.home() / ".reslice" / "cluster"
    ).expanduser()


def _alive(pid: int) -> bool:
    """Whether the process runs (a zombie doesn't: reap it if it is our child, as when `up` and
    `down` run in one Python process)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


def read_info(d: Path) -> dict[str, Any] | None:
    """The running cluster's cluster.json, or None when none runs there."""
    f = d / "cluster.json"
    try:
        info = json.loads(f.read_text())
    except (OSError, ValueError):
        return None
    return info if _alive(int(info.get("pid", 0))) else None


def _running(d: Path) -> dict[str, Any]:
    info = read_info(d)
    if info is None:
        raise UserError(f"no embedded cluster is running in {d} (start one with `reslice cluster up`)")
    return info


def _call(
    info: dict[str, Any], action: str, body: dict[str, Any] | None, timeout: float = 120.0
) -> dict[str, Any]:
    req = urllib.request.Request(
        f"{info['url']}/embedded/v1/{action}",
        data=json.dumps(body).encode() if body is not None else None,
        method="POST" if body is not None else "GET",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        try:
            msg = json.loads(e.read()).get("message") or str(e)
        except ValueError:
            msg = str(e)
        raise UserError(msg) from None
    except urllib.error.URLError as e:
        raise UserError(f"cannot reach the cluster at {info['url']}: {e.reason}") from None


@app.command()
def up(
    nodepools: Annotated[
        str, typer.Option("--nodepools", help="PRESET[:COUNT][:spot],... e.g. tpu7x-2x2x2:2,tpu7x-2x2x1:1")
    ] = "tpu7x-2x2x2:2",  # cluster.DEFAULT_NODEPOOLS (not imported: it would load the whole cluster)
    directory: StateDir = None,
    mode: Annotated[
        str, typer.Option("--mode", help="process: run pods as processes; simulate: don't.")
    ] = "process",
    port: Annotated[int, typer.Option("--port", help="API port (0: any free port).")] = 0,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for it to come up.")] = 60.0,
    runtime: Annotated[
        str,
        typer.Option(
            "--runtime",
            help="process: run a pod's command as local processes; podman: run its image (dev.py images).",
        ),
    ] = "process",
    share: Annotated[
        list[Path] | None,
        typer.Option(
            "--share",
            help="podman: a host folder every container sees at its own path (run directories); "
            "default: the current directory.",
        ),
    ] = None,
) -> None:
    """Start an embedded cluster in the background."""
    from launcher.core.words import PodRuntime
    from launcher.embedded.nodes import parse_nodepools

    if mode not in ("process", "simulate"):
        raise UserError(f"--mode must be process or simulate, got {mode!r}")
    if runtime not in tuple(PodRuntime):
        raise UserError(f"--runtime must be {' or '.join(PodRuntime)}, got {runtime!r}")
    if share and runtime != PodRuntime.PODMAN:
        raise UserError("--share is for --runtime podman (processes see the whole host)")
    shared = [p.resolve() for p in share or [Path.cwd()]]
    if missing := [str(p) for p in shared if not p.is_dir()]:
        raise UserError(f"--share: no such directory: {missing[0]}")
    parse_nodepools(nodepools)  # a bad spec fails here, not in the background
    from launcher.core import inputs

    inputs.integer("--port", port, low=0, high=65535)
    inputs.seconds("--timeout", timeout, positive=True)
    d = inputs.directory("--state-dir", state_dir(directory))
    created = [p for p in (d, *d.parents) if not p.exists()]
    info = read_info(d)
    if info is not None:
        raise UserError(
            f"a cluster is already running in {d} (pid {info['pid']}); `reslice cluster down` first"
        )
    d.mkdir(parents=True, exist_ok=True)
    (d / "cluster.json").unlink(missing_ok=True)
    log = open(d / "cluster.log", "ab")  # noqa: SIM115 - handed to the child
    cmd = [sys.executable, "-m", "launcher.embedded", "--nodepools", nodepools, "--state-dir", str(d)]
    cmd += ["--mode", mode, "--port", str(port), "--runtime", runtime]
    if runtime == PodRuntime.PODMAN:
        cmd += [a for p in shared for a in ("--share", str(p))]
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    log.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = read_info(d)
        if info is not None and info.get("pid") == proc.pid:
            break
        if proc.poll() is not None:
            tail = (d / "cluster.log").read_text(errors="replace").strip().splitlines()[-1:]
            if created:  # the state directory was this command's: leave nothing behind
                shutil.rmtree(created[-1], ignore_errors=True)
            raise UserError(f"the cluster exited at start (code {proc.returncode}): {' '.join(tail)}")
        time.sleep(0.1)
    else:
        proc.terminate()
        raise UserError(f"the cluster did not come up within {timeout:.0f} s (see {d / 'cluster.log'})")
    pools = info.get("nodepools") or []
    console.print(
        f"Embedded cluster up at {info['url']} (pid {info['pid']}, {mode} mode, {runtime} runtime): "
        f"{len(pools)} node pool(s), {sum(p['hosts'] for p in pools)} node(s)."
    )
    console.print("Use it with kubectl or the kubernetes client:")
    print(f"  export KUBECONFIG={info['kubeconfig']}")


@app.command()
def down(
    directory: StateDir = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait before SIGKILL.")] = 30.0,
) -> None:
    """Stop the background cluster (its pods' processes are killed)."""
    d = state_dir(directory)
    info = _running(d)
    pid = int(info["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    (d / "cluster.json").unlink(missing_ok=True)
    console.print(f"Embedded cluster {info['url']} (pid {pid}) stopped.")


@app.command()
def status(
    directory: StateDir = None,
    all_pods: Annotated[
        bool, typer.Option("--all", help="List every node and pod, not the first 50.")
    ] = False,
) -> None:
    """Node pools, nodes and pods of the running cluster."""
    from kubernetes import client, config

    info = _running(state_dir(directory))
    meta = _call(info, "info", None)
    api = client.CoreV1Api(config.new_client_from_config(config_file=info["kubeconfig"]))
    # Any: the client's models make metadata, spec and status Optional; the embedded API server
    # sets all three on every node and pod it lists (its admission defaults them).
    nodes: list[Any] = api.list_node().items
    pods: list[Any] = api.list_pod_for_all_namespaces().items
    by_pool: dict[str, list[Any]] = {}
    for n in nodes:
        by_pool.setdefault((n.metadata.labels or {}).get("cloud.google.com/gke-nodepool", ""), []).append(n)
    node_pool = {n.metadata.name: p for p, ns in by_pool.items() for n in ns}

    t = Table(title=f"Node pools ({info['url']}, {meta.get('mode')} mode)")
    for col in ("node pool", "preset", "nodes", "ready", "tainted", "pods", "spot", "kubelet"):
        t.add_column(col)
    for p in meta.get("nodepools") or []:
        ns = by_pool.get(p["name"], [])
        ready = sum(
            1 for n in ns if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
        )
        tainted = sum(
            1
            for n in ns
            if any(tt.key == "cloud.google.com/impending-node-termination" for tt in n.spec.taints or [])
        )
        npods = sum(1 for pod in pods if node_pool.get(pod.spec.node_name) == p["name"])
        t.add_row(
            p["name"],
            p["preset"],
            f"{len(ns)}/{p['hosts']}" + (" (removed)" if p.get("gone") else ""),
            str(ready),
            str(tainted),
            str(npods),
            "yes" if p["spot"] else "no",
            "simulate" if p["simulate"] else meta.get("runtime", "process"),
        )
    console.print(t)

    t = Table(title=f"Nodes ({len(nodes)})")
    for col in ("node", "node pool", "ready", "google.com/tpu", "taints"):
        t.add_column(col)
    for n in nodes if all_pods else nodes[:50]:
        ready_word = next((c.status for c in n.status.conditions or [] if c.type == "Ready"), "Unknown")
        taints = ", ".join(
            f"{tt.key}:{tt.effect}" for tt in n.spec.taints or [] if tt.key != "google.com/tpu"
        )
        t.add_row(
            n.metadata.name,
            node_pool.get(n.metadata.name, ""),
            ready_word,
            (n.status.allocatable or {}).get("google.com/tpu", "0"),
            taints,
        )
    console.print(t)
    if not all_pods and len(nodes) > 50:
        console.print(f"... {len(nodes) - 50} more nodes (--all)")

    t = Table(title=f"Pods ({len(pods)})")
    for col in ("namespace", "pod", "phase", "node pool", "attempt", "reason"):
        t.add_column(col)
    shown = pods if all_pods else pods[:50]
    for pod in shown:
        reason = pod.status.reason or ""
        for cs in pod.status.container_statuses or []:
            term = cs.state.terminated if cs.state else None
            if term is not None:
                reason = reason or f"exit {term.exit_code}"
        for c in pod.status.conditions or []:
            if c.type == "PodScheduled" and c.status == "False":
                reason = reason or c.reason or ""
        t.add_row(
            pod.metadata.namespace,
            pod.metadata.name,
            pod.status.phase or "",
            node_pool.get(pod.spec.node_name or "", ""),
            (pod.metadata.labels or {}).get("jobset.sigs.k8s.io/restart-attempt", ""),
            reason,
        )
    console.print(t)
    if len(shown) < len(pods):
        console.print(f"... {len(pods) - len(shown)} more pods (--all)")


@app.command()
def preempt(
    nodepool: Annotated[str, typer.Argument(help="Node pool (or a unique suffix of its name).")],
    grace: Annotated[
        float,
        typer.Option(
            "--grace", help="Seconds the pods get from SIGTERM to SIGKILL (GKE spot: 15 of the 30 s notice)."
        ),
    ] = 15.0,
    wait: Annotated[bool, typer.Option("--wait", help="Return after the nodes are gone.")] = False,
    directory: StateDir = None,
) -> None:
    """Spot preemption: taint, DisruptionTarget, SIGTERM, grace, nodes removed."""
    from launcher.core import inputs

    inputs.seconds("--grace", grace)
    out = _call(
        _running(state_dir(directory)), "preempt", {"nodepool": nodepool, "grace_s": grace, "wait": wait}
    )
    console.print(
        f"Preempting {out['nodepool']}: {len(out['nodes'])} node(s), {len(out['pods'])} pod(s) "
        f"got SIGTERM; nodes removed after {grace:g} s (until `reslice cluster restore {out['nodepool']}`)."
    )


@app.command()
def remove(
    nodepool: Annotated[str, typer.Argument(help="Node pool (or a unique suffix of its name).")],
    directory: StateDir = None,
) -> None:
    """Capacity gone: nodes deleted, running pods failed (DeletionByPodGC) and killed."""
    out = _call(_running(state_dir(directory)), "remove", {"nodepool": nodepool})
    console.print(
        f"Removed {out['nodepool']}: {len(out['nodes'])} node(s) deleted, {len(out['pods'])} pod(s) lost."
    )


@app.command()
def restore(
    nodepool: Annotated[str, typer.Argument(help="Node pool (or a unique suffix of its name).")],
    directory: StateDir = None,
) -> None:
    """Bring a removed or preempted node pool's nodes back."""
    out = _call(_running(state_dir(directory)), "restore", {"nodepool": nodepool})
    console.print(f"Restored {out['nodepool']}: {len(out['nodes'])} node(s) created.")


@app.command("kill-pod")
def kill_pod(
    pod: Annotated[str, typer.Argument(help="Pod name.")],
    namespace: Annotated[str, typer.Option("--namespace", "-n")] = "default",
    directory: StateDir = None,
) -> None:
    """SIGKILL a pod's containers (exit code 137)."""
    out = _call(_running(state_dir(directory)), "kill-pod", {"namespace": namespace, "pod": pod})
    console.print(f"Killed {out['pod']} (exit code {out['exitCode']}).")


@app.command("crash-host")
def crash_host(
    pod: Annotated[str, typer.Argument(help="Pod name.")],
    namespace: Annotated[str, typer.Option("--namespace", "-n")] = "default",
    down: Annotated[
        float,
        typer.Option(
            "--down",
            help="Seconds the host stays down before its reboot: no heartbeats meanwhile, so its node"
            " turns NotReady after the node monitor grace period. 0: an instant reboot.",
        ),
    ] = 0.0,
    directory: StateDir = None,
) -> None:
    """The pod's host crashes and reboots: its processes die (no DisruptionTarget); back, its kubelet
    fails the pod, its container gone (ContainerStatusUnknown, 137), as upstream's does."""
    from launcher.core import inputs

    inputs.seconds("--down", down)
    out = _call(
        _running(state_dir(directory)), "crash-host", {"namespace": namespace, "pod": pod, "down_s": down}
    )
    back = (
        f"; its node is down for {down:g} s (NotReady after the grace period), then the pod Failed"
        if down > 0
        else "; rebooted at once: the pod Failed (ContainerStatusUnknown)"
    )
    console.print(f"Crashed the host of {out['pod']} ({out['node']}): its processes are gone{back}.")


NodeArg = Annotated[str, typer.Argument(help="Node name (kubectl get nodes).")]


@app.command()
def drain(
    node: NodeArg,
    timeout: Annotated[
        float,
        typer.Option("--timeout", help="Seconds to keep retrying evictions a disruption budget refuses."),
    ] = 60.0,
    directory: StateDir = None,
) -> None:
    """`kubectl drain`: cordon the node and evict its pods (eviction API, PodDisruptionBudgets)."""
    out = _call(_running(state_dir(directory)), "drain", {"node": node, "timeout_s": timeout})
    console.print(
        f"Drained {out['node']}: {len(out['evicted'])} pod(s) evicted; cordoned (`reslice cluster uncordon`)."
    )


@app.command()
def uncordon(node: NodeArg, directory: StateDir = None) -> None:
    """Make a drained node schedulable again."""
    out = _call(_running(state_dir(directory)), "uncordon", {"node": node})
    console.print(f"Uncordoned {out['node']}.")


@app.command()
def repair(node: NodeArg, directory: StateDir = None) -> None:
    """GKE auto-repair: the node is deleted and recreated, no graceful shutdown (PodGC fails its pods)."""
    out = _call(_running(state_dir(directory)), "repair", {"node": node})
    console.print(f"Repaired {out['node']}: recreated, {len(out['pods'])} pod(s) lost.")


@app.command()
def partition(node: NodeArg, directory: StateDir = None) -> None:
    """The node's kubelet stops heartbeating: NotReady, unreachable taints, its pods evicted after
    their tolerationSeconds (until `reslice cluster heal`)."""
    out = _call(_running(state_dir(directory)), "partition", {"node": node})
    console.print(f"Partitioned {out['node']}: NotReady after {out['grace_s']:g} s without heartbeats.")


@app.command()
def heal(node: NodeArg, directory: StateDir = None) -> None:
    """End a partition: heartbeats resume, the kubelet catches up with its pods."""
    out = _call(_running(state_dir(directory)), "heal", {"node": node})
    console.print(f"Healed {out['node']}.")


def main(argv: list[str] | None = None) -> None:
    """Standalone entry (`python -m launcher.embedded.cli`), with `reslice`'s error handling:
    a user error is one line on stderr and exit 2."""
    try:
        app(args=argv, prog_name="reslice cluster", standalone_mode=False)
    except UserError as e:
        print(f"reslice: error: {e}", file=sys.stderr)
        sys.exit(2)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except Exception as e:  # click usage errors carry their own exit code (2)
        code = getattr(e, "exit_code", None)
        if code is None:
            raise
        msg = e.format_message() if hasattr(e, "format_message") else str(e)
        print(f"reslice: error: {' '.join(msg.split())}", file=sys.stderr)
        sys.exit(code)


if __name__ == "__main__":
    main()
