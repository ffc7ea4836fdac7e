"""The training loop: plan check, restore or init, steps, metrics, checkpoints, SIGTERM.

Step s (0-based) trains on global batch s; after it the model has seen s + 1 batches and the
metrics record and checkpoint carry ``step = s + 1``. Dispatch runs one step ahead of the host:
step n + 1 is queued before step n's metrics are read, so host work overlaps device work.

SIGTERM sets a flag that rides into the next step as an input; its maximum over all processes comes
back in that step's metrics. Every process therefore sees it at the same step n, finishes the step
already in flight (n + 1), saves it, waits for the commit and exits 42.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from trainer import data, distributed, model, moe
from trainer.checkpoint import Checkpointer
from trainer.config import Config, ConfigError, config_hash, identity
from trainer.mesh import batch_sharding, make_mesh
from trainer.metrics import RunWriter
from trainer.step import abstract_state, init_state, make_train_step

EXIT_FINISHED, EXIT_CONFIG, EXIT_PREEMPTED = 0, 2, 42


@dataclass(frozen=True)
class Plan:
    devices: int
    micro_batch: int
    grad_accum: int
    num_processes: int
    expert_parallel: int


def batch_plan(cfg: Config, devices: int, num_processes: int, expert_parallel: int) -> Plan:
    """Check devices × micro-batch × grad-accum = global batch against the devices JAX sees."""
    t = cfg.train
    b = t.micro_batch or t.global_batch // (devices * t.grad_accum)
    if devices * b * t.grad_accum != t.global_batch:
        raise ConfigError(
            f"devices × micro-batch × grad-accum = {devices} × {b} × {t.grad_accum}"
            f" = {devices * b * t.grad_accum} ≠ global batch {t.global_batch}"
        )
    if (devices * b) % cfg.moe.balance_group:
        raise ConfigError(
            f"moe.balance_group={cfg.moe.balance_group} must divide the micro-batch {devices * b}"
        )
    return Plan(devices, b, t.grad_accum, num_processes, expert_parallel)


class Preemption:
    """Remembers a SIGTERM; the loop acts on it at a step boundary."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        print("trainer: SIGTERM: finishing the step in flight, then checkpoint and exit 42", flush=True)

    def restore(self) -> None:
        signal.signal(signal.SIGTERM, self._previous)


def _env_float(env: Mapping[str, str], key: str) -> float:
    try:
        return float(env.get(key) or 0.0)
    except ValueError:
        raise ConfigError(f"{key}={env.get(key)!r} is not a number") from None


