"""``kill -USR1`` writes every Python thread's stack to stderr (the pod's log) and the process goes
on: what a stuck trainer or supervisor waits on, without ptrace. ``trainer.__main__`` calls
``on_usr1`` first thing, before any other thread starts.

A thread of its own waits for the signal, which is blocked in every thread started after (a forked
child starts its own waiting thread), and reads the stacks as Python code: ``sys._current_frames``
holds the GIL and the interpreter's lock on its threads. ``faulthandler`` reads them holding
neither, as it must inside a signal handler, and a thread's state coming or going meanwhile crashed
a training process (SIGSEGV), through its registered handler and ``dump_traceback`` alike. At exit
the waiting thread is stopped before the interpreter goes: woken during finalization, a thread that
wants the GIL back is unwound, which aborted the process (SIGABRT) after it had trained to the end.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import traceback

_waiter: threading.Thread | None = None
_stopping = threading.Event()


def write() -> None:
    """Every Python thread's stack to stderr, faulthandler's layout, the threads' names added."""
    names = {t.ident: t.name for t in threading.enumerate()}
    lines = []
    for ident, frame in sys._current_frames().items():
        name = names.get(ident, "not started by Python")
        lines.append(f"\nThread {ident:#x} {name} (most recent call first):")
        lines += [
            f'  File "{f.filename}", line {f.lineno} in {f.name}'
            for f in reversed(traceback.extract_stack(frame))
        ]
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()


def _wait() -> None:
    while True:
        signal.sigwait({signal.SIGUSR1})
        if _stopping.is_set():
            return
        write()


def _start() -> None:
    global _waiter
    _stopping.clear()
    _waiter = threading.Thread(target=_wait, name="stacks-on-usr1", daemon=True)
    _waiter.start()


def _stop() -> None:
    waiter = _waiter
    if waiter is None or not waiter.is_alive() or waiter.ident is None:
        return
    _stopping.set()
    signal.pthread_kill(waiter.ident, signal.SIGUSR1)
    waiter.join(5.0)


def on_usr1() -> None:
    """SIGUSR1 blocked in this thread (and so in every thread it starts) and handed to a waiting
    thread that writes the stacks; the same in a forked child; the thread stopped at exit."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    _start()
    os.register_at_fork(after_in_child=_start)
    atexit.register(_stop)
