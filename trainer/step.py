"""Train state and the jitted train step: A micro-batches under ``lax.scan``, then one AdamW update.

The state is ``nnx.state((model, optimizer))``: parameters, Adam moments and the step counter, all
carrying their partitioning, so the same abstract state restores a checkpoint onto any mesh. Outside
this module it travels as ``plain(state)``: nested dicts keyed by each leaf's path, which is what a
checkpoint holds. The compiled step takes and returns that form, so a resumed trainer that loads
its executable (trainer/state/compile_cache.py) runs it without importing flax or optax.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jax.tree_util import DictKey, GetAttrKey, SequenceKey

from trainer.config import Config, decay_steps, wsd_decay_start
from trainer.model.mesh import batch_sharding, device_sharding, logical_rules, replicated
from trainer.model.transformer import Transformer
from trainer.state import compile_cache


def schedule(cfg: Config) -> optax.Schedule:
    """The learning rate of step s (0-based): a warm-up, then cosine to lr · min_lr_ratio at the
    decay steps, or WSD: the peak until ``wsd_decay_start``, then linear to the same floor."""
    o = cfg.optim
    total = max(decay_steps(cfg), o.warmup_steps + 1)
    floor = o.lr * o.min_lr_ratio
    if o.schedule == "cosine" and not o.warmup_nonzero_start:  # the configs before these keys: bitwise
        return optax.warmup_cosine_decay_schedule(0.0, o.lr, o.warmup_steps, total, floor)
    warm = o.warmup_steps
    # optax's warm-up trains step 0 at lr 0 (a wasted update); this one reaches the peak at step warm - 1.
    first = 1 if o.warmup_nonzero_start else 0

    def warmup(step: jax.Array) -> jax.Array:
        return o.lr * jnp.minimum((step + first) / max(warm, 1), 1.0)

    if o.schedule == "cosine":
        decay = optax.cosine_decay_schedule(o.lr, total - warm, o.min_lr_ratio)
        return optax.join_schedules([warmup, decay], [warm])
    start = wsd_decay_start(cfg)

    def wsd(step: jax.Array) -> jax.Array:
        # nnx.Optimizer counts steps in uint32: step - start must not wrap around before the decay.
        step = jnp.asarray(step).astype(jnp.float32)
        into = jnp.clip((step - start) / max(total - start, 1), 0.0, 1.0)
        return jnp.where(step < warm, warmup(step), o.lr - (o.lr - floor) * into)

    return wsd


def _path_names(path: tuple) -> list[str]:
    return [str(_name(k)) for k in path]


def decay_mask(cfg: Config) -> Callable[[Any], Any]:
    """Which parameters AdamW decays, by name, as OLMo-core's AdamW options: every matrix but the
    embedding (``optim.decay_embeddings``), never a norm scale or a bias (``optim.decay_norm_and_bias``).

    By name, not by rank: scanned layers store their norm scales as [layers, d], so ``ndim >= 2``
    decayed them."""
    o = cfg.optim

    def decayed(path: tuple, _: Any) -> bool:
        names = _path_names(path)
        if names[0] == "embed":
            return o.decay_embeddings
        if names[-1] in ("scale", "bias") or (names[-1] == "value" and names[-2] in ("scale", "bias")):
            return o.decay_norm_and_bias
        return True

    return lambda params: jax.tree_util.tree_map_with_path(decayed, params)


def optimizer(cfg: Config) -> optax.GradientTransformation:
    o = cfg.optim
    return optax.chain(
        optax.clip_by_global_norm(o.clip_norm),
        optax.adamw(
            schedule(cfg), b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay, mask=decay_mask(cfg)
        ),
    )


def _build(cfg: Config, key: jax.Array | None = None) -> tuple[Transformer, nnx.Optimizer]:
    """The model and its optimizer, initialised from ``key`` (default: ``train.seed``'s)."""
    model = Transformer(cfg, rngs=nnx.Rngs(cfg.train.seed if key is None else key))
    return model, nnx.Optimizer(model, optimizer(cfg), wrt=nnx.Param)


def abstract_state(cfg: Config, mesh: Mesh) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, abstract state) whose leaves carry their NamedSharding on ``mesh``.

    Call under ``jax.set_mesh(mesh)``. Nothing is allocated: this is also the restore target that
    puts a checkpoint written on any other mesh onto this one.
    """
    with nnx.logical_axis_rules(logical_rules(cfg.mesh)):
        graphdef, state = nnx.split(nnx.eval_shape(lambda: _build(cfg)))
        shardings = nnx.get_named_sharding(state, mesh)
    state = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=_fitted(s, a.shape)), state, shardings
    )
    return graphdef, state


def _fitted(sharding: NamedSharding, shape: tuple[int, ...]) -> NamedSharding:
    """The rule's sharding, less the mesh axes that do not divide their dimension: that dimension
    stays whole on them (a 64-wide embedding on 3 devices), as XLA cannot split it unevenly."""
    entries = []
    for dim, entry in zip(
        shape, tuple(sharding.spec) + (None,) * (len(shape) - len(sharding.spec)), strict=True
    ):
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        size = 1
        for name in names:
            size *= sharding.mesh.shape[name]
        entries.append(entry if dim % size == 0 else None)
    return NamedSharding(sharding.mesh, P(*entries))


def shardings_of(state: Any) -> Any:
    return jax.tree.map(lambda a: a.sharding, state)


def _name(key: Any) -> Any:
    if isinstance(key, DictKey):
        return key.key
    if isinstance(key, GetAttrKey):
        return key.name  # nnx's Variable: "value", as Orbax names it on disk
    if isinstance(key, SequenceKey):
        return key.idx
    raise TypeError(f"unexpected pytree key {key!r}")


def plain(tree: Any) -> dict:
    """``tree`` (a state, or its abstract values or shardings) as nested dicts keyed by each leaf's
    path: the leaves, paths and so the checkpoint files are nnx's, the containers plain."""
    out: dict = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        node = out
        for key in path[:-1]:
            node = node.setdefault(_name(key), {})
        node[_name(path[-1])] = leaf
    return out


