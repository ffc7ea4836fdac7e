"""``python -m trainer --hbm`` (the AOT figure) and the launcher's analytic estimate of it; ``--memory``,
its former name, still accepted."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

from launcher.core.hbm import estimate, param_counts
from launcher.core.plan import plan_batch
from launcher.embedded.kubelet import podenv
from tests.trainer.runs import ROOT
from trainer import config

# A small dense decoder with every HBM-saving feature on: bf16, whole-block remat, query blocks of 128
# of 512 positions, a chunked loss; fsdp 4 × tensor 2 on the 8 simulated devices. The blocked
# attention said outright: what a CPU compiles, where the estimate of a TPU's splash kernel has no scores.
MINI = [
    "model.vocab_size=4096", "model.seq_len=512", "model.d_model=256", "model.n_layers=4",
    "model.n_heads=8", "model.head_dim=32", "model.d_ff=768", "model.dense_layers=4",
    "model.dtype=bfloat16", "model.remat=full", "model.attention_block=128", "model.loss_chunk=128",
    "model.attention=blocked", "mesh.fsdp=4", "mesh.tensor=2",
]  # fmt: skip


def test_hbm_json_and_the_analytic_estimate_within_25_percent() -> None:
    # Against XLA:CPU's default pipeline, as `--hbm` compiles on a user's machine, not the
    # embedded kubelet's (podenv.simulated_host, which this session runs with): its Eigen dots alone
    # needed 10 % less temporary memory for this step (54.0 MB against 59.9; estimate 71.9 MB).
    simulated = podenv.simulated_xla_flags("").split()
    flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if f not in simulated)
    env = dict(os.environ, XLA_FLAGS=flags, JAX_NUM_CPU_DEVICES="8", RESLICE_GLOBAL_BATCH="16")
    args = ["--config", "tiny", "--hbm", *(a for s in MINI for a in ("--set", s))]
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["mesh"] == {"data": 1, "fsdp": 4, "expert": 1, "tensor": 2}
    assert (report["dp_ranks"], report["micro_batch"], report["grad_accum"]) == (4, 4, 1)
    assert report["per_device_bytes"] == (
        report["argument_bytes"] + report["output_bytes"] - report["alias_bytes"] + report["temp_bytes"]
    )
    # The state is donated: its buffers are the step's outputs, counted once.
    assert report["alias_bytes"] == report["state_bytes"] > 0

    cfg = config.resolve("tiny", MINI, {"RESLICE_GLOBAL_BATCH": "16"})
    plan = plan_batch(16, 8, 16, model_parallel=2)
    assert plan.micro_batch == report["micro_batch"]
    est = estimate(dataclasses.asdict(cfg), plan)
    assert 0.75 <= est["total"] / report["per_device_bytes"] <= 1.25, (est, report)
    # Without the query blocks and the chunked loss the estimate grows by the whole scores and logits.
    whole = config.resolve(
        "tiny", [*MINI, "model.attention_block=0", "model.loss_chunk=0"], {"RESLICE_GLOBAL_BATCH": "16"}
    )
    assert estimate(dataclasses.asdict(whole), plan)["total"] > 1.5 * est["total"]


def test_memory_the_former_name_of_hbm_still_works_out_of_help(monkeypatch, capsys) -> None:
    """``--memory`` runs what ``--hbm`` runs, saying on stderr that it is deprecated; ``--help`` shows
    ``--hbm`` alone."""
    from trainer import __main__ as cli
    from trainer import hbm

    monkeypatch.setenv("RESLICE_GLOBAL_BATCH", "16")
    monkeypatch.setattr(hbm, "aot_hbm", lambda cfg: {"config": cfg.name, "per_device_bytes": 1})
    for flag, note in (("--hbm", ""), ("--memory", "trainer: --memory is deprecated: it is now --hbm\n")):
        assert cli.main(["--config", "tiny", flag]) == 0
        out, err = capsys.readouterr()
        assert json.loads(out) == {"config": "tiny", "per_device_bytes": 1} and err == note, flag
    usage = cli._parser().format_help()
    assert "--hbm" in usage and "--memory" not in usage


def test_the_estimate_counts_the_parameters_the_trainer_builds_grouped_query_attention_and_qk_norm_included() -> (
    None
):
    # The launcher cannot import the trainer (an import contract): its count is kept beside the
    # trainer's and held equal here, on configs where each attention feature changes the count.
    from trainer.model import sizes

    for overrides in ([], ["model.kv_heads=2"], ["model.kv_heads=1", "model.qk_norm=true"]):
        cfg = config.resolve("tiny", overrides, {"RESLICE_GLOBAL_BATCH": "16"})
        as_dict = dataclasses.asdict(cfg)
        assert sum(param_counts(as_dict["model"], as_dict["moe"])) == sizes.param_counts(cfg)[0], overrides
    # Fewer key/value heads: a smaller state in the estimate too.
    plan = plan_batch(16, 8, 16)
    full, grouped = (
        estimate(dataclasses.asdict(config.resolve("tiny", o, {"RESLICE_GLOBAL_BATCH": "16"})), plan)
        for o in ([], ["model.kv_heads=1"])
    )
    assert grouped["state"] < full["state"] and grouped["total"] < full["total"]


def test_the_launcher_knows_every_remat_policy_and_each_keeps_more_than_the_last() -> None:
    """launcher/core/hbm.py mirrors trainer.config.Remat (the launcher cannot import the trainer);
    its estimate keeps a block's input under full and offload, then the attention's inputs and
    output, then its projections, then everything."""
    from types import SimpleNamespace

    from launcher.core.hbm import TrainerRemat

    assert {str(k) for k in TrainerRemat} == {str(k) for k in config.Remat}
    plan = SimpleNamespace(devices=8, micro_batch=4, model_parallel=2, grad_accum=1)

    def saved(kind: str) -> float:
        cfg = config.resolve("tiny", [*MINI, f"model.remat={kind}"], {})
        return estimate(cfg.to_dict(), plan)["saved_activations"]

    assert saved("full") == saved("offload") > 0
    assert saved("full") < saved("save_attention") < saved("save_all_but_mlp_in") < saved("none")
