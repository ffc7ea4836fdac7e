"""The in-place follower: with ``RESLICE_RESTART_MODE=in-place`` (``supervise_world``, docs/contract.md
"World (in-place restarts)") the pod outlives its trainers: this process follows the published worlds
(``trainer.elastic.world``, delivered by ``trainer.elastic.world_source``) and forks one child per
epoch, with that world's environment. Each child is forked as the one-shot supervisor forks its one
(``trainer.elastic.supervisor``: ``run_child``, its stderr through ``pass_through``, what it leaves
behind ended by ``end_strays``). This process has threads when it forks (the world source, the
previous child's stderr pump): none of them prints, logs or writes through ``sys.stderr``'s buffer
(the pump writes to file descriptor 2 directly), so no lock the child could need is held at the fork.

In place, the pod imports the trainer once: ``supervise_world`` runs the trainer's imports (JAX,
Flax, Orbax, Grain: most of a start-up on a loaded host; ``preload``, from ``trainer.__main__``)
before it starts any thread, and every child of every world is a fork of this process with those
imports done, so a new world costs a child only its mesh, restore and compile. What the imports did
to the environment (``import jax`` on a TPU host sets ``LIBTPU_INIT_ARGS`` and more) is in each
forked child's environment, as it would be had the child imported itself (``imports_replayed``).
A world with ``env`` of its own (variables the imports may read: ``JAX_*``) gets a fresh
interpreter instead: the forked child ``exec``s the trainer (``fresh``), which imports in that
world's environment. No JAX backend exists in this process, so no JAX thread is forked over.

One process holds a TPU host's chips at a time (libtpu's lock, ``LIBTPU_LOCKFILE``): each child is
started once no process holds it, and one that failed on it anyway is started again
(``_Follower``). The loop reads one event at a time and hands it to that event's handler
(``_Follower.on_world``, ``on_exited``, ``on_signal``, ...), which decides and acts.

Called by ``trainer.__main__`` (in place, even for a one-process world) and ``bench.tpu_handoff``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import queue
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NoReturn

from contract import envvars
from contract.exits import Exit
from trainer.elastic import peers, supervisor, world
from trainer.state import memdir

if TYPE_CHECKING:
    from trainer.elastic import world_source

# In the pod: how long to wait for a newer world after a child lost a peer (exit 43) before the pod
# itself exits 43. The controller acts on what it can see (a pool gone, a node NotReady, a pod
# failed); a peer that died where nothing reports it (a host rebooted within the node monitor's
# grace period) gives it nothing, and a world whose pods all wait would wait for good. The pod's 43
# is that report: JobSet restarts the slice, uncounted, and the controller starts a new world.
PEER_LOST_WAIT_S = 120.0
# One process holds a TPU host's chips at a time: libtpu takes a ``lockf`` on this file when its
# backend starts and keeps it until the process exits; a second process fails at once with
# LOCK_ERROR (it does not fall back to the CPU). The in-place supervisor starts a trainer once the
# lock is free (``_Follower.await_chip``), waiting up to CHIP_WAIT_S (``RESLICE_CHIP_WAIT_S`` in
# the pod), and starts one that still failed on it again (``_Follower.on_exited``), LOCK_RETRIES
# times in a row at most. ``RESLICE_LIBTPU_LOCKFILE``: another path (the tests' stand-in).
LIBTPU_LOCKFILE = "/tmp/libtpu_lockfile"
LOCK_ERROR = "Internal error when accessing libtpu multi-process lockfile"
CHIP_WAIT_S = 60.0
LOCK_RETRIES = 3


def imports_replayed(
    forked: Mapping[str, str], now: Mapping[str, str], env: Mapping[str, str]
) -> dict[str, str]:
    """`env` with what the pod's imports did to its environment (from `forked`, before them, to
    `now`) done again, as they would have done it to a child that imported itself with `env`.

    On a TPU host ``import jax`` runs ``cloud_tpu_init``, which sets ``LIBTPU_INIT_ARGS``,
    ``TPU_ML_PLATFORM``, the tensorstore stall timeouts and more, read later when the backend
    starts, in the world: a child forked into the world has them. They are set when absent
    (``setdefault``) or appended to: a variable the imports set or changed is taken as they left
    it unless the world's `env` has a value of its own for it (then it is kept, as ``setdefault``
    would keep it); one they removed is removed likewise. A world whose ``env`` has variables of
    its own gets a fresh interpreter, which imports in it (``_Follower.start``)."""
    out = dict(env)
    for key in forked.keys() | now.keys():
        before, after = forked.get(key), now.get(key)
        if before == after or out.get(key) != before:
            continue
        if after is None:
            out.pop(key, None)
        else:
            out[key] = after
    return out


class _Event(StrEnum):
    """What the in-place supervisor's loop hears about, one queue for all."""

    WORLD = "world"  # a world document (from the source's thread)
    PROBLEM = "problem"  # the source's trouble, for one log line
    EXITED = "exited"  # the child ended (from its waiter thread)
    RUNNING = "running"  # the child's first step ran (from its watcher thread)
    SIGNAL = "signal"  # SIGTERM or SIGINT to this process (already forwarded to the child)


