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

So a multi-process trainer runs in a child of this process, in the same process group (the
kubelet's signals reach both; this one forwards SIGTERM and SIGINT as well, for a runtime that
signals PID 1 only). The child is a fork, not a new interpreter: it goes on from here into the
trainer's own start-up, sparing a second Python start-up and importing ``trainer.__main__`` again
(the ``interpreter`` phase 0.13 -> 0.07 CPU s, median over 5 rounds of bench.recovery). This
process has started no thread and imported nothing heavy when it forks.
The child's stdout is inherited; its stderr passes through here, and its last 64 KiB are kept: a
child killed by SIGABRT right after JAX's "Terminating process because the JAX distributed service
detected fatal errors" exits ``EXIT_PEER_LOST``; every other exit is passed on. The child gets
SIGKILL if this process dies first (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from typing import NoReturn

from trainer import peers

CHILD_ENV = "RESLICE_TRAINER_CHILD"  # set in the child: it trains instead of supervising
_TAIL = 64 * 1024
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _pass_through(read_end: int, tail: bytearray) -> None:
    """Copy the child's stderr to ours, keeping the last _TAIL bytes in `tail`."""
    out = sys.stderr.buffer
    while chunk := os.read(read_end, 65536):
        out.write(chunk)
        out.flush()
        tail += chunk
        del tail[:-_TAIL]


def _child(train: Callable[[], int], parent: int, read_end: int, write_end: int) -> NoReturn:
    """The forked child: stderr into the pipe, the signals' defaults back, then train and exit."""
    code = 1
    try:
        os.close(read_end)
        os.dup2(write_end, 2)
        os.close(write_end)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the trainer installs its own
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _die_with_parent()
        if os.getppid() != parent:  # the parent died before PR_SET_PDEATHSIG was set
            os._exit(1)
        os.environ[CHILD_ENV] = "1"
        code = train()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def supervise(train: Callable[[], int]) -> int:
    """Run ``train()`` in a forked child (with ``CHILD_ENV`` set) and return the exit code this
    process should have."""
    child: list[int] = []
    caught: list[int] = []  # a signal that came before the child existed is passed on once it does

    def forward(signum: int, _frame: object) -> None:
        if not child:
            caught.append(signum)
        for pid in child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        _child(train, parent, read_end, write_end)
    os.close(write_end)
    child.append(pid)
    for signum in caught:
        os.kill(pid, signum)
    tail = bytearray()
    pump = threading.Thread(target=_pass_through, args=(read_end, tail), name="stderr", daemon=True)
    pump.start()
    returncode = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
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
