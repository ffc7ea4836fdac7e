"""The checks that need an accelerator: the ragged MoE transport against the dense one, and a step time
and MFU of ``olmo-7b`` at reduced depth. Prints figures (and, with ``--json``, one JSON line last).

    python -m bench.accelerator [--layers 4] [--batch 4] [--quick] [--json]

1. Transports. ``trainer.model.moe.dispatch_combine`` with ``transport=ragged`` (``jax.lax.ragged_all_to_all``)
   and ``transport=dense`` (fixed chunks through ``all_to_all``, the path the CPU tests cover) on the
   same inputs, dropless and with drops (buffer factor 1.0 under skewed routing): the outputs and
   the gradients of a fixed cotangent with respect to the tokens, the gates and the three expert
   weights must agree within 1e-5 in float32. Run on every backend that has the devices for
   4-way expert parallelism and can compile the ragged op; a backend that cannot is reported, not
   skipped silently (XLA:CPU in jaxlib 0.10.2 has no ``ragged-all-to-all``; one GPU cannot hold 4
   expert shards, so there the check runs at the parallelism the devices allow and says so).
2. Step time. The real train step (``trainer.step.make_train_step``) of ``olmo-7b`` with
   ``model.n_layers`` reduced to fit one device, bf16 compute, fp32 parameters and Adam moments, on
   the first accelerator device: seconds per step over timed steps after the compile, tokens per
   second, and MFU = ``trainer.model.sizes.flops_per_token`` × tokens / s / the device's peak dense bf16
   FLOP/s (a table below; the vendor's figure, not a measurement).

``--quick`` shrinks part 2 to a toy model so that the script can be tried on CPU before a lease.
Not a test: CI has no accelerator.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# Before jax is imported. bench/__init__ sets the simulated hosts' JAX settings (CPU only, and
# XLA:CPU flags that other jaxlib versions refuse); this benchmark is for the accelerator, with 8
# host devices beside it for the transport check on CPU.
os.environ.pop("JAX_PLATFORMS", None)
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

# Peak dense bf16 FLOP/s by device kind (vendor data sheets, without sparsity).
PEAK_BF16 = {"NVIDIA H200": 989e12, "NVIDIA H100 80GB HBM3": 989e12, "TPU7x": 2307e12, "TPU v4": 275e12}
TOLERANCE = 1e-5
E, K, D_MODEL, D_FF, N = 8, 2, 32, 64, 64  # experts, top-k, widths, tokens per device


def _inputs(devices: int, seed: int = 0) -> dict:
    import numpy as np

    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, E + 1) ** 1.2  # Zipf-skewed routing, so that a buffer factor of 1 drops
    p /= p.sum()
    ids = np.stack([rng.choice(E, size=K, replace=False, p=p) for _ in range(devices * N)]).astype(np.int32)
    f32 = np.float32
    return {
        "x": rng.normal(size=(devices * N, D_MODEL)).astype(f32),
        "ids": ids,
        "gates": rng.uniform(0.1, 1.0, size=(devices * N, K)).astype(f32),
        "w_gate": (rng.normal(size=(E, D_MODEL, D_FF)) / 3).astype(f32),
        "w_up": (rng.normal(size=(E, D_MODEL, D_FF)) / 3).astype(f32),
        "w_down": (rng.normal(size=(E, D_FF, D_MODEL)) / 4).astype(f32),
        "cotangent": rng.normal(size=(devices * N, D_MODEL)).astype(f32),
    }


def compare_transports(devices: list, ep: int, factor: float) -> dict:
    """Max |ragged - dense| of the output and of each gradient, and the rows dropped, on ``devices``."""
    from functools import partial

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType, Mesh
    from jax.sharding import PartitionSpec as P

    from trainer.model import moe

    n = len(devices)
    mesh = Mesh(
        np.array(devices).reshape(n // ep, 1, ep, 1),
        ("data", "fsdp", "expert", "tensor"),
        axis_types=(AxisType.Auto,) * 4,
    )
    arrays = _inputs(n)
    tok, ex = P(moe.BATCH_AXES), P(moe.EXPERT_AXIS)

    def run(transport: str):
        body = partial(moe.dispatch_combine, num_experts=E, factor=factor, transport=transport)
        layer = jax.shard_map(body, mesh=mesh, in_specs=(tok,) * 3 + (ex,) * 3, out_specs=(tok,) * 3)

        def objective(x, gates, w_gate, w_up, w_down, ids, cot):
            y, kept, stats = layer(x, ids, gates, w_gate, w_up, w_down)
            return jnp.sum(y * cot), (y, kept, stats)

        grad = jax.jit(jax.grad(objective, argnums=(0, 1, 2, 3, 4), has_aux=True))
        a = arrays
        with jax.set_mesh(mesh):
            grads, (y, kept, stats) = grad(
                a["x"], a["gates"], a["w_gate"], a["w_up"], a["w_down"], a["ids"], a["cotangent"]
            )
        return jax.device_get((y, grads, kept, stats))

    ragged, dense = run("ragged"), run("dense")
    names = ("x", "gates", "w_gate", "w_up", "w_down")
    diffs = {"output": float(np.max(np.abs(ragged[0] - dense[0])))}
    diffs |= {
        f"grad_{k}": float(np.max(np.abs(r - d))) for k, r, d in zip(names, ragged[1], dense[1], strict=True)
    }
    return {
        "platform": devices[0].platform,
        "devices": n,
        "expert_parallel": ep,
        "factor": factor,
        "rows_dropped": int(np.sum(ragged[3][:, 0])),
        "kept_rows_equal": bool(np.array_equal(ragged[2], dense[2])),
        "max_abs_diff": max(diffs.values()),
        "diffs": diffs,
        "ok": max(diffs.values()) <= TOLERANCE and bool(np.array_equal(ragged[2], dense[2])),
    }


def transports() -> list[dict]:
    import jax

    rows = []
    backends = [b for b in ("gpu", "cpu") if _has_backend(b)]
    for backend in backends:
        devices = jax.devices(backend)
        ep = min(4, len(devices))
        devices = devices[: (len(devices) // ep) * ep]
        # Dropless, a buffer that drops under the skewed routing with 4 shards, and one that drops
        # with a single shard (whose buffer holds all of its own rows at factor 1).
        for factor in (-1.0, 1.0, 0.5):
            try:
                rows.append(compare_transports(devices, ep, factor))
            except Exception as err:  # a backend that cannot compile the ragged op: say so
                first = str(err).strip().splitlines()[0][:200]
                rows.append({"platform": backend, "devices": len(devices), "expert_parallel": ep,
                             "factor": factor, "error": f"{type(err).__name__}: {first}", "ok": False})  # fmt: skip
    return rows


def _has_backend(name: str) -> bool:
    import jax

    try:
        return bool(jax.devices(name))
    except RuntimeError:
        return False


def step_time(layers: int, batch: int, steps: int, quick: bool, overrides: list[str] | None = None) -> dict:
    """The real train step of olmo-7b (``layers`` deep) on one accelerator device."""
    import jax
    import numpy as np

    from trainer import config
    from trainer.model.mesh import batch_sharding, device_sharding, mesh_for
    from trainer.model.sizes import flops_per_token, param_counts
    from trainer.step import abstract_state, init_state, make_train_step

    sets = [f"model.n_layers={layers}", f"model.dense_layers={layers}", f"train.global_batch={batch}",
            "train.grad_accum=1", "train.micro_batch=0"]  # fmt: skip
    if quick:
        sets += ["model.vocab_size=512", "model.seq_len=128", "model.d_model=128", "model.n_heads=4",
                 "model.head_dim=32", "model.d_ff=256", "model.attention_block=32", "model.loss_chunk=32", "data.eos_id=1"]  # fmt: skip
    cfg = config.resolve("olmo-7b", [*sets, *(overrides or [])], {})
    backend = jax.default_backend()
    device = jax.devices()[0]
    mesh = mesh_for(cfg, [device])
    seq = cfg.model.seq_len
    rng = np.random.default_rng(0)
    with jax.set_mesh(mesh):
        graphdef, abstract = abstract_state(cfg, mesh)
        t0 = time.perf_counter()
        state = init_state(cfg, mesh, abstract)
        step = make_train_step(cfg, graphdef, mesh, abstract)
        tokens_np = rng.integers(0, cfg.model.vocab_size, size=(1, batch, seq + 1), dtype=np.int32)
        tokens = jax.device_put(tokens_np, batch_sharding(mesh))
        stop = jax.device_put(np.zeros(mesh.size, np.int32), device_sharding(mesh))
        state, m = step(state, tokens, stop)
        jax.block_until_ready(m)
        first_s = time.perf_counter() - t0
        state, m = step(state, tokens, stop)  # untimed: the first calls after a compile run slower
        jax.block_until_ready(m)
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            state, m = step(state, tokens, stop)
            jax.block_until_ready(m)
            times.append(time.perf_counter() - start)
        loss = float(jax.device_get(m["scalars"])[0])
    step_s = sorted(times)[len(times) // 2]
    tokens_per_step = batch * seq
    fpt = flops_per_token(cfg)
    peak = PEAK_BF16.get(device.device_kind)
    achieved = fpt * tokens_per_step / step_s
    total, _ = param_counts(cfg)
    memory = device.memory_stats() or {}
    return {
        "backend": backend,
        "device_kind": device.device_kind,
        "layers": layers,
        "overrides": overrides or [],
        "params": total,
        "global_batch": batch,
        "seq_len": seq,
        "compile_and_first_step_s": round(first_s, 2),
        "step_s_median": round(step_s, 4),
        "step_s_all": [round(t, 4) for t in times],
        "tokens_per_s": round(tokens_per_step / step_s, 1),
        "model_tflops_per_s": round(achieved / 1e12, 1),
        "peak_bf16_tflops": peak / 1e12 if peak else None,
        "mfu": round(achieved / peak, 4) if peak else None,
        "peak_memory_gib": round(memory.get("peak_bytes_in_use", 0) / 2**30, 1),
        "loss_last": round(loss, 4),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.accelerator", description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4, help="olmo-7b depth for the step time (default 4)")
    parser.add_argument("--batch", type=int, default=4, help="sequences per step (default 4)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (default 5)")
    parser.add_argument("--quick", action="store_true", help="a toy model for part 2 (a CPU dry run)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--transports-only", action="store_true", help="part 1 only")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="olmo-7b override (part 2)"
    )
    args = parser.parse_args(argv)

    import jax

    print(f"jax {jax.__version__}, backend {jax.default_backend()}, devices {jax.devices()}", flush=True)
    rows = transports()
    print("\n1. ragged vs dense MoE transport (float32; outputs and gradients; tolerance 1e-5)")
    for r in rows:
        if "error" in r:
            print(f"  {r['platform']:4s} {r['devices']} devices, EP {r['expert_parallel']}, factor "
                  f"{r['factor']:5}: not run: {r['error']}")  # fmt: skip
        else:
            print(f"  {r['platform']:4s} {r['devices']} devices, EP {r['expert_parallel']}, factor "
                  f"{r['factor']:5}: rows dropped {r['rows_dropped']:4d}, max |diff| {r['max_abs_diff']:.2e}, "
                  f"kept rows equal {r['kept_rows_equal']}: {'OK' if r['ok'] else 'FAIL'}", flush=True)  # fmt: skip
    result: dict = {"jax": jax.__version__, "transports": rows}
    try:
        if args.transports_only:
            raise RuntimeError("skipped (--transports-only)")
        st = step_time(args.layers, args.batch, args.steps, args.quick, args.set)
        result["step"] = st
        print(f"\n2. olmo-7b {' '.join(args.set)} at {st['layers']} layers ({st['params'] / 1e9:.2f} B parameters), "
              f"{st['global_batch']} × {st['seq_len']} tokens, on {st['device_kind']}:")  # fmt: skip
        print(f"  compile + first step {st['compile_and_first_step_s']} s; step {st['step_s_median']} s "
              f"(median of {len(st['step_s_all'])}: {st['step_s_all']}); {st['tokens_per_s']:.0f} tokens/s; "
              f"{st['model_tflops_per_s']} TFLOP/s; MFU {st['mfu']} of {st['peak_bf16_tflops']} TFLOP/s; "
              f"peak memory {st['peak_memory_gib']} GiB; loss {st['loss_last']}")  # fmt: skip
    except Exception as err:
        result["step_error"] = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300]}"
        print(f"\n2. step time not measured: {result['step_error']}")
    if args.json:
        print(json.dumps(result))
    return 0 if all(r.get("ok") or "error" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
