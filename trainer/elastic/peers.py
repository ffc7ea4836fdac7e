"""A lost peer: how a process of a multi-process run tells it from its own bug. Pure, no JAX.

A host that dies without a graceful shutdown (host error, auto-repair, SIGKILL) makes the other
processes of the segment fail in one of two ways (observed with jax 0.10.2 on CPU, docs/contract.md):

- a Python exception out of a collective or a coordination-service call, e.g.
  ``JaxRuntimeError: UNKNOWN: Gloo AllGather failed: [...pair.cc:538] Read error
  [127.0.0.1]:2976: Connection reset by peer`` (``peer_lost`` classifies these);
- JAX's fate sharing: the coordination-service client aborts the process from a C++ thread
  (LOG(FATAL), SIGABRT) with ``Terminating process because the JAX distributed service detected
  fatal errors`` — at once when process 0 (which hosts the service) is gone, after the heartbeat
  timeout otherwise, and when the cluster does not form within the initialization timeout. No
  Python runs before that abort; ``trainer.elastic.supervisor`` sees it from the parent process
  (``fate_shared``).

Either way the process exits ``Exit.PEER_LOST``: the renderer's failure policy restarts the JobSet
without counting it against ``maxRestarts``. Everything else (a genuine bug) still exits 1.

A third way is not told apart here: XLA:CPU's collectives (Gloo, on simulated hosts) may throw
from their transport thread when a peer dies mid-collective, an uncaught C++ exception and
SIGABRT (``terminate called after throwing an instance of 'gloo::EnforceNotMet'``, "Received data
size doesn't match expected size": seen when a rebooted host's process died under an in-place
world), which a collective mismatch in the program itself also prints. ``transport_aborted``
names it; the in-place supervisor waits for a newer world after it, as after a lost peer, and
without one the pod fails with the child's own code.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping

from contract import envvars
from contract.exits import Exit

# Where the failure comes from: the CPU collectives' transport, or the coordination service.
_SOURCES = ("gloo", "coordination service", "coordinationservice", "jax distributed service")
# What it says happened: the other end went away, stopped answering, or never came.
_GONE = (
    "connection reset",
    "connection closed",
    "connection refused",
    "broken pipe",
    "socket closed",
    "end of file",
    "unavailable",
    "heartbeat",
    "disconnected",
    "unhealthy",
    "barrier timed out",
    "barrier failed",
    "deadline_exceeded",
)
FATAL_MARKER = "Terminating process because the JAX distributed service detected fatal errors"
# What a trainer writes to stderr once its exit code can no longer change: its last step committed
# by every process (the run finished, or the step saved after a SIGTERM). Process 0, which hosts the
# coordination service, may then exit while another process still closes its checkpointer; that
# process's service client aborts it (FATAL_MARKER), which is the group ending, not a lost peer.
SETTLED = "trainer: exit {code} settled"
_SETTLED = re.compile(r"trainer: exit (\d+) settled")


def peer_lost(error: str) -> bool:
    """Whether an exception's text (``Type: message``, causes included) is a lost peer's signature:
    a distributed-runtime source and a peer-gone symptom together (a storage "connection refused"
    or a barrier in user code is neither)."""
    text = error.lower()
    return any(s in text for s in _SOURCES) and any(g in text for g in _GONE)


def error_text(exc: BaseException) -> str:
    """``Type: message`` of an exception and of its causes (never the traceback's source lines,
    whose comments could mention anything)."""
    parts, seen = [], set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        parts.append(f"{type(cur).__name__}: {cur}")
        cur = cur.__cause__ or cur.__context__
    return "\n".join(parts)


def fate_shared(returncode: int, stderr_tail: str) -> bool:
    """A child that JAX's coordination-service client aborted because another task failed."""
    return returncode == -signal.SIGABRT and FATAL_MARKER in stderr_tail


GLOO_ABORT = "terminate called after throwing an instance of 'gloo::"


def transport_aborted(returncode: int, stderr_tail: str) -> bool:
    """A child that an exception thrown in Gloo's transport ended (std::terminate, SIGABRT)."""
    return returncode == -signal.SIGABRT and GLOO_ABORT in stderr_tail


def settled(stderr_tail: str) -> int | None:
    """The exit code the child said was settled (SETTLED), if it did."""
    found = _SETTLED.findall(stderr_tail)
    return int(found[-1]) if found else None


def supervised_exit(returncode: int, stderr_tail: str) -> int:
    """The exit code of the supervisor for its child's ``Popen.returncode``: the child's own code,
    ``Exit.PEER_LOST`` for a fate-sharing abort (the code it had settled, if it had: SETTLED), and
    128 + N for any other signal N (as a container runtime reports a process killed by a signal)."""
    if returncode >= 0:
        return returncode
    if fate_shared(returncode, stderr_tail):
        code = settled(stderr_tail)
        return Exit.PEER_LOST if code is None else code
    return 128 - returncode


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env.get(key) or 1)
    except ValueError:
        return 1  # trainer.elastic.distributed reports the bad value as a config error


def multi_process(env: Mapping[str, str]) -> bool:
    """Whether the contract environment makes this one process of several (docs/contract.md):
    ``RESLICE_NUM_PROCESSES`` > 1, or a multi-host or multislice Cloud TPU environment."""
    hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]
    return (
        _int(env, envvars.NUM_PROCESSES) > 1 or len(hosts) > 1 or _int(env, envvars.MEGASCALE_NUM_SLICES) > 1
    )
