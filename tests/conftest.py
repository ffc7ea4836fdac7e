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


# `dev.py test` hands whole files to two workers in collection order (`--dist loadfile`). The
# longest files go first (longest-processing-time first), so the suite does not end with one
# worker alone on a 5-minute e2e file while the other idles. Seconds from a fresh-clone run.
LONGEST_FIRST = (
    "tests/controller/test_e2e_elastic.py",  # ~306
    "tests/controller/test_e2e_takeover.py",  # ~228
    "tests/trainer/test_train.py",  # ~250
    "tests/controller/test_e2e_disruptions.py",  # ~190
    "tests/trainer/test_start_barrier.py",  # ~160
    "tests/sweep/test_e2e_sweep.py",  # ~157
    "tests/trainer/test_sharded.py",  # ~110
    "tests/controller/test_e2e_failures.py",
    "tests/controller/test_e2e_node_faults.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: file order kept
