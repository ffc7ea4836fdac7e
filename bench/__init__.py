"""Benchmarks: they print figures (ratios measured side by side in one run), they are not tests.

.venv/bin/python -m bench                 # list them
.venv/bin/python -m bench.<name> [args]   # run one
"""

import os
from pathlib import Path

from launcher.embedded.kubelet import podenv

# Trainer processes share one persistent compilation cache, as in the tests.
os.environ.update(podenv.simulated_host(os.environ))  # as the embedded kubelet's trainers run
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".cache" / "jax")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
