"""The parent of a trainer child: the one-shot supervisor of a multi-process trainer (``supervise``),
and the parts of a fork that the in-place follower (``trainer.elastic.follower``) shares with it.

The one-shot supervisor turns JAX's fate-sharing abort into ``Exit.PEER_LOST``. When a peer dies,
JAX's coordination-service client kills every other process on purpose (the JAX
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
(the ``interpreter`` phase about halved: docs/measurements.md, "Figures behind the code's
constants"). This process has started no thread and imported nothing heavy when it forks.
The child's stdout is inherited; its stderr passes through here (``pass_through``), and its last
``_TAIL`` bytes are kept: a child killed by SIGABRT right after JAX's "Terminating process because
the JAX distributed service detected fatal errors" exits ``Exit.PEER_LOST``; every other exit is
passed on.
The child (``run_child``) gets SIGKILL if this process dies first (``PR_SET_PDEATHSIG``). What a
child that died without its own exit path leaves behind (its Grain workers) is adopted here
(``PR_SET_CHILD_SUBREAPER``, ``adopt_orphans``) and ended when the child's end is seen
(``end_strays``): in place the pod outlives many children.

The in-place follower forks each of its children with these same parts (``run_child``,
``pass_through``, ``adopt_orphans``, ``end_strays``); its child reports its first step to it with
``notify_running``, which ``trainer.loop`` calls.

Called by ``trainer.__main__`` (``supervise``: the recreate mode's multi-process trainer; ``CHILD_ENV``
tells it that it is a child, ``later_incarnation`` that it is not its pod's first),
``trainer.elastic.follower`` (the parts above), ``trainer.elastic.distributed``
(``later_incarnation``) and ``trainer.loop`` (``notify_running``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Collection, Mapping
from typing import NoReturn

from contract import envvars
from contract.exits import Exit
from trainer.elastic import peers

CHILD_ENV = "RESLICE_TRAINER_CHILD"  # set in the child: it trains instead of supervising
# In an in-place child: the file descriptor it writes one byte to after its first step.
RUNNING_ENV = "RESLICE_TRAINER_RUNNING_FD"
_TAIL = 64 * 1024
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
# How long a process an ended child left behind has after SIGTERM before SIGKILL (``end_strays``).
STRAY_GRACE_S = 10.0


def later_incarnation(env: Mapping[str, str]) -> bool:
    """Whether this trainer is an in-place pod's child but its first (``envvars.INCARNATION`` above
    0, which the follower sets in every child): its start-up began at its fork, not at the
    container's start (``trainer.telemetry.startup.Timeline``, which ``__main__`` tells so), and it
    joins a world of running pods (``trainer.elastic.distributed.join_timeout``)."""
    raw = env.get(envvars.INCARNATION) or ""
    return raw.isdigit() and int(raw) > 0


def notify_running() -> None:
    """In an in-place child: tell its supervisor (``trainer.elastic.follower``) its first step ran
    (a child that fails on the chip's lock after it is not started again). Once; nothing elsewhere."""
    raw = os.environ.pop(RUNNING_ENV, None)
    if raw:
        with contextlib.suppress(OSError, ValueError):
            os.write(int(raw), b"1")
            os.close(int(raw))


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def adopt_orphans() -> None:
    """Make this process the reaper of its descendants' orphans (``PR_SET_CHILD_SUBREAPER``; as a
    container's PID 1 it is already): a trainer child that dies without its own exit path (SIGKILL,
    JAX's fate-sharing abort) leaves its data loader's workers behind, which then become this
    process's children, for ``end_strays``."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)


def _children() -> list[int]:
    """This process's children, from each process's ``/proc/N/stat`` (its parent after the command
    name, which may hold spaces and parentheses). ``/proc/self/task/*/children`` would be shorter,
    but needs a kernel option (CONFIG_PROC_CHILDREN) not every kernel has."""
    me, out = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # it exited meanwhile
            continue
        if int(stat[stat.rindex(b")") + 2 :].split()[1]) == me:
            out.append(int(name))
    return out


_ending: set[int] = set()  # strays signalled and not reaped yet


def end_strays(keep: Collection[int]) -> None:
    """SIGTERM every child of this process but `keep` (the running trainer) and reap
    it in a thread of its own, SIGKILL after STRAY_GRACE_S: what an ended trainer left behind. A
    killed trainer's Grain workers otherwise live on (each with its own JAX import), one set more
    with every world that killed a trainer, for the pod's life. SIGTERM rather than SIGKILL:
    multiprocessing's resource tracker ignores it on purpose, outlives the workers, unlinks the
    shared memory and semaphores they leave in /dev/shm, then exits."""
    for pid in _children():
        if pid in keep or pid in _ending:
            continue
        _ending.add(pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        threading.Thread(target=_reap_stray, args=(pid,), name="stray", daemon=True).start()


def _reap_stray(pid: int) -> None:
    # A child of this process stays a zombie until reaped here: its pid cannot be reused meanwhile.
    deadline = time.monotonic() + STRAY_GRACE_S
    try:
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.05)
    except ChildProcessError:
        pass
    finally:
        _ending.discard(pid)


def pass_through(read_end: int, tail: bytearray, raw: bool = False) -> None:
    """Copy the child's stderr to ours, keeping the last _TAIL bytes in `tail`. `raw`: straight to
    file descriptor 2, without the lock of ``sys.stderr``'s buffer (a later child is forked while
    this thread may still run: a lock it held at the fork would stay held in that child)."""
    out = sys.stderr.buffer
    while chunk := os.read(read_end, 65536):
        if raw:
            view = memoryview(chunk)
            while view:
                view = view[os.write(2, view) :]
        else:
            out.write(chunk)
            out.flush()
        tail += chunk
        del tail[:-_TAIL]


def run_child(
    train: Callable[[], int],
    parent: int,
    read_end: int,
    write_end: int,
    env: Mapping[str, str] | None = None,
    fresh: Callable[[Mapping[str, str]], NoReturn] | None = None,
) -> NoReturn:
    """The forked child: stderr into the pipe, the signals' defaults back, its environment (`env`,
    a world's; else the pod's), then train and exit; or, given `fresh`, replace this process with a
    fresh trainer in that environment."""
    code: int = Exit.FAILED
    try:
        os.close(read_end)
        os.dup2(write_end, 2)
        os.close(write_end)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the trainer installs its own
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _die_with_parent()
        if os.getppid() != parent:  # the parent died before PR_SET_PDEATHSIG was set
            os._exit(Exit.FAILED)
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        os.environ[CHILD_ENV] = "1"
        if fresh is not None:
            if (running := os.environ.get(RUNNING_ENV)) is not None:
                os.set_inheritable(int(running), True)  # os.pipe()'s ends close at exec otherwise
            fresh(dict(os.environ))
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
    adopt_orphans()
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        run_child(train, parent, read_end, write_end)
    os.close(write_end)
    child.append(pid)
    for signum in caught:
        os.kill(pid, signum)
    tail = bytearray()
    pump = threading.Thread(target=pass_through, args=(read_end, tail), name="stderr", daemon=True)
    pump.start()
    returncode = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    # A data-loader worker the child left behind holds the pipe open until it ends: what the child
    # wrote is in it already, so a short wait reads it all.
    end_strays(keep=())
    pump.join(timeout=2.0)
    said = bytes(tail).decode(errors="replace")
    code = peers.supervised_exit(returncode, said)
    if code == Exit.PEER_LOST and returncode < 0:
        print(
            f"trainer: JAX's coordination service ended this process because a peer is lost:"
            f" exit {Exit.PEER_LOST}; the latest committed step stands",
            flush=True,
        )
    elif peers.fate_shared(returncode, said):  # the abort came after the child settled `code`
        print(
            f"trainer: JAX's coordination service ended this process after its exit {code} was settled"
            f" (process 0 had exited): exit {code}",
            flush=True,
        )
    return code
