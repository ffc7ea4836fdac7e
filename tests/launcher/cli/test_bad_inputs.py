"""Every command, every class of bad input: one short line on stderr, the documented exit code, no
traceback, and nothing created, deleted or overwritten — checked against a snapshot of the cluster's
objects (the real client over HTTP against the embedded cluster, simulate mode) and of the files
under the working directory, taken before and after each case. And the valid inputs that must be
accepted (scientific notation, the README's examples, the longest run name the advice allows).

Everything runs in-process (`launcher.cli.app.main`, `trainer.__main__.main`), so the whole table is cheap.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from launcher.controller.launch import prepare
from launcher.core.record import Knobs
from launcher.core.spec import RunSpec
from launcher.embedded.cluster import EmbeddedCluster
from tests.support.cli import run_cli
from trainer.__main__ import main as trainer_main

PRESET = ["--preset", "tpu7x-2x2x2"]
PLAN = ["plan", *PRESET, "-b", "32"]
RENDER = ["render", *PRESET, "--run", "r", "--run-dir", "rd", "-b", "32"]
LAUNCH = ["launch", *PRESET, "--run", "r", "--detach", "-b", "32"]
PREFLIGHT = ["preflight", *PRESET, "--run", "r", "--run-dir", "rd", "--no-probe", "-b", "32"]
SWEEP = ["sweep", *PRESET, "--steps", "20"]
WITH_SPEC = {"render": RENDER, "launch": LAUNCH, "preflight": PREFLIGHT}
WITH_SHAPE = {"plan": PLAN, **WITH_SPEC}


def _cases() -> list[tuple[list[str], int]]:
    cases: list[tuple[list[str], int]] = []

    def add(argv: list[str], code: int = 2) -> None:
        cases.append((argv, code))

    # Numbers nobody checked: the shape options of every planning command.
    for base in WITH_SHAPE.values():
        for flag, values in {
            "--slices": ["0", "-1", "1000000000", "nan", "1.5"],
            "--global-batch": ["0", "-8", "1000000000000", "inf"],
            "--max-micro-batch": ["0", "-1", "1000000000"],
            "--max-grad-accum": ["0", "-2"],
        }.items():
            for v in values:
                add([*(base[:-2] if flag == "--global-batch" and base[-2] == "-b" else base), flag, v])
    # The spec options of render, launch and preflight.
    for name, base in WITH_SPEC.items():
        spec_flags: dict[str, list[str]] = {
            "--image": ["", "two words"],
            "--namespace": ["Bad", "", "a_b", "x" * 64],
            "--queue": ["bad queue", "-q", "x" * 64],
            "--priority-class": ["Bad", "a_b"],
            "--service-account": ["UPPER", "a b"],
            "--placement-policy": ["=x", "nope=x"],
            "--cpu-request": ["lots", "Infinity"] if name != "render" else [],
        }
        if name != "preflight":
            spec_flags |= {
                # A Kueue topology level is a node label key, and asked of Kueue: with --queue only.
                "--tas-topology": ["cloud.google.com/gke-nodepool"],  # no --queue
                "--grace-period": ["-5", "nan"],
                "--max-restarts": ["-1", "1000000"],
                "--init-timeout": ["0", "-5"],
                "--coordinator-port": ["0", "99999", "8080", "8476"],
                "--set": ["noequals", "=1"],
                "--memory-request": ["-1Gi"],
            }
        for flag, values in spec_flags.items():
            for v in values:
                add([*base, flag, v])
        if name != "preflight":
            for level in ["Bad Key", "a/b/c", "/x", "x" * 64]:
                add([*base, "--queue", "q", "--tas-topology", level])
            add([*base, "--queue", "q", "--tas-preferred"])  # preferring no level
        add([*[a if a != "r" else "Bad" for a in base]])  # run name not DNS-1035
        add([*[a if a != "r" else "x" * 64 for a in base]])
    # Run directories that cannot be: a file, below a file, an invalid bucket, another scheme.
    for base in (RENDER, PREFLIGHT):
        for rd in ("afile", "afile/sub", "gs://UPPER/x", "gs://a/x", "gs://bad..name/x", "s3://b/x", ""):
            if base is RENDER or not rd.startswith("afile"):  # preflight's local path is the pods'
                add([*[a if a != "rd" else rd for a in base]])
    for rd in ("afile", "afile/sub", "gs://Bad_Bucket/x", "http://x"):
        add([*LAUNCH, "--run-dir", rd])
    # render: the segment, the pull policy, the output file.
    for seg in ("-1", "10001", "x"):
        add([*RENDER, "--segment", seg])
    add([*RENDER, "--pull-policy", "Sometimes"])
    # The restart mode: an unknown one, and in place with a trainer whose pods cannot follow worlds.
    for base in (RENDER, LAUNCH):
        add([*base, "--restart-mode", "sideways"])
        add([*base, "--restart-mode", "in-place", "--trainer", "maxtext"])
    for out in ("adir", "afile/x.yaml"):
        add([*RENDER, "-o", out])
    # launch: the policy's numbers and the save options.
    for flag, values in {
        "--unschedulable-grace": ["nan", "-1", "inf", "1e12"],
        "--grow-window": ["nan", "-1"],
        "--app-failure-budget": ["-1"],
        "--app-backoff": ["-1", "inf"],
        "--save-seconds": ["0", "nan", "-1"],
        "--short-notice-interval": ["0", "-3"],
    }.items():
        for v in values:
            add([*LAUNCH, flag, v])
    # launch: config errors the trainer finds (through its --check contract).
    for kv in (
        "optim.lr=.inf",
        "optim.lr=nan",
        "train.stepz=1",
        "train.steps=0",
        "train.steps=1.5",
        "optim.b2=2",
    ):
        add([*LAUNCH, "--set", kv])
    add([*LAUNCH, "--config", "nosuch"])
    add(["launch", "-p", "tpu7x-8x8x48", "-n", "4", "--run", "r" * 44, "-b", "24576"])  # name too long
    # sweep.
    for flag, values in {
        "--steps": ["0", "-1"],
        "--factors": ["", "a,b", "nan"],
        "--max-parallel": ["0", "1000"],
        "--max-drop": ["2", "nan", "-0.1"],
        "--warmup": ["-1"],
        "--name": ["Bad", "x" * 80],
        "--sweep-dir": ["afile", "gs://UPPER/x"],
        "--namespace": ["Bad"],
        "--image": [""],
        "--slices": ["0", "1000000000"],
        "--global-batch": ["0", "-1"],
        "--grace-period": ["-5"],
        "--set": ["noequals"],
    }.items():
        for v in values:
            add([*SWEEP, flag, v])
    add(["sweep-report", "nosuch", "--sweep-dir", "afile"])
    # sweep --trainer maxtext: the factor key set twice, keys the sweep owns, no MoE model, a key
    # MaxText does not have (reslice's own factor key among them), and an unknown profile.
    mt_sweep = [*SWEEP, "--trainer", "maxtext", "--set", "num_experts=4"]
    for kv in ("ragged_buffer_factor=2", "steps=5", "log_required_ragged_buffer_factor=false",
               "use_ring_of_experts=false", "moe.ragged_buffer_factor=2", "bogus=1"):  # fmt: skip
        add([*mt_sweep, "--set", kv])
    add([*SWEEP, "--trainer", "maxtext"])
    add([*SWEEP, "--trainer", "maxtext", "--config", "relative.yml"])
    add([*SWEEP, "--trainer", "megatron"])
    # --trainer on the other commands: an unknown profile; MaxText keys and config for preflight.
    for base in (RENDER, LAUNCH, PREFLIGHT):
        add([*base, "--trainer", "megatron"])
    add([*PREFLIGHT, "--trainer", "maxtext", "--set", "bogus=1"])
    add([*PREFLIGHT, "--trainer", "maxtext", "--config", "tiny"])
    # The run commands, by name and by namespace.
    for cmd in (["status", "r"], ["stop", "r"], ["report", "r"], ["runs"], ["watch", "r"]):
        add([*cmd, "--namespace", "Bad_NS"])
    for cmd in (["status", "nosuch"], ["stop", "nosuch"], ["report", "nosuch"]):
        add(cmd)
    add(["report", "r", "--out", "afile"])
    add(["report", "r", "--out", "afile/sub"])
    for extra in (["--resync", "0"], ["--resync", "nan"], ["--lease", "0"], ["--health-port", "70000"]):
        add(["watch", "--all", *extra])
    add(["watch"])
    add(["watch", "r", "--all"])
    add(["watch", "r", "--health-port", "8081"])
    add(["demo", "--steps", "5"])
    add(["demo", "--steps", "1000000000"])
    add(["demo", "--workdir", "afile"])
    add(["demo", "--runtime", "docker"])
    add(["demo", "--restart-mode", "sideways"])
    add(["demo", "--ui", "--ui-port", "70000"])
    # `reslice ui`: a port or an address it cannot bind (192.0.2.1: TEST-NET, no machine's), a host
    # that does not resolve, a bad namespace. A port in use: test_ui_port_in_use below.
    for extra in (["--port", "99999"], ["--port", "-1"], ["--host", "no.such.host.invalid"],
                  ["--host", "192.0.2.1"], ["--namespace", "Bad_NS"]):  # fmt: skip
        add(["ui", *extra])
    # The environment: kubeconfigs that are missing, malformed or point at nothing.
    for cmd in (["runs"], ["status", "r"], [a for a in LAUNCH if a != "--detach"], ["stop", "r"]):
        add([*cmd, "--kubeconfig", "missing.yaml"])
        add([*cmd, "--kubeconfig", "malformed.yaml"])
        add([*cmd, "--kubeconfig", "nocontext.yaml"])
        add([*cmd, "--kubeconfig", "nowhere.yaml"], 1)  # the cluster is unreachable: exit 1
    # A namespace that does not exist: the cluster is not ready for the run (1), whether preflight's
    # check or the launch itself finds it.
    add([*LAUNCH, "--namespace", "nosuch"], 1)
    add([*LAUNCH, "--namespace", "nosuch", "--no-preflight"], 1)
    # One check of --config and --set for every command that takes them: a config file that is not
    # there, a config file with an unknown key, an unknown key or a value of the wrong type.
    for base in (PLAN, RENDER, LAUNCH, PREFLIGHT, SWEEP):
        add([*base, "--config", "/path/that/does/not/exist.yaml"])
        add([*base, "--config", "unknownkey.yaml"])
        add([*base, "--set", "train.nosuch=1"])
        add([*base, "--set", "model.d_model=wide"])
    # A sweep on a cluster without node pools of its shape: refused as launch refuses it (1).
    add(["sweep", "--preset", "tpu7x-4x4x4", "--steps", "20"], 1)
    # A run name render used to take and launch refuses: one limit, the tightest rung's last segment.
    add(["render", "-p", "tpu7x-8x8x48", "-n", "4", "--run", "r" * 42, "--run-dir", "rd", "-b", "24576"])
    # The embedded cluster's commands.
    for extra in (["--port", "99999"], ["--port", "-1"], ["--timeout", "0"], ["--timeout", "nan"]):
        add(["cluster", "up", "--state-dir", "newstate", *extra])
    add(["cluster", "up", "--mode", "fast", "--state-dir", "newstate"])
    add(["cluster", "up", "--nodepools", "tpu9:2", "--state-dir", "newstate"])
    add(["cluster", "up", "--state-dir", "afile"])
    for grace in ("nan", "-5", "inf", "1e9"):
        add(["cluster", "preempt", "tpu7x-2x2x2-np-0", "--grace", grace])
    # Unknown commands and options.
    add(["launchx"])
    add([*PLAN, "--colour", "red"])
    add(["plan", *PRESET])
    return cases


CASES = _cases()
TRAINER_CASES = [
    ["--check", "--set", kv]
    for kv in (
        "optim.lr=.inf",
        "optim.lr=.nan",
        "optim.lr=-1e-3",
        "optim.lr=abc",
        "train.steps=1.5",
        "train.steps=-1e2",
        "train.stepz=1",
        "nosection",
        "model.dtype=int8",
        "data.copy_prob=2",
        "optim.b1=1",
        "checkpoint.interval=0",
        "metrics.log_every=0",
        "moe.top_k=0",
        "data.source=files",
    )
] + [["--check", "--config", "nosuch"], ["--check", "--config", "malformed.yaml"], ["--bogus"]]


def test_the_table_is_big_enough() -> None:
    assert len(CASES) + len(TRAINER_CASES) >= 150
    commands = {argv[0] for argv, _ in CASES}
    assert commands >= {"plan", "render", "launch", "preflight", "sweep", "sweep-report", "status", "stop"}
    assert commands >= {"report", "runs", "watch", "demo", "cluster", "ui"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster("tpu7x-2x2x2:2", mode="simulate") as c:
        yield c


@pytest.fixture
def world(cluster: EmbeddedCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with the files the cases name, and the cluster as $KUBECONFIG."""
    monkeypatch.chdir(tmp_path)
    for k in [k for k in os.environ if k.startswith("RESLICE_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    monkeypatch.setenv("RESLICE_CLUSTER_DIR", str(tmp_path / "nostate"))  # no background cluster here
    (tmp_path / "afile").write_text("a file, not a directory\n")
    (tmp_path / "adir").mkdir()
    (tmp_path / "malformed.yaml").write_text("apiVersion: v1\nclusters: [oops\n")
    (tmp_path / "unknownkey.yaml").write_text("base: tiny\ntrain:\n  stepz: 10\n")
    (tmp_path / "nocontext.yaml").write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n")
    nowhere = Path(cluster.kubeconfig).read_text().replace(cluster.url, "http://127.0.0.1:9")
    (tmp_path / "nowhere.yaml").write_text(nowhere)
    return tmp_path


def _objects(cluster: EmbeddedCluster) -> set[tuple[str, ...]]:
    api = cluster.api_client()
    core, custom, coord = client.CoreV1Api(api), client.CustomObjectsApi(api), client.CoordinationV1Api(api)
    items = [("ns", "", n.metadata.name, n.metadata.resource_version) for n in core.list_namespace().items]
    for kind, listing in (
        ("cm", core.list_config_map_for_all_namespaces().items),
        ("pod", core.list_pod_for_all_namespaces().items),
        ("lease", coord.list_lease_for_all_namespaces().items),
    ):
        items += [(kind, o.metadata.namespace, o.metadata.name, o.metadata.resource_version) for o in listing]
    jobsets = custom.list_cluster_custom_object("jobset.x-k8s.io", "v1alpha2", "jobsets")["items"]
    items += [("js", j["metadata"]["namespace"], j["metadata"]["name"], "") for j in jobsets]
    return set(items)


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


@pytest.mark.parametrize(("argv", "code"), CASES, ids=[" ".join(a)[:90] for a, _ in CASES])
def test_bad_input(argv: list[str], code: int, world: Path, cluster: EmbeddedCluster, capsys) -> None:
    before = (_objects(cluster), _files(world))
    got, _, err = run_cli(capsys, *argv)
    assert (got, err.count("\n") <= 3, "Traceback" not in err) == (code, True, True), err
    assert err.startswith("reslice: "), err
    assert (_objects(cluster), _files(world)) == before


@pytest.mark.parametrize("argv", TRAINER_CASES, ids=[" ".join(a) for a in TRAINER_CASES])
def test_bad_trainer_input(argv: list[str], world: Path, capsys) -> None:
    before = _files(world)
    code = _trainer(argv)
    err = capsys.readouterr().err
    assert (code, len(err.splitlines()), "Traceback" not in err) == (2, 1, True), err
    assert _files(world) == before


def _trainer(argv: list[str]) -> int:
    try:
        return trainer_main(argv)
    except SystemExit as e:  # argparse's usage error
        return int(e.code or 0)


VALID = [
    [*RENDER, "--set", "optim.lr=1e-3", "--set", "train.steps=1e2"],
    [*RENDER, "--set", "optim.lr=5E-4", "--segment", "998"],
    ["plan", "--preset", "tpu7x-4x4x4", "--slices", "4", "-b", "512"],  # the README's
    [
        "render",
        "--preset",
        "tpu7x-4x4x4",
        "--slices",
        "4",
        "--run",
        "llm",
        "--image",
        "IMG",
        "--run-dir",
        "gs://bucket/runs/llm",
        "--global-batch",
        "512",
    ],
    [*RENDER, "--grace-period", "0", "--max-restarts", "0", "--queue", "team-a.q_1"],
    [*RENDER, "--priority-class", "high.priority", "--service-account", "trainer-sa", "--namespace", "ml-1"],
    ["plan", *PRESET, "--slices", "64", "-b", "1024"],
    ["presets"],
]


@pytest.mark.parametrize("argv", VALID, ids=[" ".join(a)[:80] for a in VALID])
def test_valid_input_is_accepted(argv: list[str], world: Path, capsys) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert (code, err) == (0, "") and out


@pytest.mark.parametrize("argv", [["--check", "--set", "optim.lr=1e-3", "--set", "train.steps=1e2"]])
def test_valid_trainer_input_is_accepted(argv: list[str], capsys) -> None:
    assert _trainer(argv) == 0 and '"lr": 0.001' in capsys.readouterr().out


@pytest.mark.parametrize("shape", [("tpu7x-8x8x48", 4, 24576), ("tpu7x-2x2x2", 2, 32)])
def test_the_longest_run_name_the_advice_allows_is_accepted(shape: tuple, capsys, world: Path) -> None:
    preset, slices, batch = shape
    code, _, err = run_cli(
        capsys, "launch", "-p", preset, "-n", str(slices), "--run", "r" * 70, "-b", str(batch)
    )
    room = int(re.search(r"use at most (\d+) characters", err).group(1))
    spec = RunSpec(run="r" * room, run_dir="runs/x", global_batch=batch)
    prepare(spec, preset, slices, Knobs())  # launch's own checks: no error
    code, _, err = run_cli(capsys, *RENDER[:1], "-p", preset, "-n", str(slices), "--run", "r" * room,
                             "--run-dir", "rd", "-b", str(batch), "--segment", str(Knobs().max_segments - 1))  # fmt: skip
    assert code == 0, err
    with pytest.raises(Exception, match=f"use at most {room} characters"):
        prepare(RunSpec(run="r" * (room + 1), run_dir="runs/x", global_batch=batch), preset, slices, Knobs())


def test_no_cloud_credentials_for_a_gcs_run_dir(
    world: Path, cluster: EmbeddedCluster, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    for k in ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST", "CLOUDSDK_CONFIG"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(world))  # no ~/.config/gcloud
    monkeypatch.setenv("NO_GCE_CHECK", "true")  # not on GCE: skip the metadata server's probe
    from launcher.adapters import rundir

    rundir._client_for.cache_clear()
    before = (_objects(cluster), _files(world))
    code, _, err = run_cli(capsys, *LAUNCH, "--run-dir", "gs://my-bucket/x", "--no-preflight")
    rundir._client_for.cache_clear()
    assert code == 2 and err.count("\n") == 1 and "no Google Cloud credentials" in err, err
    assert (_objects(cluster), _files(world)) == before


def test_a_sweep_on_a_cluster_without_its_pools_is_refused_at_once(
    world: Path, cluster: EmbeddedCluster, capsys
) -> None:
    """launch's free checks, before any run is created: one line naming the missing pools, exit 1."""
    import time

    before = (_objects(cluster), _files(world))
    t0 = time.monotonic()
    code, _, err = run_cli(capsys, "sweep", "--preset", "tpu7x-4x4x4", "--steps", "20")
    elapsed = time.monotonic() - t0
    assert code == 1 and err.count("\n") == 1 and elapsed < 10, (elapsed, err)
    assert "node pools for tpu7x-4x4x4 x1" in err and "needs 1 node pool of tpu7x-4x4x4" in err, err
    assert (_objects(cluster), _files(world)) == before


def test_render_and_launch_state_one_run_name_limit(world: Path, capsys) -> None:
    shape = ["-p", "tpu7x-8x8x48", "-n", "4", "-b", "24576", "--run", "r" * 60]
    _, _, launched = run_cli(capsys, "launch", *shape)
    _, _, rendered = run_cli(capsys, "render", *shape, "--run-dir", "rd")
    advice = [re.search(r"use at most (\d+) characters", e) for e in (launched, rendered)]
    assert advice[0] and advice[1] and advice[0].group(1) == advice[1].group(1), (launched, rendered)


def test_a_run_directory_in_a_bucket_no_bucket_can_have_is_one_line(
    world: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv("RESLICE_RUN_DIR", "gs://Bad_Bucket!/x")
    before = _files(world)
    code = _trainer(["--config", "tiny"])
    err = capsys.readouterr().err
    assert (code, len(err.splitlines()), "Traceback" not in err) == (2, 1, True), err
    assert "'Bad_Bucket!' is not a valid Cloud Storage bucket name" in err
    assert _files(world) == before


def test_status_of_a_run_without_a_checkpoint_says_so(world: Path, cluster: EmbeddedCluster, capsys) -> None:
    code, _, err = run_cli(capsys, "launch", *PRESET, "--run", "fresh", "--detach", "-b", "32")
    assert code == 0, err
    code, out, err = run_cli(capsys, "status", "fresh")
    [line] = [ln for ln in out.splitlines() if "committed checkpoint" in ln]
    assert code == 0 and line.startswith("no committed checkpoint yet (target step") and "None" not in line, (
        out
    )
    run_cli(capsys, "stop", "fresh")


def test_ui_port_in_use(world: Path, cluster: EmbeddedCluster, capsys) -> None:
    """`reslice ui` on the port the embedded cluster's API server holds: one line, exit 2."""
    port = cluster.url.rsplit(":", 1)[1].strip("/")
    code, _, err = run_cli(capsys, "ui", "--port", port)
    assert (code, err.count("\n"), "Traceback" in err) == (2, 1, False), err
    assert err.startswith(f"reslice: error: cannot serve on 127.0.0.1:{port}: Address already in use"), err
