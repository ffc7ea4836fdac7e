"""The SIGTERM watchdog (trainer.elastic.watchdog.Preemption) on a fake clock, in this process with a real
SIGTERM and wakeup fd: a step that never finishes after a SIGTERM ends the process with 143 after
the stall timeout; a healthy loop, a save in progress, or a SIGTERM before the first step do not."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest

from contract.exits import Exit
from tests.support.fakeclock import FakeClock
from trainer.elastic.watchdog import Preemption


class Watched:
    """A Preemption on a fake clock whose exit is recorded instead of ending pytest."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.exits: list[int] = []
        self.exited = threading.Event()
        self.p = Preemption(self.clock.monotonic, self.clock.sleep, self._exit)

    def _exit(self, code: int) -> None:
        self.exits.append(code)
        self.exited.set()

    def sigterm(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        self.clock.wait_for_waiter()  # the watchdog has read the signal and watches the time

    def step(self, seconds: float) -> None:
        """Move the clock on and let the watchdog look at it once."""
        self.clock.step(seconds)
        for _ in range(1000):  # until it sleeps again, or has exited
            if self.p._closed or self.clock.has_waiter() or self.exited.wait(0.01):
                return
        raise AssertionError("the watchdog neither slept again nor exited")


@pytest.fixture
def watched() -> Iterator[Watched]:
    w = Watched()
    yield w
    w.p.restore()
    w.clock.step(1.0)  # wake the watchdog so that it sees restore() and ends
    w.p.watchdog.join(timeout=10)
    assert not w.p.watchdog.is_alive()


def test_a_step_that_never_finishes_after_sigterm_exits_143_after_the_stall_timeout(watched, capfd) -> None:
    watched.p.step_done(6.0)  # the first step waited for the peers to start
    watched.p.step_done(0.2)  # then steps have been finishing, the longest took 0.2 s
    watched.sigterm()  # the step in flight waits for a peer that is gone
    assert watched.p.requested
    watched.step(2.9)
    assert watched.exits == []  # max(3 s, 3 x 0.2 s) has not passed
    watched.step(0.2)
    assert watched.exited.wait(10) and watched.exits == [Exit.STALLED]  # not 3 x 6 s
    out = capfd.readouterr().out
    assert "no step finished for 3.1 s" in out and "without a checkpoint" in out


def test_steps_that_keep_finishing_and_a_long_save_are_not_stalls(watched, capfd) -> None:
    watched.p.step_done(0.2)
    watched.sigterm()
    for _ in range(12):  # steps keep finishing for 2.4 s
        watched.step(0.2)
        watched.p.step_done(0.2)
    with watched.p.saving():  # then the emergency save takes longer than the stall timeout
        for _ in range(4):
            watched.step(1.0)
    watched.step(2.9)  # the save counts as progress: the stall timeout starts again after it
    assert watched.exits == []
    watched.p.restore()  # the loop returns: the watchdog stops
    watched.step(10.0)
    watched.p.watchdog.join(timeout=10)
    assert not watched.p.watchdog.is_alive() and watched.exits == [] and watched.p.requested
    assert "no step finished" not in capfd.readouterr().out


def test_no_watchdog_before_the_first_step(watched) -> None:
    # Compiling a big model can take minutes: a SIGTERM then is not a stall.
    watched.sigterm()
    for _ in range(3):
        watched.step(100.0)
    assert watched.exits == [] and watched.p.requested


def test_a_second_sigterm_is_quiet(watched, capfd) -> None:
    # A supervised trainer gets two: the one sent to its process group, and the supervisor's copy.
    watched.sigterm()  # the watchdog has read the first one
    os.kill(os.getpid(), signal.SIGTERM)
    watched.step(0.5)
    watched.p.restore()
    assert watched.p.requested
    out, err = capfd.readouterr()
    assert out.count("trainer: SIGTERM") == 1, out
    assert "Exception ignored" not in err and "BrokenPipeError" not in err, err


def test_restore_puts_the_previous_handler_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    w = Watched()
    assert signal.getsignal(signal.SIGTERM) == w.p._handle
    w.p.restore()
    w.p.watchdog.join(timeout=10)  # closing the pipe ends a watchdog that never heard a signal
    assert signal.getsignal(signal.SIGTERM) == before and not w.p.watchdog.is_alive()


def test_a_sigterm_while_joining_the_group_exits_42_at_once(watched, capfd) -> None:
    # jax.distributed.initialize blocks in C++ for peers that will never come (an in-place world
    # superseded before it formed): the watchdog must not wait for a first step.
    with watched.p.joining():
        os.kill(os.getpid(), signal.SIGTERM)  # the watchdog exits without sleeping first
        assert watched.exited.wait(10) and watched.exits == [Exit.PREEMPTED]
    assert "while joining the process group" in capfd.readouterr().out


def test_a_sigterm_whose_wakeup_byte_never_came_still_exits_42_while_joining(watched, capfd) -> None:
    # Seen in place: a forked trainer's handler ran ("SIGTERM: finishing the step in flight") but
    # the watchdog's pipe got no byte, and the trainer waited in jax.distributed.initialize for good
    # (its stacks, docs/measurements.md). The watchdog also reads the handler's flag.
    ours = signal.set_wakeup_fd(-1)  # the signal's byte goes nowhere
    try:
        with watched.p.joining():
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, in the main thread
            assert watched.exited.wait(10) and watched.exits == [Exit.PREEMPTED]
    finally:
        signal.set_wakeup_fd(ours)
    assert "while joining the process group" in capfd.readouterr().out


def test_a_sigterm_before_joining_exits_42_once_joining_begins(watched) -> None:
    watched.sigterm()  # during the imports: the watchdog waits, the main thread goes on
    watched.step(5.0)
    assert watched.exits == []
    with watched.p.joining():
        watched.step(0.1)
        assert watched.exited.wait(10) and watched.exits == [Exit.PREEMPTED]


def test_the_test_hooks_sleep_is_cut_short_by_a_sigterm() -> None:
    """trainer.loop's train.debug_step_pause_s and debug_start_delay_s: a whole sleep unless a
    SIGTERM's flag is raised, then back within one poll."""
    import time
    from types import SimpleNamespace

    from trainer.loop import _sleep_unless_preempted

    flag = SimpleNamespace(requested=False)
    t0 = time.monotonic()
    _sleep_unless_preempted(0.3, flag)  # type: ignore[arg-type]
    assert 0.3 <= time.monotonic() - t0 < 1.0
    threading.Timer(0.2, lambda: setattr(flag, "requested", True)).start()
    t0 = time.monotonic()
    _sleep_unless_preempted(30.0, flag)  # type: ignore[arg-type]
    assert 0.2 <= time.monotonic() - t0 < 1.0
