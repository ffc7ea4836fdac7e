"""The training loop: plan check, restore or init, steps, metrics, checkpoints, SIGTERM.

Step s (0-based) trains on global batch s; after it the model has seen s + 1 batches, and its metrics
record and checkpoint say ``step = s + 1``. The host runs one step ahead: step n + 1 is dispatched
before step n's metrics are read, so host work (data, metrics) overlaps device work.

SIGTERM sets a flag that rides into the next step as an input; its maximum over all processes comes
back in that step's metrics. Every process therefore learns of a preemption at the same step n,
finishes the step already in flight (n + 1), saves it, waits for the commit and exits 42.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import jax
import numpy as np

from contract import envvars
from contract.exits import Exit
from contract.words import STATE_SOURCE, StateSource
from trainer import evaluate, restore
from trainer.config import Config, ConfigError, config_hash, identity, schedule_point
from trainer.data import pipeline as data
from trainer.elastic import distributed, peers, supervisor
from trainer.elastic.watchdog import Preemption
from trainer.model import sizes
from trainer.model.mesh import (
    BatchPlan,
    batch_plan,
    batch_sharding,
    device_sharding,
    dp_ranks,
    mesh_for,
    process_block,
)
from trainer.state import compile_cache, snapshot, stages, storage
from trainer.state.checkpoint import Checkpointer, storage_bytes_read
from trainer.telemetry import peaks
from trainer.telemetry.metrics import RunWriter, recorded_steps
from trainer.telemetry.profile import StepProfiler
from trainer.telemetry.startup import Timeline

# trainer.step (flax, optax) is imported only where the model is traced: a fresh start, or a
# resume whose abstract state or train step the compile cache does not hold.


def _env_number(env: Mapping[str, str], key: str, kind: type = float) -> Any:
    try:
        return kind(env.get(key) or 0)
    except ValueError:
        raise ConfigError(f"{key}={env.get(key)!r} is not a number") from None


# trainer.step's order
SCALARS = ("loss", "total_loss", "lb_loss", "z_loss", "grad_norm", "lr", "logit_z_loss", "stop")


def unpack(metrics: dict) -> dict[str, Any]:
    """Host-side view of a step's metrics: the named scalars and ``layers`` [MoE layers, 3]
    (dropped rows, routed rows, largest load over balanced)."""
    out = dict(zip(SCALARS, (float(x) for x in metrics["scalars"]), strict=True))
    out["layers"] = metrics["layers"]
    return out


@dataclass(frozen=True)
class Recorder:
    """Turns a step's device metrics into the contract's metrics record (docs/contract.md)."""

    segment: int
    attempt: int
    plan: BatchPlan
    tokens_per_step: int
    flops_per_token: float
    peak_tflops: float
    buffer_rows: int

    def __call__(self, n: int, m: dict, batch: dict, data_s: float, step_s: float) -> dict[str, Any]:
        tokens_per_sec = self.tokens_per_step / step_s
        tflops = self.flops_per_token * tokens_per_sec / self.plan.devices / 1e12
        layers = [
            {"dropped_rows": int(d), "total_rows": int(t), "max_load_over_balanced": float(x)}
            for d, t, x in m["layers"]
        ]
        return {
            "step": n, "segment": self.segment, "jobset_attempt": self.attempt, "time": time.time(),
            "learning/loss": float(m["loss"]), "learning/total_loss": float(m["total_loss"]),
            "learning/moe_lb_loss": float(m["lb_loss"]), "learning/moe_z_loss": float(m["z_loss"]),
            "learning/lr": float(m["lr"]), "learning/grad_norm": float(m["grad_norm"]),
            "learning/logit_z_loss": float(m["logit_z_loss"]),
            "perf/step_time_seconds": step_s, "perf/tokens_per_sec": tokens_per_sec,
            "perf/per_device_tflops_per_sec": tflops,
            "perf/mfu": tflops / self.peak_tflops if self.peak_tflops else None,
            "perf/data_loading_seconds": data_s, "perf/checkpoint_save_seconds": 0.0,
            "moe/dropped_rows": sum(x["dropped_rows"] for x in layers),
            "moe/total_rows": sum(x["total_rows"] for x in layers),
            "moe/max_load_over_balanced": max((x["max_load_over_balanced"] for x in layers), default=0.0),
            "moe/layers": layers, "moe/buffer_rows": self.buffer_rows,
            "data/sample_digest": batch.get("digest"), "data/first_sample": batch.get("first_sample"),
            **{f"data/tokens/{k}": v for k, v in (batch.get("source_tokens") or {}).items()},
            "devices": self.plan.devices, "micro_batch": self.plan.micro_batch, "dp_ranks": self.plan.dp_ranks,
            "grad_accum": self.plan.grad_accum, "num_processes": self.plan.num_processes,
        }  # fmt: skip


def _sleep_unless_preempted(seconds: float, preemption: Preemption) -> None:
    """The test hooks' sleeps (train.debug_start_delay_s, debug_step_pause_s), cut short by a SIGTERM."""
    deadline = time.monotonic() + seconds
    while not preemption.requested and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.05))


