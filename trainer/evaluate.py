"""Held-out evaluation: the loss of each ``eval.sources`` source on its fixed batches.

Called by trainer/loop.py after every ``eval.interval`` steps and after the last. Each source's
batches are the same every time and on every shape: batch b is positions ``[b·GB, (b+1)·GB)`` of
the source's own fixed order (trainer.data.eval_order, seeded by the source's name), split over
micro-batches and processes as a training step is, so the eval loss at a checkpoint is a function
of the parameters alone (up to the reduction order of the devices' sums). The loss is the model's
own (``Transformer.loss``: mean cross-entropy over a micro-batch) averaged over the equal-sized
micro-batches and batches, which is the mean over every eval token; perplexity is its exp.

The eval step reads the state and never donates it, so turning evaluation on changes no training
step. Its time is reported apart (``perf/eval_seconds``) and kept out of the next step's time.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from trainer import data
from trainer.config import Config

EVAL_TIME = "perf/eval_seconds"


def make_eval_step(cfg: Config, graphdef: Any, mesh: Any, abstract: Any) -> Any:
    """jit(state, tokens [A, GB/A, T+1]) -> the mean loss over the micro-batches (replicated)."""
    from flax import nnx

    from trainer.mesh import batch_sharding, replicated
    from trainer.step import from_plain, plain, shardings_of

    def step(state: dict, tokens: jax.Array) -> jax.Array:
        def micro(total: jax.Array, mb: jax.Array) -> tuple[jax.Array, None]:
            # Merged inside the loop body: nnx refuses variables made at the outer trace level.
            model, _ = nnx.merge(graphdef, from_plain(abstract, state))
            ce, _ = model.loss(mb[:, :-1], mb[:, 1:])
            return total + ce.astype(jnp.float32), None

        total, _ = jax.lax.scan(micro, jnp.zeros((), jnp.float32), tokens)
        return total / tokens.shape[0]

    return jax.jit(
        step,
        in_shardings=(plain(shardings_of(abstract)), batch_sharding(mesh)),
        out_shardings=replicated(mesh),
    )


@dataclass
class Evaluator:
    """The eval sources of one incarnation and its compiled eval step."""

    cfg: Config
    parts: list[data.Part]
    orders: list[Any]
    layout: data.Layout
    tokens_sharding: Any
    global_shape: tuple[int, int, int]
    step: Any = None  # compiled by `compile`

    @classmethod
    def build(
        cls, cfg: Config, layout: data.Layout, tokens_sharding: Any, global_shape: tuple
    ) -> Evaluator | None:
        if not cfg.eval.sources:
            return None
        parts = data.eval_sources(cfg.eval.sources, cfg.data, cfg.model.vocab_size, cfg.model.seq_len)
        orders = [data.eval_order(p.name, len(p.source)) for p in parts]
        return cls(cfg, parts, orders, layout, tokens_sharding, global_shape)

    def due(self, n: int) -> bool:
        interval = self.cfg.eval.interval
        return n == self.cfg.train.steps or bool(interval and n % interval == 0)

    def compile(self, model: Any, state: Any) -> float:
        """Trace (flax) and compile the eval step; the seconds it took."""
        t0 = time.perf_counter()
        graphdef, abstract = model.traced
        spec = jax.ShapeDtypeStruct(self.global_shape, np.int32, sharding=self.tokens_sharding)
        fn = make_eval_step(self.cfg, graphdef, model.mesh, abstract)
        self.step = fn.lower(state, spec).compile()
        return time.perf_counter() - t0

    def __call__(self, state: Any) -> dict[str, float]:
        """``eval/<name>/loss`` and ``/perplexity`` for every source, and ``perf/eval_seconds``."""
        t0 = time.perf_counter()
        out: dict[str, float] = {}
        for part, order in zip(self.parts, self.orders, strict=True):
            losses = []
            for b in range(self.cfg.eval.batches):
                local = data.eval_batch(part.source, order, b, self.layout)
                tokens = jax.make_array_from_process_local_data(
                    self.tokens_sharding, local, self.global_shape
                )
                losses.append(self.step(state, tokens))
            loss = float(np.mean([float(x) for x in jax.device_get(losses)]))
            out[f"eval/{part.name}/loss"] = loss
            out[f"eval/{part.name}/perplexity"] = math.exp(min(loss, 700.0))  # exp overflows past ~709
        out[EVAL_TIME] = time.perf_counter() - t0
        return out
