"""The checks that need an accelerator, sized for the device it finds. Prints figures (and, with
``--json``, one JSON object last).

    python -m bench.accelerator [--layers N] [--batch N] [--steps 5] [--quick] [--json]

1. Transports. ``trainer.model.moe.dispatch_combine`` with ``transport=ragged`` (``jax.lax.ragged_all_to_all``)
   and ``transport=dense`` (fixed chunks through ``all_to_all``, the path the CPU tests cover) on the
   same inputs, dropless and with drops: outputs and the gradients of a fixed cotangent with respect
   to the tokens, the gates and the three expert weights within 1e-5 in float32. On every backend
   present (TPU, GPU, CPU), at the expert parallelism its devices allow (up to 4; one TPU chip: 1, said
   so); a backend that cannot compile the ragged op is reported (XLA:CPU in jaxlib 0.10.2 has none).
2. Step time. The real train step (``trainer.step.make_train_step``) of ``olmo-7b`` (OLMo 3 7B's
   layer, its sliding windows and documents, bf16 compute, fp32 parameters and Adam moments) at the
   depth, batch and vocabulary that fit the first device's HBM (``pick``; printed with why), with
   ``model.attention=auto`` (the splash kernel on a TPU): seconds per step, tokens per second, MFU =
   ``trainer.model.sizes.flops_per_token`` × tokens / s / the device's peak dense bf16 FLOP/s (the
   trainer's table, ``trainer.telemetry.peaks``: the vendors' figures), the peak HBM in use beside
   the planner's estimate (``launcher.core.hbm.estimate``, what ``plan``/``preflight`` use) and XLA's
   compiled figure for the same step (what ``python -m trainer --hbm`` reports).
3. Reference. In the same process a plain-JAX step of the same shape (a functional transformer, the
   same attention call, optax's AdamW): ``step_over_reference`` is what the trainer adds.
4. Attention agreement at olmo-7b's head shape ([1, 8192, 32, 128], bf16): the splash kernel against
   the blocked path, forward and gradients, causal and with a 4,096-token window over 8 documents;
   each one's forward+backward time.
5. MoE. ``olmoe-1b`` at the depth that fits: MFU with the grouped expert matmul (``jax.lax.ragged_dot``,
   ``moe.expert_matmul=ragged``) against every expert over every row (``dense``).

``--quick`` shrinks parts 2-5 to toy shapes so that the script can be tried on CPU before a lease.
Not a test: CI has no accelerator.
"""

from __future__ import annotations

import json
import os
import sys
import time

from bench._cli import Parser

# Before jax is imported. bench/__init__ sets the simulated hosts' JAX settings (CPU only, and
# XLA:CPU flags that other jaxlib versions refuse); this benchmark is for the accelerator, with 8
# host devices beside it for the transport check on CPU.
os.environ.pop("JAX_PLATFORMS", None)
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

GIB = 2**30
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
    backends = [b for b in ("tpu", "gpu", "cpu") if _has_backend(b)]
    for backend in backends:
        devices = jax.devices(backend)
        ep = min(4, len(devices))  # what the devices allow: one chip holds one expert shard
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


