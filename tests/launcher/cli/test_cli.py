import json
import subprocess
import sys
from dataclasses import replace

import pytest
import yaml

from tests.support.cli import run_cli

RENDER = ["render", "--preset", "tpu7x-2x2x2", "--run", "demo", "--run-dir", "/tmp/r", "--global-batch", "32"]
GOOD_PRESET = """name: {name}
accelerator: tpu7x
machine_type: tpu7x-standard-4t
topology: {topology}
chips_per_host: 4
devices_per_chip: 2
peak_tflops_per_chip: 2307
"""


def test_presets_table_and_json(capsys):
    code, out, _ = run_cli(capsys, "presets")
    assert code == 0
    for needle in ("tpu7x-4x4x4", "tpu7x-8x8x48", "tpu-v5p-slice", "768", "6144"):
        assert needle in out
    code, out, _ = run_cli(capsys, "presets", "--json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["tpu7x-8x8x48"]["hosts"] == 768 and rows["tpu7x-4x4x4"]["devices"] == 128


def test_plan_table_and_json(capsys):
    code, out, _ = run_cli(capsys, "plan", "-p", "tpu7x-2x2x2", "-n", "4", "-b", "64")
    assert code == 0 and "not divisible by 48" in out and "multislice needs multi-host" in out
    code, out, _ = run_cli(capsys, "plan", "-p", "tpu7x-2x2x2", "-n", "4", "-b", "64", "--json")
    ladder = json.loads(out)
    assert [r["slices"] for r in ladder if r["preset"] == "tpu7x-2x2x2"] == [4, 3, 2, 1]
    assert ladder[-1]["micro_batch"] * ladder[-1]["grad_accum"] * ladder[-1]["devices"] == 64


def test_render_yaml_json_and_file(capsys, tmp_path):
    code, out, _ = run_cli(capsys, *RENDER, "--slices", "2", "--set", "train.steps=10")
    assert code == 0
    js = yaml.safe_load(out)
    assert js["kind"] == "JobSet" and js["spec"]["replicatedJobs"][0]["replicas"] == 2
    code, out, _ = run_cli(capsys, *RENDER, "--json")
    assert json.loads(out)["metadata"]["name"] == "demo-0"
    target = tmp_path / "js.yaml"
    code, out, _ = run_cli(capsys, *RENDER, "--output", str(target))
    assert code == 0 and out == "" and yaml.safe_load(target.read_text())["kind"] == "JobSet"
    code, out, _ = run_cli(capsys, *RENDER, "--init-timeout", "1800", "--json")
    container = json.loads(out)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in container["containers"][0]["env"]}
    assert code == 0 and env["RESLICE_INIT_TIMEOUT_S"] == "1800"


def _presets_dir(tmp_path, **files):
    for name, text in files.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    return tmp_path