class _Child:
    """One trainer child of the in-place supervisor: its pid, its world, its stderr pump."""

    def __init__(self, pid: int, of: world.World, pump: threading.Thread, tail: bytearray) -> None:
        self.pid, self.world, self.pump, self.tail = pid, of, pump, tail
        self.ended_at: float | None = None  # when this supervisor signalled it for a newer world
        # The slices of its world that a newer world says are lost (then it got SIGKILL, not SIGTERM).
        self.killed: tuple[str, ...] = ()
        self.running = False  # it reported its first step


def supervise_world(
    train: Callable[[], int],
    env: Mapping[str, str],
    source: world_source.Source | None = None,
    *,
    preload: Callable[[], None] | None = None,
    fresh: Callable[[Mapping[str, str]], NoReturn] | None = None,
) -> int:
    """``RESLICE_RESTART_MODE=in-place`` (docs/contract.md "World (in-place restarts)"): follow the
    published worlds and run ``train()`` in a forked child in each that includes this pod, with
    ``world.child_env``; return the exit code this process should have.

    A newer epoch ends the child (SIGTERM: it saves the step in flight and exits 42, or 43/143
    when a peer is gone; SIGKILL when the new world's ``lost`` names a slice of the child's world)
    and starts the next in the new world; a world that leaves this pod out, after one that had it,
    ends the child and returns 0. The child's 0 returns 0; its 43, its 42 (after this
    supervisor's own SIGTERM, or with no signal here at all: a peer's preemption stopped the
    world), its 143 after this supervisor's SIGTERM, or its end after this supervisor's SIGKILL,
    waits for the next epoch; any other code is returned. A SIGTERM to this process is forwarded
    and the child's code returned (42 when no child runs). One child at a time, and never one for
    an epoch at or below the last started. After a 43, or a 42 nobody here asked for, no newer
    world within ``RESLICE_PEER_LOST_WAIT_S`` returns 43. Each child starts once the chip is free
    (``_Follower.await_chip``); one that failed on the chip's lock before its first step is started
    again (``_Follower.on_exited``).

    ``preload()``: the trainer's imports, run here once, before any thread, so that every child
    forked after it has them done. ``fresh(env)``: replaces a forked child with a fresh trainer in
    `env` (``exec``), for a world with ``env`` of its own; None: such a world's child is forked too."""
    from trainer.elastic import world_source  # http.client imports ssl: not for the recreate mode's start-up

    env = dict(env)  # the pod's, as it started: `preload` may change os.environ
    try:
        me = world.me_from_env(env)
        src = source or world_source.from_env(env)
    except world.WorldError as e:
        print(f"trainer: {e}", file=sys.stderr, flush=True)
        return Exit.CONFIG
    follower = _Follower(train, env, me, fresh)

    def on_signal(signum: int, _frame: object) -> None:
        # The loop forwards it: a child forked a moment ago, not yet the follower's, gets it too.
        follower.terminating.append(signum)
        follower.events.put((_Event.SIGNAL, signum, time.time()))

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    supervisor.adopt_orphans()
    imported: tuple[dict[str, str], dict[str, str]] = ({}, {})  # os.environ before and after preload()
    if preload is not None:
        # Before any thread starts, so that no other thread holds a lock meanwhile. A fork while
        # another thread holds a module's import lock leaves it held in the child: the world
        # source's first connection imports lazily, and every fork comes after it delivered a
        # world, when that thread imports nothing more.
        before = dict(os.environ)
        preload()
        imported = (before, dict(os.environ))
    # RAM for the children's snapshots, which outlives each of them (trainer/state/snapshot.py).
    memory = memdir.make(env, me.slice_id, me.host)
    if memory is not None:
        follower.env = {**follower.env, envvars.MEMORY_DIR: str(memory)}
    follower.forked_env = imports_replayed(*imported, follower.env)
    src.start(
        lambda doc: follower.events.put((_Event.WORLD, doc, time.time())),
        lambda msg: follower.events.put((_Event.PROBLEM, msg, time.time())),
    )
    print(
        f"trainer: in-place: slice {me.slice_id} host {me.host} follows the worlds of {src.describe()}",
        flush=True,
    )
    try:
        return follower.follow()
    finally:
        src.stop()
        memdir.remove(memory)


