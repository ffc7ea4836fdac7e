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
SIGKILL if this process dies first (``PR_SET_PDEATHSIG``). What a child that died without its own
exit path leaves behind (its Grain workers) is adopted here (``PR_SET_CHILD_SUBREAPER``) and ended
when the child's end is seen (``_end_strays``): in place the pod outlives many children.

With ``RESLICE_RESTART_MODE=in-place`` (``supervise_world``, docs/contract.md "World (in-place
restarts)") the pod outlives its trainers: this process follows the published worlds
(``trainer.elastic.world``, delivered by ``trainer.elastic.world_source``) and forks one child per epoch, with that
world's environment. It then has threads when it forks (the world source, the previous child's
stderr pump): none of them prints, logs or writes through ``sys.stderr``'s buffer (the pump writes
to file descriptor 2 directly), so no lock the child could need is held at the fork.

In place, the next child is forked ahead of its world, as a *standby*: it goes through the
trainer's imports (JAX, Flax, Orbax, Grain: most of a start-up on a loaded host) and then blocks on
a pipe (``await_world``) until the supervisor hands it the environment of the world it is to train
in, at the moment the supervisor would otherwise have forked it, so it never sees any other world
than the newest at that moment; a new world then costs a child only its mesh, restore and compile.
One standby at a time, forked when the pod starts (before its first world, and before the world
source's thread: see ``supervise_world``) and again once the running child reports its first step
(``notify_running``), so that it never competes with a child's start-up, or while this process
waits for a world with no child. It holds no state: it is killed when the supervisor returns (and by
``PR_SET_PDEATHSIG`` should the supervisor die), a SIGTERM kills it (the default disposition:
it has not trained), and one that exits on its own turns standbys off for the pod's life (the
next child is forked as before). A world with ``env`` of its own is forked as before (those
variables may concern the imports), and ``RESLICE_STANDBY=0`` in the pod turns standbys off.
Its cost is one more process with the trainer's imports done (RSS: docs/contract.md).

Called by ``trainer.__main__``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Collection, Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NoReturn

from trainer.elastic import peers, world
from trainer.state import memdir

if TYPE_CHECKING:
    from trainer.elastic import world_source

CHILD_ENV = "RESLICE_TRAINER_CHILD"  # set in the child: it trains instead of supervising
# Set in an in-place pod's every child but its first: its start-up began at its fork, not at the
# container's start (trainer.telemetry.startup.Timeline, which __main__ tells so).
RESTARTED_ENV = "RESLICE_TRAINER_RESTARTED"
# In a standby child: the file descriptor its world's environment arrives on (``await_world``).
STANDBY_ENV = "RESLICE_TRAINER_STANDBY_FD"
# In an in-place child: the file descriptor it writes one byte to after its first step.
RUNNING_ENV = "RESLICE_TRAINER_RUNNING_FD"
# In the pod: "0" turns standbys off.
STANDBY_SWITCH_ENV = "RESLICE_STANDBY"
# In the pod: how long to wait for a newer world after a child lost a peer (exit 43) before the pod
# itself exits 43. The controller acts on what it can see (a pool gone, a node NotReady, a pod
# failed); a peer that died where nothing reports it (a host rebooted within the node monitor's
# grace period) gives it nothing, and a world whose pods all wait would wait for good. The pod's 43
# is that report: JobSet restarts the slice, uncounted, and the controller starts a new world.
PEER_LOST_WAIT_ENV = "RESLICE_PEER_LOST_WAIT_S"
PEER_LOST_WAIT_S = 120.0
_TAIL = 64 * 1024
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
# How long a process an ended child left behind has after SIGTERM before SIGKILL (``_end_strays``).
STRAY_GRACE_S = 10.0


def await_world() -> float | None:
    """In a standby child (``STANDBY_ENV`` set), after the trainer's imports: block until the
    supervisor hands over the environment of the world to train in, make it this process's, and
    return the time the supervisor sent it. None in any other process. Exits 0 without a word if
    the supervisor is gone (the pipe closed)."""
    raw = os.environ.get(STANDBY_ENV)
    if not raw:
        return None
    fd, buf = int(raw), b""
    while not buf.endswith(b"\n"):
        chunk = os.read(fd, 65536)
        if not chunk:
            os._exit(0)
        buf += chunk
    os.close(fd)
    msg = json.loads(buf)
    os.environ.clear()
    os.environ.update(msg["env"])
    os.environ[CHILD_ENV] = "1"
    return float(msg["at"])