BAD_INPUTS = [
    (["render", "--preset", "tpu9-1x1", *RENDER[3:]], None, "unknown preset 'tpu9-1x1'"),
    (["plan", "-p", "nope", "-b", "8"], None, "unknown preset 'nope'"),
    (RENDER[:-1] + ["30"], None, "global batch 30 is not divisible by 16 devices"),
    (["plan", "-p", "tpu7x-4x4x4", "-b", "100"], None, "not divisible by 128 devices"),
    (RENDER[:-1] + ["-8"], None, "--global-batch -8: expected an integer between 1 and"),
    (["render", "--preset", "tpu7x-2x2x1", "--run", "Demo", "--run-dir", "/r", "-b", "8"], None, "DNS-1035"),
    (
        [
            "render",
            "--preset",
            "tpu7x-8x8x48",
            "-n",
            "4",
            "--run",
            "x" * 60,
            "--run-dir",
            "/r",
            "-b",
            "24576",
        ],
        None,
        "too long",
    ),
    (RENDER[:-2], None, "Missing option '--global-batch'"),
    (RENDER[:-1] + ["many"], None, "Invalid value for '--global-batch'"),
    ([*RENDER, "--slices", "0"], None, "--slices 0: expected an integer between 1 and 1024"),
    ([*RENDER, "--set", "train.steps"], None, "expected key=value"),
    ([*RENDER, "--pull-policy", "Sometimes"], None, "expected Always, IfNotPresent or Never"),
    ([*RENDER, "--init-timeout", "0"], None, "--init-timeout 0: expected an integer between 1 and"),
    (
        ["launch", "-p", "tpu7x-2x2x1", "--run", "x", "-b", "8", "--init-timeout", "-5"],
        None,
        "--init-timeout -5",
    ),
    (["launchx"], None, "No such command"),
    (
        ["launch", "-p", "tpu7x-2x2x1", "--run", "x", "-b", "8", "--set", "train.stepz=1"],
        None,
        "unknown config key 'train.stepz'",
    ),
    (
        ["launch", "-p", "tpu7x-2x2x1", "--run", "x", "-b", "8", "--config", "huge"],
        None,
        "config 'huge' is neither a named config",
    ),
    (["launch", "-p", "tpu7x-8x8x48", "-n", "4", "--run", "r" * 44, "-b", "24576"], None, "too long"),
    (["demo", "--steps", "5"], None, "--steps must be between 25 and"),
    (
        ["plan", "-p", "bad", "-b", "8"],
        {"bad": GOOD_PRESET.format(name="bad", topology="4x4x6")},
        "multiple of 4",
    ),
    (["plan", "-p", "bad", "-b", "8"], {"bad": "name: bad\ntopology: [4x4\n"}, "malformed YAML"),
    (["presets"], {"bad": GOOD_PRESET.format(name="bad", topology="2x2x1") + "colour: red\n"}, "unknown key"),
    (
        ["presets"],
        {"bad": GOOD_PRESET.format(name="bad", topology="2x2x2") + "fallbacks: [gone]\n"},
        "fallback 'gone'",
    ),
    (
        ["plan", "-p", "bad", "-b", "8"],
        {
            "bad": GOOD_PRESET.format(name="bad", topology="2x2x1").replace(
                "chips_per_host: 4", "chips_per_host: 3"
            )
        },
        "do not divide",
    ),
    (
        ["launch", "-p", "v6e-16x16", "--run", "x", "-b", "256", "--save-seconds", "40"],
        None,
        "an emergency save takes 40 s, more than v6e-16x16 (15 s), v6e-4x4 (15 s), v6e-2x4 (15 s) give",
    ),
    (
        [
            "launch",
            "-p",
            "v6e-16x16",
            "--run",
            "x",
            "-b",
            "256",
            "--save-seconds",
            "40",
            "--short-notice-interval",
            "0",
        ],
        None,
        "--short-notice-interval 0: expected an integer between 1 and",
    ),
    (
        ["launch", "-p", "tpu7x-2x2x1", "--run", "x", "-b", "8", "--cpu-request", "lots"],
        None,
        "--cpu-request 'lots'",
    ),
    (
        ["launch", "-p", "tpu7x-2x2x1", "--run", "x", "-b", "8", "--memory-request", "-1Gi"],
        None,
        "not a positive",
    ),
]


@pytest.mark.parametrize("argv,preset_files,message", BAD_INPUTS)
def test_bad_input_is_one_line_and_exit_2(capsys, monkeypatch, tmp_path, argv, preset_files, message):
    if preset_files is not None:
        monkeypatch.setenv("RESLICE_PRESETS_DIR", str(_presets_dir(tmp_path, **preset_files)))
    target = tmp_path / "out.yaml"
    code, out, err = run_cli(capsys, *argv, *(["--output", str(target)] if argv[0] == "render" else []))
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("reslice: error:"), err
    assert message in err
    assert "Traceback" not in err
    assert not target.exists()


def test_console_script_is_wired():
    # The installed entry point, in a fresh interpreter: exit code and stderr as a user sees them.
    proc = subprocess.run(
        [sys.executable, "-m", "launcher", "plan", "-p", "tpu7x-4x4x4", "-b", "100"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "reslice: error: tpu7x-4x4x4 x1: global batch 100 is not divisible by 128 devices"
    ]


def test_render_service_account_names_the_pods_service_account(capsys):
    code, out, _ = run_cli(capsys, *RENDER, "--service-account", "trainer")
    pod = yaml.safe_load(out)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert code == 0 and pod["serviceAccountName"] == "trainer"
    code, out, _ = run_cli(capsys, *RENDER)
    assert "serviceAccountName" not in out  # the namespace's default ServiceAccount


def test_plan_and_render_learn_the_tensor_parallel_degree_from_the_trainer_config(capsys):
    """48 sequences do not split over 64 devices; over 16 data-parallel ranks of tensor 4 they do."""
    args = ["-p", "tpu7x-2x2x2", "-n", "4", "-b", "48"]
    code, _, err = run_cli(capsys, "plan", *args)
    assert code == 2 and "not divisible by 64 devices" in err
    code, out, _ = run_cli(capsys, "plan", *args, "--config", "tiny", "--set", "mesh.tensor=4", "--json")
    assert code == 0
    top = json.loads(out)[0]
    assert top["feasible"] and top["plan"] == {
        "micro_batch": 3,
        "grad_accum": 1,
        "dp_ranks": 16,
        "model_parallel": 4,
    }
    render = ["render", "--preset", "tpu7x-2x2x2", "--slices", "4", "--run", "tp", "--run-dir", "/tmp/r"]
    code, out, _ = run_cli(capsys, *render, "--global-batch", "48", "--set", "mesh.tensor=4", "--json")
    assert code == 0
    env = {
        e["name"]: e.get("value")
        for e in json.loads(out)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
            "containers"
        ][0]["env"]
    }
    assert (env["RESLICE_MICRO_BATCH"], env["RESLICE_GRAD_ACCUM"]) == ("3", "1")


