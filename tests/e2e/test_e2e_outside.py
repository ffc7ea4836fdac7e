"""reslice on the path a GKE user's cluster takes it down, end to end: every command against the
embedded cluster in outside mode (docs/embedded.md "Outside mode"), reached only through its
kubeconfig. The server answers /version as an ordinary one does, so no command takes an embedded
default: the run directories are gs:// (the real fake-gcs-server), the images need a registry, the
grace periods are the presets' notices, and an in-place run's pods read their world through the
in-cluster API (`KUBERNETES_SERVICE_HOST/PORT`, the pod's projected service-account token, the
run's Role), with the world's coordinator a JobSet host name the cluster's DNS resolves.

One cluster for the whole file (its node pools: two slices of MULTI_HOST for the in-place run,
one of PRESET for the rest), runs of a few steps each.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest

from contract.words import STATE_SOURCE, StateSource
from launcher.core.accounting import build_report
from launcher.core.errors import UserError
from launcher.core.labels import LABEL_SLICE, world_configmap_name
from launcher.core.words import RunState
from tests.e2e.harness import (
    GLOBAL_BATCH,
    MULTI_HOST,
    MULTI_HOST_BATCH,
    PRESET,
    TRAINER_SETTINGS,
    Harness,
    assert_same_samples_and_losses,
    kept_steps,
    paced,
    shared_reference,
    wait_for,
)
from tests.support.cli import run_cli
from tests.support.fake_gcs import fake_gcs

pytestmark = pytest.mark.e2e
IMAGE = "example.com/reslice-trainer:1"  # a registry, as a real cluster's pods need; never pulled here
BUCKET = "runs"
IN_PLACE_STEPS = 30
# The in-place run is paced by the clock, so that the grow back comes while it still has steps to
# train however fast the machine is (an idle one finished them in the one-slice world first).
IN_PLACE_PACE_S = 0.5


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    tmp = tmp_path_factory.mktemp("outside")
    with fake_gcs(buckets=[BUCKET]) as gcs:
        try:
            h = Harness(tmp, pools=0, nodepools=f"{MULTI_HOST}:2,{PRESET}:1", gcs_env=gcs.env, outside=True)
        except UserError as e:  # a machine without unprivileged user namespaces (docs/embedded.md)
            pytest.skip(str(e))
        try:
            yield h
        finally:
            h.close()


@pytest.fixture(autouse=True)
def in_its_folder(outside: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plots of gs:// runs and sweeps go to ./reslice-report-RUN, ./reslice-sweep-NAME: here."""
    monkeypatch.chdir(outside.tmp)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict]:
    return shared_reference(tmp_path_factory, MULTI_HOST_BATCH)


def settings(steps: int, interval: int = 5) -> list[str]:
    """`--set` for the harness's trainer settings (one layer, dropless, one schedule)."""
    out = []
    for s in TRAINER_SETTINGS:
        out += ["--set", s.format(steps=steps, interval=interval)]
    return out


def cli(h: Harness, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int | str | None, str]:
    """`reslice ARGV --kubeconfig K` in this process: (exit code, what it printed)."""
    code, out, err = run_cli(capsys, *argv, "--kubeconfig", str(h.cluster.kubeconfig))
    return code, out + err


