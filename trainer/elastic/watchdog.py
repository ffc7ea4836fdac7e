"""The trainer's SIGTERM handler and its stall watchdog (``Preemption``). ``__main__`` installs it
before importing JAX and hands it to ``loop.run``, which reports each finished step and save.
Free of heavy imports for that reason. The time it reads and waits on is passed in (monotonic and
sleep), so that tests/trainer/test_preemption.py steps a fake clock instead of sleeping.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from contract.exits import Exit

POLL_S = 0.5  # how often the watchdog looks at the handler's flag while no signal's byte comes


class Preemption:
    """Remembers a SIGTERM; the loop acts on it at a step boundary.

    Free of heavy imports, so that ``__main__`` can install it before importing JAX:
    a SIGTERM during start-up must not kill the process with a non-contract exit code.

    After a SIGTERM the step in flight may never finish: when a peer is gone, its collectives wait
    for it until JAX's heartbeat timeout (``RESLICE_HEARTBEAT_TIMEOUT_S``) while this host stays
    held, and then the grace period runs out anyway. So a watchdog thread hears the signal through a
    wakeup fd (the Python handler only runs once the main thread is back from XLA) and, once steps
    have been finishing, exits ``Exit.STALLED`` when none has finished for ``stall_s()`` since the
    signal. Never during a checkpoint save (``saving()``), and never before the first step
    (compiling).

    While the process joins its group (``joining()``: ``jax.distributed.initialize``, which blocks
    in C++ until every peer has registered or the init timeout has passed) a SIGTERM, before or
    during it, exits ``Exit.PREEMPTED`` at once from the watchdog: nothing has been trained or
    written, and peers that will never come (an in-place world superseded before it formed: its
    other pods already follow the next one) must not hold this pod's next trainer.
    """

    def __init__(
        self,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        exit: Callable[[int], Any] = os._exit,
    ) -> None:
        self._monotonic, self._sleep, self._exit = monotonic, sleep, exit
        self.requested = False
        self.stall_timeout_s = 0.0  # train.stall_timeout_s; 0: automatic, see stall_s()
        self._last_step: float | None = None  # monotonic time the last step finished
        self._first_step_s = 0.0
        self._longest_since_s = 0.0  # the longest step after the first
        self._saving = False
        self._joining = False
        self._closed = False
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._previous_fd = signal.set_wakeup_fd(self._write)
        self.watchdog = threading.Thread(target=self._watch, name="sigterm-watchdog", daemon=True)
        self.watchdog.start()

    def _handle(self, signum: int, frame: Any) -> None:
        if not self.requested:  # the kubelet's signal and the supervisor's copy of it: say it once
            print(
                f"trainer: SIGTERM: finishing the step in flight, then checkpoint and exit {Exit.PREEMPTED}",
                flush=True,
            )
        self.requested = True

    def step_done(self, seconds: float) -> None:
        if self._last_step is None:
            self._first_step_s = seconds
        else:
            self._longest_since_s = max(self._longest_since_s, seconds)
        self._last_step = self._monotonic()

    @property
    def stepped(self) -> bool:
        """Whether a step has finished: before that, the processes of a run agree on nothing."""
        return self._last_step is not None

    @contextlib.contextmanager
    def saving(self) -> Iterator[None]:
        self._saving = True
        try:
            yield
        finally:
            self._saving = False
            self._last_step = self._monotonic()

    @contextlib.contextmanager
    def joining(self) -> Iterator[None]:
        """Around joining the process group: a SIGTERM meanwhile exits ``Exit.PREEMPTED`` at once."""
        self._joining = True
        try:
            yield
        finally:
            self._joining = False

    def stall_s(self) -> float:
        """3 x the longest step, with a floor (below): the first step only until there is another, as
        it waits for every peer to start (seconds more than a step on a multi-process run)."""
        return self.stall_timeout_s or max(3.0, 3 * (self._longest_since_s or self._first_step_s))

    def _watch(self) -> None:
        # The read end stays open until restore(): a second SIGTERM (a supervised trainer gets the
        # kubelet's and the supervisor's copy) must not find a closed pipe (EPIPE, a traceback).
        with os.fdopen(self._read, "rb", buffering=0) as wakeups:
            # The signal's byte (a byte per signal caught), or the handler's flag once the main
            # thread ran it: in place, a forked trainer's handler once ran and no byte came, and
            # the trainer then waited in jax.distributed.initialize for good (docs/measurements.md).
            while not self.requested:
                if not select.select([wakeups], [], [], POLL_S)[0]:
                    continue
                got = wakeups.read(64)
                if not got:  # restore() closed the pipe
                    return
                if signal.SIGTERM in got:
                    break
            signalled = self._monotonic()
            while not self._closed:
                if self._joining:
                    print(
                        "trainer: SIGTERM while joining the process group: nothing trained,"
                        f" exit {Exit.PREEMPTED}; the latest committed step stands",
                        flush=True,
                    )
                    sys.stderr.flush()
                    self._exit(Exit.PREEMPTED)  # os._exit: the main thread waits in C++
                    return
                self._sleep(0.1)
                if self._last_step is None or self._saving or self._closed:
                    continue
                idle = self._monotonic() - max(self._last_step, signalled)
                if idle > self.stall_s():
                    print(
                        f"trainer: no step finished for {idle:.1f} s after SIGTERM (a peer is gone?):"
                        f" exiting {Exit.STALLED} without a checkpoint; the latest committed step stands",
                        flush=True,
                    )
                    sys.stderr.flush()
                    self._exit(Exit.STALLED)  # os._exit: the main thread may be stuck in XLA
                    return

    def restore(self) -> None:
        """Put the previous handler back and stop the watchdog (the loop has returned)."""
        if self._closed:
            return
        signal.signal(signal.SIGTERM, self._previous)
        signal.set_wakeup_fd(self._previous_fd)
        self._closed = True  # only now may the watchdog close the read end
        os.close(self._write)
