"""reslice trainer: ``python -m trainer``. See docs/contract.md and the module docstrings.

Module map: ``config`` (named configs, overrides, contract env) -> ``distributed`` (process group,
start barrier) -> ``mesh`` (data × fsdp × expert × tensor, logical-axis rules) -> ``model`` / ``moe`` (flax nnx decoder, expert-parallel
MoE) -> ``data`` (Grain, step-indexed order) -> ``step`` (jitted train step) -> ``checkpoint`` (Orbax) ->
``metrics`` (run directory) -> ``loop`` (the training loop) <- ``__main__`` (entry, exit codes).
``evaluate`` is the held-out evaluation the loop runs when ``eval.sources`` are given (it traces the
model, so flax is imported then); ``tokenize`` is a command of its own (``python -m
trainer.tokenize``: raw text to token files; no JAX).
``watchdog`` holds the SIGTERM handler and its stall watchdog, which ``__main__`` installs first;
``startup`` times the process's start-up phases; ``compile_cache`` keeps the train step's executable
and the state's abstract values; ``sizes`` holds a config's parameter and FLOP counts without flax
(only ``model``, ``moe``, ``step`` and ``evaluate`` import flax and optax: a resume with a warm cache skips them).
A multi-process run's ``__main__`` first starts ``supervisor`` (the parent that turns JAX's
fate-sharing abort into exit 43); ``peers`` tells a lost peer from a bug (no JAX in either).
"""
