"""Multi-process setup from the contract environment (docs/contract.md).

``RESLICE_COORDINATOR`` set: ``jax.distributed.initialize(coordinator, RESLICE_NUM_PROCESSES,
process_id)`` with process id = slice index × hosts per slice + completion index. Absent: a single
process, unless this is a multi-host Cloud TPU slice (``TPU_WORKER_HOSTNAMES`` lists several hosts
or ``MEGASCALE_NUM_SLICES`` > 1), where JAX's own cluster detection is used.

The heartbeat timeout decides how fast the survivors of a dead process give up (the launcher then
restarts the whole set): ``RESLICE_HEARTBEAT_TIMEOUT_S``, default JAX's own. The initialization
timeout is how long the first process waits for the last one to join: ``RESLICE_INIT_TIMEOUT_S``,
default ``INIT_TIMEOUT_S`` (JAX's default is short for hundreds of hosts whose pods start minutes
apart; see docs/contract.md). An in-place pod's later trainers (``RESLICE_INCARNATION`` > 0) join
within ``RESLICE_REJOIN_TIMEOUT_S`` (default ``REJOIN_TIMEOUT_S``) instead (``join_timeout``).

Before the first step every process waits at a barrier of JAX's coordination service
(``wait_for_peers``), with the initialization timeout: the first step's collectives set up Gloo's
communicators (on CPU), whose rendezvous gives up after a fixed timeout of its own, and a process
that compiled (or restored) faster than another would otherwise reach them that much earlier.
"""

from __future__ import annotations

import contextlib
import queue
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import jax
from orbax.checkpoint import multihost

from contract import envvars
from trainer.config import ConfigError
from trainer.elastic.supervisor import later_incarnation


@dataclass(frozen=True)
class Identity:
    process_id: int = 0
    num_processes: int = 1
    coordinator: str | None = None


def _int(env: Mapping[str, str], key: str, default: int) -> int:
    raw = env.get(key, "")
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not an integer") from None


def identity(env: Mapping[str, str]) -> Identity:
    coordinator = env.get(envvars.COORDINATOR) or None
    num = _int(env, envvars.NUM_PROCESSES, 1)
    pid = _int(env, envvars.SLICE_INDEX, 0) * _int(env, envvars.HOSTS_PER_SLICE, 1) + _int(
        env, envvars.JOB_COMPLETION_INDEX, 0
    )
    if num < 1 or not 0 <= pid < num:
        raise ConfigError(f"process id {pid} is outside [0, RESLICE_NUM_PROCESSES={num})")
    if num > 1 and coordinator is None:
        raise ConfigError(f"RESLICE_NUM_PROCESSES={num} needs RESLICE_COORDINATOR")
    return Identity(pid, num, coordinator)


def _tpu_multihost(env: Mapping[str, str]) -> bool:
    hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]
    return len(hosts) > 1 or _int(env, envvars.MEGASCALE_NUM_SLICES, 1) > 1


INIT_TIMEOUT_S = 900
# An in-place pod's later trainer joins a world whose pods all ran when the controller published it
# (a shrink, a grow once the new slices' pods run, a restart once every slice runs again): its
# peers are a fork away, not a pod start. A world that has not formed by then holds
# a pod that cannot take part (a host that rebooted under a pod the API still reads Running:
# docs/design.md, "A crashed host"), and JAX's initialization timeout ends the wait as a lost
# peer's: exit 43, after which the supervisor's own wait ends (trainer.elastic.follower).
REJOIN_TIMEOUT_S = 120


def joined() -> bool:
    """Whether this process joined a multi-process group (its exit then involves the peers): JAX's
    own answer, which also holds once a join began and failed half-way (the client exists)."""
    return jax.distributed.is_initialized()


def timeouts(env: Mapping[str, str]) -> tuple[int, int]:
    """(initialization, heartbeat) timeouts in seconds, from the contract environment."""
    init_timeout = _int(env, envvars.INIT_TIMEOUT_S, INIT_TIMEOUT_S)
    heartbeat = _int(env, envvars.HEARTBEAT_TIMEOUT_S, 100)
    if init_timeout < 1 or heartbeat < 1:
        raise ConfigError("RESLICE_INIT_TIMEOUT_S and RESLICE_HEARTBEAT_TIMEOUT_S must be >= 1 second")
    return init_timeout, heartbeat