def _meet_peers(
    cfg: Config, env: Mapping[str, str], processes: int, segment: int, attempt: int, preemption: Preemption
) -> float | None:
    """After the compile and the restore, before the first step's collectives: every process of the
    group waits for the last one (trainer.elastic.distributed.wait_for_peers). The seconds waited, or None
    on a SIGTERM (nothing trained yet: the caller exits 42)."""
    if delay := cfg.train.debug_start_delay_s:
        print(f"trainer: train.debug_start_delay_s={delay:g}: sleeping before the start barrier", flush=True)
        _sleep_unless_preempted(delay, preemption)
    if preemption.requested:
        return None
    barrier = distributed.start_barrier_id(segment, attempt)
    if processes > 1:
        print(f"trainer: at the start barrier {barrier}, waiting for the other processes", flush=True)
    waited = distributed.wait_for_peers(barrier, distributed.timeouts(env)[0], lambda: preemption.requested)
    if waited is not None and processes > 1:
        print(f"trainer: all {processes} processes at the start barrier after {waited:.3f} s", flush=True)
    return waited


@dataclass(frozen=True)
class Pending:
    """The step in flight: dispatched to the devices, its metrics not read yet."""

    n: int
    device_metrics: Any
    batch: dict
    data_s: float
    snapshot_s: float = 0.0  # blocking time of the memory snapshot taken after this step


@dataclass(frozen=True)
class StepResult:
    record: dict[str, Any]
    stop: bool  # some process was preempted: the maximum of the SIGTERM flags came back in this step
    done_at: float  # time.perf_counter() when its metrics arrived; the next step's clock starts here


@dataclass(frozen=True)
class Incarnation:
    """What one trainer incarnation's steps share, built once by `run`."""

    cfg: Config
    preemption: Preemption
    recorder: Recorder
    writer: RunWriter
    ckpt: Checkpointer
    meta: Callable[[int], dict[str, Any]]  # a checkpoint's meta at a step
    status: dict[str, Any]  # what every status.json write carries
    timeline: Timeline  # this process's start-up, reported with its first step
    evaluator: Any = None  # trainer.evaluate.Evaluator when eval.sources are given
    snapshots: snapshot.Snapshotter | None = None  # in-memory snapshots (in-place runs)
    profiler: StepProfiler | None = None  # train.profile_steps' traces


@dataclass(frozen=True)
class Steps:
    """The train step and its inputs' layouts (`_build_steps`)."""

    train_step: Any  # compiled by `_compile` (None before)
    tokens_sharding: Any
    global_shape: tuple[int, int, int]
    flags: dict[bool, Any]  # the two possible values of this process's SIGTERM flag, as global arrays


class Model:
    """The model as flax sees it, traced on first use (trainer.step): only where the compile cache
    misses, so a trainer with a warm cache, fresh or resumed, never imports flax or optax nor
    traces the initializers (docs/measurements.md, "Figures behind the code's constants")."""

    def __init__(self, cfg: Config, mesh: Any):
        self.cfg, self.mesh = cfg, mesh

    @functools.cached_property
    def traced(self) -> tuple[Any, Any]:  # (graphdef, abstract nnx state), under the mesh
        from trainer import step

        return step.abstract_state(self.cfg, self.mesh)

    @property
    def was_traced(self) -> bool:
        return "traced" in self.__dict__  # functools.cached_property keeps its value there

    def abstract(self) -> dict:
        from trainer import step

        return step.plain(self.traced[1])

    def lower_initial_state(self) -> Any:
        from trainer import step

        return step.lower_initial_state(self.cfg, self.traced[1])

    def train_step(self) -> Any:
        from trainer import step

        graphdef, abstract = self.traced
        return step.make_train_step(self.cfg, graphdef, self.mesh, abstract)


