"""``distributed.await_step``: a step that failed on one local device while another still waits is
reported at once (what a dead peer's collectives do to a multi-device host, test_train's survivor)."""

from __future__ import annotations

import subprocess
import sys

from tests.trainer.runs import ROOT

# Device 1's part of the step fails; device 0's waits (as a Gloo receive from a rank that gave up
# would) until released. `jax.device_get` reads device 0's buffer and so waits with it.
SCRIPT = """
import os, threading, time
os.environ.update(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="2")
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from trainer.elastic import distributed

release = threading.Event()

def part(x):
    if x[0] == 1:
        raise RuntimeError("device 1 failed")
    release.wait(60)
    return x

mesh = jax.make_mesh((2,), ("d",))
step = jax.jit(jax.shard_map(
    lambda x: jax.pure_callback(part, jax.ShapeDtypeStruct(x.shape, x.dtype), x),
    mesh=mesh, in_specs=P("d"), out_specs=P("d"),
))
x = jax.device_put(np.arange(2, dtype=np.int32), NamedSharding(mesh, P("d")))

y = step(x)
getter = threading.Thread(target=jax.device_get, args=(y,), daemon=True)
getter.start()
t0 = time.monotonic()
try:
    distributed.await_step({"metrics": y})
    print("RESULT no error")
except Exception as e:
    print(f"RESULT raised after {time.monotonic() - t0:.2f} s:", "device 1 failed" in str(e))
getter.join(1.0)
print("RESULT device_get still waiting:", getter.is_alive())
release.set()
os._exit(0)
"""


def test_a_step_failed_on_one_device_raises_while_another_device_still_waits() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120
    ).stdout
    results = [line.removeprefix("RESULT ") for line in out.splitlines() if line.startswith("RESULT")]
    assert len(results) == 2, out
    raised, waiting = results
    assert raised.startswith("raised after") and raised.endswith("True"), raised
    assert float(raised.split()[2]) < 5, raised
    assert waiting == "device_get still waiting: True"