def is_standby() -> bool:
    return bool(os.environ.get(STANDBY_ENV))


def notify_running() -> None:
    """In an in-place child: tell the supervisor its first step ran (it may fork the next standby
    now without slowing this child's start-up). Once; nothing elsewhere."""
    raw = os.environ.pop(RUNNING_ENV, None)
    if raw:
        with contextlib.suppress(OSError, ValueError):
            os.write(int(raw), b"1")
            os.close(int(raw))


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _adopt_orphans() -> None:
    """Make this process the reaper of its descendants' orphans (``PR_SET_CHILD_SUBREAPER``; as a
    container's PID 1 it is already): a trainer child that dies without its own exit path (SIGKILL,
    JAX's fate-sharing abort) leaves its data loader's workers behind, which then become this
    process's children, for ``_end_strays``."""
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


def _end_strays(keep: Collection[int]) -> None:
    """SIGTERM every child of this process but `keep` (the running trainer, the standby) and reap
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


def _pass_through(read_end: int, tail: bytearray, raw: bool = False) -> None:
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


def _child(
    train: Callable[[], int],
    parent: int,
    read_end: int,
    write_end: int,
    env: Mapping[str, str] | None = None,
) -> NoReturn:
    """The forked child: stderr into the pipe, the signals' defaults back, its environment (`env`,
    a world's; else the pod's), then train and exit."""
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
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
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
    _adopt_orphans()
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
    # A data-loader worker the child left behind holds the pipe open until it ends: what the child
    # wrote is in it already, so a short wait reads it all.
    _end_strays(keep=())
    pump.join(timeout=2.0)
    code = peers.supervised_exit(returncode, bytes(tail).decode(errors="replace"))
    if code == peers.EXIT_PEER_LOST and returncode < 0:
        print(
            f"trainer: JAX's coordination service ended this process because a peer is lost:"
            f" exit {peers.EXIT_PEER_LOST}; the latest committed step stands",
            flush=True,
        )
    return code


class _Event(StrEnum):
    """What the in-place supervisor's loop hears about, one queue for all."""

    WORLD = "world"  # a world document (from the source's thread)
    PROBLEM = "problem"  # the source's trouble, for one log line
    EXITED = "exited"  # the child (or the standby) ended (from its waiter thread)
    RUNNING = "running"  # the child's first step ran (from its watcher thread)
    SIGNAL = "signal"  # SIGTERM or SIGINT to this process (already forwarded to the child)


class _Child:
    """One trainer child of the in-place supervisor: its pid, its world, its stderr pump."""

    def __init__(self, pid: int, of: world.World, pump: threading.Thread, tail: bytearray) -> None:
        self.pid, self.world, self.pump, self.tail = pid, of, pump, tail
        self.ended_at: float | None = None  # when this supervisor signalled it for a newer world
        # The slices of its world that a newer world says are lost (then it got SIGKILL, not SIGTERM).
        self.killed: tuple[str, ...] = ()


class _Standby:
    """A child forked ahead of its world: ``send`` hands it one (``await_world`` reads it)."""

    def __init__(self, pid: int, send: int, running_fd: int, pump: threading.Thread, tail: bytearray) -> None:
        self.pid, self.send, self.running_fd, self.pump, self.tail = pid, send, running_fd, pump, tail