def from_plain(template: nnx.State, values: dict) -> nnx.State:
    """The nnx state of ``template``'s structure holding ``values`` (``plain`` of such a state)."""
    paths, treedef = jax.tree_util.tree_flatten_with_path(template)

    def at(path: tuple) -> Any:
        node: Any = values
        for key in path:
            node = node[_name(key)]
        return node

    return jax.tree_util.tree_unflatten(treedef, [at(path) for path, _ in paths])


def lower_initial_state(cfg: Config, abstract: nnx.State) -> jax.stages.Lowered:
    """The initializer, traced and lowered: it takes the seed (``train.seed`` as a uint32 scalar)
    and returns the initial state (``plain``) directly in its shardings (no host-side full
    copy). Call under the mesh.

    The seed is an argument, not a constant of the program: with a constant key every random
    number of the state is a constant expression, which XLA's TPU compiler folds on the host,
    element by element (most of a fresh start there, docs/measurements.md). The values are the
    same: ``jax.random.key`` of a uint32 seed is that of the int."""

    def init(seed: jax.Array) -> dict:
        return plain(nnx.state(_build(cfg, jax.random.key(seed))))

    with nnx.logical_axis_rules(logical_rules(cfg.mesh)):
        return jax.jit(init, in_shardings=P(), out_shardings=plain(shardings_of(abstract))).lower(
            jax.ShapeDtypeStruct((), jnp.uint32)
        )


def init_state(cfg: Config, mesh: Mesh, abstract: nnx.State) -> dict:
    """Materialise the initial state (``plain``); the loop goes through the run's compile cache
    instead (trainer.state.compile_cache.initial_state)."""
    with jax.set_mesh(mesh):
        lowered = lower_initial_state(cfg, abstract)
        if jax.default_backend() == "cpu":
            return lowered.compile()(np.uint32(cfg.train.seed))
        return compile_cache.compile_with(lowered, compile_cache.INITIALIZER_OPTIONS)(
            np.uint32(cfg.train.seed)
        )


