"""In-memory snapshots: their cost per step, and a restore from memory against one from storage,
measured side by side in one process.

    python -m bench.snapshot_cost [--config tiny] [--set key=value ...] [--steps N] [--rounds R]

Each round runs ``trainer.loop.run`` twice on the same config, without and with snapshots every
step (``checkpoint.memory_interval=1``, a memory directory under /dev/shm), and takes the per-step
wall time from the metrics between step 1 (compile) and the last step, as bench.trainer_overhead
does; a round's ratio is with / without, the median of the rounds is reported (goal <= 1.01).
Then the state of the last step is restored onto the same mesh from the last round's run
directory (Orbax, as a new segment does) and from its snapshot (trainer/state/snapshot.py), each until
its arrays are on the devices, alternately, and the medians are printed with their ratio.

Defaults: ``tiny`` with a global batch of 256 on 8 simulated CPU devices (bench.trainer_overhead's),
40 steps (checkpoint every 20), 3 rounds. Prints figures; it is not a timed test.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench._cli import Parser


def _loop(
    cfg_name: str, overrides: list[str], steps: int, run_dir: str, memory_dir: str | None
) -> list[dict]:
    from launcher.adapters.rundir import read_jsonl
    from trainer import config, loop

    sets = [*overrides, f"train.steps={steps}", f"run_dir={run_dir}", "checkpoint.memory_interval=1"]
    cfg = config.resolve(cfg_name, sets, {})
    env = {"RESLICE_MEMORY_DIR": memory_dir} if memory_dir else {}
    if loop.run(cfg, env) != 0:
        raise SystemExit("bench: the training loop did not finish")
    records = [r for f in sorted(Path(run_dir, "metrics").glob("*.jsonl")) for r in read_jsonl(f.read_text())]
    return sorted(records, key=lambda r: r["step"])


def _per_step(records: list[dict]) -> float:
    return (records[-1]["time"] - records[0]["time"]) / (len(records) - 1)


def restores(cfg_name: str, overrides: list[str], run_dir: str, memory_dir: str, repeats: int) -> dict:
    """Seconds to restore the newest step onto this process's mesh: from storage, from memory."""
    import jax

    from trainer import config
    from trainer.model.mesh import mesh_for
    from trainer.state import snapshot
    from trainer.state.checkpoint import Checkpointer
    from trainer.step import abstract_state, plain

    cfg = config.resolve(cfg_name, [*overrides, f"run_dir={run_dir}"], {})
    mesh = mesh_for(cfg)
    with jax.set_mesh(mesh):
        abstract = plain(abstract_state(cfg, mesh)[1])
        ckpt = Checkpointer(run_dir, 3)
        step = ckpt.latest_step()
        if step is None:
            raise SystemExit(f"bench.snapshot_cost: the run left no checkpoint in {run_dir}")
        header = snapshot.read_header(Path(memory_dir) / f"{step}.snap")
        storage, memory = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(ckpt.restore(step, abstract))
            storage.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            jax.block_until_ready(snapshot.load(header, abstract))
            memory.append(time.perf_counter() - t0)
        ckpt.close()
    return {"step": step, "storage": storage, "memory": memory, "bytes": os.path.getsize(header["file"])}


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m bench.snapshot_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--devices", type=int, default=8, help="simulated CPU devices when no accelerator")
    args = parser.parse_args(argv)
    parser.at_least(args, 1, "rounds", "devices")
    if args.steps < 3:  # per-step time is taken between step 1 (compile) and the last step
        parser.error(f"--steps {args.steps}: at least 3 (step 1 compiles, the time is from it to the last)")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("JAX_NUM_CPU_DEVICES", str(args.devices))
    overrides = ["train.global_batch=256", *args.set] if args.config == "tiny" else list(args.set)
    overrides += ["metrics.log_every=1000000", "train.compile_cache=false"]

    without, with_, ratios = [], [], []
    root = Path(tempfile.mkdtemp(prefix="reslice-bench-"))
    shm = Path(tempfile.mkdtemp(prefix="reslice-bench-", dir="/dev/shm"))
    try:
        _loop(args.config, overrides, args.steps, str(root / "warm"), None)  # compiles, warms the caches
        for r in range(args.rounds):
            off = _per_step(_loop(args.config, overrides, args.steps, str(root / f"off{r}"), None))
            memory_dir = shm / f"on{r}"
            on_records = _loop(args.config, overrides, args.steps, str(root / f"on{r}"), str(memory_dir))
            on = _per_step(on_records)
            without.append(off)
            with_.append(on)
            ratios.append(on / off)
        blocked = [x["perf/memory_snapshot_seconds"] for x in on_records[1:]]
        got = restores(args.config, overrides, str(root / f"on{args.rounds - 1}"), str(memory_dir), 5)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    cfg_line = f"{args.config} {' '.join(overrides)}, {on_records[-1]['devices']} devices, {args.steps} steps x {args.rounds} rounds"
    print(cfg_line)
    print(
        f"  loop without snapshots  {statistics.median(without) * 1e3:8.2f} ms/step  (each: {_ms(without)})"
    )
    print(f"  loop, snapshot per step {statistics.median(with_) * 1e3:8.2f} ms/step  (each: {_ms(with_)})")
    print(f"  snapshot cost ratio     {statistics.median(ratios):8.3f}        (each: {', '.join(f'{x:.3f}' for x in ratios)}; goal <= 1.01)")  # fmt: skip
    print(f"  loop blocked per snapshot {statistics.median(blocked) * 1e3:6.2f} ms median, {max(blocked) * 1e3:.2f} ms max")  # fmt: skip
    s, m = statistics.median(got["storage"]), statistics.median(got["memory"])
    print(f"  restore step {got['step']} ({got['bytes'] / 1e6:.1f} MB snapshot): from storage {s * 1e3:.1f} ms, from memory {m * 1e3:.1f} ms median of {len(got['memory'])}; memory / storage {m / s:.3f}")  # fmt: skip
    return 0


def _ms(values: list[float]) -> str:
    return ", ".join(f"{v * 1e3:.1f}" for v in values)


if __name__ == "__main__":
    sys.exit(main())
