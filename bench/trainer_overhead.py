"""Training-loop overhead against a bare jitted step, measured side by side in one process.

    python -m bench.trainer_overhead [--config tiny] [--set key=value ...] [--steps N] [--sharded k=v,...]

1. bare: the jitted train step of the config, called back to back on one device-resident batch,
   keeping one step in flight like the loop does (queueing every step at once is slower on the
   simulated CPU devices, which would flatter the loop).
2. loop: ``trainer.loop.run`` on the same config: data pipeline, metrics every step (JSON lines,
   TensorBoard), async Orbax checkpoints at the config's interval. Its per-step wall time is taken
   from the metrics lines between step 1 (compile) and the last step (whose final save is not
   steady state), so it includes the blocking part of every intermediate save.
3. bare again; a round's ratio is loop / mean(bare before, bare after). Several rounds, the median
   is reported: the simulated devices share the host's cores with everything else on it.

Defaults: ``tiny`` with a global batch of 256, 8 simulated CPU devices, 3 checkpoint intervals + 1
steps. On CPU the "devices" are the host's cores, so every millisecond of host work (the loop's
data, metrics and save) is taken from them: the ratio depends on how long a step is (figures by
global batch: docs/measurements.md). On an accelerator the host work overlaps the device step.
A second row measures the same config sharded (default fsdp 4 × tensor 2 on the 8 devices), in the
same process and run, and the last line gives its ratios to the first row's.
Prints figures; it is not a timed test.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench._cli import Parser

# The second row: the dense parameters and Adam moments sharded (fsdp), heads and MLP split (tensor).
SHARDED = ["mesh.fsdp=4", "mesh.tensor=2"]


class Bare:
    """The config's jitted train step on one device-resident batch, nothing else."""

    def __init__(self, cfg) -> None:
        import jax
        import numpy as np

        from trainer.data import pipeline as data
        from trainer.model.mesh import batch_sharding, device_sharding, mesh_for
        from trainer.step import abstract_state, init_state, make_train_step

        self.mesh = mesh_for(cfg)
        gb, a, seq = cfg.train.global_batch, cfg.train.grad_accum, cfg.model.seq_len
        with jax.set_mesh(self.mesh):
            graphdef, abstract = abstract_state(cfg, self.mesh)
            self.state = init_state(cfg, self.mesh, abstract)
            self.step = make_train_step(cfg, graphdef, self.mesh, abstract)
            batch = next(
                iter(data.make_dataset(cfg.data, cfg.model.vocab_size, seq, data.Layout(gb, a), 0, 1))
            )
            self.tokens = jax.device_put(batch["tokens"], batch_sharding(self.mesh))
            self.stop = jax.device_put(np.zeros(self.mesh.size, np.int32), device_sharding(self.mesh))
        self.seconds_per_step(1)  # compile

    def seconds_per_step(self, steps: int) -> float:
        import jax

        with jax.set_mesh(self.mesh):
            state, m = self.step(self.state, self.tokens, self.stop)
            jax.block_until_ready(m)
            start = time.perf_counter()
            for _ in range(steps):
                previous = m
                state, m = self.step(state, self.tokens, self.stop)
                jax.block_until_ready(previous)  # one step in flight, as in the loop
            jax.block_until_ready((state, m))
            elapsed = time.perf_counter() - start
            self.state = state
        return elapsed / steps


def _loop_round(cfg_name: str, overrides: list[str], steps: int) -> list[dict]:
    from launcher.adapters.rundir import read_jsonl
    from trainer import config, loop

    with tempfile.TemporaryDirectory(prefix="reslice-bench-") as tmp:
        cfg = config.resolve(cfg_name, [*overrides, f"train.steps={steps}", f"run_dir={tmp}"], {})
        if loop.run(cfg, {}) != 0:
            raise SystemExit("bench: the training loop did not finish")
        records = [r for f in sorted(Path(tmp, "metrics").glob("*.jsonl")) for r in read_jsonl(f.read_text())]
    return sorted(records, key=lambda r: r["step"])


