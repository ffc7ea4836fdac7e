"""A stand-in for `python -m maxtext.trainers.pre_train.train`, for the entrypoint's plumbing tests
(tests/maxtext/test_entry_run.py; the suite's venv has no MaxText). It behaves as MaxText 0.2.5 did
in the measured runs (docs/maxtext.md): 0-based steps, one metrics line per step appended to
`metrics_file`, Orbax-like `checkpoints/<k>/commit_success.txt` every `checkpoint_period` steps and
at the last, a SIGTERM saves at the next step, prints the stop line and exits 0. FAKE_MODE picks a
failure: `data_crash` (exit 0 half-way, as MaxText does when its input pipeline dies) or `config`
(the config module's ValueError, exit 1)."""

import json
import os
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
ckpt = os.path.join(keys["base_output_directory"], keys["run_name"], "checkpoints")
steps, period = int(keys["steps"]), int(keys["checkpoint_period"])
term = []
signal.signal(signal.SIGTERM, lambda *_: term.append(1))


def save(k: int) -> None:
    os.makedirs(os.path.join(ckpt, str(k)), exist_ok=True)
    with open(os.path.join(ckpt, str(k), "commit_success.txt"), "w") as f:
        f.write("Checkpoint commit was successful")


done = [int(n) for n in os.listdir(ckpt)] if os.path.isdir(ckpt) else []
start = max(done) + 1 if done else 0
print(f"fake: hardware={keys.get('hardware')} ici_data={keys.get('ici_data_parallelism')}", flush=True)
for step in range(start, steps):
    time.sleep(float(os.environ.get("FAKE_STEP_S", "0.02")))
    with open(keys["metrics_file"], "a") as f:
        f.write(
            json.dumps(
                {"learning/loss": 5.0 - step / 100, "learning/lm_loss": 5.0 - step / 100, "step": float(step)}
            )
            + "\n"
        )
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