def join_timeout(env: Mapping[str, str]) -> int:
    """How long ``initialize`` waits for the process group to form: the initialization timeout, or
    for an in-place pod's later trainer the shorter of it and ``RESLICE_REJOIN_TIMEOUT_S``."""
    init_timeout = timeouts(env)[0]
    if not later_incarnation(env):
        return init_timeout
    rejoin = _int(env, envvars.REJOIN_TIMEOUT_S, REJOIN_TIMEOUT_S)
    if rejoin < 1:
        raise ConfigError("RESLICE_REJOIN_TIMEOUT_S must be >= 1 second")
    return min(init_timeout, rejoin)


# The coordinator dial's pauses: the first ones short (process 0 is usually a few ms late), then
# growing by DIAL_FACTOR up to DIAL_CAP_S, each one jittered by DIAL_JITTER: every process of a
# world dials at once (3,072 on a 768-host slice x 4), and each dial of a name that does not resolve
# yet asks kube-dns again.
DIAL_FIRST_S, DIAL_FACTOR, DIAL_CAP_S, DIAL_JITTER = 0.02, 1.6, 1.0, 0.2


def dial_pauses(rng: random.Random) -> Iterator[float]:
    """The pauses between the coordinator dial's attempts: exponential backoff with jitter, so
    that thousands of processes neither dial nor ask the cluster's DNS in lock step."""
    pause = DIAL_FIRST_S
    while True:
        yield pause * rng.uniform(1 - DIAL_JITTER, 1 + DIAL_JITTER)
        pause = min(DIAL_CAP_S, pause * DIAL_FACTOR)


