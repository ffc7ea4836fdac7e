"""Session-wide settings shared by every test.

JAX runs on simulated CPU devices. The persistent compilation cache is shared by the test process
and every trainer subprocess (they inherit the environment), so a model shape compiled once is
loaded from disk by every later process instead of recompiled: that is most of what keeps the
end-to-end tests inside the CI budget on two cores.
"""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".cache" / "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# Keep XLA from spawning more compile threads than the two cores CI has.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