def supervise_world(
    train: Callable[[], int],
    env: Mapping[str, str],
    source: world_source.Source | None = None,
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
    world within ``RESLICE_PEER_LOST_WAIT_S`` returns 43."""
    from trainer.elastic import world_source  # http.client imports ssl: not for the recreate mode's start-up

    try:
        me = world.me_from_env(env)
        src = source or world_source.from_env(env)
    except world.WorldError as e:
        print(f"trainer: {e}", file=sys.stderr, flush=True)
        return world.EXIT_CONFIG
    events: queue.SimpleQueue[tuple[_Event, object, float]] = queue.SimpleQueue()  # put is reentrant
    state: dict[str, Any] = {"child": None, "standby": None}
    terminating: list[int] = []  # the signals this process got (set in the handler, read by the loop)

    def on_signal(signum: int, _frame: object) -> None:
        # The loop forwards it: a child forked a moment ago, not yet in `state`, gets it too.
        terminating.append(signum)
        events.put((_Event.SIGNAL, signum, time.time()))

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    _adopt_orphans()
    # RAM for the children's snapshots, which outlives each of them (trainer/state/snapshot.py).
    memory = memdir.make(env, me.slice_id, me.host)
    if memory is not None:
        env = {**env, memdir.MEMORY_DIR_ENV: str(memory)}
    if env.get(STANDBY_SWITCH_ENV, "1") != "0":
        # Before the world source's thread starts: its first connection imports modules lazily
        # (the idna codec for a host name), and a fork while another thread holds a module's import
        # lock leaves that lock held for good in the child, whose imports then wait forever. Later
        # forks come after the first world was delivered, when that thread imports nothing more.
        with contextlib.suppress(OSError):  # no process left for it: the first child is forked
            state["standby"] = _spawn_standby(train, env, events)
    src.start(
        lambda doc: events.put((_Event.WORLD, doc, time.time())),
        lambda msg: events.put((_Event.PROBLEM, msg, time.time())),
    )
    print(
        f"trainer: in-place: slice {me.slice_id} host {me.host} follows the worlds of {src.describe()}",
        flush=True,
    )
    try:
        return _follow(train, env, me, events, state, terminating)
    finally:
        src.stop()
        if (standby := state["standby"]) is not None:  # nothing to save: it never had a world
            with contextlib.suppress(ProcessLookupError):
                os.kill(standby.pid, signal.SIGKILL)
        memdir.remove(memory)


def _follow(
    train: Callable[[], int],
    env: Mapping[str, str],
    me: world.Me,
    events: queue.SimpleQueue[tuple[_Event, object, float]],
    state: dict[str, Any],
    terminating: list[int],
) -> int:
    newest: world.World | None = None
    seen_at = 0.0
    started = -1  # the epoch of the last child started
    member = False  # a child of this pod ran in some world
    ended = "no trainer before"  # how the previous child ended, for the next epoch's log line
    failed: int | None = None  # the exit code once the running child has ended (a bad world)
    standbys = env.get(STANDBY_SWITCH_ENV, "1") != "0"
    lost_since: float | None = None  # monotonic time the last child exited 43, until the next starts
    waits = {}
    for name, default in (
        (PEER_LOST_WAIT_ENV, PEER_LOST_WAIT_S),
        (world.PEER_LOST_MAX_WAIT_ENV, world.PEER_LOST_MAX_WAIT_S),
    ):
        try:
            waits[name] = float(env.get(name) or default)
        except ValueError:
            waits[name] = -1.0
        if not waits[name] > 0:
            print(f"trainer: {name}={env.get(name)!r}: expected seconds > 0", file=sys.stderr, flush=True)
            return world.EXIT_CONFIG
    patience, bound = waits[PEER_LOST_WAIT_ENV], waits[world.PEER_LOST_MAX_WAIT_ENV]
    # The controller's latest heartbeat, and when (monotonic) this supervisor saw it change.
    beat: float | None = None
    beat_seen: float | None = None

    def standby() -> None:
        """Fork the next child ahead of its world, unless one waits already (or they are off)."""
        nonlocal standbys
        if not standbys or state["standby"] is not None or terminating or failed is not None:
            return
        try:
            state["standby"] = _spawn_standby(train, env, events)
        except OSError as e:  # no memory or no process left for it: fork when the world comes
            standbys = False
            print(
                f"trainer: no standby trainer ({e}); the next trainers are forked when their world comes",
                flush=True,
            )

    def end(child: _Child, w: world.World) -> None:
        """End the running child for the newer world `w`: SIGTERM (it saves the step in flight),
        or SIGKILL when `w` says a slice of the child's world is lost: its hosts are gone, so the
        step in flight can never finish and there is nothing newer than the last snapshot to save
        (the SIGTERM would only wait for the trainer's stall watchdog). Also after a SIGTERM."""
        if terminating:
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

    def start() -> int | None:
        """Start a child in `newest` when it is due: None, or the code to exit with."""
        nonlocal started, member, lost_since
        if newest is None or newest.epoch <= started or terminating or failed is not None:
            return None
        position = newest.position(me)
        if position is None:
            if member:
                print(
                    f"trainer: world epoch {newest.epoch} leaves slice {me.slice_id} out"
                    f" (slices {list(newest.slices)}; {ended}): exit 0",
                    flush=True,
                )
                return 0
            return None  # a pod of a slice not taking part yet: it waits for a world with it
        try:
            child_env = world.child_env(newest, me, env)
        except world.WorldError as e:
            print(f"trainer: {e}", file=sys.stderr, flush=True)
            return world.EXIT_CONFIG
        if member:
            child_env[RESTARTED_ENV] = "1"
        child = None
        if (ready := state["standby"]) is not None and not newest.env:
            state["standby"] = None
            child = _activate(ready, newest, child_env)  # None: it died meanwhile (its exit is ignored)
        child = child or _fork(train, newest, child_env, events)
        state["child"], started, member, lost_since = child, newest.epoch, True, None
        pid = position * newest.hosts_per_slice + me.host
        published = (
            f"seen {seen_at - newest.published:.3f} s after publication, "
            if newest.published is not None
            else ""
        )
        print(
            f"trainer: world epoch {newest.epoch}: process {pid} of {newest.num_processes} on slices"
            f" {list(newest.slices)}, micro-batch {newest.micro_batch} x {newest.grad_accum} accum;"
            f" {published}{ended}, started {time.time() - seen_at:.3f} s after it was seen",
            flush=True,
        )
        return None

    while True:
        now = time.monotonic()
        if (
            lost_since is not None
            and state["child"] is None
            and not world.keep_waiting(
                now - lost_since, patience, None if beat_seen is None else now - beat_seen, bound
            )
        ):
            print(
                f"trainer: no world newer than epoch {started} {now - lost_since:.0f} s after a peer was lost"
                f" or preempted (the controller's heartbeat {'stale' if beat_seen is not None else 'absent'},"
                f" wait {patience:.0f} s, at most {bound:.0f} s):"
                f" exit {peers.EXIT_PEER_LOST} (the slice restarts)",
                flush=True,
            )
            return peers.EXIT_PEER_LOST
        try:
            kind, what, at = events.get(timeout=1.0)  # a timeout lets signal handlers run
        except queue.Empty:
            continue
        child = state["child"]
        if kind is _Event.RUNNING:
            if child is not None and what == child.pid:
                standby()
            continue
        if kind is _Event.PROBLEM:
            print(f"trainer: {what}", file=sys.stderr, flush=True)
        elif kind is _Event.SIGNAL:
            if child is None:
                print(
                    f"trainer: signal {what} with no trainer running: nothing to save,"
                    f" exit {world.EXIT_PREEMPTED}",
                    flush=True,
                )
                return world.EXIT_PREEMPTED
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, what)  # type: ignore[arg-type]
        elif kind is _Event.WORLD:
            try:
                w = world.parse(what, world.env_allowed(env))  # type: ignore[arg-type]
            except world.WorldError as e:
                print(f"trainer: {e}", file=sys.stderr, flush=True)
                if child is None:
                    return world.EXIT_CONFIG
                # The trainer saves the step in flight first; then the pod fails with exit 2.
                failed = world.EXIT_CONFIG
                if child.ended_at is None and not terminating:
                    child.ended_at = time.time()
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child.pid, signal.SIGTERM)
                continue
            if (
                w.heartbeat is not None
                and w.heartbeat != beat
                and (newest is None or w.epoch >= newest.epoch)
            ):
                beat, beat_seen = w.heartbeat, time.monotonic()  # the controller is at work on it
            if newest is not None and w.epoch <= newest.epoch:
                if w.epoch < newest.epoch:
                    print(
                        f"trainer: world epoch {w.epoch} ignored: epoch {newest.epoch} is newer", flush=True
                    )
                continue
            newest, seen_at = w, at
            if child is not None:
                end(child, w)
            elif (code := start()) is not None:
                return code
        elif kind is _Event.EXITED:
            pid, returncode = what  # type: ignore[misc]
            if (waiting := state["standby"]) is not None and pid == waiting.pid:
                state["standby"], standbys = None, False
                os.close(waiting.send)
                waiting.pump.join(timeout=2.0)
                if not terminating:  # a SIGTERM to the pod's process group ends a standby too
                    print(
                        f"trainer: the standby trainer exited {returncode} before its world;"
                        " the next trainers are forked when their world comes",
                        flush=True,
                    )
                continue
            if child is None or pid != child.pid:  # a standby that died as it was handed its world
                continue
            state["child"] = None
            # See supervise(): a leftover loader worker holds the pipe until it ends. A killed
            # child's tail says nothing more (no fate-sharing abort).
            _end_strays(keep=[s.pid] if (s := state["standby"]) is not None else [])
            child.pump.join(timeout=0.1 if child.killed else 2.0)
            code = peers.supervised_exit(returncode, bytes(child.tail).decode(errors="replace"))
            signalled = "SIGKILL" if child.killed else "SIGTERM"
            took = f" {time.time() - child.ended_at:.3f} s after {signalled}" if child.ended_at else ""
            ended = f"the trainer of epoch {child.world.epoch} exited {code}{took}"
            if child.killed:
                ended += f" (slice(s) {', '.join(child.killed)} of its world lost)"
            if terminating or code == 0:
                return code
            if failed is not None:
                print(f"trainer: {ended}; exit {failed} for the world that could not be read", flush=True)
                return failed
            peer_lost = code == peers.EXIT_PEER_LOST
            # A 42 that neither this process nor a signal to it asked for: a peer's SIGTERM (its
            # slice preempted) stopped the world at a step boundary, the SIGTERM flags being
            # combined every step, and every process saved. This pod was not preempted: it waits
            # for the world without that slice (or with it back), as after a lost peer, instead of
            # exiting 42 and having its slice's JobSet recreate its pods.
            peer_stopped = code == world.EXIT_PREEMPTED and child.ended_at is None
            if (
                peer_lost
                or peer_stopped
                or (
                    child.ended_at is not None
                    and (child.killed or code in (world.EXIT_PREEMPTED, 128 + signal.SIGTERM))
                )
            ):
                if (code := start()) is not None:
                    return code
                if state["child"] is None:
                    if peer_stopped:
                        ended += " (a peer's preemption stopped its world; this pod was not signalled)"
                    print(f"trainer: {ended}; waiting for a world newer than epoch {started}", flush=True)
                    if peer_lost or peer_stopped:
                        lost_since = time.monotonic()
                    standby()
            else:
                print(f"trainer: {ended}: exit {code}", flush=True)
                return code


