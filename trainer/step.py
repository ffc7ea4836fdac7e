"""Train state and the jitted train step: A micro-batches under ``lax.scan``, then one AdamW update.

The state is ``nnx.state((model, optimizer))``: parameters, Adam moments and the step counter, all
carrying their partitioning, so the same abstract state restores a checkpoint onto any mesh. Outside
this module it travels as ``plain(state)``: nested dicts keyed by each leaf's path, which is what a
checkpoint holds. The compiled step takes and returns that form, so a resumed trainer that loads
its executable (trainer/compile_cache.py) runs it without importing flax or optax.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jax.tree_util import DictKey, GetAttrKey, SequenceKey

from trainer.config import Config, decay_steps
from trainer.mesh import batch_sharding, device_sharding, logical_rules, replicated
from trainer.model import Transformer


def schedule(cfg: Config) -> optax.Schedule:
    o = cfg.optim
    total = max(decay_steps(cfg), o.warmup_steps + 1)
    return optax.warmup_cosine_decay_schedule(0.0, o.lr, o.warmup_steps, total, o.lr * o.min_lr_ratio)


def optimizer(cfg: Config) -> optax.GradientTransformation:
    o = cfg.optim

    def decay_mask(params: Any) -> Any:  # no weight decay on norm scales
        return jax.tree.map(lambda p: p.ndim >= 2, params)

    return optax.chain(
        optax.clip_by_global_norm(o.clip_norm),
        optax.adamw(schedule(cfg), b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay, mask=decay_mask),
    )


def _build(cfg: Config) -> tuple[Transformer, nnx.Optimizer]:
    model = Transformer(cfg, rngs=nnx.Rngs(cfg.train.seed))
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


def init_state(
    cfg: Config,
    mesh: Mesh,
    abstract: nnx.State,
    compile: Callable[[jax.stages.Lowered], jax.stages.Compiled] = lambda lowered: lowered.compile(),
) -> dict:
    """Materialise the initial state (``plain``) directly in its shardings (no host-side full
    copy); ``compile`` turns the lowered initializer into its executable (the loop passes the run's
    compile cache)."""
    with nnx.logical_axis_rules(logical_rules(cfg.mesh)):
        lowered = jax.jit(
            lambda: plain(nnx.state(_build(cfg))), out_shardings=plain(shardings_of(abstract))
        ).lower()
    return compile(lowered)()


def make_train_step(cfg: Config, graphdef: nnx.GraphDef, mesh: Mesh, abstract: nnx.State) -> Callable:
    """jit(state, tokens [A, GB/A, T+1], stop [devices]) -> (state, metrics), the state ``plain``;
    ``metrics["scalars"]`` in the order of trainer.loop.SCALARS.

    Gradients take the parameters' shardings (FSDP: reduce-scattered, never whole on a device).

    ``stop`` carries each process's SIGTERM flag; its maximum comes back in the metrics, so every
    process learns about a preemption at the same step without an extra collective.
    """
    lb_w, z_w = cfg.moe.load_balance_weight, cfg.moe.z_loss_weight
    lr_at = schedule(cfg)
    abstract_model, _ = nnx.merge(graphdef, abstract)
    param_shardings = shardings_of(nnx.state(abstract_model))

    def loss_fn(params: nnx.State, gdef: nnx.GraphDef, tokens: jax.Array) -> tuple[jax.Array, dict]:
        ce, aux = nnx.merge(gdef, params).loss(tokens[:, :-1], tokens[:, 1:])
        if aux:  # each stacked over the MoE layers: [L, groups], [L, B], [L, devices, 3]
            lb, z = jnp.mean(aux["lb_loss"]), jnp.mean(aux["z_loss"])
            layers = aux["stats"]
        else:
            lb = z = jnp.zeros(())
            layers = jnp.zeros((0, 1, 3))
        return ce + lb_w * lb + z_w * z, {"ce": ce, "lb": lb, "z": z, "layers": layers}

    def step(state: dict, tokens: jax.Array, stop: jax.Array) -> tuple[dict, dict]:
        model, opt = nnx.merge(graphdef, from_plain(abstract, state))
        gdef, params = nnx.split(model)
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

        def micro(acc: nnx.State, mb: jax.Array) -> tuple[nnx.State, tuple]:
            (total, parts), grads = grad_fn(params, gdef, mb)
            acc = jax.lax.with_sharding_constraint(jax.tree.map(jnp.add, acc, grads), param_shardings)
            return acc, (total, parts)

        zeros = jax.lax.with_sharding_constraint(jax.tree.map(jnp.zeros_like, params), param_shardings)
        grads, (total, parts) = jax.lax.scan(micro, zeros, tokens)
        grads = jax.tree.map(lambda g: g / tokens.shape[0], grads)
        lr = lr_at(opt.step[...])
        opt.update(model, grads)
        layers = parts["layers"]  # [A, L, devices, 3]
        grad_norm = optax.tree.norm(grads)
        # The flag's cross-device max must not be independent of the micro-batch loop: XLA:CPU can
        # run a top-level collective and the loop's collectives in different orders on different
        # devices and deadlock. Adding (grad_norm < 0), always 0, orders it after the loop.
        stop_any = jnp.max(stop + (grad_norm < 0).astype(stop.dtype))
        scalars = [
            parts["ce"].mean(),
            total.mean(),
            parts["lb"].mean(),
            parts["z"].mean(),
            grad_norm,
            lr,
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