# The line the follower prints when it starts a world's child (``_Follower.start``), as benchmarks
# and docs/contract.md read it.
_WORLD_LINE = re.compile(
    r"^trainer: world epoch (?P<epoch>\d+): process .*?; seen (?P<seen>[\d.]+) s after publication, "
    r"(?:the trainer of epoch \d+ exited -?\d+ (?P<ended>[\d.]+) s after (?P<signal>SIG[A-Z]+))?"
    r".*?, started (?P<started>[\d.]+) s after it was seen"
)


def world_line(line: str) -> dict | None:
    """{"epoch", "seen" (s after publication), "ended" (the previous child's end, s after this
    supervisor's signal, or None), "signal", "started" (s after the world was seen)} from a world
    line, or None for any other line (one of a world without a publication time, say)."""
    if not (m := _WORLD_LINE.match(line)):
        return None
    return {
        "epoch": int(m["epoch"]),
        "seen": float(m["seen"]),
        "ended": float(m["ended"]) if m["ended"] else None,
        "signal": m["signal"],
        "started": float(m["started"]),
    }


class _Follower:
    """The in-place supervisor's loop and what it knows: it reads one event, decides and acts in
    that event's handler (``on_world``, ``on_exited``, ...), each returning None to go on or the
    code this process exits with."""

    def __init__(
        self,
        train: Callable[[], int],
        env: Mapping[str, str],
        me: world.Me,
        fresh: Callable[[Mapping[str, str]], NoReturn] | None = None,
    ) -> None:
        self.train, self.env, self.me, self.fresh = train, env, me, fresh
        # The pod's environment with what its imports did to it: a forked child's base (`env`: a
        # fresh interpreter's, which imports itself). Set by supervise_world.
        self.forked_env: Mapping[str, str] = env
        self.events: queue.SimpleQueue[tuple[_Event, object, float]] = queue.SimpleQueue()  # put is reentrant
        self.terminating: list[int] = []  # the signals this process got (set in the handler, read here)
        self.child: _Child | None = None
        self.newest: world.World | None = None
        self.seen_at = 0.0
        self.started = -1  # the epoch of the last child started
        self.member = False  # a child of this pod ran in some world
        self.incarnation = 0  # the next child's number among the pod's children (envvars.INCARNATION)
        self.ended = "no trainer before"  # how the previous child ended, for the next epoch's log line
        self.failed: int | None = None  # the exit code once the running child has ended (a bad world)
        self.lost_since: float | None = None  # monotonic time the last child exited 43, until the next starts
        # What the pod exits with when no newer world comes after that (on_tick): 43, or a child's
        # own code when only a newer world would have shown its failure to be a lost peer's doing.
        self.lost_code: int = Exit.PEER_LOST
        self.not_mine = -1  # the last epoch not joined because it is of another attempt of this slice
        self.patience = PEER_LOST_WAIT_S
        self.bound = world.PEER_LOST_MAX_WAIT_S  # RESLICE_PEER_LOST_MAX_WAIT_S: however long it beats
        # The controller's latest world heartbeat, and when (monotonic) this pod saw it change.
        self.beat: float | None = None
        self.beat_seen: float | None = None
        self.lockfile = env.get(envvars.LIBTPU_LOCKFILE) or LIBTPU_LOCKFILE
        self.chip_wait = CHIP_WAIT_S
        self.lock_retries = 0  # children in a row that failed on the chip's lock before a step
        self.retry = False  # start the newest world again: its child failed on the chip's lock

    def follow(self) -> int:
        """Read, decide, act, until a handler returns the code to exit with."""
        if (code := self._read_waits()) is not None:
            return code
        handlers: dict[_Event, Callable[[Any, float], int | None]] = {
            _Event.WORLD: self.on_world,
            _Event.PROBLEM: self.on_problem,
            _Event.EXITED: self.on_exited,
            _Event.RUNNING: self.on_running,
            _Event.SIGNAL: self.on_signal,
        }
        while True:
            if (code := self.on_tick()) is not None:
                return code
            try:
                kind, what, at = self.events.get(timeout=1.0)  # a timeout lets signal handlers run
            except queue.Empty:
                continue
            if (code := handlers[kind](what, at)) is not None:
                return code

    def _read_waits(self) -> int | None:
        """The pod's waits (``RESLICE_PEER_LOST_WAIT_S``, ``RESLICE_PEER_LOST_MAX_WAIT_S``,
        ``RESLICE_CHIP_WAIT_S``): one line and
        ``Exit.CONFIG`` for one that is not seconds > 0."""
        for key, default, attr in ((envvars.PEER_LOST_WAIT_S, PEER_LOST_WAIT_S, "patience"),
                                   (envvars.PEER_LOST_MAX_WAIT_S, world.PEER_LOST_MAX_WAIT_S, "bound"),
                                   (envvars.CHIP_WAIT_S, CHIP_WAIT_S, "chip_wait")):  # fmt: skip
            try:
                value = float(self.env.get(key) or default)
            except ValueError:
                value = -1.0
            if not value > 0:
                print(
                    f"trainer: {key}={self.env.get(key)!r}: expected seconds > 0", file=sys.stderr, flush=True
                )
                return Exit.CONFIG
            setattr(self, attr, value)
        return None

    # The events, one handler each.

    def on_tick(self) -> int | None:
        """Before each read: no newer world long after a lost peer ends the pod with 43 — past
        ``RESLICE_PEER_LOST_WAIT_S`` unless the controller's heartbeat says it is at work on one
        (``world.keep_waiting``)."""
        if self.lost_since is None or self.child is not None:
            return None
        now = time.monotonic()
        beat_age = None if self.beat_seen is None else now - self.beat_seen
        if world.keep_waiting(now - self.lost_since, self.patience, beat_age, self.bound):
            return None
        peer = self.lost_code == Exit.PEER_LOST
        after = "a peer was lost or preempted" if peer else "its collectives' transport aborted"
        print(
            f"trainer: no world newer than epoch {self.started} {now - self.lost_since:.0f} s after"
            f" {after} (the controller's heartbeat {'stale' if beat_age is not None else 'absent'},"
            f" wait {self.patience:.0f} s, at most {self.bound:.0f} s): exit {self.lost_code}"
            f" ({'the slice restarts' if peer else 'its own failure'})",
            flush=True,
        )
        return self.lost_code

    def on_running(self, pid: int, _at: float) -> int | None:
        """The child's first step ran (a failure on the chip's lock is no longer a reason to retry)."""
        if self.child is not None and pid == self.child.pid:
            self.child.running = True
        return None

    def on_problem(self, msg: str, _at: float) -> int | None:
        print(f"trainer: {msg}", file=sys.stderr, flush=True)
        return None

    def on_signal(self, signum: int, _at: float) -> int | None:
        """SIGTERM or SIGINT to the pod: the child gets it (and its code is the pod's); none: 42."""
        if self.child is None:
            print(
                f"trainer: signal {signum} with no trainer running: nothing to save, exit {Exit.PREEMPTED}",
                flush=True,
            )
            return Exit.PREEMPTED
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.child.pid, signum)
        return None

    def on_world(self, doc: Any, at: float) -> int | None:
        """A world document: a newer epoch ends the running child, or starts one when none runs."""
        try:
            w = world.parse(doc, world.env_allowed(self.env))
        except world.WorldError as e:
            print(f"trainer: {e}", file=sys.stderr, flush=True)
            if self.child is None:
                return Exit.CONFIG
            # The trainer saves the step in flight first; then the pod fails with exit 2.
            self.failed = Exit.CONFIG
            if self.child.ended_at is None and not self.terminating:
                self.child.ended_at = time.time()
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.child.pid, signal.SIGTERM)
            return None
        fresh = w.heartbeat is not None and w.heartbeat != self.beat
        if fresh and (self.newest is None or w.epoch >= self.newest.epoch):
            self.beat, self.beat_seen = w.heartbeat, time.monotonic()  # the controller is at work on it
        if self.newest is not None and w.epoch <= self.newest.epoch:
            if w.epoch < self.newest.epoch:
                print(
                    f"trainer: world epoch {w.epoch} ignored: epoch {self.newest.epoch} is newer", flush=True
                )
            return None
        self.newest, self.seen_at = w, at
        if self.child is not None:
            self.end_child(w)
            return None
        return self.start()

    def on_exited(self, what: tuple[int, int], _at: float) -> int | None:
        """The child ended: wait for the next world, start it, or exit with its code."""
        pid, returncode = what
        child = self.child
        if child is None or pid != child.pid:
            return None
        self.child = None
        # See supervisor.supervise(): a leftover loader worker holds the pipe until it ends. A killed
        # child's tail says nothing more (no fate-sharing abort).
        supervisor.end_strays(keep=())
        child.pump.join(timeout=0.1 if child.killed else 2.0)
        tail = bytes(child.tail).decode(errors="replace")
        code = peers.supervised_exit(returncode, tail)
        signalled = "SIGKILL" if child.killed else "SIGTERM"
        took = f" {time.time() - child.ended_at:.3f} s after {signalled}" if child.ended_at else ""
        self.ended = f"the trainer of epoch {child.world.epoch} exited {code}{took}"
        if child.killed:
            self.ended += f" (slice(s) {', '.join(child.killed)} of its world lost)"
        if self.terminating or code == Exit.FINISHED:
            return code
        if self.failed is not None:
            print(
                f"trainer: {self.ended}; exit {self.failed} for the world that could not be read", flush=True
            )
            return self.failed
        if self._lost_the_chip(child, code, tail):
            return self.start()
        peer_lost = code == Exit.PEER_LOST
        # Gloo's transport threw from its own thread (std::terminate): a peer that died mid-collective
        # does this too, with nothing to tell it from a bug but the newer world the controller then
        # publishes. Waited for as after a lost peer; with none, the pod fails with the child's code.
        aborted = peers.transport_aborted(returncode, tail)
        # A 42 that neither this process nor a signal to it asked for: a peer's SIGTERM (its
        # slice preempted) stopped the world at a step boundary, the SIGTERM flags being
        # combined every step, and every process saved. This pod was not preempted: it waits
        # for the world without that slice (or with it back), as after a lost peer, instead of
        # exiting 42 and having its slice's JobSet recreate its pods.
        peer_stopped = code == Exit.PREEMPTED and child.ended_at is None
        asked = child.ended_at is not None and (bool(child.killed) or code in (Exit.PREEMPTED, Exit.STALLED))
        if not (peer_lost or peer_stopped or aborted or asked):
            print(f"trainer: {self.ended}: exit {code}", flush=True)
            return code
        if (next_code := self.start()) is not None:
            return next_code
        if self.child is None:
            if peer_stopped:
                self.ended += " (a peer's preemption stopped its world; this pod was not signalled)"
            if aborted:
                self.ended += " (Gloo's transport aborted it)"
            print(f"trainer: {self.ended}; waiting for a world newer than epoch {self.started}", flush=True)
            if peer_lost or peer_stopped or aborted:
                self.lost_since = time.monotonic()
                self.lost_code = code if aborted else Exit.PEER_LOST
        return None

    def _lost_the_chip(self, child: _Child, code: int, tail: str) -> bool:
        """Whether `child` failed, before its first step, because another process held the chip
        (libtpu's lock): then its world is started again, ``LOCK_RETRIES`` times in a row at most."""
        if code in (Exit.FINISHED, Exit.CONFIG) or child.running or LOCK_ERROR not in tail:
            return False
        if self.lock_retries >= LOCK_RETRIES:
            print(f"trainer: the chip's lock failed {self.lock_retries + 1} trainers in a row", flush=True)
            return False
        self.lock_retries += 1
        self.retry = True
        print(
            f"trainer: {self.ended}: another process held the chip (libtpu's lock {self.lockfile});"
            f" starting epoch {child.world.epoch}'s trainer again ({self.lock_retries} of {LOCK_RETRIES})",
            flush=True,
        )
        return True

    # What the handlers do.

    def end_child(self, w: world.World) -> None:
        """End the running child for the newer world `w`: SIGTERM (it saves the step in flight),
        or SIGKILL when `w` says a slice of the child's world is lost: its hosts are gone, so the
        step in flight can never finish and there is nothing newer than the last snapshot to save
        (the SIGTERM would only wait for the trainer's stall watchdog). Also after a SIGTERM."""
        child = self.child
        if self.terminating or child is None:
            return
        doomed = tuple(s for s in child.world.slices if s in w.lost)
        if doomed and not child.killed:
            child.killed, child.ended_at = doomed, time.time()
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)
        elif child.ended_at is None:
            child.ended_at = time.time()
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGTERM)

    def start(self) -> int | None:
        """Start a child in the newest world when it is due: None, or the code to exit with."""
        newest, me = self.newest, self.me
        if newest is None or self.terminating or self.failed is not None:
            return None
        if newest.epoch <= self.started and not self.retry:
            return None
        position = newest.position(me)
        if position is None:
            if self.member:
                print(
                    f"trainer: world epoch {newest.epoch} leaves slice {me.slice_id} out"
                    f" (slices {list(newest.slices)}; {self.ended}): exit 0",
                    flush=True,
                )
                return Exit.FINISHED
            return None  # a pod of a slice not taking part yet: it waits for a world with it
        if (formed := newest.other_attempt(me)) is not None:
            if self.not_mine != newest.epoch:
                self.not_mine = newest.epoch
                print(
                    f"trainer: world epoch {newest.epoch} was decided for attempt {formed} of slice"
                    f" {me.slice_id}, and this pod is attempt {me.attempt}: waiting for a newer world",
                    flush=True,
                )
            return None
        # A world's own variables may be read by the imports: its child imports in them, afresh.
        fresh = self.fresh if newest.env else None
        try:
            child_env = world.child_env(newest, me, self.env if fresh is not None else self.forked_env)
        except world.WorldError as e:
            print(f"trainer: {e}", file=sys.stderr, flush=True)
            return Exit.CONFIG
        child_env[envvars.INCARNATION] = str(self.incarnation)
        self.await_chip()
        if self.terminating:  # a SIGTERM while it waited: the loop forwards it to nobody, exit 42
            return None
        child = _fork(self.train, newest, child_env, self.events, fresh)
        self.incarnation += 1
        if not self.retry:
            self.lock_retries = 0
        self.child, self.started, self.member, self.lost_since, self.retry = (
            child,
            newest.epoch,
            True,
            None,
            False,
        )
        pid = position * newest.hosts_per_slice + me.host
        published = (
            f"seen {self.seen_at - newest.published:.3f} s after publication, "
            if newest.published is not None
            else ""
        )
        print(
            f"trainer: world epoch {newest.epoch}: process {pid} of {newest.num_processes} on slices"
            f" {list(newest.slices)}, micro-batch {newest.micro_batch} x {newest.grad_accum} accum;"
            f" {published}{self.ended}, started {time.time() - self.seen_at:.3f} s after it was seen",
            flush=True,
        )
        return None

    def await_chip(self) -> None:
        """Before a child starts: wait, up to ``RESLICE_CHIP_WAIT_S``, until no process holds
        libtpu's lock (``chip_held``). The previous trainer released it when it exited, but what it
        left behind (a data loader's worker with a backend of its own, ended by ``supervisor.end_strays``
        in the background) or a process outside this pod may hold it still, and a trainer that
        finds it held fails at once rather than wait. No TPU: no lock file, no wait."""
        if not chip_held(self.lockfile):
            return
        t0 = time.monotonic()
        print(
            f"trainer: another process holds the chip (libtpu's lock {self.lockfile}):"
            f" waiting up to {self.chip_wait:.0f} s before the next trainer starts",
            flush=True,
        )
        while time.monotonic() - t0 < self.chip_wait and not self.terminating:
            time.sleep(0.05)
            if not chip_held(self.lockfile):
                print(f"trainer: the chip is free after {time.monotonic() - t0:.3f} s", flush=True)
                return
        if not self.terminating:
            print(
                f"trainer: the chip is still held after {self.chip_wait:.0f} s: starting anyway", flush=True
            )