def make_train_step(
    cfg: Config, graphdef: nnx.GraphDef, mesh: Mesh, abstract: nnx.State
) -> jax.stages.Wrapped:
    """jit(state, tokens [A, GB/A, T+1], stop [devices]) -> (state, metrics), the state ``plain``;
    ``metrics["scalars"]`` in the order of trainer.loop.SCALARS.

    Gradients take the parameters' shardings (FSDP: reduce-scattered, never whole on a device).

    ``stop`` carries each process's SIGTERM flag; its maximum comes back in the metrics, so every
    process learns about a preemption at the same step without an extra collective.
    """
    lb_w, z_w = cfg.moe.load_balance_weight, cfg.moe.z_loss_weight
    logit_z_w = cfg.model.logit_z_loss
    eos = cfg.data.eos_id
    # With document boundaries the micro-batches count different numbers of targets: each one's
    # loss is its token sum over the whole step's count, and the step adds them (no mean of means),
    # so that any micro-batching of the global batch trains exactly the one-batch step. Without
    # them every micro-batch counts the same and the mean of means is that; kept for bitwise results.
    token_sum = eos >= 0
    lr_at = schedule(cfg)
    abstract_model, _ = nnx.merge(graphdef, abstract)
    param_shardings = shardings_of(nnx.state(abstract_model))

    def loss_fn(
        params: nnx.State, gdef: nnx.GraphDef, tokens: jax.Array, count: jax.Array | None, accum: int
    ) -> tuple[jax.Array, dict]:
        ce, aux = nnx.merge(gdef, params).loss(tokens[:, :-1], tokens[:, 1:])
        if "lb_loss" in aux:  # each stacked over the MoE layers: [L, groups], [L, B], [L, devices, 3]
            lb, z = jnp.mean(aux["lb_loss"]), jnp.mean(aux["z_loss"])
            layers = aux["stats"]
        else:
            lb = z = jnp.zeros(())
            layers = jnp.zeros((0, 1, 3))
        logit_z = jnp.zeros(())
        if count is not None:  # this micro-batch's share of the step's means
            ce, lb, z = aux["loss_sum"] / count, lb / accum, z / accum
            if logit_z_w:
                logit_z = aux["logit_z_sum"] / count
        elif logit_z_w:
            logit_z = aux["logit_z_sum"] / aux["loss_tokens"]
        total = ce + lb_w * lb + z_w * z
        if logit_z_w:
            total = total + logit_z_w * logit_z
        return total, {"ce": ce, "lb": lb, "z": z, "logit_z": logit_z, "layers": layers}

    def step(state: dict, tokens: jax.Array, stop: jax.Array) -> tuple[dict, dict]:
        model, opt = nnx.merge(graphdef, from_plain(abstract, state))
        gdef, params = nnx.split(model)
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        accum = tokens.shape[0]
        # The targets that count in the whole global batch (every micro-batch, every device).
        count = jnp.maximum(jnp.sum(tokens[..., :-1] != eos).astype(jnp.float32), 1.0) if token_sum else None

        def micro(acc: nnx.State, mb: jax.Array) -> tuple[nnx.State, tuple]:
            (total, parts), grads = grad_fn(params, gdef, mb, count, accum)
            acc = jax.lax.with_sharding_constraint(jax.tree.map(jnp.add, acc, grads), param_shardings)
            return acc, (total, parts)

        zeros = jax.lax.with_sharding_constraint(jax.tree.map(jnp.zeros_like, params), param_shardings)
        grads, (total, parts) = jax.lax.scan(micro, zeros, tokens)
        # Token sums add up to the step's means; means of equal micro-batches are averaged.
        reduce = jnp.sum if token_sum else jnp.mean
        if not token_sum:
            grads = jax.tree.map(lambda g: g / accum, grads)
        lr = lr_at(opt.step[...])
        opt.update(model, grads)
        layers = parts["layers"]  # [A, L, devices, 3]
        grad_norm = optax.tree.norm(grads)
        # The flag's cross-device max must not be independent of the micro-batch loop: XLA:CPU can
        # run a top-level collective and the loop's collectives in different orders on different
        # devices and deadlock. Adding (grad_norm < 0), always 0, orders it after the loop.
        stop_any = jnp.max(stop + (grad_norm < 0).astype(stop.dtype))
        scalars = [
            reduce(parts["ce"]),
            reduce(total),
            reduce(parts["lb"]),
            reduce(parts["z"]),
            grad_norm,
            lr,
            reduce(parts["logit_z"]),
            stop_any,
        ]
        metrics = {  # two arrays, not a dozen: one device-to-host transfer each per step
            "scalars": jnp.stack([jnp.asarray(x, jnp.float32) for x in scalars]),
            "layers": jnp.stack(
                [layers[..., 0].sum((0, 2)), layers[..., 1].sum((0, 2)), layers[..., 2].max((0, 2))], axis=-1
            ),
        }
        return plain(nnx.state((model, opt))), metrics

    rep, state_shardings = replicated(mesh), plain(shardings_of(abstract))
    return jax.jit(
        step,
        in_shardings=(state_shardings, batch_sharding(mesh), device_sharding(mesh)),
        out_shardings=(state_shardings, rep),
        donate_argnums=0,
    )