def reslice(h: Harness, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`reslice ARGV` as a person runs it: its own process, the cluster named by KUBECONFIG only."""
    env = {**_env(), "KUBECONFIG": str(h.cluster.kubeconfig), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "launcher", *argv],
        env=env, capture_output=True, text=True, timeout=timeout, cwd=h.tmp,
    )  # fmt: skip


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


def launch_args(run: str, steps: int, *extra: str) -> list[str]:
    return [
        "launch", "--preset", PRESET, "--run", run, "-b", str(GLOBAL_BATCH), "--config", "tiny",
        *settings(steps), "--run-dir", f"gs://{BUCKET}/{run}", "--image", IMAGE, *extra,
    ]  # fmt: skip


def test_preflight_reads_the_cluster_as_a_real_one(outside: Harness, capsys) -> None:
    code, out = cli(
        outside, capsys, "preflight", "--preset", PRESET, "--run-dir", f"gs://{BUCKET}/probe",
        "--image", IMAGE, "--json",
    )  # fmt: skip
    assert code == 0, out
    rows = {r["name"]: r for r in json.loads(out[out.index("[") :])}
    # The JobSet release from its controller's Deployment, not from the embedded cluster's info.
    assert (
        "jobset-system/jobset-controller-manager runs registry.k8s.io/jobset/jobset:v0.12.0"
        in (rows["JobSet controller"]["found"])
    )
    assert rows["trainer image"]["status"] == "ok" and "local processes" not in rows["trainer image"]["found"]
    assert rows["write probe"]["status"] == "ok", rows["write probe"]


def test_launch_detached_then_watch_status_runs_report(outside: Harness, capsys) -> None:
    code, out = cli(outside, capsys, *launch_args("det", 4), "--detach")
    assert code == 0 and "detached: segment 0 submitted" in out, out
    spec = outside.record("det").spec
    # GKE's defaults: the preset's notice as the grace period, no heartbeat override, no local API.
    assert (spec.grace_period_s, spec.heartbeat_timeout_s, spec.world_api) == (None, None, None)
    watched = reslice(outside, "watch", "det")
    assert watched.returncode == 0, watched.stdout + watched.stderr
    assert outside.record("det").state == RunState.FINISHED
    code, out = cli(outside, capsys, "status", "det")
    assert code == 0 and "det: Finished" in out and "latest committed checkpoint: step 4 of 4" in out, out
    code, out = cli(outside, capsys, "runs")
    assert code == 0 and re.search(r"│ det\s+│ Finished", out), out
    code, out = cli(outside, capsys, "report", "det", "--out", str(outside.tmp / "report"))
    assert code == 0, out
    assert (outside.tmp / "report" / "loss.png").stat().st_size > 0


def test_an_attached_launch_finishes_and_stop_stops(outside: Harness, capsys) -> None:
    done = reslice(outside, *launch_args("att", 3))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "att: Finished" in done.stdout, done.stdout
    code, out = cli(outside, capsys, *launch_args("gone", 200), "--detach")
    assert code == 0, out
    wait_for(lambda: outside.run_pods("gone"), 60, "the run's pods")
    code, out = cli(outside, capsys, "stop", "gone")
    assert code == 0, out
    assert outside.record("gone").state == RunState.STOPPED
    assert outside.kube.jobsets("gone") == []


def test_sweep_and_its_report(outside: Harness, capsys) -> None:
    """Without --grace-period (the seed's third use on GKE): the sweep's relaunch path takes the
    preset's notice. On a cluster that is not the embedded one, `--max-parallel` is kept."""
    sweep_dir = f"gs://{BUCKET}/sweeps/moe"
    code, out = cli(
        outside, capsys, "sweep", "--preset", PRESET, "--config", "tiny", "--steps", "4", "--warmup", "1",
        "--factors", "1.0", "--name", "moe", "--sweep-dir", sweep_dir, "--image", IMAGE,
        "--max-parallel", "2", "--set", "model.n_layers=1",
    )  # fmt: skip
    assert code == 0, out
    assert "moe-f1: Finished" in out and "written:" in out and "one at a time" not in out, out
    code, out, err = run_cli(capsys, "sweep-report", "moe", "--sweep-dir", sweep_dir)  # no cluster asked
    assert code == 0 and "plot:" in out, out + err


def test_ui_serves_the_runs(outside: Harness) -> None:
    env = {**_env(), "KUBECONFIG": str(outside.cluster.kubeconfig)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", "ui", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=outside.tmp,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = re.search(r"at (http://127\.0\.0\.1:\d+/)$", line.strip())
        assert url, line
        with urllib.request.urlopen(url.group(1) + "api/runs", timeout=30) as r:
            rows = {row["run"]: row for row in json.load(r)["runs"]}
        assert rows["det"]["state"] == RunState.FINISHED and rows["det"]["error"] is None, rows
        with urllib.request.urlopen(url.group(1) + "api/run/det", timeout=30) as r:
            page = json.load(r)
        assert sum(len(s["loss"]) for s in page["loss"]) == 4, page["loss"]  # its gs:// metrics
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=20)


def trained(h: Harness, run: str, segment: int | None = None) -> int:
    steps = [m["step"] for m in h.rundir(run).metrics() if segment is None or m.get("segment") == segment]
    return max(steps, default=0)


def uids(h: Harness, run: str, slice_id: str) -> set[str]:
    return {
        p["metadata"]["uid"]
        for p in h.run_pods(run)
        if p["metadata"]["labels"].get(LABEL_SLICE) == slice_id and not p["metadata"].get("deletionTimestamp")
    }


def pod_logs(h: Harness, run: str) -> dict[str, str]:
    return {
        log.parent.name: log.read_text(errors="replace")
        for log in h.cluster.kubelet.runtime.log_dir.glob(f"*_{run}-s*/*.log")
    }


def refused(h: Harness, run: str) -> str | None:
    """The first line a pod of the run logged about an API refusal (401, 403), if any."""
    for log in pod_logs(h, run).values():
        for line in log.splitlines():
            if "HTTP 401" in line or "HTTP 403" in line:
                return line
    return None


def wait_trained(h: Harness, run: str, step: int, timeout: float, segment: int | None = None) -> None:
    """Until the run's metrics reach `step`; an AssertionError at once, with the pod's own line,
    when a pod's world source was refused (a Role without a verb the pods need, a bad token)."""

    def progress() -> bool:
        if (line := refused(h, run)) is not None:
            raise AssertionError(f"{run}: a pod's API request was refused: {line}")
        return trained(h, run, segment) >= step

    try:
        wait_for(progress, timeout, f"{run} step {step}", interval=0.5)
    except AssertionError as e:
        if "refused" in str(e):
            raise
        pods = [
            f"{p['metadata']['name']}: {(p.get('status') or {}).get('phase')} {(p.get('status') or {}).get('message') or ''}"
            for p in h.run_pods(run)
        ]
        logs = [f"--- {name}\n{log[-1500:]}" for name, log in pod_logs(h, run).items()]
        raise AssertionError("\n".join([str(e), "pods:", *pods, *logs])) from None


def launch_in_place(h: Harness, capsys, run: str, steps: int) -> None:
    code, out = cli(
        h, capsys, "launch", "--preset", MULTI_HOST, "--slices", "2", "--restart-mode", "in-place",
        "--run", run, "-b", str(MULTI_HOST_BATCH), "--config", "tiny", *settings(steps),
        *(a for s in paced(IN_PLACE_PACE_S) for a in ("--set", s)),
        "--run-dir", f"gs://{BUCKET}/{run}", "--image", IMAGE, "--unschedulable-grace", "20",
        "--grow-window", "1", "--app-backoff", "1", "--detach",
    )  # fmt: skip
    assert code == 0, out


def test_in_place_loses_a_node_pool_and_gets_it_back(outside: Harness, capsys, reference) -> None:
    h = outside
    launch_in_place(h, capsys, "ip", IN_PLACE_STEPS)
    h.start_controller("ip")
    wait_trained(h, "ip", 6, 300)
    first = uids(h, "ip", "0")
    assert len(first) == 2
    pods1 = [p for p in h.run_pods("ip") if p["metadata"]["labels"].get(LABEL_SLICE) == "1"]
    lost = h.cluster.node_pool_of[pods1[0]["spec"]["nodeName"]]
    h.cluster.remove(lost)
    wait_for(lambda: len(h.record("ip").segments) >= 2, 60, "the shrink to a new world")
    wait_trained(h, "ip", 1, 240, segment=1)
    assert uids(h, "ip", "0") == first  # the same pods
    h.cluster.restore(lost)
    wait_for(lambda: len(h.record("ip").segments) >= 3, 120, "the grow back")
    rec = h.wait_state("ip", {RunState.FINISHED}, timeout=300)
    assert uids(h, "ip", "0") in (first, set())
    rundir = h.rundir("ip")
    metrics, ledger = rundir.metrics(), rundir.ledger()
    # Every pod followed its world through the in-cluster endpoint (the kubernetes Service, TLS,
    # its token), not an API address the launcher handed it.
    port = h.cluster.server.port
    for log in pod_logs(h, "ip").values():
        assert f"follows the worlds of ConfigMap default/ip-world at https://127.0.0.1:{port}" in log, log[
            :2000
        ]
    status = build_report(rec, metrics, ledger, rec.finished_at or 0.0).as_dict()
    froms = [s[STATE_SOURCE] for s in status["segments"][:3]]
    assert froms == [StateSource.FRESH, StateSource.MEMORY, StateSource.PEERS], froms
    first_seg, shrunk, grown = rec.segments[:3]
    assert (first_seg.slice_ids, shrunk.slice_ids, grown.slice_ids) == (("0", "1"), ("0",), ("0", "1"))
    # GKE's coordinator, a JobSet host name the cluster resolves, not the embedded 127.0.0.1 one.
    assert all(not seg.coordinator.startswith("127.") for seg in rec.segments), rec.segments
    kept = kept_steps(metrics)
    assert sorted(kept) == list(range(1, IN_PLACE_STEPS + 1))
    assert_same_samples_and_losses(kept, reference)
    assert rec.segments[-1].end_step == IN_PLACE_STEPS


def test_a_role_without_a_verb_the_pods_need_fails_the_run_with_403(
    outside: Harness, capsys, monkeypatch
) -> None:
    """The run's Role as `create_run` writes it, less `list`: every pod's world source is refused,
    and the wait for a first step fails at once, saying which verb (a missing verb is caught here,
    not by a run that waits forever on a real cluster)."""
    from launcher.controller import launch as launch_module

    render = launch_module.render_world_access

    def without_list(*args, **kwargs):
        objs = render(*args, **kwargs)
        for obj in objs:
            for rule in obj.get("rules") or []:
                rule["verbs"] = [v for v in rule["verbs"] if v != "list"]
        return objs

    monkeypatch.setattr(launch_module, "render_world_access", without_list)
    launch_in_place(outside, capsys, "norole", 40)
    try:
        with pytest.raises(AssertionError) as failed:
            wait_trained(outside, "norole", 1, 120)
        said = str(failed.value)
        cm = world_configmap_name("norole")
        assert "HTTP 403" in said and f'configmaps "{cm}" is forbidden' in said, said
        assert 'cannot list resource "configmaps" in API group "" in the namespace "default"' in said, said
        assert trained(outside, "norole") == 0
    finally:
        code, out = cli(outside, capsys, "stop", "norole")
        assert code == 0, out
