"""A stand-in for `python -m maxtext.trainers.pre_train.train`, for the entrypoint's plumbing tests
(tests/maxtext/test_entry_run.py; the suite's venv has no MaxText). It behaves as MaxText 0.2.5 did
in the measured runs (docs/maxtext.md): 0-based steps, one metrics line per step appended to
`metrics_file` (a local `open()`, whatever the output directory), Orbax-like
`checkpoints/<k>/commit_success.txt` every `checkpoint_period` steps and at the last — through
etils' epath on a gs:// `base_output_directory`, as Orbax writes its metadata —, a SIGTERM saves at
the next step, prints the stop line and exits 0. FAKE_MODE picks a failure: `data_crash` (exit 0
half-way, as MaxText does when its input pipeline dies) or `config` (the config module's ValueError,
exit 1).

MaxText's MoE overflow probes, as 0.2.5 writes them (docs/maxtext.md, The sweep):
`log_required_ragged_buffer_factor=true` logs `REQUIRED_RBF step=S max=M per_layer=[...]
program=normal` on stderr while training step S, and `moe_log_max_load_ratio=true` adds
`learning/moe_max_load_ratio{,_mean}` to the step's metrics line. The per-layer loads are drawn
from (step, layer) alone, so every factor of a sweep sees the same routing; a step's time grows
with the buffer (`ragged_buffer_factor`; ≤ 0, dropless, is the worst case: `num_experts_per_tok`
× the balanced rows per expert shard)."""

import json
import os
import random
import signal
import sys
import time

keys = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
mode = os.environ.get("FAKE_MODE", "")
if mode == "config":
    print(
        '  File "/venv/lib/python3.12/site-packages/maxtext/configs/pyconfig.py", line 271', file=sys.stderr
    )
    print("ValueError: 'no_such_key' not in 'emb_dim'", file=sys.stderr)
    sys.exit(1)
ckpt = f"{keys['base_output_directory'].rstrip('/')}/{keys['run_name']}/checkpoints"
remote = "://" in ckpt
steps, period = int(keys["steps"]), int(keys["checkpoint_period"])
term = []
signal.signal(signal.SIGTERM, lambda *_: term.append(1))
layers = int(keys.get("base_num_decoder_layers", "2"))
factor = float(keys.get("ragged_buffer_factor", "-1"))
worst = float(keys.get("num_experts_per_tok", "2")) * 2  # the dropless buffer, in balanced rows
log_rbf = keys.get("log_required_ragged_buffer_factor") == "true"
log_load = keys.get("moe_log_max_load_ratio") == "true"


def save(k: int) -> None:
    text = "Checkpoint commit was successful"
    if remote:
        from etils import epath

        epath.Path(f"{ckpt}/{k}/commit_success.txt").write_text(text)
        return
    os.makedirs(os.path.join(ckpt, str(k)), exist_ok=True)
    with open(os.path.join(ckpt, str(k), "commit_success.txt"), "w") as f:
        f.write(text)


def committed() -> list[int]:
    if remote:
        from etils import epath

        root = epath.Path(ckpt)
        return [int(p.name) for p in root.iterdir() if p.name.isdigit()] if root.exists() else []
    return [int(n) for n in os.listdir(ckpt)] if os.path.isdir(ckpt) else []


def loads(step: int) -> list[float]:
    """Each MoE layer's largest expert-shard load over the balanced load at this step."""
    return [1.0 + random.Random(step * 1000 + layer).expovariate(5.0) for layer in range(layers)]


done = committed()
start = max(done) + 1 if done else 0
print(f"fake: hardware={keys.get('hardware')} ici_data={keys.get('ici_data_parallelism')}", flush=True)
for step in range(start, steps):
    buffer = worst if factor <= 0 else factor
    step_s = float(os.environ.get("FAKE_STEP_S", "0.02")) * (0.5 + buffer / 2)
    time.sleep(step_s)
    load = loads(step)
    if log_rbf:
        per_layer = ",".join(f"{v:.4f}" for v in load)
        print(
            f"I1204 train.py:795] REQUIRED_RBF step={step} max={max(load):.4f} per_layer=[{per_layer}] "
            "program=normal",
            file=sys.stderr,
            flush=True,
        )
    line = {
        "learning/loss": 5.0 - step / 100,
        "learning/lm_loss": 5.0 - step / 100,
        "perf/step_time_seconds": step_s,
        "perf/per_device_tokens_per_sec": 64 / step_s,
        "step": float(step),
    }
    if log_load:
        line["learning/moe_max_load_ratio"] = max(load)
        line["learning/moe_max_load_ratio_mean"] = sum(load) / len(load)
    with open(keys["metrics_file"], "a") as f:
        f.write(json.dumps(line) + "\n")
    if mode == "data_crash" and step == steps // 2:
        print("grain worker died", file=sys.stderr)
        sys.exit(0)
    if term:
        save(step)
        print(
            "I1202 train.py:1454] Training stopped: Job received termination signal (SIGTERM).",
            file=sys.stderr,
        )
        sys.exit(0)
    if step % period == 0 or step == steps - 1:
        save(step)
