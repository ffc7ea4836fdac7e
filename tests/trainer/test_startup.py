"""Start-up timing (trainer.telemetry.startup) and the wait for the coordinator (trainer.elastic.distributed)."""

from __future__ import annotations

import importlib.metadata
import itertools
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time

from tests.trainer.runs import ROOT
from trainer.elastic.distributed import await_coordinator, dial_pauses
from trainer.telemetry.startup import no_rocm_plugin_scan

TICK = 0.011  # /proc counts process starts in clock ticks of 10 ms


def test_a_process_start_is_its_spawn_time_to_the_tick() -> None:
    # /proc/stat's btime is whole seconds: a start computed from it is off by up to 1 s.
    before = time.time()
    out = subprocess.run(
        [sys.executable, "-c", "import os; from trainer.telemetry.startup import process_start; print(process_start(os.getpid()))"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    after = time.time()
    assert before - TICK <= float(out) <= after


def test_a_supervised_timeline_counts_the_supervisors_cpu_before_the_fork() -> None:
    # In place the supervisor does the trainer's imports before it forks: its CPU is start-up too.
    code = """
import json, os, time
from trainer.telemetry.startup import Timeline
t0 = time.process_time()
while time.process_time() - t0 < 0.3:  # the supervisor's imports
    pass
pid = os.fork()
if pid == 0:
    timeline = Timeline(supervised=True)
    timeline.mark("imports")
    print(json.dumps(timeline.phases()), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    phases = json.loads(out)
    assert list(phases) == ["supervisor", "interpreter", "imports", "total"]
    assert 0.28 <= phases["supervisor"]["cpu"] < 1.0
    assert phases["interpreter"]["cpu"] < 0.1 and phases["imports"]["cpu"] < 0.1  # the child's own
    assert (
        abs(phases["total"]["cpu"] - sum(phases[p]["cpu"] for p in ("supervisor", "interpreter", "imports")))
        < 0.01
    )


def test_the_coordinator_is_dialed_until_it_listens() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = socket.socket()

    def listen_later() -> None:
        time.sleep(0.3)
        server.bind(("127.0.0.1", port))
        server.listen()

    threading.Thread(target=listen_later, daemon=True).start()
    try:
        waited = await_coordinator(f"127.0.0.1:{port}", timeout_s=10)
    finally:
        server.close()
    # As soon as it listens: not gRPC's first reconnect backoff of 1 s.
    assert 0.25 <= waited < 0.8


def test_the_dial_backs_off_with_jitter_up_to_a_second() -> None:
    # Every process of a world dials at once (3,072 on 768 hosts x 4), each dial of a name not yet
    # resolvable a DNS query: pauses short at first (process 0 is a few ms late), then growing to 1 s,
    # each jittered so that the processes spread out instead of dialing in lock step.
    pauses = list(itertools.islice(dial_pauses(random.Random(1)), 30))
    assert 0.016 <= pauses[0] <= 0.024
    assert all(0.8 <= p <= 1.2 for p in pauses[12:])  # capped at 1 s, +-20%
    assert sum(pauses[:10]) < 5.0  # the first ten within a few seconds
    others = list(itertools.islice(dial_pauses(random.Random(2)), 30))
    assert pauses != others  # two processes do not pause alike
    # Over a 900 s initialization timeout: about 900 dials a process, not 45,000.
    n, total = 0, 0.0
    for p in dial_pauses(random.Random(3)):
        n, total = n + 1, total + p
        if total >= 900:
            break
    assert 850 <= n <= 1000


def test_a_coordinator_that_never_comes_is_left_to_jax_after_the_timeout() -> None:
    for address in ("127.0.0.1:1", "no-such-host.invalid:8490", "[::1]:1"):
        waited = await_coordinator(address, timeout_s=0.2)
        assert 0.2 <= waited < 2.0, address


_COUNT_METADATA_READS = """
import os, sys
from importlib import metadata
from trainer.telemetry.startup import no_rocm_plugin_scan
reads = []
read_text = metadata.PathDistribution.read_text
metadata.PathDistribution.read_text = lambda self, name: reads.append(name) or read_text(self, name)
with no_rocm_plugin_scan(os.environ):
    import jax.numpy
print(sum(n in ("METADATA", "PKG-INFO") for n in reads))
"""


def _metadata_reads_importing_jax(platforms: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    if platforms is not None:
        env["JAX_PLATFORMS"] = platforms
    run = subprocess.run(
        [sys.executable, "-c", _COUNT_METADATA_READS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(run.stdout.split()[-1])


def test_importing_jax_skips_its_rocm_plugin_scan_where_the_platforms_rule_rocm_out() -> None:
    installed = sum(1 for _ in importlib.metadata.distributions())
    # jax reads every distribution's METADATA looking for a ROCm plugin, unless JAX_PLATFORMS says
    # ROCm cannot be used; a few reads (libraries asking for a version) remain either way.
    assert _metadata_reads_importing_jax(None) >= installed
    assert _metadata_reads_importing_jax("rocm,cpu") >= installed
    assert _metadata_reads_importing_jax("cpu") < 10 <= installed


def test_the_distributions_are_hidden_only_inside_the_block_and_only_from_a_bare_scan() -> None:
    real = importlib.metadata.distributions
    with no_rocm_plugin_scan({"JAX_PLATFORMS": "cpu"}):
        assert list(importlib.metadata.distributions()) == []
        assert [d.metadata["Name"] for d in importlib.metadata.distributions(name="jax")] == ["jax"]
    assert importlib.metadata.distributions is real
    with no_rocm_plugin_scan({}):
        assert importlib.metadata.distributions is real
