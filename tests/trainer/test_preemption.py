"""The SIGTERM watchdog (trainer.Preemption) in a child process, without JAX: a step that never
finishes after a SIGTERM ends the process with 143; a healthy loop or a save in progress does not."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from tests.trainer.runs import ROOT

CHILD = """
import os, signal, sys, time
from trainer import Preemption
p = Preemption()
{body}
"""


def run_child(body: str, timeout: float = 30) -> tuple[int, str, float]:
    code = CHILD.format(body=textwrap.dedent(body).strip())
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    return done.returncode, done.stdout + done.stderr, time.monotonic() - t0


def test_a_step_that_never_finishes_after_sigterm_exits_143_after_the_stall_timeout() -> None:
    rc, out, took = run_child("""
        p.step_done(6.0)              # the first step waited for the peers to start
        p.step_done(0.2)              # then steps have been finishing, the longest took 0.2 s
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)                # the step in flight, waiting for a peer that is gone
        sys.exit(0)
    """)
    assert rc == 143, out
    assert "no step finished for 3." in out and "without a checkpoint" in out
    assert 3 <= took < 10  # max(3 s, 3 x 0.2 s): not 3 x 6 s, nor the 30 s the step would hang


def test_steps_that_keep_finishing_and_a_long_save_are_not_stalls() -> None:
    rc, out, _ = run_child("""
        p.step_done(0.2)
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(12):           # steps keep finishing for 2.4 s
            time.sleep(0.2)
            p.step_done(0.2)
        with p.saving():              # then the emergency save takes longer than the stall timeout
            time.sleep(4)
        p.restore()                   # the loop returns: the watchdog stops
        time.sleep(4)
        sys.exit(42 if p.requested else 1)
    """)
    assert rc == 42, out
    assert "no step finished" not in out


def test_no_watchdog_before_the_first_step() -> None:
    # Compiling a big model can take minutes: a SIGTERM then is not a stall.
    rc, out, _ = run_child("""
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(4)
        sys.exit(42)
    """)
    assert rc == 42, out


def test_a_second_sigterm_is_quiet() -> None:
    # A supervised trainer gets two: the one sent to its process group, and the supervisor's copy.
    rc, out, _ = run_child("""
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)               # the watchdog has read the first one
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)
        p.restore()
        sys.exit(42 if p.requested else 1)
    """)
    assert rc == 42, out
    assert "Exception ignored" not in out and "BrokenPipeError" not in out, out
