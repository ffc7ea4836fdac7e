"""The parent of a multi-process trainer: it turns JAX's fate-sharing abort into ``EXIT_PEER_LOST``.

When a peer dies, JAX's coordination-service client kills every other process on purpose (the JAX
docs' "Fault Tolerant Distributed JAX": "If any process crashes, then all other processes will also
intentionally crash"): LOG(FATAL) from a C++ thread, SIGABRT, exit 134 — which the failure policy
would count as an application failure. jax 0.10.2 has no way to run Python first:
``jax.distributed.initialize`` takes no missed-heartbeat callback; a Python callback handed to
``_jax.get_distributed_runtime_client`` cannot receive the ``absl::Status`` (``std::bad_cast``, then
``std::terminate``: SIGABRT all the same); ``shutdown_on_destruction`` only concerns the exit
barrier; and recoverability (``jax_enable_recoverability``) is experimental, GPU-only and does not
cover the loss of process 0, which hosts the service.

So a multi-process trainer runs as this process's child, in the same process group (the kubelet's
signals reach both; this one forwards SIGTERM and SIGINT as well, for a runtime that signals PID 1
only). The child's stdout is inherited; its stderr passes through here, and its last 64 KiB are
kept: a child killed by SIGABRT right after JAX's "Terminating process because the JAX distributed
service detected fatal errors" exits ``EXIT_PEER_LOST``; every other exit is passed on. The child
gets SIGKILL if this process dies first (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading

from trainer import peers

CHILD_ENV = "RESLICE_TRAINER_CHILD"  # set in the child: it trains instead of supervising
_TAIL = 64 * 1024
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _pass_through(child: subprocess.Popen, tail: bytearray) -> None:
    """Copy the child's stderr to ours, keeping the last _TAIL bytes in `tail`."""
    assert child.stderr is not None
    out = sys.stderr.buffer
    while chunk := os.read(child.stderr.fileno(), 65536):
        out.write(chunk)
        out.flush()
        tail += chunk
        del tail[:-_TAIL]


def supervise(argv: list[str]) -> int:
    """Run ``python -m trainer argv`` as a child and return the exit code this process should have."""
    children: list[subprocess.Popen] = []
    caught: list[int] = []  # a signal that came before the child existed is passed on once it does

    def forward(signum: int, _frame: object) -> None:
        caught.append(signum)
        for c in children:
            c.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    child = subprocess.Popen(
        [sys.executable, "-m", "trainer", *argv],
        env={**os.environ, CHILD_ENV: "1"},
        stderr=subprocess.PIPE,
        preexec_fn=_die_with_parent if sys.platform == "linux" else None,
    )
    children.append(child)
    for signum in caught:
        child.send_signal(signum)
    tail = bytearray()
    pump = threading.Thread(target=_pass_through, args=(child, tail), name="stderr", daemon=True)
    pump.start()
    returncode = child.wait()
    # A data-loader worker the child left behind may hold the pipe open: what the child wrote is
    # in it already, so a short wait reads it all.
    pump.join(timeout=2.0)
    code = peers.supervised_exit(returncode, bytes(tail).decode(errors="replace"))
    if code == peers.EXIT_PEER_LOST and returncode < 0:
        print(
            f"trainer: JAX's coordination service ended this process because a peer is lost:"
            f" exit {peers.EXIT_PEER_LOST}; the latest committed step stands",
            flush=True,
        )
    return code