def measure(cfg_name: str, overrides: list[str], steps_arg: int, rounds: int) -> dict:
    """One row: bare and loop seconds per step, their ratio per round, save and data blocking times."""
    from trainer import config

    cfg = config.resolve(cfg_name, overrides, {})
    steps = steps_arg or 3 * cfg.checkpoint.interval + 1
    bare_steps = max(steps // 2, 10)
    bare = Bare(cfg)
    # Untimed: the first calls after the compile run slower, which would flatter the first round's
    # loop.
    bare.seconds_per_step(bare_steps)
    bares, loops, records = [bare.seconds_per_step(bare_steps)], [], []
    for _ in range(rounds):
        records = _loop_round(cfg_name, overrides, steps)
        # Step 1 compiles; the final step's save is not steady state: time from step 1 to the end.
        loops.append((records[-1]["time"] - records[0]["time"]) / (len(records) - 1))
        bares.append(bare.seconds_per_step(bare_steps))
    return {
        "cfg": cfg,
        "steps": steps,
        "devices": records[-1]["devices"],
        "dp_ranks": records[-1]["dp_ranks"],
        "bares": bares,
        "loops": loops,
        "ratios": [lp / ((b0 + b1) / 2) for lp, b0, b1 in zip(loops, bares, bares[1:], strict=False)],
        "saves": [
            r["perf/checkpoint_save_seconds"] for r in records if r["perf/checkpoint_save_seconds"] > 0
        ],
        "data": [r["perf/data_loading_seconds"] for r in records[1:]],
    }


def report(label: str, row: dict, rounds: int) -> None:
    cfg, saves, data_s = row["cfg"], row["saves"], row["data"]
    print(f"{label}: global batch {cfg.train.global_batch}, {row['devices']} devices ({row['dp_ranks']} data-parallel"
          f" ranks), checkpoint every {cfg.checkpoint.interval} steps, {row['steps']} loop steps x {rounds} rounds")  # fmt: skip
    print(f"  bare jitted step        {statistics.median(row['bares']) * 1e3:8.2f} ms/step  (each: {_ms(row['bares'])})")  # fmt: skip
    print(f"  training loop           {statistics.median(row['loops']) * 1e3:8.2f} ms/step  (each: {_ms(row['loops'])})")  # fmt: skip
    print(f"  overhead ratio          {statistics.median(row['ratios']):8.3f}        (each: {', '.join(f'{r:.3f}' for r in row['ratios'])}; target <= 1.03)")  # fmt: skip
    print(f"  save blocking time      {statistics.mean(saves) * 1e3:8.2f} ms mean, {max(saves) * 1e3:.2f} ms max over {len(saves)} saves")  # fmt: skip
    print(f"  data loading (blocking) {statistics.median(data_s) * 1e3:8.2f} ms/step median, {statistics.mean(data_s) * 1e3:.2f} mean")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m bench.trainer_overhead", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--steps", type=int, default=0, help="loop steps (default: 3 checkpoint intervals + 1)"
    )
    parser.add_argument("--devices", type=int, default=8, help="simulated CPU devices when no accelerator")
    parser.add_argument("--rounds", type=int, default=2, help="loop runs, each between two bare measurements")
    parser.add_argument(
        "--sharded",
        default=",".join(SHARDED),
        metavar="KEY=VALUE,...",
        help=f"more settings for a second, sharded row of the same config (default {','.join(SHARDED)}; '' for none)",
    )
    args = parser.parse_args(argv)
    parser.at_least(args, 1, "rounds", "devices")
    if args.steps and args.steps < 3:  # the loop's time is from step 1 (compile) to the last
        parser.error(f"--steps {args.steps}: at least 3 (or 0: 3 checkpoint intervals + 1)")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("JAX_NUM_CPU_DEVICES", str(args.devices))

    overrides = ["train.global_batch=256", *args.set] if args.config == "tiny" else list(args.set)
    overrides.append("metrics.log_every=1000000")
    rows = [(args.config, overrides)]
    if args.sharded:
        extra = [s for s in args.sharded.split(",") if s]
        rows.append((f"{args.config} {' '.join(extra)}", [*overrides, *extra]))
    _check_rows(parser, args.config, rows)
    measured = []
    for label, sets in rows:
        measured.append(measure(args.config, sets, args.steps, args.rounds))
        report(label, measured[-1], args.rounds)
    if len(measured) == 2:
        base, other = (statistics.median(m["ratios"]) for m in measured)
        bare_ratio = statistics.median(measured[1]["bares"]) / statistics.median(measured[0]["bares"])
        print(f"sharded / {args.config}: overhead ratio {other / base:.3f}, bare step {bare_ratio:.3f}")
    return 0


def _check_rows(parser: Parser, cfg_name: str, rows: list[tuple[str, list[str]]]) -> None:
    """Every row's config resolves and its mesh fits the devices, before anything is measured: a
    sharded row that cannot run (fsdp 4 × tensor 2 on one device) is one line, not a traceback
    after the first row's minutes."""
    import jax

    from trainer import config
    from trainer.model.mesh import has_moe_layers, mesh_shape

    for label, sets in rows:
        try:
            cfg = config.resolve(cfg_name, sets, {})
            mesh_shape(jax.device_count(), cfg.mesh, cfg.moe.num_experts, has_moe_layers(cfg))
        except config.ConfigError as e:
            parser.error(f"{label}: {e}")


def _ms(values: list[float]) -> str:
    return ", ".join(f"{v * 1e3:.1f}" for v in values)


if __name__ == "__main__":
    sys.exit(main())