def test_plan_marks_rungs_the_model_cannot_live_on_infeasible(capsys):
    """olmo-7b at global batch 512 in one micro-step: a quarter slice (128 Ironwood devices, 96 GiB
    each, 4 sequences a device) holds it, a tpu7x-2x2x2 (16 devices, 32 sequences each) does not;
    the launch-time ladder uses the same estimate."""
    code, out, _ = run_cli(
        capsys, "plan", "-p", "tpu7x-4x4x4", "-b", "512", "--config", "olmo-7b", "--json",
        "--max-micro-batch", "32", "--max-grad-accum", "1",
    )  # fmt: skip
    assert code == 0
    rungs = {r["preset"]: r for r in json.loads(out) if r["slices"] == 1}
    quarter, small = rungs["tpu7x-4x4x4"], rungs["tpu7x-2x2x2"]
    assert quarter["feasible"] and 10 * 2**30 < quarter["memory"]["total"] < 96 * 2**30
    assert quarter["memory"]["state"] < 2**30  # fp32 parameters and Adam moments, 128 ways
    assert (
        not small["feasible"]
        and "GiB of HBM" in small["infeasible"]
        and small["memory"]["total"] > 96 * 2**30
    )


@pytest.mark.parametrize(
    ("module", "distribution"), [("typer", "typer"), ("kubernetes", "kubernetes"), ("yaml", "pyyaml")]
)
def test_a_bare_install_says_which_extra_the_command_line_needs(module, distribution):
    """`pip install reslice` without the `controller` extra: the entry point says so in one line,
    exit 2, no traceback (a module set to None in sys.modules cannot be imported)."""
    code = f"import sys; sys.modules[{module!r}] = None; from launcher.cli.entry import main; main()"
    proc = subprocess.run([sys.executable, "-c", code, "presets"], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert f"lacks {distribution}," in proc.stderr and "reslice[controller]" in proc.stderr
    assert proc.stdout == ""


def test_python_dash_m_launcher_runs_the_command_line():
    proc = subprocess.run(
        [sys.executable, "-m", "launcher", "presets", "--json"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert any(r["name"] == "tpu7x-4x4x4" for r in json.loads(proc.stdout))


def test_a_mixture_set_on_olmo_7b_plans_and_renders_as_before(capsys):
    """`data.sources` is the trainer's business: the plan is the same, and the JobSet differs only in
    the overrides it hands the trainer; a bad source is refused before anything renders."""
    sources = "data.sources=[{name: web, path: gs://bkt/web/, weight: 3}, {name: code, path: gs://bkt/code/, weight: 1}]"
    plan = ["plan", "-p", "tpu7x-4x4x4", "-n", "4", "-b", "512", "--config", "olmo-7b", "--json"]
    code, before, _ = run_cli(capsys, *plan)
    code2, after, _ = run_cli(capsys, *plan, "--set", sources)
    assert (code, code2) == (0, 0) and json.loads(after) == json.loads(before)
    render = [
        "render",
        "-p",
        "tpu7x-4x4x4",
        "--run",
        "o",
        "--run-dir",
        "gs://bkt/r",
        "-b",
        "512",
        "--config",
        "olmo-7b",
    ]

    def env(out: str) -> dict:
        pod = yaml.safe_load(out)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        return {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}

    code, before, _ = run_cli(capsys, *render)
    code2, after, _ = run_cli(capsys, *render, "--set", sources)
    assert (code, code2) == (0, 0)
    changed = {k for k in env(before) if env(before)[k] != env(after)[k]}
    assert len(changed) == 1 and json.loads(env(after)[changed.pop()]) == [sources]
    code, out, err = run_cli(capsys, *render, "--set", "data.sources=[{name: web}]")
    assert code == 2 and out == "" and "data.sources[0] (web)" in err and err.count("\n") == 1


def test_a_real_cluster_refuses_an_image_without_a_registry() -> None:
    # The default names are dev.py's local builds: on GKE containerd would pull
    # docker.io/library/reslice-trainer:latest. Refused before anything is created: one line, exit 2.
    from launcher.cli.spec_options import for_cluster
    from launcher.core import images
    from launcher.core.errors import UserError
    from launcher.core.spec import RunSpec

    spec = RunSpec(run="r", run_dir="gs://b/r", global_batch=64)
    assert spec.image == images.TRAINER
    with pytest.raises(
        UserError, match=r"docker\.io/library/reslice-trainer:latest.*REGION-docker\.pkg\.dev"
    ):
        for_cluster(spec, embedded=False)
    assert for_cluster(spec, embedded=True).image_pull_policy == "Never"  # the embedded cluster's own
    assert for_cluster(spec, embedded=False, pulled=False) == spec  # preflight reports it in its row
    for ok in ("europe-docker.pkg.dev/p/r/reslice-trainer:1", "localhost:5000/t:1", "org/trainer:2"):
        assert for_cluster(replace(spec, image=ok), embedded=False).image == ok