def finish_step(inc: Incarnation, pending: Pending, since: float, startup: dict[str, Any]) -> StepResult:
    """Wait for the pending step and build its record, with `startup` merged in (the caller passes
    the start-up timers with the first step of an incarnation only)."""
    if jax.process_count() > 1:
        distributed.await_step(pending.device_metrics)
    m = unpack(jax.device_get(pending.device_metrics))
    now = time.perf_counter()
    rec = inc.recorder(pending.n, m, pending.batch, pending.data_s, now - since)
    if inc.snapshots is not None:
        rec["perf/memory_snapshot_seconds"] = pending.snapshot_s
    inc.preemption.step_done(rec["perf/step_time_seconds"])
    if startup:
        inc.timeline.mark("first step")
        print(inc.timeline.report(jax.process_index()), flush=True)
        supervisor.notify_running()  # in place: a lock failure after this is not retried
        rec.update(startup, **{"perf/startup": inc.timeline.phases()})
    total_steps = inc.cfg.train.steps
    if pending.n % inc.cfg.metrics.log_every == 0 or pending.n == total_steps:
        print(
            f"step {pending.n}/{total_steps} loss {rec['learning/loss']:.4f} step_time"
            f" {rec['perf/step_time_seconds']:.3f}s dropped {rec['moe/dropped_rows']}/{rec['moe/total_rows']}",
            flush=True,
        )
    return StepResult(rec, bool(m["stop"]), now)


