"""reslice trainer: ``python -m trainer``. See docs/contract.md and the module docstrings.

The folders are layers (pyproject.toml, the import contract "the layers of trainer/"); each imports
only what lies below it:

    __main__ | tokenize     the entry point and the tokenizer command
    loop                    the training loop: restore or init, steps, metrics, checkpoints, SIGTERM
    evaluate | hbm | restore  held-out evaluation; the step's HBM per device, before launching;
                              the newest state onto a new mesh (memory, peers or storage)
    step                    the jitted train step (flax, optax)
    model/                  the decoder, attention, MoE, the mesh and batch plan, sizes
    elastic/                worlds, the supervisor, the process group, lost peers, the watchdog
    data/ | state/ | telemetry/   what is read; what survives a process; what is reported
    config | exits          named configs, overrides, the contract's environment; the exit codes

Only ``model``, ``step`` and ``evaluate`` import flax and optax: a resume with a warm compile cache
skips them. A multi-process run's ``__main__`` first starts the supervisor (the parent that turns
JAX's fate-sharing abort into exit 43) before anything heavy is imported.
"""
