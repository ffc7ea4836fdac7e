"""MaxText 0.2.5's pre-training main with reslice's two fixes, run by the entrypoint
(`maxtext_entry/run.py`, `child_program`) by path, in MaxText's own interpreter, in place of
`python -m maxtext.trainers.pre_train.train` when either applies: `python .../pretrain.py key=value
...`. Imports MaxText, JAX, grain and Orbax, never this package (MaxText's interpreter may not have
it on its path). Both fixes are described in docs/maxtext.md with the MaxText code they touch.

1. Grain's ElasticIterator checkpointed as one state (any process count restores it). MaxText saves
   and restores the iterator as one shared `process_0.json` only when the data iterator's
   `local_iterator` is an `ElasticIterator` (`for_save`/`for_restore`,
   `src/maxtext/common/grain_utility.py`), but `MultiHostDataLoadIterator` keeps `iter(dataloader)`
   (`src/maxtext/input_pipeline/multihost_dataloading.py`), and in grain >= 0.2.18 (what MaxText
   0.2.5 requires) `ElasticIterator` is an `IterDataset` whose `iter()` is an inner iterator: MaxText
   writes one file per process, and a restore on another process count fails (`AssertionError: 4
   processes found in Grain checkpoint directory ..., but only 2 jax processes in this run`). Fix:
   keep the `ElasticIterator` itself as `local_iterator` (its `__next__`, `get_state` and
   `set_state` are its inner iterator's).
2. On CPU with several processes, a barrier of JAX's coordination service before the first step:
   Gloo's rendezvous of the first step's collectives gives up after a fixed 30 s, and only process 0
   loads the train step from the persistent compilation cache while the others compile it. MaxText
   compiles the step ahead of time in `train_loop` and calls `start_run_clock` right before the loop
   (`src/maxtext/trainers/pre_train/train.py`); the barrier goes there (Orbax's
   `multihost.get_barrier_sync_fn`, up to `RESLICE_INIT_TIMEOUT_S`, 900 s by default).
"""

from __future__ import annotations

import os
import time

import jax
from absl import app
from grain.experimental import ElasticIterator
from maxtext.input_pipeline import multihost_dataloading
from maxtext.trainers.pre_train import train
from orbax.checkpoint import multihost

_Loader = multihost_dataloading.MultiHostDataLoadIterator
_loader_init, _loader_reset = _Loader.__init__, _Loader.reset
_start_run_clock = train.start_run_clock


def _keep_elastic_iterator(loader) -> None:
    if isinstance(loader.dataloader, ElasticIterator):
        loader.local_iterator = loader.dataloader


def _loader_init_keeping_elastic(self, *args, **kwargs) -> None:
    _loader_init(self, *args, **kwargs)
    _keep_elastic_iterator(self)


def _loader_reset_keeping_elastic(self) -> None:
    _loader_reset(self)
    _keep_elastic_iterator(self)


def _barrier_then_start_run_clock(*args, **kwargs):
    if jax.default_backend() == "cpu" and jax.process_count() > 1:
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
    _Loader.__init__, _Loader.reset = _loader_init_keeping_elastic, _loader_reset_keeping_elastic
    train.start_run_clock = _barrier_then_start_run_clock  # looked up in train_loop at call time
    app.run(train.main)
