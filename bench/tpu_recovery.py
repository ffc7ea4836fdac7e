"""Recovery on the host's accelerator: from a world's publication (or a process's start) to the
first trained step, phase by phase, beside the chip's own floor.

    python -m bench.tpu_recovery [--config olmo-7b] [--set KEY=VALUE ...] [--quick] [--workdir DIR] [--timeout 900] [--json]

Every case runs the real trainer (``python -m trainer``) in processes of its own, one after the
other (one process holds a TPU host's chips at a time), on one run directory, at the shape
bench.accelerator picks for one v5e chip (``olmo-7b``: 2 layers, a 32,768-token vocabulary,
2 × 8,192 tokens, 8 GB of fp32 state); ``--quick``: the ``tiny`` config, to try it on CPU:

1. **cold**: an empty run directory and compile cache, to the first step (it then saves step 1);
2. **storage**: the same run resumed from that checkpoint, the compile cache warm;
3. **memory**: one pod of an in-place run (the real supervisor,
   ``trainer.elastic.follower.supervise_world``, following a world file) trains world 0 until its
   trainer has a snapshot of a step in the pod's memory (``/dev/shm``); then world 1 names the
   pod's slice lost, so the supervisor kills its trainer (SIGKILL: what a surviving pod's does when
   another slice of its world is lost; one chip cannot run the two-process world in which another
   slice would be the lost one) and forks the next, which restores the snapshot from memory;
4. **floor**: a bare process's ``import jax`` and ``jax.devices()``, then the train step loaded
   from the run's compile cache and run once: what any new trainer process pays on this host.

It prints one table (each case's total and phases; the memory case from the world's publication)
and, with ``--json``, one JSON object on the last line. Exit 0 when every case reached its step
(the memory case from memory), else 1. Figures: docs/measurements.md, "On a TPU".
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._cli import Parser
from bench.tpu_handoff import _host_env
from contract.words import StateSource, read_state_source
from trainer.elastic.follower import world_line

ROOT = Path(__file__).resolve().parents[1]
RUN = "recovery"
# The shape bench.accelerator picks for one v5e chip (its `pick`, measured on the chip): the whole
# vocabulary's embedding and head leave no room for one layer in 15.75 GiB.
V5E_SHAPE = ["model.vocab_size=32768", "data.eos_id=32767", "model.n_layers=2", "model.dense_layers=2",
             "train.global_batch=2"]  # fmt: skip
COMMON = [
    "data.source=synthetic",
    "metrics.log_every=1",
    "checkpoint.interval=1000",
    "optim.decay_steps=1000",
]


def trainer_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The host's environment for a trainer: its accelerator (not bench/__init__'s simulated CPU
    hosts) and no shared compile cache (each case's cache is its run directory's)."""
    env = {
        k: v
        for k, v in _host_env(dict(os.environ)).items()
        if not k.startswith(("RESLICE_", "JAX_COMPILATION"))
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return {**env, **(extra or {})}


def records(run_dir: Path, segment: int | None = None) -> list[dict]:
    out = []
    for path in sorted((run_dir / "metrics").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line being written
            if segment is None or rec.get("segment") == segment:
                out.append(rec)
    return out


def startup_phases(record: dict) -> dict[str, float]:
    """A first record's ``perf/startup`` as {phase: wall seconds}, ``total`` the spawn to the step."""
    return {k: v["wall"] for k, v in (record.get("perf/startup") or {}).items()}


class Trainer:
    """One ``python -m trainer`` (or, ``pod``: an in-place pod's supervisor) with its log."""

    def __init__(self, work: Path, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.log = work / f"{name}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "trainer", *argv], env=env, stdout=out, stderr=subprocess.STDOUT,
                cwd=ROOT, start_new_session=True,
            )  # fmt: skip

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_for(self, what: str, ready: Callable[[], Any], deadline: float) -> Any:
        while time.monotonic() < deadline:
            if (got := ready()) is not None:
                return got
            if self.proc.poll() is not None and (got := ready()) is None:
                raise RuntimeError(
                    f"exited {self.proc.returncode} waiting for {what}:\n{self.output()[-3000:]}"
                )
            time.sleep(0.1)
        raise RuntimeError(f"timed out waiting for {what}:\n{self.output()[-3000:]}")

    def wait(self, deadline: float) -> int:
        try:
            return self.proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"did not exit:\n{self.output()[-3000:]}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def first_record(run_dir: Path, segment: int, start: int, after: float = 0.0) -> Callable[[], dict | None]:
    """The first record of `segment` above step `start` written after `after` (epoch seconds)."""

    def ready() -> dict | None:
        got = [r for r in records(run_dir, segment) if r.get("step", 0) > start and r.get("time", 0) > after]
        return min(got, key=lambda r: r["step"]) if got else None

    return ready


def trainer_argv(name: str, sets: list[str]) -> list[str]:
    return ["--config", name, *(a for kv in [*COMMON, *sets] for a in ("--set", kv))]


def cold_and_storage(work: Path, run_dir: Path, name: str, sets: list[str], deadline: float) -> list[dict]:
    """Cases 1 and 2: a fresh start that trains and saves step 1, then a resume of it (killed after
    its first step: its own save is not what is measured)."""
    argv = trainer_argv(name, sets)
    cold = Trainer(
        work, "cold", [*argv, "--set", f"run_dir={run_dir}", "--set", "train.steps=1"], trainer_env()
    )
    if (code := cold.wait(deadline)) != 0:
        raise RuntimeError(f"the cold start exited {code}:\n{cold.output()[-3000:]}")
    first = records(run_dir, 0)[0]
    storage = Trainer(
        work, "storage", [*argv, "--set", f"run_dir={run_dir}", "--set", "train.steps=3"],
        trainer_env({"RESLICE_SEGMENT": "1"}),
    )  # fmt: skip
    try:
        resumed = storage.wait_for("the resumed first step", first_record(run_dir, 1, 1), deadline)
    finally:
        storage.kill()
    return [case("cold", first), case("storage", resumed)]


def case(name: str, record: dict) -> dict:
    """A case's row from its trainer's first record: where its state came from, its start-up."""
    phases = startup_phases(record)
    return {"case": name, "total_s": phases.pop("total", None), "from": read_state_source(record) or StateSource.FRESH,
            "phases": phases, "step_s": record.get("perf/step_time_seconds")}  # fmt: skip


def publish(world_file: Path, epoch: int, batch: int, lost: tuple[str, ...] = ()) -> float:
    """World `epoch` of one slice (this pod's) on one device, the whole global batch `batch` a step."""
    now = time.time()
    doc = {"run": RUN, "epoch": epoch, "slices": ["a"], "hosts_per_slice": 1, "coordinator": "127.0.0.1:1",
           "global_batch": batch, "micro_batch": batch, "grad_accum": 1, "published": now,
           **({"lost": list(lost)} if lost else {})}  # fmt: skip
    tmp = world_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, world_file)  # whole, as the contract asks of a file publisher
    return now


def memory(
    work: Path,
    run_dir: Path,
    name: str,
    sets: list[str],
    batch: int,
    pause: float,
    step_s: float,
    deadline: float,
) -> dict:
    """Case 3: world 0 resumes the run and trains; once its trainer's snapshot of step 2 is complete
    in the pod's memory, world 1 names the slice lost, and the next trainer restores it."""
    world_file, shm = work / "world.json", Path(SHM_ROOT) / f"tpu-recovery-{os.getpid()}"
    shm.mkdir(parents=True, exist_ok=True)
    argv = trainer_argv(name, [*sets, f"run_dir={run_dir}", "train.steps=100000", "checkpoint.memory_interval=2",
                               f"train.debug_step_pause_s={pause}"])  # fmt: skip
    env = trainer_env({"RESLICE_RUN": RUN, "RESLICE_RESTART_MODE": "in-place", "RESLICE_SLICE_ID": "a",
                       "JOB_COMPLETION_INDEX": "0", "RESLICE_WORLD_FILE": str(world_file),
                       "RESLICE_MEMORY_ROOT": str(shm)})  # fmt: skip
    pod = Trainer(work, "pod", argv, env)
    try:
        started = publish(world_file, 0, batch)
        pod.wait_for("world 0's first step", first_record(run_dir, 0, 1, started), deadline)
        snapped = pod.wait_for("a snapshot in the pod's memory", lambda: _snapshot(shm), deadline)
        published = publish(world_file, 1, batch, lost=("a",))
        got = pod.wait_for("world 1's first step", first_record(run_dir, 1, 0, published), deadline)
    finally:
        pod.kill()
        shutil.rmtree(shm, ignore_errors=True)
    out = case("memory", got)
    # World 0's pacing (train.debug_step_pause_s, which keeps the snapshots of a large state from
    # piling up in RAM) is slept once more before the new trainer's first record: not recovery.
    # The step in flight runs during that sleep, so the first step counts at least `step_s` (the
    # storage case's step, the same program) rather than what is left once the pause is taken off.
    first = out["phases"]["first step"]
    taken = first - max(first - pause, step_s)
    out["phases"]["first step"] = round(first - taken, 3)
    got = {**got, "time": got["time"] - taken}
    out["total_s"] = round((out["total_s"] or 0.0) - taken, 3)
    line = next(x for x in pod.output().splitlines() if x.startswith("trainer: world epoch 1:"))
    world = world_line(line)
    assert world is not None and world["ended"] is not None and world["signal"] == "SIGKILL", line
    started_after = world["started"]
    trainer_s, total = out["total_s"] or 0.0, got["time"] - published
    out["phases"] = {"seen": round(world["seen"], 3), "previous trainer killed": round(world["ended"], 3),
                     "forked": round(max(started_after - world["ended"], 0.0), 3), **out["phases"]}  # fmt: skip
    out.update(total_s=round(total, 3), trainer_s=trainer_s, restored_step=got.get("restore/step"),
               snapshot_step=snapped, unaccounted_s=round(total - world["seen"] - started_after - trainer_s, 3))  # fmt: skip
    return out


SHM_ROOT = "/dev/shm"  # RAM, as an in-place pod's memory emptyDir


def _snapshot(root: Path) -> int | None:
    """The step of a complete snapshot under `root` (the pod's memory directory is inside)."""
    steps = [int(p.name.split(".")[0]) for p in root.glob("*/*.snap")]
    return min(steps) if steps else None


# The floor's process: nothing of bench/ is imported there (bench/__init__ sets the simulated CPU
# hosts' environment, which is in the train step's cache key); the run's own config and cache.
FLOOR = r"""
import json, sys, time
t0 = time.time()
import jax
from trainer.elastic import distributed
distributed.initialize({})  # what a trainer sets before its runtime starts (the step's cache key reads it)
imported = time.time()
jax.devices()
runtime = time.time()
import numpy as np
from trainer import config, loop
from trainer.model.mesh import batch_plan, dp_ranks, mesh_for
from trainer.state import compile_cache
cfg = config.resolve(sys.argv[1], sys.argv[2:], {})
compile_cache.enable(cfg.run_dir)
mesh = mesh_for(cfg)
plan = batch_plan(cfg, mesh.size, 1, mesh.shape["expert"], dp_ranks(mesh), mesh.shape["fsdp"])
with jax.set_mesh(mesh):
    model, program = loop.Model(cfg, mesh), compile_cache.program(cfg)
    abstract = compile_cache.abstract_state(program, mesh, model.abstract)
    shardings = jax.tree.map(lambda a: a.sharding, abstract)
    zeros = jax.jit(lambda: jax.tree.map(lambda a: jax.numpy.zeros(a.shape, a.dtype), abstract), out_shardings=shardings)()
    jax.block_until_ready(zeros)
    steps = loop._build_steps(cfg, mesh, plan.grad_accum)
    t1 = time.time()
    steps, timers = loop._compile(program, steps, zeros, model)
    loaded = time.time()
    tokens = jax.make_array_from_process_local_data(steps.tokens_sharding, np.zeros(steps.global_shape, np.int32), steps.global_shape)
    _, metrics = steps.train_step(zeros, tokens, steps.flags[False])
    jax.block_until_ready(metrics)
    done = time.time()
print("FLOOR " + json.dumps({"import": round(imported - t0, 3), "runtime": round(runtime - imported, 3),
      "train step loaded": round(loaded - t1, 3), "step run once": round(done - loaded, 3),
      "cache hits": timers["perf/compile_cache_hits"]}), flush=True)
"""


def floor(work: Path, run_dir: Path, name: str, sets: list[str], deadline: float) -> dict:
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-c", FLOOR, name, *COMMON, *sets, f"run_dir={run_dir}"],
        env=trainer_env(), cwd=ROOT, capture_output=True, text=True, timeout=max(1.0, deadline - time.monotonic()),
    )  # fmt: skip
    wall = time.time() - t0
    (work / "floor.log").write_text(proc.stdout + proc.stderr)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("FLOOR ")), None)
    if proc.returncode or line is None:
        raise RuntimeError(
            f"the floor's process exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    phases = json.loads(line[6:])
    hits = phases.pop("cache hits")
    return {"case": "floor", "total_s": round(sum(phases.values()), 3), "from": "-", "phases": phases,
            "process_wall_s": round(wall, 3), "train_step_from_cache": bool(hits)}  # fmt: skip


def table(rows: list[dict]) -> str:
    lines = [f"{'case':<8} {'from':<8} {'total s':>8}  phases (wall s)"]
    for r in rows:
        phases = ", ".join(f"{k} {v:.2f}" for k, v in r["phases"].items() if isinstance(v, int | float))
        lines.append(f"{r['case']:<8} {r['from']:<8} {r['total_s']:>8.2f}  {phases}")
    return "\n".join(lines)


def main() -> int:
    parser = Parser(prog="python -m bench.tpu_recovery", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="olmo-7b", help="the trainer's config (default olmo-7b)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a trainer override")
    parser.add_argument("--quick", action="store_true", help="the tiny config: to try it on CPU")
    parser.add_argument("--pause", type=float, default=None, help="seconds between world 0's steps")
    parser.add_argument("--workdir", help="where the runs write (default: a temporary directory, removed)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for the whole benchmark")
    parser.add_argument("--json", action="store_true", help="one JSON object on the last line")
    args = parser.parse_args()
    if args.timeout <= 0 or (args.pause is not None and args.pause < 0):
        parser.error("--timeout must be > 0 seconds and --pause >= 0")
    name = "tiny" if args.quick else args.config
    sets = (["train.global_batch=16"] if args.quick else (V5E_SHAPE if name == "olmo-7b" else [])) + args.set
    pause = args.pause if args.pause is not None else (0.5 if args.quick else 4.0)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tpu-recovery-"))
    work.mkdir(parents=True, exist_ok=True)
    run_dir = work / "run"
    deadline = time.monotonic() + args.timeout
    rows: list[dict] = []
    try:
        rows += cold_and_storage(work, run_dir, name, sets, deadline)
        batch = int(next(kv for kv in reversed(sets) if kv.startswith("train.global_batch=")).split("=")[1])
        rows.append(memory(work, run_dir, name, sets, batch, pause, rows[1]["step_s"] or 0.0, deadline))
        rows.append(floor(work, run_dir, name, sets, deadline))
    except RuntimeError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print(table(rows))
    ok = all(r["total_s"] for r in rows) and rows[2]["from"] == StateSource.MEMORY
    if args.json:
        print(json.dumps({"config": name, "sets": sets, "cases": rows, "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
