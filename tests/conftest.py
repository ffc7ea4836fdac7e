"""Session-wide settings shared by every test.

JAX runs on simulated CPU devices. The persistent compilation cache is shared by the test process
and every trainer subprocess (they inherit the environment), so a model shape compiled once is
loaded from disk by every later process instead of recompiled: that is most of what keeps the
end-to-end tests inside the CI budget on two cores.
"""

import os
from pathlib import Path

from launcher.embedded.kubelet import podenv

ROOT = Path(__file__).resolve().parent.parent

# This process and every trainer it starts run as the embedded kubelet's processes do (JAX on CPU,
# the same XLA flags): then they load each other's compile cache entries.
os.environ.update(podenv.simulated_host(os.environ))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".cache" / "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# Keep XLA from spawning more compile threads than the two cores CI has.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MAXTEXT_E2E = ROOT / "tests" / "maxtext_e2e"

# The files that take longest, longest first (by worker-seconds in a run of `dev.py test`'s three
# workers; --durations prints them). The workers take whole files in this order
# (`--no-loadscope-reorder`): the long files start first and the many short ones fill in beside
# them. xdist's default order (most tests first) left these few-test files for the end, where the
# end-to-end tests' waiting left the cores half idle.
LONGEST_FIRST = (
    "tests/controller/test_e2e_inplace.py",  # 338
    "tests/trainer/test_train.py",  # 136
    "tests/trainer/test_start_barrier.py",  # 132
    "tests/trainer/test_inplace_train.py",  # 122
    "tests/trainer/test_memory_restore.py",  # 108
    "tests/controller/test_e2e_disruptions.py",  # 107
    "tests/trainer/test_recipe.py",  # 101
    "tests/sweep/test_e2e_sweep.py",  # 97
    "tests/trainer/test_lost_peers.py",  # 84
    "tests/controller/test_e2e_elastic.py",  # 75
    "tests/images/test_podman_runtime.py",  # 68
    "tests/trainer/test_mixture.py",  # 61
    "tests/trainer/test_sharded.py",  # 60
    "tests/images/test_maxtext_image.py",  # 54
    "tests/trainer/test_stages.py",  # 50
    "tests/controller/test_e2e_takeover.py",  # 44
    "tests/launcher/test_bad_inputs.py",  # 37
    "tests/trainer/test_moe.py",  # 33
    "tests/maxtext/test_e2e_outcomes.py",  # 31
    "tests/embedded/test_cluster_nodes.py",  # 30
    "tests/embedded/test_cluster_faults.py",  # 25
    "tests/controller/test_incluster.py",  # 23
    "tests/images/test_trainer_image.py",  # 22
    "tests/trainer/test_step.py",  # 21
    "tests/embedded/test_upstream_fidelity.py",  # 20
    "tests/embedded/test_cluster_failure_policy.py",  # 19
)


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    """tests/maxtext_e2e runs real MaxText (.venv-maxtext: 1.1 GB, minutes per run): collected only
    when an argument names it (`python3 dev.py test tests/maxtext_e2e`), never by the default run."""
    if not _inside(collection_path, MAXTEXT_E2E):
        return None
    here = Path(config.invocation_params.dir)
    named = [(here / a.split("::")[0]).resolve() for a in config.args]
    return True if not any(_inside(p, MAXTEXT_E2E) for p in named) else None


def pytest_collection_modifyitems(config, items: list) -> None:
    """LONGEST_FIRST's files first, in its order; every other file after them as collected."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