def _count(n: float) -> str:
    """1234567 -> '1.23 M' (a toy model's count printed in billions read "0.00 B")."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return str(int(n))


# What ``pick`` allows a sequence's activations beside the state: one layer's working set under
# remat=full (the MLP's [T, d_ff] products, q/k/v/o, one loss chunk of logits) plus the block inputs
# kept per layer. Rough on purpose: the compiled step's own figure then confirms the choice.
ACTIVATION_BYTES_PER_TOKEN = 256 * 1024
SAVED_BYTES_PER_TOKEN_LAYER = 2 * 4096
STATE_BYTES_PER_PARAM = 16  # fp32 parameter, two Adam moments, its gradient
FIT = 0.92  # of the device's bytes_limit: room for XLA's fragmentation and the runtime
SMALL_VOCAB = 32768  # when the whole vocabulary's embedding and head leave no room for a layer


def _resolve(name: str, sets: list[str]):
    from trainer import config

    return config.resolve(name, sets, {})


def pick(
    name: str,
    limit: int,
    layers: int,
    batch: int,
    quick: bool,
    max_layers: int = 8,
    batches: tuple = (1, 2, 4),
) -> tuple[list, str]:
    """The overrides that fit ``name`` on one device of ``limit`` bytes, and why: the deepest model
    (up to ``max_layers``) at batch 1, then the largest batch of up to 4 at that depth, by state
    bytes (16 a parameter) plus an allowance for activations; with the whole vocabulary if one layer
    fits beside it, else a 32,768-token vocabulary. ``layers``/``batch`` > 0 are taken as given."""
    from trainer.model.sizes import param_counts

    if quick:
        sets = ["model.vocab_size=512", "model.seq_len=256", "model.d_model=128", "model.n_heads=4",
                "model.head_dim=32", "model.d_ff=256", "model.attention_block=64", "model.loss_chunk=64",
                "model.sliding_window=128", "data.eos_id=1", "moe.num_experts=8", "moe.top_k=2",
                "moe.d_expert=64"]  # fmt: skip
        return [*sets, *_depth(name, layers or 2), f"train.global_batch={batch or 2}"], "--quick: a toy shape"
    base = _resolve(name, ["data.source=synthetic"])
    seq = base.model.seq_len

    def need(sets: list[str], b: int) -> float:
        cfg = _resolve(name, ["data.source=synthetic", *sets])
        total, _ = param_counts(cfg)
        n = cfg.model.n_layers
        return STATE_BYTES_PER_PARAM * total + b * seq * (
            ACTIVATION_BYTES_PER_TOKEN + n * SAVED_BYTES_PER_TOKEN_LAYER
        )

    budget = FIT * limit
    vocab: list[str] = []
    why = []
    if need(_depth(name, 1), 1) > budget:
        vocab = [f"model.vocab_size={SMALL_VOCAB}", f"data.eos_id={SMALL_VOCAB - 1}"]  # an id that exists
        why.append(f"the whole vocabulary ({base.model.vocab_size:,}) leaves no room for one layer "
                   f"({need(_depth(name, 1), 1) / GIB:.1f} GiB > {FIT:.0%} of {limit / GIB:.2f} GiB): "
                   f"vocabulary {SMALL_VOCAB:,}")  # fmt: skip
    depth = layers
    if not depth:
        depth = max(
            [n for n in range(1, max_layers + 1) if need([*vocab, *_depth(name, n)], 1) <= budget] or [1]
        )
        why.append(f"{depth} layers: the deepest (up to {max_layers}) whose state (16 bytes a parameter) and "
                   f"one sequence's activations fit {FIT:.0%} of {limit / GIB:.2f} GiB")  # fmt: skip
    b = batch
    if not b:
        sets = [*vocab, *_depth(name, depth)]
        b = max([x for x in batches if need(sets, x) <= budget] or [1])
        why.append(f"batch {b}: the largest of {', '.join(map(str, batches))} that fits beside them "
                   f"({need(sets, b) / GIB:.1f} GiB estimated)")  # fmt: skip
    return [*vocab, *_depth(name, depth), f"train.global_batch={b}"], "; ".join(why) or "as given"


def _depth(name: str, n: int) -> list[str]:
    dense = n if name == "olmo-7b" else 0
    return [f"model.n_layers={n}", f"model.dense_layers={dense}"]


def _planner_estimate(cfg) -> float:
    """What ``launcher plan``/``preflight`` estimate per device for this config on one device."""
    from types import SimpleNamespace

    from launcher.core.hbm import estimate

    plan = SimpleNamespace(devices=1, micro_batch=cfg.train.global_batch, model_parallel=1, grad_accum=1)
    return estimate(cfg.to_dict(), plan)["total"]


class OverHBM(Exception):
    """The compiled step's peak does not fit the device (``step_time``'s ``max_bytes``)."""


def step_time(name: str, sets: list[str], steps: int, max_bytes: float = 0) -> dict:
    """The real train step of ``name`` with ``sets`` on the first device: timed steps after the
    compile, MFU, the peak HBM in use, XLA's compiled HBM figure and the planner's estimate."""
    import jax
    import numpy as np

    from trainer.model.attention import resolve
    from trainer.model.mesh import batch_sharding, device_sharding, mesh_for
    from trainer.model.sizes import flops_per_token, param_counts
    from trainer.step import abstract_state, init_state, make_train_step, plain
    from trainer.telemetry.peaks import device_peak_tflops

    cfg = _resolve(name, ["data.source=synthetic", "train.grad_accum=1", "train.micro_batch=0", *sets])
    batch, seq = cfg.train.global_batch, cfg.model.seq_len
    device = jax.devices()[0]
    mesh = mesh_for(cfg, [device])
    rng = np.random.default_rng(0)
    with jax.set_mesh(mesh):
        graphdef, abstract = abstract_state(cfg, mesh)
        t0 = time.perf_counter()
        step = make_train_step(cfg, graphdef, mesh, abstract)
        tokens_np = rng.integers(0, cfg.model.vocab_size, size=(1, batch, seq + 1), dtype=np.int32)
        if cfg.data.eos_id >= 0:  # documents: about 8 a sequence, so that the segment ids matter
            tokens_np[rng.random(tokens_np.shape) < 8 / seq] = cfg.data.eos_id
        tokens = jax.device_put(tokens_np, batch_sharding(mesh))
        stop = jax.device_put(np.zeros(mesh.size, np.int32), device_sharding(mesh))
        compiled = step.lower(plain(abstract), tokens, stop).compile()
        ma = compiled.memory_analysis()
        if ma is None:
            raise RuntimeError(f"{jax.default_backend()}'s compiler reports no memory analysis for the step")
        # XLA's own peak where the backend reports it (a TPU's does), else what `trainer --hbm`
        # adds up (arguments + outputs - aliased + temporaries, which double-counts on a TPU).
        xla_bytes = getattr(ma, "peak_memory_in_bytes", 0) or (
            ma.argument_size_in_bytes
            + ma.output_size_in_bytes
            - ma.alias_size_in_bytes
            + ma.temp_size_in_bytes
        )
        compile_s = time.perf_counter() - t0
        if max_bytes and xla_bytes > max_bytes:
            raise OverHBM(f"XLA's peak {xla_bytes / GIB:.2f} GiB > {max_bytes / GIB:.2f} GiB")
        state = init_state(cfg, mesh, abstract)
        state, m = compiled(state, tokens, stop)
        jax.block_until_ready(m)
        state, m = compiled(state, tokens, stop)  # untimed: the first calls after a compile run slower
        jax.block_until_ready(m)
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            state, m = compiled(state, tokens, stop)
            jax.block_until_ready(m)
            times.append(time.perf_counter() - start)
        loss = float(jax.device_get(m["scalars"])[0])
        del state, m
    step_s = sorted(times)[len(times) // 2]
    fpt = flops_per_token(cfg)
    peak = (device_peak_tflops(device.device_kind) or 0.0) * 1e12  # per JAX device
    achieved = fpt * batch * seq / step_s
    total, active = param_counts(cfg)
    hbm = device.memory_stats() or {}
    # A TPU's runtime reserves an executable's temporaries apart from the buffers it allocates: the
    # step's peak is the peak in use (the state, the batch) plus the peak reserved (the temporaries).
    peak_bytes = hbm.get("peak_bytes_in_use", 0) + hbm.get("peak_bytes_reserved", 0)
    planner = _planner_estimate(cfg)
    return {
        "memory_stats": hbm,
        "memory_analysis": {k: int(getattr(ma, k)) for k in dir(ma) if k.endswith("_in_bytes")},
        "config": name,
        "sets": sets,
        "attention": str(resolve(cfg.model.attention, seq, cfg.model.head_dim)),
        "device_kind": device.device_kind,
        "layers": cfg.model.n_layers,
        "vocab_size": cfg.model.vocab_size,
        "params": total,
        "active_params": active,
        "global_batch": batch,
        "seq_len": seq,
        "compile_s": round(compile_s, 1),
        "step_s": round(step_s, 4),
        "step_s_all": [round(t, 4) for t in times],
        "tokens_per_s": round(batch * seq / step_s, 1),
        "model_tflops_per_s": round(achieved / 1e12, 1),
        "peak_bf16_tflops": peak / 1e12 if peak else None,
        "mfu": round(achieved / peak, 4) if peak else None,
        "peak_hbm_gib": round(peak_bytes / GIB, 2),
        "peak_in_use_gib": round(hbm.get("peak_bytes_in_use", 0) / GIB, 2),
        "peak_reserved_gib": round(hbm.get("peak_bytes_reserved", 0) / GIB, 2),
        "xla_peak_gib": round(xla_bytes / GIB, 2),
        "planner_estimate_gib": round(planner / GIB, 2),
        "planner_over_peak": round(planner / peak_bytes, 3) if peak_bytes else None,
        "planner_over_xla": round(planner / xla_bytes, 3) if xla_bytes else None,
        "loss_last": round(loss, 4),
        "_cfg": cfg,
    }


EVERY_POLICY = "auto"  # --remat's word for every model.remat policy


def remat_candidates(given: str, parser: Parser) -> list[str]:
    """``--remat``: auto (every policy), one policy, or several comma-separated; an unknown one is
    a usage error (one line, exit 2)."""
    from trainer.config import Remat

    kinds = list(Remat) if given == EVERY_POLICY else [k.strip() for k in given.split(",") if k.strip()]
    if not kinds or any(k not in tuple(Remat) for k in kinds):
        parser.error(f"--remat {given}: expected auto or some of {', '.join(Remat)}")
    return [str(k) for k in kinds]


def choose_remat(
    st: dict, kinds: list[str], sets: list[str], steps: int, max_bytes: float, guarded, result: dict
) -> dict:
    """Part 2's step under each ``model.remat`` policy of ``kinds`` (``st``: under the config's own):
    the ones whose compiled peak fits ``max_bytes``, timed; the fastest is returned (and kept in
    ``result["remat"]`` beside the others' figures)."""
    own = st["_cfg"].model.remat
    runs = {own: st}
    for kind in kinds:
        if kind != own:
            runs[kind] = guarded(
                f"remat_{kind}",
                lambda kind=kind: step_time("olmo-7b", [*sets, f"model.remat={kind}"], steps, max_bytes),
            )
    table = {}
    for kind, run in runs.items():
        error = result.pop(f"remat_{kind}_error", None)
        table[kind] = (
            {k: run[k] for k in ("step_s", "mfu", "xla_peak_gib", "peak_hbm_gib")}
            if run
            else {"error": error}
        )
        print(f"  remat {kind}: {table[kind]}", flush=True)
    best = min((k for k, r in runs.items() if r), key=lambda k: runs[k]["step_s"])
    result["remat"], result["remat_chosen"] = table, str(best)
    print(f"  remat chosen: {best} (the fastest that fits)", flush=True)
    return runs[best]


def reference_step(cfg, steps: int) -> dict:
    """A plain-JAX train step of ``cfg``'s dense shape: parameters in a dict, the layers under
    ``lax.scan`` with ``jax.checkpoint`` and the trainer's policy of ``model.remat`` over the same
    named activations (trainer/model/remat.py), the same attention call, the same chunked loss
    with its EOS mask and logit z-loss, optax's clipped AdamW with the trainer's schedule and decay
    mask; no flax, no mesh, no metrics beyond the loss."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from trainer.config import Remat, layer_windows
    from trainer.model import remat
    from trainer.model.attention import attend, resolve
    from trainer.model.transformer import rope, segment_ids, token_losses
    from trainer.step import optimizer

    m = cfg.model
    d, h, kv, hd, f, v, n = (
        m.d_model,
        m.n_heads,
        m.kv_heads or m.n_heads,
        m.head_dim,
        m.d_ff,
        m.vocab_size,
        m.n_layers,
    )
    batch, seq, dt = cfg.train.global_batch, m.seq_len, jnp.dtype(m.dtype)
    kind, windows = resolve(m.attention, m.seq_len, m.head_dim), layer_windows(m)
    distinct = tuple(sorted(set(windows)))
    eos = cfg.data.eos_id

    def init(key):
        ks = iter(jax.random.split(key, 16))

        def normal(shape):
            return m.init_std * jax.random.normal(next(ks), shape, jnp.float32)

        def ones(shape):
            return {"scale": jnp.ones(shape, jnp.float32)}

        layers = {
            "wq": normal((n, d, h, hd)), "wk": normal((n, d, kv, hd)), "wv": normal((n, d, kv, hd)),
            "wo": normal((n, h, hd, d)), "q_norm": ones((n, h * hd)), "k_norm": ones((n, kv * hd)),
            "attn_norm": ones((n, d)), "ffn_norm": ones((n, d)),
            "w_gate": normal((n, d, f)), "w_up": normal((n, d, f)), "w_down": normal((n, f, d)),
        }  # fmt: skip
        return {
            "embed": normal((v, d)),
            "layers": layers,
            "final_norm": ones((d,)),
            "lm_head": normal((d, v)),
        }

    def norm(x, p):
        x32 = x.astype(jnp.float32)
        return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6) * p["scale"]).astype(
            x.dtype
        )

    def loss(params, tokens):
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        x = params["embed"][inputs].astype(dt)
        seg = segment_ids(inputs, eos) if m.document_attention and eos >= 0 else None

        def layer(x, pw):
            p, w = pw
            q = jnp.einsum("btd,dhk->bthk", x, p["wq"].astype(dt))
            k = jnp.einsum("btd,dhk->bthk", x, p["wk"].astype(dt))
            val = jnp.einsum("btd,dhk->bthk", x, p["wv"].astype(dt))
            if m.qk_norm:
                q = norm(q.reshape(*q.shape[:2], -1), p["q_norm"]).reshape(q.shape)
                k = norm(k.reshape(*k.shape[:2], -1), p["k_norm"]).reshape(k.shape)
            q, k = rope(q, m.rope_theta), rope(k, m.rope_theta)
            q, k, val = (remat.name(a, remat.QKV) for a in (q, k, val))
            o = attend(q, k, val, kind=kind, block=m.attention_block, kernel_block=m.splash_block,
                       segments=seg, window=w if any(windows) else None, windows=distinct)  # fmt: skip
            o = remat.name(jnp.einsum("bthk,hkd->btd", remat.name(o, remat.ATTENTION), p["wo"].astype(dt)),
                           remat.ATTENTION_OUT)  # fmt: skip
            x = x + norm(o, p["attn_norm"])
            gate = remat.name(x @ p["w_gate"].astype(dt), remat.MLP_IN)
            up = remat.name(x @ p["w_up"].astype(dt), remat.MLP_IN)
            y = remat.name((jax.nn.silu(gate) * up) @ p["w_down"].astype(dt), remat.MLP_OUT)
            return x + norm(y, p["ffn_norm"]), None

        if m.remat != Remat.NONE:  # the trainer's policy over the same names
            layer = jax.checkpoint(layer, policy=remat.policy(m.remat))
        x, _ = jax.lax.scan(layer, x, (params["layers"], jnp.asarray(windows, jnp.int32)))
        x = norm(x, params["final_norm"])
        weights = (inputs != eos).astype(jnp.float32)
        ce, z = token_losses(x, params["lm_head"].astype(dt), targets, weights, m.loss_chunk)
        count = jnp.maximum(jnp.sum(weights), 1.0)
        return (ce + m.logit_z_loss * z) / count

    tx = optimizer(cfg)

    def step(params, opt_state, tokens):
        value, grads = jax.value_and_grad(loss)(params, tokens)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    step = jax.jit(step, donate_argnums=(0, 1))
    rng = np.random.default_rng(0)
    tokens_np = rng.integers(0, v, size=(batch, seq + 1), dtype=np.int32)
    if eos >= 0:
        tokens_np[rng.random(tokens_np.shape) < 8 / seq] = eos
    tokens = jnp.asarray(tokens_np)
    params = jax.jit(init)(jax.random.key(0))
    opt_state = jax.jit(tx.init)(params)
    t0 = time.perf_counter()
    for _ in range(2):  # the compile, and the first call after it
        params, opt_state, value = step(params, opt_state, tokens)
        jax.block_until_ready(value)
    first_s = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        params, opt_state, value = step(params, opt_state, tokens)
        jax.block_until_ready(value)
        times.append(time.perf_counter() - start)
    del params, opt_state
    return {
        "step_s": round(sorted(times)[len(times) // 2], 4),
        "step_s_all": [round(t, 4) for t in times],
        "compile_and_first_steps_s": round(first_s, 1),
        "loss_last": round(float(value), 4),
    }


def attention_agreement(quick: bool) -> list[dict]:
    """The splash kernel against the blocked path at olmo-7b's head shape in bf16 (toy on --quick):
    max |diff| of the output and of dq, dk, dv for one cotangent, and each path's forward+backward."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from trainer.config import AttentionKind
    from trainer.model.attention import attend
    from trainer.model.transformer import segment_ids

    b, t, h, hd = (1, 256, 4, 64) if quick else (1, 8192, 32, 128)
    window = t // 2  # olmo-7b: 4,096 of 8,192
    rng = np.random.default_rng(0)
    q, k, v, cot = (jnp.asarray(rng.normal(size=(b, t, h, hd)), jnp.bfloat16) for _ in range(4))
    eos = np.zeros((b, t), np.int32)
    eos[:, rng.choice(t, 7, replace=False)] = 1  # 8 documents
    seg = segment_ids(jnp.asarray(eos), 1)
    rows = []
    for label, segments, w in (("causal", None, 0), (f"window {window}, 8 documents", seg, window)):
        win = jnp.int32(w) if w else None
        results = {}
        paths = [
            (AttentionKind.SPLASH, {"windows": (w,)}),
            (AttentionKind.BLOCKED, {"block": 64 if quick else 512}),
        ]
        for kind, kw in paths:
            t0 = time.perf_counter()

            def fwd_bwd(q, k, v, kind=kind, kw=kw, segments=segments, win=win):
                out, vjp = jax.vjp(
                    lambda q, k, v: attend(q, k, v, kind=kind, segments=segments, window=win, **kw), q, k, v
                )
                return out, vjp(cot)

            fn = jax.jit(fwd_bwd)
            res = jax.block_until_ready(fn(q, k, v))
            first = time.perf_counter() - t0
            times = []
            for _ in range(3):
                start = time.perf_counter()
                jax.block_until_ready(fn(q, k, v))
                times.append(time.perf_counter() - start)
            results[kind] = (res, sorted(times)[1])
            print(f"    {label}, {kind}: compile and first call {first:.1f} s, "
                  f"forward+backward {sorted(times)[1]:.4f} s", flush=True)  # fmt: skip
        (s_out, s_grads), s_time = results[AttentionKind.SPLASH]
        (b_out, b_grads), b_time = results[AttentionKind.BLOCKED]
        diffs = {}
        for name, x, y in zip(("out", "dq", "dk", "dv"), (s_out, *s_grads), (b_out, *b_grads), strict=True):
            x32, y32 = np.asarray(x, np.float32), np.asarray(y, np.float32)
            diffs[name] = {"max_abs": float(np.abs(x32 - y32).max()), "max_ref": float(np.abs(y32).max())}
        rows.append({"case": label, "shape": [b, t, h, hd], "diffs": diffs, "splash_fwd_bwd_s": round(s_time, 4),
                     "blocked_fwd_bwd_s": round(b_time, 4)})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m bench.accelerator", description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=0, help="olmo-7b depth (default: what fits the device)")
    parser.add_argument("--batch", type=int, default=0, help="sequences per step (default: what fits)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (default 5)")
    parser.add_argument("--quick", action="store_true", help="toy shapes for parts 2-5 (a CPU dry run)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--transports-only", action="store_true", help="part 1 only")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: reference,attention,moe")
    parser.add_argument(
        "--remat",
        default=EVERY_POLICY,
        help="olmo-7b's model.remat: one, several comma-separated or auto (default: every policy);"
        " of several, the fastest that fits is kept",
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="olmo-7b override (part 2)"
    )
    parser.add_argument(
        "--fit",
        type=float,
        default=FIT,
        help=f"the share of the device's memory a remat policy's XLA peak may take (default {FIT})",
    )
    args = parser.parse_args(argv)
    if not 0 < args.fit <= 1:
        parser.error(f"--fit {args.fit}: a share of the device's memory, in (0, 1]")
    parser.at_least(args, 1, "steps")
    parser.at_least(args, 0, "layers", "batch")  # 0: what fits the device
    skip = set(filter(None, args.skip.split(",")))
    if unknown := skip - {"reference", "attention", "moe"}:
        parser.error(f"--skip {args.skip}: no part {', '.join(sorted(unknown))} (reference, attention, moe)")
    candidates = remat_candidates(args.remat, parser)

    import jax

    device = jax.devices()[0]
    limit = (device.memory_stats() or {}).get("bytes_limit", 0)
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, devices {jax.devices()}; "
          f"{device.device_kind}: {limit / GIB:.2f} GiB", flush=True)  # fmt: skip
    rows = transports()
    print("\n1. ragged vs dense MoE transport (float32; outputs and gradients; tolerance 1e-5)")
    for r in rows:
        ep = f"EP {r['expert_parallel']}" + (" (all the devices allow)" if r["expert_parallel"] < 4 else "")
        if "error" in r:
            print(
                f"  {r['platform']:4s} {r['devices']} devices, {ep}, factor {r['factor']:5}: not run: {r['error']}"
            )
        else:
            print(f"  {r['platform']:4s} {r['devices']} devices, {ep}, factor "
                  f"{r['factor']:5}: rows dropped {r['rows_dropped']:4d}, max |diff| {r['max_abs_diff']:.2e}, "
                  f"kept rows equal {r['kept_rows_equal']}: {'OK' if r['ok'] else 'FAIL'}", flush=True)  # fmt: skip
    result: dict = {
        "jax": jax.__version__,
        "device_kind": device.device_kind,
        "bytes_limit": limit,
        "transports": rows,
    }
    if args.transports_only:
        print(json.dumps(result)) if args.json else None
        return 0 if all(r.get("ok") or "error" in r for r in rows) else 1
    limit = limit or 16 * GIB  # a CPU reports no limit: size as for 16 GiB

    def guarded(part: str, fn):
        try:
            return fn()
        except Exception as err:  # a part that fails is reported, and the others still run
            msg = (
                f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300] if str(err).strip() else ''}"
            )
            result[f"{part}_error"] = msg
            print(f"  {part} not measured: {msg}", flush=True)
            return None

    sets, why = pick("olmo-7b", limit, args.layers, args.batch, args.quick)
    sets = [*sets, *args.set, *([f"model.remat={candidates[0]}"] if len(candidates) == 1 else [])]
    print(f"\n2. olmo-7b {' '.join(sets)}\n  chosen: {why}", flush=True)
    st = guarded("step", lambda: step_time("olmo-7b", sets, args.steps))
    while st is None and "RESOURCE_EXHAUSTED" in result.get("step_error", "") and not args.layers:
        # The estimate let through a shape that XLA cannot fit: one layer less, and say so.
        layers = int(next(x for x in sets if x.startswith("model.n_layers=")).split("=")[1])
        if layers == 1:
            break
        sets = [x for x in sets if not x.startswith(("model.n_layers=", "model.dense_layers="))]
        sets += _depth("olmo-7b", layers - 1)
        print(f"  retrying at {layers - 1} layers: {sets}", flush=True)
        result["step_retried"] = result.pop("step_error")
        st = guarded("step", lambda sets=sets: step_time("olmo-7b", sets, args.steps))
    if st and len(candidates) > 1:
        st = choose_remat(st, candidates, sets, args.steps, args.fit * limit, guarded, result)
    if st:
        cfg = st.pop("_cfg")
        result["step"] = st
        result |= {k: st[k] for k in ("step_s", "tokens_per_s", "mfu", "peak_hbm_gib")}
        print(f"  {st['layers']} layers, vocabulary {st['vocab_size']:,} ({_count(st['params'])} parameters), "
              f"{st['global_batch']} × {st['seq_len']} tokens, attention {st['attention']}, on {st['device_kind']}:\n"
              f"  compile {st['compile_s']} s; step {st['step_s']} s (median of {len(st['step_s_all'])}: "
              f"{st['step_s_all']}); {st['tokens_per_s']:.0f} tokens/s; {st['model_tflops_per_s']} TFLOP/s; "
              f"MFU {st['mfu']} of {st['peak_bf16_tflops']} TFLOP/s; loss {st['loss_last']}\n"
              f"  HBM: peak {st['peak_hbm_gib']} GiB (in use {st['peak_in_use_gib']} + reserved for the step's "
              f"temporaries {st['peak_reserved_gib']}); planner's estimate {st['planner_estimate_gib']} GiB "
              f"(launcher.core.hbm: {st['planner_over_peak']} of the peak); XLA's peak for the step "
              f"{st['xla_peak_gib']} GiB", flush=True)  # fmt: skip
        if "reference" not in skip:
            print("\n3. plain-JAX reference step, same shape and attention:", flush=True)
            ref = guarded("reference", lambda: reference_step(cfg, args.steps))
            if ref:
                result["reference"] = ref
                result["reference_step_s"] = ref["step_s"]
                result["step_over_reference"] = round(st["step_s"] / ref["step_s"], 3)
                print(f"  step {ref['step_s']} s (median of {len(ref['step_s_all'])}: {ref['step_s_all']}); "
                      f"loss {ref['loss_last']}; trainer / reference = {result['step_over_reference']}", flush=True)  # fmt: skip
    if "moe" not in skip:
        # At most 2 sequences: the routed rows' buffers (top-8 of 64 experts) are not in the allowance.
        moe_sets, moe_why = pick("olmoe-1b", limit, 0, 0, args.quick, max_layers=2, batches=(1, 2))
        print(f"\n5. olmoe-1b {' '.join(moe_sets)}\n  chosen: {moe_why}", flush=True)
        result["moe"] = {}
        for kind in ("ragged", "dense"):
            mo = guarded(
                f"moe_{kind}",
                lambda kind=kind: step_time("olmoe-1b", [*moe_sets, f"moe.expert_matmul={kind}"], args.steps),
            )
            if mo:
                mo.pop("_cfg")
                result["moe"][kind] = mo
                print(f"  expert matmul {kind}: step {mo['step_s']} s; {mo['tokens_per_s']:.0f} tokens/s; "
                      f"MFU {mo['mfu']} ({_count(mo['active_params'])} active of {_count(mo['params'])}); "
                      f"XLA's peak {mo['xla_peak_gib']} GiB, planner's estimate {mo['planner_estimate_gib']} GiB "
                      f"(the process's peak is part 2's)", flush=True)  # fmt: skip
    if "attention" not in skip:
        print(
            "\n4. splash kernel vs blocked attention (bf16; max |diff| against the blocked path's max |value|):",
            flush=True,
        )
        att = guarded("attention", lambda: attention_agreement(args.quick))
        if att:
            result["attention"] = att
            for r in att:
                d = "; ".join(f"{k} {v['max_abs']:.3g} of {v['max_ref']:.3g}" for k, v in r["diffs"].items())
                print(f"  {r['shape']} {r['case']}: {d}; forward+backward splash {r['splash_fwd_bwd_s']} s, "
                      f"blocked {r['blocked_fwd_bwd_s']} s", flush=True)  # fmt: skip
    if args.json:
        print(json.dumps(result, default=str))
    return 0 if all(r.get("ok") or "error" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