def await_coordinator(address: str, timeout_s: float, rng: random.Random | None = None) -> float:
    """Until ``address`` (host:port) accepts a TCP connection, or ``timeout_s``: the seconds waited.

    A JAX client that dials the coordination service before process 0 listens waits out gRPC's
    reconnect backoff (grpc/grpc doc/connection-backoff.md: a first pause, then growing), and
    process 0 waits with it, for every peer to register: a large share of every start-up whose
    process 0 came up a few ms late (docs/measurements.md, "Figures behind the code's constants").
    Dialing it with a plain socket first costs nothing; a host name that does not resolve yet
    (process 0's pod not created) is waited for the same way.
    The caller calls ``jax.distributed.initialize`` either way, which reports a real failure."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")  # an IPv6 literal, "[::1]:8490"
    t0 = time.monotonic()
    pauses = dial_pauses(rng or random.Random())
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=1.0):
                return time.monotonic() - t0
        except (OSError, ValueError):
            waited = time.monotonic() - t0
            if waited >= timeout_s:
                return waited
            time.sleep(min(next(pauses), timeout_s - waited))


def await_step(outputs: Any) -> None:
    """Until every local device's part of a step's ``outputs`` (a pytree of global arrays) is ready;
    raises the error of the first device whose part failed.

    When a peer process dies mid-collective, one local device's Gloo collective can fail
    (connection reset) while another's waits, with no timeout of its own, to receive from the
    failed one's rank: the two ranks live in this process, so their socket stays open. Blocking on
    the waiting device's buffer (``jax.device_get`` reads the first) would then hold this process
    until the coordination service's heartbeat timeout, nearly the whole of it. One thread per local
    device blocks on its buffer and the first failure is raised at once. (Polling ``is_ready`` in a
    tight loop instead made a four-process run on 2 cores much slower: docs/measurements.md, "Figures
    behind the code's constants".)"""
    first = jax.tree.leaves(outputs)[0]  # every output of a step comes from the same executions
    buffers = [shard.data for shard in first.addressable_shards]
    results: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
    for buf in buffers:
        _device_waiters.put((buf, results))
    while len(_device_waiters_started) < len(buffers):  # one waiter per buffer, kept for later steps
        thread = threading.Thread(target=_device_waiter, name="device-waiter", daemon=True)
        thread.start()
        _device_waiters_started.append(thread)
    for _ in buffers:
        error = results.get()
        if error is not None:
            raise error


_device_waiters: queue.SimpleQueue[tuple[Any, queue.SimpleQueue]] = queue.SimpleQueue()
_device_waiters_started: list[threading.Thread] = []


def _device_waiter() -> None:
    while True:
        buf, results = _device_waiters.get()
        try:
            buf.block_until_ready()
            results.put(None)
        except Exception as e:  # a failed execution raises its error here
            results.put(e)


def initialize(
    env: Mapping[str, str], joining: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
) -> Identity:
    """Join the process group (before anything touches the JAX backend). `joining`: around the
    wait for the peers, when there are any (trainer.elastic.watchdog.Preemption.joining)."""
    ident = identity(env)
    init_timeout, heartbeat = join_timeout(env), timeouts(env)[1]
    # JAX's preemption service would install its own SIGTERM handler over ours (trainer.elastic.watchdog.Preemption):
    # the loop agrees on the stopping step through the step's own outputs instead.
    jax.config.update("jax_enable_preemption_service", False)
    if ident.coordinator is not None and ident.num_processes > 1:
        with joining():
            waited = 0.0
            if ident.process_id != 0:  # process 0 starts the service itself
                waited = await_coordinator(ident.coordinator, init_timeout)
            if later_incarnation(env):  # a rejoin's timeout bounds the whole wait
                init_timeout = max(1, round(init_timeout - waited))
            jax.distributed.initialize(
                ident.coordinator,
                ident.num_processes,
                ident.process_id,
                initialization_timeout=init_timeout,
                heartbeat_timeout_seconds=heartbeat,
            )
    elif _tpu_multihost(env):
        with joining():
            jax.distributed.initialize(
                initialization_timeout=init_timeout, heartbeat_timeout_seconds=heartbeat
            )
        ident = Identity(jax.process_index(), jax.process_count(), None)
    return ident


def start_barrier_id(segment: int, attempt: int) -> str:
    """The start barrier of one start of the process group, by segment and restart attempt: a set
    restarted by JobSet (a new restart attempt) or a later segment never meets an earlier one's."""
    return f"reslice-first-step-segment-{segment}-attempt-{attempt}"


def wait_for_peers(
    barrier_id: str, timeout_s: float, interrupted: Callable[[], bool], poll_s: float = 0.1
) -> float | None:
    """Wait until every process of the group is at ``barrier_id``; the seconds waited (0 when this
    process is alone), or None as soon as ``interrupted()`` (a SIGTERM).

    The barrier is the coordination service's, not a collective (``multihost_utils``' barriers run
    one over Gloo, with its fixed rendezvous timeout). Orbax's exported ``get_barrier_sync_fn`` is a
    thin wrapper of the JAX client's ``wait_at_barrier``, which jax 0.10.2 does not expose publicly.
    That call blocks in C++ (without the GIL), where no Python signal handler runs, so it waits in
    a daemon thread while this thread watches ``interrupted``; an interrupted caller must exit
    without JAX's shutdown barrier, which would wait for the peers. A peer that dies meanwhile
    fails the barrier (its heartbeat timeout) and JAX's fate sharing aborts this process: a lost
    peer either way (trainer.elastic.peers, trainer.elastic.supervisor)."""
    if not joined():
        return 0.0
    sync = multihost.get_barrier_sync_fn()
    done, failed = threading.Event(), []

    def wait() -> None:
        try:
            sync(key=barrier_id, timeout_ms=int(timeout_s * 1000))
        except BaseException as e:  # handed to the main thread, which classifies it
            failed.append(e)
        finally:
            done.set()

    t0 = time.monotonic()
    threading.Thread(target=wait, name="start-barrier", daemon=True).start()
    while not done.wait(poll_s):
        if interrupted():
            return None
    if failed:
        raise failed[0]
    return time.monotonic() - t0
