"""MaxText's pre-training, with every process meeting at a barrier of JAX's coordination service
before the first step. Run by the entrypoint (`maxtext_entry/run.py`) by path, in MaxText's own
interpreter, in place of `python -m maxtext.trainers.pre_train.train`, on CPU with several processes
(the embedded cluster): `python .../first_step_barrier.py key=value ...`. Imports MaxText, JAX and
Orbax, never this package (MaxText's interpreter may not have it on its path).

Why (docs/maxtext.md, The first step on CPU): on CPU the first step's collectives set up Gloo
communicators, whose rendezvous gives up after a fixed 30 s (`Gloo context initialization failed:
DEADLINE_EXCEEDED: GetKeyValue() timed out`), and only process 0 reads the persistent compilation
cache (JAX writes it from process 0 only): process 0 loads the train step and reaches the first step
while the others still compile it, and every restart fails the same way. MaxText compiles the step
ahead of time (`train_loop`, `src/maxtext/trainers/pre_train/train.py`) and then calls
`start_run_clock` right before the loop; the barrier goes there. The barrier is the coordination
service's (Orbax's `multihost.get_barrier_sync_fn`), which has no 30 s limit: it waits up to
`RESLICE_INIT_TIMEOUT_S` (the launcher's `--init-timeout`, 900 s by default).
"""

from __future__ import annotations

import os
import time

from absl import app
from maxtext.trainers.pre_train import train
from orbax.checkpoint import multihost

_start_run_clock = train.start_run_clock


def _barrier_then_start_run_clock(*args, **kwargs):
    import jax

    name = f"maxtext-entry-first-step-{os.environ.get('RESLICE_SEGMENT', '0')}"
    name += f"-{os.environ.get('RESLICE_RESTART_ATTEMPT', '0')}"
    timeout_ms = int(os.environ.get("RESLICE_INIT_TIMEOUT_S") or 900) * 1000
    started = time.monotonic()
    multihost.get_barrier_sync_fn()(key=name, timeout_ms=timeout_ms)
    print(
        f"maxtext_entry: all {jax.process_count()} processes at the first-step barrier after "
        f"{time.monotonic() - started:.1f} s (process {jax.process_index()})",
        flush=True,
    )
    return _start_run_clock(*args, **kwargs)


if __name__ == "__main__":
    train.start_run_clock = _barrier_then_start_run_clock  # looked up in train_loop at call time
    app.run(train.main)
