"""Start-up timing (trainer.startup) and the wait for the coordinator (trainer.distributed)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

from tests.trainer.runs import ROOT
from trainer.distributed import await_coordinator

TICK = 0.011  # /proc counts process starts in clock ticks of 10 ms


def test_a_process_start_is_its_spawn_time_to_the_tick() -> None:
    # /proc/stat's btime is whole seconds: a start computed from it is off by up to 1 s.
    before = time.time()
    out = subprocess.run(
        [sys.executable, "-c", "import os; from trainer.startup import process_start; print(process_start(os.getpid()))"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    after = time.time()
    assert before - TICK <= float(out) <= after


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


def test_a_coordinator_that_never_comes_is_left_to_jax_after_the_timeout() -> None:
    for address in ("127.0.0.1:1", "no-such-host.invalid:8490", "[::1]:1"):
        waited = await_coordinator(address, timeout_s=0.2)
        assert 0.2 <= waited < 2.0, address