def _build_steps(cfg: Config, mesh: Any, grad_accum: int) -> Steps:
    gb, seq = cfg.train.global_batch, cfg.model.seq_len
    flag_sharding = device_sharding(mesh)
    local_flag = {v: np.full((len(mesh.local_devices),), int(v), np.int32) for v in (False, True)}
    return Steps(
        None,
        batch_sharding(mesh),
        (grad_accum, gb // grad_accum, seq + 1),
        {
            v: jax.make_array_from_process_local_data(flag_sharding, f, (mesh.size,))
            for v, f in local_flag.items()
        },
    )


def _compile(program: dict[str, Any], steps: Steps, state: Any, model: Model) -> tuple[Steps, dict[str, Any]]:
    """Compile (or load) before the clock starts: the first step's time is then a step's, and the
    compilation is reported on its own (start-up is badput, not training)."""
    t_compile, hits = time.perf_counter(), compile_cache.hits()
    token_spec = jax.ShapeDtypeStruct(steps.global_shape, np.int32, sharding=steps.tokens_sharding)
    train_step = compile_cache.train_step(
        model.train_step,
        (state, token_spec, steps.flags[False]),
        list(model.mesh.devices.flat),
        program,
    )
    timers = {
        "perf/compile_seconds": time.perf_counter() - t_compile,
        # 1: the train step was loaded from the run's compile cache, not compiled.
        "perf/compile_cache_hits": compile_cache.hits() - hits,
    }
    how = "loaded from the compile cache" if timers["perf/compile_cache_hits"] else "compiled"
    print(f"trainer: train step {how} in {timers['perf/compile_seconds']:.1f} s", flush=True)
    return replace(steps, train_step=train_step), timers


def _recorded(inc: Incarnation, n: int, record: dict[str, Any]) -> None:
    """Step n's record is written: its snapshot may now count as done (``Snapshotter.recorded``),
    with the record beside the next snapshot, so that a restore from memory never skips a step the
    metrics lack (``_rewrite_lost_records``)."""
    if inc.snapshots is not None:
        inc.snapshots.recorded(n, record)


def _rewrite_lost_records(writer: RunWriter, run_dir: str, memory_dir: Path | None, step: int) -> None:
    """Process 0, after a restore of `step` from memory: the records of the steps up to it, from
    beside the snapshots, that the run's metrics lack. The previous world's process 0 writes every
    record, and it can be killed, or its own step wait on a dead peer of its slice, after the other
    processes finished a step or two (and snapshotted them): the state is whole there, the records
    were never written."""
    if not writer.enabled or not (records := snapshot.step_records(memory_dir, step)):
        return
    have = recorded_steps(run_dir, [r["step"] for r in records])
    lost = [r for r in records if r["step"] not in have]
    for record in lost:
        writer.write(record)
    if lost:
        print(
            f"trainer: the metrics records of steps {[r['step'] for r in lost]}, lost with the previous "
            "world, written from memory",
            flush=True,
        )


def _train(
    inc: Incarnation, steps: Steps, state: Any, batches: Any, start: int, startup: dict[str, Any]
) -> int:
    """Steps ``start + 1`` to ``train.steps``, or to the step after everyone learnt of a SIGTERM;
    each step is dispatched before the one in flight is finished. The last step saved."""
    cfg, preemption, writer, profiler = inc.cfg, inc.preemption, inc.writer, inc.profiler
    pending: Pending | None = None
    last_done, stop, n = time.perf_counter(), False, start
    for s in range(start, cfg.train.steps):
        n = s + 1
        if n == cfg.train.crash_at_step:
            raise RuntimeError(f"train.crash_at_step={n}: failing on purpose")
        trace = profiler is not None and profiler.starts(n)
        if trace and pending is not None:  # the step in flight is not the trace's: finished first
            done = finish_step(inc, pending, last_done, startup)
            startup, last_done, stop, pending = {}, done.done_at, stop or done.stop, None
            writer.write(done.record)
            _recorded(inc, n - 1, done.record)
        t0 = time.perf_counter()
        batch = next(batches)
        assert batch["step"] == s, (batch["step"], s)
        tokens = jax.make_array_from_process_local_data(
            steps.tokens_sharding, batch["tokens"].astype(np.int32, copy=False), steps.global_shape
        )
        stop_in = steps.flags[preemption.requested]
        data_s = time.perf_counter() - t0
        if trace:
            profiler.start(n)  # type: ignore[union-attr]  # `trace` holds only with a profiler
        with profiler.step(n) if profiler is not None else contextlib.nullcontext():
            state, dm = steps.train_step(state, tokens, stop_in)
        if pending is not None:
            done = finish_step(inc, pending, last_done, startup)
            startup, last_done, stop = {}, done.done_at, stop or done.stop
            writer.write(done.record)
            _recorded(inc, pending.n, done.record)
        snap_s = 0.0
        if inc.snapshots is not None and inc.snapshots.due(n):  # before the next step donates `state`
            snap_s = inc.snapshots.take(n, state, inc.meta(n))
        pending = Pending(n, dm, batch, data_s, snap_s)
        evaluate = inc.evaluator is not None and inc.evaluator.due(n)
        traced = profiler is not None and profiler.ends(n)
        if evaluate or traced or n % cfg.checkpoint.interval == 0 or n == cfg.train.steps or stop:
            done = finish_step(inc, pending, last_done, startup)  # the step's own time, before the save
            startup, pending, stop = {}, None, stop or done.stop
            if traced and (where := profiler.stop()) is not None:  # type: ignore[union-attr]  # as `trace`
                print(f"trainer: profile of steps up to {n} written to {where}", flush=True)
            if evaluate:  # the state after step n, read before step n + 1 donates it
                done.record.update(inc.evaluator(state))
            # A SIGTERM learnt from this very step (an eval step finishes it early): nothing is in
            # flight, so step n is the one every process saves.
            if n % cfg.checkpoint.interval == 0 or n == cfg.train.steps or stop:
                with preemption.saving():
                    done.record["perf/checkpoint_save_seconds"] = inc.ckpt.save(n, state, inc.meta(n))
                writer.write(done.record)
                writer.status(state="running", step=n, **inc.status)
                writer.flush()
                _recorded(inc, n, done.record)
                if stop and inc.snapshots is not None and not inc.snapshots.due(n):
                    inc.snapshots.take(n, state, inc.meta(n))  # the step all stop at, recorded
            else:
                writer.write(done.record)
                _recorded(inc, n, done.record)
            last_done = time.perf_counter()  # neither the eval nor the save is the next step's time
            if stop:
                break
        pause = cfg.train.debug_step_pause_s
        if pause and n < cfg.train.steps:  # the step in flight runs meanwhile; none after the last
            _sleep_unless_preempted(pause, preemption)
    return n


@dataclass(frozen=True)
class RunIdentity:
    """What this run's state must agree on to be resumed (docs/contract.md): the config's hash and
    identity, the global batch, the schedule's point; and so what a snapshot in memory must be to
    stand for one of its checkpoints (``expected``)."""

    config_hash: str
    identity: dict[str, Any]
    schedule: dict[str, Any] | None
    expected: dict[str, Any]

    @classmethod
    def of(cls, cfg: Config) -> RunIdentity:
        chash, sched = config_hash(cfg), schedule_point(cfg)
        gb = cfg.train.global_batch
        expected = {
            "run_dir": cfg.run_dir,
            "config_hash": chash,
            "global_batch": gb,
            "schedule": sched or None,
        }
        return cls(chash, identity(cfg), sched or None, expected)


@dataclass(frozen=True)
class Placement:
    """This incarnation's place: its segment and attempt, its mesh and batch plan, the block of each
    global batch it reads, and the recorder of its steps' metrics."""

    cfg: Config  # with the slices' replicas (``snapshot.with_slice_replicas``) where snapshots are on
    segment: int
    attempt: int
    mesh: Any
    plan: BatchPlan
    layout: data.Layout
    recorder: Recorder
    memory: snapshot.Memory


@dataclass
class _Held:
    """What `run` closes however it ends, each opened by a phase: the checkpointer, the metrics
    writer, the memory snapshots and the profiler (None until opened)."""

    ckpt: Checkpointer
    writer: RunWriter | None = None
    snapshots: snapshot.Snapshotter | None = None
    profiler: StepProfiler | None = None

    def close(self, preemption: Preemption) -> None:
        if self.profiler is not None:  # a trace cut short (a SIGTERM, a failed step): what it has is kept
            with contextlib.suppress(Exception):
                self.profiler.stop()
        if self.snapshots is not None:  # a failed step (a lost peer): a snapshot in flight of a recorded step
            self.snapshots.abandon(timeout_s=30.0)
        preemption.restore()
        self.ckpt.close()
        if self.writer is not None:
            self.writer.close()
        sys.stdout.flush()


@dataclass(frozen=True)
class Start:
    """Where the steps start (`_restore_or_init`): the step and the state on the devices, the train
    step, the data, the status every write carries, and the start-up timers so far."""

    step: int
    state: Any
    steps: Steps
    batches: Any
    model: Model
    writer: RunWriter
    status: dict[str, Any]
    restore_s: float
    compile_timers: dict[str, Any]  # the eval step's compile is added to them (`_ready`)
    restore_record: dict[str, Any]


def run(
    cfg: Config,
    env: Mapping[str, str],
    preemption: Preemption | None = None,
    timeline: Timeline | None = None,
) -> int:
    """Train until ``train.steps`` (exit 0) or a SIGTERM (exit 42); see the module docstring.

    Start-up in phases, each marked on ``timeline`` (``perf/startup``; docs/design.md "The
    trainer"), one function each. ``_join``: inputs refused before anything is written; the group
    joined (``distributed``); the accelerator's runtime started (``runtime``, while the newest
    snapshot in memory is read ahead); the placement. ``_our_snapshots``: the snapshots in memory
    this run may restore, else the newest checkpoint's identity checked. ``_restore_or_init``: the
    abstract state; then on a resume the state read (``restore``), the train step compiled or
    loaded while it arrives (``train step``) and its arrival (``transfer``), or on a fresh start the
    train step and the initializer compiled at once (``train step``, ``init``). ``_ready``: the eval
    step (``eval step``), the peers met (``barrier``). Then the steps (``_train``) and the end
    (``_finish``); whatever it ended with, ``_Held.close``."""
    preemption = preemption or Preemption()
    timeline = timeline or Timeline()
    preemption.stall_timeout_s = cfg.train.stall_timeout_s
    run_id = RunIdentity.of(cfg)
    ident, where = _join(cfg, env, run_id, preemption, timeline)
    cfg = where.cfg
    c = cfg.checkpoint
    read_before = storage_bytes_read()
    held = _Held(Checkpointer(cfg.run_dir, c.keep, c.async_save, c.debug_save_delay_s))
    try:
        ours = _our_snapshots(cfg, env, where, run_id, held.ckpt)
        with jax.set_mesh(where.mesh):
            start = _restore_or_init(cfg, env, ident, where, run_id, ours, held, timeline, read_before)
            if not isinstance(start, Start):
                return start
            ready = _ready(cfg, env, ident, where, start, preemption, timeline)
            if ready is None:
                return _preempted_before_the_first_step(start.step)
            evaluator, startup = ready
            held.snapshots = where.memory.snapshotter(start.step)
            held.profiler = (
                StepProfiler(cfg.train.profile_steps, cfg.run_dir, ident.process_id)
                if cfg.train.profile_steps
                else None
            )
            meta = _checkpoint_meta(cfg, env, where, run_id)
            inc = Incarnation(
                cfg, preemption, where.recorder, start.writer, held.ckpt, meta, start.status, timeline, evaluator,
                held.snapshots, held.profiler,
            )  # fmt: skip
            n = _train(inc, start.steps, start.state, start.batches, start.step, startup)
            return _finish(inc, n)
    finally:
        held.close(preemption)


def _join(
    cfg: Config, env: Mapping[str, str], run_id: RunIdentity, preemption: Preemption, timeline: Timeline
) -> tuple[distributed.Identity, Placement]:
    """The first phases: the newest snapshot in memory read ahead, inputs refused before anything is
    written, the group joined (``distributed``), the runtime started (``runtime``), the placement."""
    prefetched = None
    if cfg.checkpoint.memory_interval >= 0:
        prefetched = snapshot.Prefetch.newest(snapshot.directory(env), run_id.expected)
    _refuse_bad_inputs(cfg, env)
    # A SIGTERM while it waits for its peers exits 42 at once (trainer.elastic.watchdog).
    ident = distributed.initialize(env, preemption.joining)
    timeline.mark("distributed")
    jax.devices()
    timeline.mark("runtime")
    return ident, _place(cfg, env, ident, run_id, prefetched)


def _compatible(
    ckpt: Checkpointer, run_id: RunIdentity, cfg: Config, step: int, saved: dict[str, Any]
) -> None:
    """Nothing for a checkpoint of this run; ConfigError for another's (never resumed)."""
    ckpt.check_compatible(
        step, saved, run_id.config_hash, run_id.identity, cfg.train.global_batch, run_id.schedule
    )


def _our_snapshots(
    cfg: Config, env: Mapping[str, str], where: Placement, run_id: RunIdentity, ckpt: Checkpointer
) -> list[int]:
    """The snapshots of this run that some slice's processes all hold in memory: written by this
    very run (their meta matched). Without any, the newest checkpoint's identity is checked before
    anything is written into its run directory, the compile cache's entries included (a checkpoint
    of another run: exit 2); with some, the restore judges every checkpoint it reads instead
    (``Checkpointer.usable_start``). The compile cache is enabled after."""
    ours = where.memory.held(distributed.timeouts(env)[0])
    if not ours:
        ckpt.check_newest(functools.partial(_compatible, ckpt, run_id, cfg))
    if cfg.train.compile_cache:
        compile_cache.enable(cfg.run_dir)
    return ours


def _restore_or_init(
    cfg: Config,
    env: Mapping[str, str],
    ident: distributed.Identity,
    where: Placement,
    run_id: RunIdentity,
    ours: list[int],
    held: _Held,
    timeline: Timeline,
    read_before: int,
) -> Start | Exit:
    """The abstract state (``abstract state``); then on a resume the state read (``restore``), the
    train step compiled or loaded while it arrives (``train step``) and its arrival (``transfer``),
    or on a fresh start the train step and the initializer (``train step``, ``init``). Opens the
    metrics writer and writes the status: exit 0 at once for a run already trained to the end."""
    ckpt = held.ckpt
    model, program = Model(cfg, where.mesh), compile_cache.program(cfg)
    abstract = compile_cache.abstract_state(program, where.mesh, model.abstract)
    timeline.mark("abstract state")
    restored = restore.onto_mesh(
        where.memory, ours, ckpt, abstract, where.mesh, cfg.train.steps, functools.partial(_compatible, ckpt, run_id, cfg),
        None if model.was_traced else lambda: compile_cache.abstract_state(program, where.mesh, model.abstract, True),
        distributed.timeouts(env)[0],
    )  # fmt: skip
    held.writer = writer = RunWriter(
        cfg.run_dir, where.segment, where.attempt, cfg.metrics.flush_seconds, ident.process_id == 0
    )
    status = {
        "total_steps": cfg.train.steps,
        "segment": where.segment,
        "config_hash": run_id.config_hash,
    }
    if ckpt.set_aside:  # the controller puts them in the run's ledger
        status["unusable_checkpoints"] = ckpt.set_aside
    if restored.step >= cfg.train.steps:
        writer.status(state="finished", step=restored.step, **status)
        return Exit.FINISHED
    # Opened before the state so that a bad data path fails fast; it starts reading ahead.
    batches = iter(
        data.make_dataset(
            cfg.data,
            cfg.model.vocab_size,
            cfg.model.seq_len,
            where.layout,
            restored.step,
            cfg.train.steps,
        )
    )
    steps = _build_steps(cfg, where.mesh, where.plan.grad_accum)
    if restored.step:
        timeline.mark("restore")  # read, and on its way to the devices
        steps, compile_timers = _compile(program, steps, restored.state, model)  # while it arrives
        timeline.mark("train step")
        state, arriving = restored.ready()
        timeline.mark("transfer")
        restore_s, source = restored.seconds + arriving, restored.source
        place = str(ckpt.directory) if source is StateSource.STORAGE else where.memory.describe()
        print(f"trainer: resumed step {restored.step} from {place} on {where.plan}", flush=True)
    else:
        # Nothing restored: the look for a checkpoint (opening Orbax's manager) is start-up.
        restore_s, source = 0.0, StateSource.FRESH
        state, steps, compile_timers = _initialise(cfg, where.mesh, program, model, steps, abstract, timeline)
    # Where this incarnation's state came from; bytes: what it read of the run directory's
    # checkpoints from opening them to its state on the devices (the storage's counters).
    restore_record = {
        STATE_SOURCE: source.value,
        "restore/step": restored.step,
        "restore/storage_bytes": storage_bytes_read() - read_before,
    }
    status["restored"] = {
        "segment": where.segment,
        "jobset_attempt": where.attempt,
        STATE_SOURCE: source.value,
        "step": restored.step,
    }
    writer.status(state="running", step=restored.step, **status)
    if source in (StateSource.MEMORY, StateSource.PEERS):
        _rewrite_lost_records(writer, cfg.run_dir, where.memory.root, restored.step)
    return Start(
        restored.step, state, steps, batches, model, writer, status, restore_s, compile_timers, restore_record
    )


def _ready(
    cfg: Config,
    env: Mapping[str, str],
    ident: distributed.Identity,
    where: Placement,
    start: Start,
    preemption: Preemption,
    timeline: Timeline,
) -> tuple[Any, dict[str, Any]] | None:
    """The last phases before the steps: the eval step compiled (``eval step``) and the peers met
    (``barrier``). The evaluator and the start-up record the first step carries, or None on a
    SIGTERM during start-up (nothing trained since the latest checkpoint: the caller exits 42)."""
    if preemption.requested:
        return None
    evaluator = evaluate.Evaluator.build(
        cfg, where.layout, start.steps.tokens_sharding, start.steps.global_shape
    )
    if evaluator is not None:
        eval_compile = evaluator.compile(start.model, start.state)
        start.compile_timers["perf/compile_seconds"] += eval_compile
        print(f"trainer: eval step compiled in {eval_compile:.1f} s", flush=True)
        timeline.mark("eval step")
    if "flax" not in sys.modules:
        print("trainer: the model was not traced: flax and optax were never imported", flush=True)
    waited = _meet_peers(cfg, env, ident.num_processes, where.segment, where.attempt, preemption)
    if waited is None:
        return None
    timeline.mark("barrier")
    startup = {
        "perf/restore_seconds": start.restore_s,
        **start.compile_timers,
        "perf/start_barrier_seconds": waited,
        **start.restore_record,
    }
    return evaluator, startup


def _preempted_before_the_first_step(step: int) -> int:
    print(f"trainer: preempted before the first step, step {step} stands, exit {Exit.PREEMPTED}")
    return Exit.PREEMPTED


def _refuse_bad_inputs(cfg: Config, env: Mapping[str, str]) -> None:
    """Exit 2 (ConfigError) before joining the group or writing anything: a run directory this node
    pool cannot write (process 0: a failing process 0 must not leave its peers waiting in a
    collective for it), a missing, short or foreign token file, token files whose metadata
    disagrees with the config, weights the global batch cannot hold, a stage's missing source."""
    if distributed.identity(env).process_id == 0:
        storage.probe_write(cfg.run_dir)
    parts: list[data.Part] = []
    if cfg.data.sources or cfg.data.source == "files":
        parts += data.make_mixture(
            cfg.data, cfg.model.vocab_size, cfg.model.seq_len, cfg.train.global_batch
        ).parts
    if cfg.eval.sources:
        parts += data.eval_sources(cfg.eval.sources, cfg.data, cfg.model.vocab_size, cfg.model.seq_len)
    data.one_tokenizer(parts)  # the evaluation's and the training's of one tokenizer
    data.warn_unlabelled(parts)
    stages.check_source(cfg)


def _place(
    cfg: Config,
    env: Mapping[str, str],
    ident: Any,
    run_id: RunIdentity,
    prefetched: snapshot.Prefetch | None,
) -> Placement:
    """The mesh, batch plan, data layout and metrics recorder of this incarnation, and its memory
    snapshots (``snapshot.Memory``, off without a memory directory)."""
    segment = _env_number(env, envvars.SEGMENT, int)
    attempt = _env_number(env, envvars.RESTART_ATTEMPT, int)
    memory_dir, memory_every = snapshot.directory(env), snapshot.interval(cfg.checkpoint.memory_interval)
    if memory_dir is not None and memory_every > 0:
        cfg = snapshot.with_slice_replicas(cfg, _env_number(env, envvars.NUM_SLICES, int))
    mesh = mesh_for(cfg)
    plan = batch_plan(
        cfg, mesh.size, ident.num_processes, mesh.shape["expert"], dp_ranks(mesh), mesh.shape["fsdp"]
    )
    gb, seq, e = cfg.train.global_batch, cfg.model.seq_len, cfg.moe
    recorder = Recorder(
        segment, attempt, plan, gb * seq, sizes.flops_per_token(cfg),
        peaks.peak_tflops(env, mesh.devices.flat[0].device_kind) or 0.0,
        sizes.buffer_rows(plan.micro_batch * seq, e.top_k, e.ragged_buffer_factor, plan.expert_parallel, e.num_experts),
    )  # fmt: skip
    memory = snapshot.Memory(
        memory_dir,
        memory_every,
        run_id.expected,
        f"{segment}-{attempt}-{env.get('RESLICE_WORLD_EPOCH', '')}",
        _env_number(env, envvars.HOSTS_PER_SLICE, int) or 1,
        prefetched,
    )
    layout = data.Layout(gb, plan.grad_accum, *process_block(mesh, ident.process_id))
    return Placement(cfg, segment, attempt, mesh, plan, layout, recorder, memory)


def _checkpoint_meta(
    cfg: Config, env: Mapping[str, str], where: Placement, run_id: RunIdentity
) -> Callable[[int], dict[str, Any]]:
    """A checkpoint's meta at a step (docs/contract.md): the data position, the batch plan, and
    what a resume checks it against (``RunIdentity``)."""
    gb = cfg.train.global_batch

    def meta(step: int) -> dict[str, Any]:
        return {
            "step": step, "data_position": step * gb, "global_batch": gb, "segment": where.segment,
            "jobset_attempt": where.attempt, "config_hash": run_id.config_hash, "identity": run_id.identity,
            "run": env.get(envvars.RUN, ""), "shape": asdict(where.plan), "time": time.time(),
            **({"schedule": run_id.schedule} if run_id.schedule else {}),
        }  # fmt: skip

    return meta


def _initialise(
    cfg: Config,
    mesh: Any,
    program: dict[str, Any],
    model: Model,
    steps: Steps,
    abstract: Any,
    timeline: Timeline,
) -> tuple[Any, Steps, dict[str, Any]]:
    """A fresh start's state and train step; a stage's first segment then takes its source's state
    (``train.init_from``). On an accelerator the two programs compile at once, the initializer on a
    thread (XLA compiles without the GIL, and a TPU's compiles take seconds each); everything is
    traced on this thread (JAX's mesh and flax's axis rules are this thread's). On CPU they compile
    one after the other: there this module's compile cache switches JAX's own off around each
    compile (``compile_cache._compile``), a process-wide setting."""
    from concurrent.futures import ThreadPoolExecutor

    devices, hits = list(mesh.devices.flat), compile_cache.hits()
    lower = functools.cache(model.lower_initial_state)
    with ThreadPoolExecutor(1, thread_name_prefix="initializer") as pool:
        if compile_cache.kept_here(jax.default_backend()):
            steps, timers = _compile(program, steps, abstract, model)
            timeline.mark("train step")
            initializer = compile_cache.initial_state(lower, devices, program)
        else:
            if not compile_cache.initial_state_held(devices, program):
                lower()  # traced here; the thread compiles what it returns
            pending = pool.submit(compile_cache.initial_state, lower, devices, program)
            steps, timers = _compile(program, steps, abstract, model)
            timeline.mark("train step")
            initializer = pending.result()
    state = initializer(np.uint32(cfg.train.seed))  # the same on every process
    if compile_cache.hits() > hits + timers["perf/compile_cache_hits"]:
        print("trainer: initial state's program loaded from the compile cache", flush=True)
    if cfg.train.init_from:  # a stage's first segment: its source's state, at step 0
        state = stages.initial_state(cfg, state, abstract)
    timeline.mark("init")
    return state, steps, timers


def _finish(inc: Incarnation, n: int) -> int:
    """After the last step (or the one all stopped at): every save committed, the status written,
    the exit code."""
    with inc.preemption.saving():
        inc.ckpt.wait()
        if inc.snapshots is not None:
            inc.snapshots.wait()
    code = Exit.FINISHED if n >= inc.cfg.train.steps else Exit.PREEMPTED
    if code == Exit.FINISHED:
        inc.writer.status(state="finished", step=n, **inc.status)
        print(f"trainer: finished {n} steps", flush=True)
    else:
        print(f"trainer: preempted: step {n} committed, exit {Exit.PREEMPTED}", flush=True)
    if inc.ckpt.committed(n):
        # Before closing the checkpointer: a process 0 that exits first takes the coordination
        # service with it, and this process's supervisor then keeps this code (trainer.elastic.peers).
        print(peers.SETTLED.format(code=code), file=sys.stderr, flush=True)
    return code