def chip_held(path: str) -> bool:
    """Whether some process holds libtpu's lock on `path` (the lock a TPU process takes on its
    chips and keeps until it exits): a non-blocking ``lockf`` taken and released at once. False
    when there is no such file (no TPU process ran on this host) or it cannot be opened for
    writing (not this pod's to judge: the trainer reports the lock itself)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        return e.errno in (errno.EACCES, errno.EAGAIN)
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)  # a POSIX lock goes with its process's every descriptor of the file anyway


def _fork(
    train: Callable[[], int],
    of: world.World,
    env: Mapping[str, str],
    events: queue.SimpleQueue[tuple[_Event, object, float]],
    fresh: Callable[[Mapping[str, str]], NoReturn] | None = None,
) -> _Child:
    """Fork the child of world `of` with `env` (`fresh`: it execs a fresh trainer), its stderr
    pump, and threads that report its first step and its exit."""
    running_r, running_w = os.pipe()
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(running_r)
        supervisor.run_child(
            train, parent, read_end, write_end, {**env, supervisor.RUNNING_ENV: str(running_w)}, fresh
        )
    os.close(write_end)
    os.close(running_w)
    pump, tail = _watch(pid, read_end, running_r, events)
    return _Child(pid, of, pump, tail)


def _watch(
    pid: int, stderr: int, running: int, events: queue.SimpleQueue[tuple[_Event, object, float]]
) -> tuple[threading.Thread, bytearray]:
    """A child's threads: its stderr pump (started; returned with the tail it keeps), one that
    reports its first step (a byte on `running`), one that reports its exit."""
    tail = bytearray()
    pump = threading.Thread(
        target=supervisor.pass_through, args=(stderr, tail, True), name="stderr", daemon=True
    )
    pump.start()

    def first_step() -> None:
        try:
            got = os.read(running, 1)
        finally:
            os.close(running)
        if got:
            events.put((_Event.RUNNING, pid, time.time()))

    def reap() -> None:
        returncode = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        events.put((_Event.EXITED, (pid, returncode), time.time()))

    threading.Thread(target=first_step, name="first-step", daemon=True).start()
    threading.Thread(target=reap, name="reaper", daemon=True).start()
    return pump, tail
