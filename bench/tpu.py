"""Everything a TPU lease is for, in one command and one JSON: the accelerator checks, the chip's
hand-off between in-place trainers, and the recovery figures at TPU scale.

    python3 -m bench.tpu [--out tpu.json] [--quick] [--timeout 1800]
    (or: python3 dev.py bench tpu ..., which sets nothing up: a TPU host has no project venv)

On a TPU host it runs with the machine's own JAX and the trainer's other packages beside it
(`python3.11 dev.py tpu-wheels --for-bench` downloads them here into .whl-tpu/; there, `pip install
--no-index --no-deps --target /tmp/site .whl-tpu/*.whl` and `PYTHONPATH=$PWD:/tmp/site`;
docs/measurements.md, "On a TPU"). It imports nothing but the standard library itself: each
benchmark runs as a child of this process (`python -m bench.<name> ... --json`), one after the
other, as one process holds the chip at a time. Their output streams through; each one's last line
(its JSON) is kept, with its exit code and seconds, in one JSON object written to --out (and
printed last). Exit 0 when every benchmark that ran exited 0.

A benchmark is run when its module is in this checkout (`BENCHES`: adding one is one line); one
that is not is listed as skipped, with why. ``--quick``: each in its smallest form (the accelerator's
toy shapes, one hand-off of one step), a dry run on CPU before a lease.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

from bench._cli import Parser

ROOT = Path(__file__).resolve().parents[1]
# (module under bench/, its arguments, its --quick arguments). Each prints one JSON object last.
BENCHES: list[tuple[str, list[str], list[str]]] = [
    ("accelerator", ["--json"], ["--json", "--quick", "--steps", "1"]),
    ("tpu_handoff", ["--json"], ["--json", "--handoffs", "1", "--steps", "1"]),
    # The recovery figures at TPU scale: run once bench/tpu_recovery.py is in the checkout.
    ("tpu_recovery", ["--json"], ["--json", "--quick"]),
]
TAIL_LINES = 40  # of a benchmark's output, kept in the JSON when its last line is no JSON


def child_env(env: dict[str, str]) -> dict[str, str]:
    """This process's environment for a benchmark on the host's own accelerator: without what
    bench/__init__.py sets on import for the simulated CPU hosts (JAX on CPU, XLA:CPU's quick-compile
    flags), which each benchmark decides for itself."""
    from launcher.embedded.kubelet.podenv import SIMULATED_XLA_FLAGS

    out = {k: v for k, v in env.items() if k != "JAX_PLATFORMS"}
    flags = out.get("XLA_FLAGS", "")
    for name, value in SIMULATED_XLA_FLAGS:
        flags = flags.replace(f"--{name}={value}", "")
    out["XLA_FLAGS"] = " ".join(flags.split())
    if not out["XLA_FLAGS"]:
        del out["XLA_FLAGS"]
    return out


def run_one(name: str, argv: list[str], timeout: float) -> dict:
    """`python -m bench.<name> ARGV` in its own process group, its output streamed through; its exit
    code, seconds and last JSON line."""
    cmd = [sys.executable, "-m", f"bench.{name}", *argv]
    print(f"\n=== bench.tpu: {' '.join(cmd[1:])}", flush=True)
    t0 = time.monotonic()
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=child_env(dict(os.environ)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group: a timeout ends its children too
    )
    assert proc.stdout is not None
    timed_out = False
    for line in proc.stdout:
        print(line, end="", flush=True)
        if line.strip():
            tail.append(line.rstrip("\n"))
        if time.monotonic() - t0 > timeout:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            break
    code = proc.wait()
    out: dict = {"argv": argv, "exit": code, "seconds": round(time.monotonic() - t0, 1)}
    if timed_out:
        out["error"] = f"no result within --timeout {timeout:.0f} s: killed"
    try:
        out["result"] = json.loads(tail[-1]) if tail else None
    except ValueError:
        out["result"] = None
    if out["result"] is None or code != 0:
        out["output_tail"] = list(tail)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m bench.tpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="the JSON file to write (default tpu-<time>.json)")
    parser.add_argument("--quick", action="store_true", help="each benchmark in its smallest form")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for each benchmark")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error(f"--timeout {args.timeout}: no time to run in (more than 0)")
    out_path = args.out or Path(f"tpu-{time.strftime('%Y%m%d-%H%M%S')}.json")
    if not out_path.parent.is_dir():
        parser.error(f"--out {out_path}: {out_path.parent} is not a directory")
    started = time.time()
    benches: dict[str, dict] = {}
    for name, full, quick in BENCHES:
        if importlib.util.find_spec(f"bench.{name}") is None:
            benches[name] = {"skipped": f"bench/{name}.py is not in this checkout"}
            print(f"\n=== bench.tpu: bench.{name} skipped: not in this checkout", flush=True)
            continue
        benches[name] = run_one(name, quick if args.quick else full, args.timeout)
    ran = [b for b in benches.values() if "skipped" not in b]
    report = {
        "command": " ".join(["python -m bench.tpu", *(argv if argv is not None else sys.argv[1:])]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        "host": platform.node(),
        "python": platform.python_version(),
        "ok": bool(ran) and all(b["exit"] == 0 for b in ran),
        "benches": benches,
    }
    out_path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\n=== bench.tpu: {out_path}", flush=True)
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