def _fork(
    train: Callable[[], int],
    of: world.World,
    env: Mapping[str, str],
    events: queue.SimpleQueue[tuple[_Event, object, float]],
) -> _Child:
    """Fork the child of world `of` with `env`, its stderr pump, and threads that report its
    first step and its exit."""
    running_r, running_w = os.pipe()
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(running_r)
        _child(train, parent, read_end, write_end, {**env, RUNNING_ENV: str(running_w)})
    os.close(write_end)
    os.close(running_w)
    pump, tail = _watch(pid, read_end, running_r, events)
    return _Child(pid, of, pump, tail)


def _spawn_standby(
    train: Callable[[], int], env: Mapping[str, str], events: queue.SimpleQueue[tuple[_Event, object, float]]
) -> _Standby:
    """Fork a standby child with the pod's environment: it imports, then waits in ``await_world``."""
    send_r, send_w = os.pipe()
    running_r, running_w = os.pipe()
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(send_w)
        os.close(running_r)
        _child(train, parent, read_end, write_end, {**env, STANDBY_ENV: str(send_r)})
    for fd in (send_r, running_w, write_end):
        os.close(fd)
    pump, tail = _watch(pid, read_end, running_r, events)
    return _Standby(pid, send_w, running_w, pump, tail)


def _activate(ready: _Standby, of: world.World, env: Mapping[str, str]) -> _Child | None:
    """Hand `ready` the environment of world `of`: it trains from here on as that world's child.
    None if it is gone (the caller forks instead)."""
    msg = json.dumps({"env": {**env, RUNNING_ENV: str(ready.running_fd)}, "at": time.time()}).encode()
    view = memoryview(msg + b"\n")
    try:
        while view:
            view = view[os.write(ready.send, view) :]
    except OSError:  # EPIPE: it exited before it read its world
        return None
    finally:
        os.close(ready.send)
    return _Child(ready.pid, of, ready.pump, ready.tail)


def _watch(
    pid: int, stderr: int, running: int, events: queue.SimpleQueue[tuple[_Event, object, float]]
) -> tuple[threading.Thread, bytearray]:
    """A child's threads: its stderr pump (started; returned with the tail it keeps), one that
    reports its first step (a byte on `running`), one that reports its exit."""
    tail = bytearray()
    pump = threading.Thread(target=_pass_through, args=(stderr, tail, True), name="stderr", daemon=True)
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
