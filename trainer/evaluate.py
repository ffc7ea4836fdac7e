"""Held-out evaluation: the loss of each ``eval.sources`` source on its fixed batches.

Called by trainer/loop.py after every ``eval.interval`` steps and after the last. Each source's
batches are the same every time and on every shape: batch b is positions ``[b·GB, (b+1)·GB)`` of
the source's own fixed order (trainer.data.pipeline.eval_order, seeded by the source's name), split over
micro-batches and processes as a training step is, so the eval loss at a checkpoint is a function
of the parameters alone (up to the reduction order of the devices' sums). The loss is the model's
own token sum (``Transformer.loss``'s ``loss_sum`` and ``loss_tokens``: with ``data.eos_id`` the
target after an EOS does not count) added over micro-batches and batches and divided once, the mean
over every eval target that counts; perplexity is its exp.

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

from trainer.config import Config
from trainer.data import pipeline

EVAL_TIME = "perf/eval_seconds"


def make_eval_step(cfg: Config, graphdef: Any, mesh: Any, abstract: Any) -> Any:
    """jit(state, tokens [A, GB/A, T+1]) -> [Σ cross entropy, targets that count] over the
    micro-batches (replicated)."""
    from flax import nnx

    from trainer.model.mesh import batch_sharding, replicated
    from trainer.step import from_plain, plain, shardings_of

    def step(state: dict, tokens: jax.Array) -> jax.Array:
        def micro(total: jax.Array, mb: jax.Array) -> tuple[jax.Array, None]:
            # Merged inside the loop body: nnx refuses variables made at the outer trace level.
            model, _ = nnx.merge(graphdef, from_plain(abstract, state))
            _, aux = model.loss(mb[:, :-1], mb[:, 1:])
            sums = jnp.stack([aux["loss_sum"], aux["loss_tokens"]]).astype(jnp.float32)
            return total + sums, None

        total, _ = jax.lax.scan(micro, jnp.zeros((2,), jnp.float32), tokens)
        return total

    return jax.jit(
        step,
        in_shardings=(plain(shardings_of(abstract)), batch_sharding(mesh)),
        out_shardings=replicated(mesh),
    )


@dataclass
class Evaluator:
    """The eval sources of one incarnation and its compiled eval step."""

    cfg: Config
    parts: list[pipeline.Part]
    orders: list[Any]
    layout: pipeline.Layout
    tokens_sharding: Any
    global_shape: tuple[int, int, int]
    step: Any = None  # compiled by `compile`

    @classmethod
    def build(
        cls, cfg: Config, layout: pipeline.Layout, tokens_sharding: Any, global_shape: tuple
    ) -> Evaluator | None:
        if not cfg.eval.sources:
            return None
        parts = pipeline.eval_sources(cfg.eval.sources, cfg.data, cfg.model.vocab_size, cfg.model.seq_len)
        orders = [pipeline.eval_order(p.name, len(p.source)) for p in parts]
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
            sums = []
            for b in range(self.cfg.eval.batches):
                local = pipeline.eval_batch(part.source, order, b, self.layout)
                tokens = jax.make_array_from_process_local_data(
                    self.tokens_sharding, local, self.global_shape
                )
                sums.append(self.step(state, tokens))
            loss_sum, count = np.sum(np.asarray(jax.device_get(sums), np.float64), axis=0)
            loss = float(loss_sum / max(count, 1.0))
            out[f"eval/{part.name}/loss"] = loss
            out[f"eval/{part.name}/perplexity"] = math.exp(min(loss, 700.0))  # exp overflows past ~709
        out[EVAL_TIME] = time.perf_counter() - t0
        return out