def run(cfg: Config, env: Mapping[str, str]) -> int:
    ident = distributed.initialize(env)
    segment = int(env.get("RESLICE_SEGMENT") or 0)
    attempt = int(env.get("RESLICE_RESTART_ATTEMPT") or 0)
    peak = _env_float(env, "RESLICE_PEAK_TFLOPS")

    mesh = make_mesh(cfg.moe.num_experts, cfg.mesh.expert)
    plan = batch_plan(cfg, mesh.size, ident.num_processes, mesh.shape["expert"])
    layout = data.Layout(cfg.train.global_batch, plan.grad_accum, ident.num_processes, ident.process_id)
    chash, ident_dict = config_hash(cfg), identity(cfg)
    total_steps, gb, seq = cfg.train.steps, cfg.train.global_batch, cfg.model.seq_len
    local_tokens = plan.micro_batch * seq
    buffer = moe.buffer_rows(
        local_tokens, cfg.moe.top_k, cfg.moe.ragged_buffer_factor, plan.expert_parallel, cfg.moe.num_experts
    )
    flops_tok = model.flops_per_token(cfg)

    writer = RunWriter(
        cfg.run_dir, segment, attempt, cfg.metrics.flush_seconds, enabled=ident.process_id == 0
    )
    ckpt = Checkpointer(cfg.run_dir, cfg.checkpoint.keep, cfg.checkpoint.async_save)
    preemption = Preemption()
    try:
        with jax.set_mesh(mesh):
            graphdef, abstract = abstract_state(cfg, mesh)
            start = ckpt.latest_step() or 0
            if start:
                meta = ckpt.read_meta(start)
                ckpt.check_compatible(start, meta, chash, ident_dict, gb)
                state = ckpt.restore(start, abstract)
                print(f"trainer: resumed step {start} from {ckpt.directory} on {plan}", flush=True)
            else:
                state = init_state(cfg, mesh, abstract)
            status = {"total_steps": total_steps, "segment": segment, "config_hash": chash}
            writer.status(state="running", step=start, **status)
            if start >= total_steps:
                writer.status(state="finished", step=start, **status)
                return EXIT_FINISHED

            train_step = make_train_step(cfg, graphdef, mesh, abstract)
            batches = iter(data.make_dataset(cfg.data, cfg.model.vocab_size, seq, layout, start, total_steps))
            tokens_sharding = batch_sharding(mesh)
            global_shape = (plan.grad_accum, gb // plan.grad_accum, seq + 1)
            flag_sharding = NamedSharding(mesh, P(moe.BATCH_AXES))
            local_devices = mesh.size // ident.num_processes

            def meta(step: int) -> dict[str, Any]:
                return {
                    "step": step, "data_position": step * gb, "global_batch": gb, "segment": segment,
                    "restart_attempt": attempt, "config_hash": chash, "identity": ident_dict,
                    "run": env.get("RESLICE_RUN", ""), "time": time.time(),
                    "shape": {"devices": plan.devices, "num_processes": plan.num_processes,
                              "micro_batch": plan.micro_batch, "grad_accum": plan.grad_accum,
                              "expert_parallel": plan.expert_parallel},
                }  # fmt: skip

            def record(n: int, m: dict, batch: dict, data_s: float, step_s: float, save_s: float) -> dict:
                tokens_per_sec = gb * seq / step_s
                tflops = flops_tok * tokens_per_sec / plan.devices / 1e12
                layers = [
                    {"dropped_rows": int(d), "total_rows": int(t), "max_load_over_balanced": float(x)}
                    for d, t, x in zip(m["moe_dropped"], m["moe_total"], m["moe_load"], strict=True)
                ]
                return {
                    "step": n, "segment": segment, "restart_attempt": attempt, "time": time.time(),
                    "learning/loss": float(m["loss"]), "learning/total_loss": float(m["total_loss"]),
                    "learning/moe_lb_loss": float(m["lb_loss"]), "learning/moe_z_loss": float(m["z_loss"]),
                    "learning/lr": float(m["lr"]), "learning/grad_norm": float(m["grad_norm"]),
                    "perf/step_time_seconds": step_s, "perf/tokens_per_sec": tokens_per_sec,
                    "perf/per_device_tflops_per_sec": tflops, "perf/mfu": tflops / peak if peak else None,
                    "perf/data_loading_seconds": data_s, "perf/checkpoint_save_seconds": save_s,
                    "moe/dropped_rows": sum(x["dropped_rows"] for x in layers),
                    "moe/total_rows": sum(x["total_rows"] for x in layers),
                    "moe/max_load_over_balanced": max((x["max_load_over_balanced"] for x in layers), default=0.0),
                    "moe/layers": layers, "moe/buffer_rows": buffer,
                    "data/sample_digest": batch.get("digest"), "data/first_sample": batch.get("first_sample"),
                    "devices": plan.devices, "micro_batch": plan.micro_batch, "grad_accum": plan.grad_accum,
                    "num_processes": plan.num_processes,
                }  # fmt: skip

            pending: tuple | None = None  # (n, device metrics, batch, data seconds) of the step in flight
            last_done = time.perf_counter()
            stop = False
            n = start

            def finish() -> dict:
                """Wait for the pending step, build its record, learn whether anyone was preempted."""
                nonlocal pending, last_done, stop
                assert pending is not None
                pn, dm, batch, data_s = pending
                m = jax.device_get(dm)
                now = time.perf_counter()
                rec = record(pn, m, batch, data_s, now - last_done, 0.0)
                last_done = now
                stop = stop or bool(m["stop"])
                if pn % cfg.metrics.log_every == 0 or pn == total_steps:
                    print(
                        f"step {pn}/{total_steps} loss {rec['learning/loss']:.4f}"
                        f" step_time {rec['perf/step_time_seconds']:.3f}s"
                        f" dropped {rec['moe/dropped_rows']}/{rec['moe/total_rows']}",
                        flush=True,
                    )
                pending = None
                return rec

            for s in range(start, total_steps):
                n = s + 1
                t0 = time.perf_counter()
                batch = next(batches)
                assert batch["step"] == s, (batch["step"], s)
                tokens = jax.make_array_from_process_local_data(
                    tokens_sharding, batch["tokens"], global_shape
                )
                flag = np.full((local_devices,), int(preemption.requested), np.int32)
                stop_in = jax.make_array_from_process_local_data(flag_sharding, flag, (mesh.size,))
                data_s = time.perf_counter() - t0
                state, dm = train_step(state, tokens, stop_in)
                if pending is not None:
                    writer.write(finish())
                pending = (n, dm, batch, data_s)
                if n % cfg.checkpoint.interval == 0 or n == total_steps or stop:
                    rec = finish()  # the step's own time, without the save
                    rec["perf/checkpoint_save_seconds"] = ckpt.save(n, state, meta(n))
                    last_done = time.perf_counter()
                    writer.write(rec)
                    writer.status(state="running", step=n, **status)
                    writer.flush()
                    if stop and n < total_steps:
                        break
            if pending is not None:
                writer.write(finish())
            ckpt.wait()
            if n >= total_steps:
                writer.status(state="finished", step=n, **status)
                print(f"trainer: finished {n} steps", flush=True)
                return EXIT_FINISHED
            writer.status(state="running", step=n, **status)
            print(f"trainer: preempted: step {n} committed, exit {EXIT_PREEMPTED}", flush=True)
            return EXIT_PREEMPTED
    finally:
        preemption.restore()
        ckpt.close()
        writer.close()
        sys.stdout.flush()
