"""Telling a lost peer from a bug (trainer.elastic.peers), on the texts jax 0.10.2 on CPU produced when one
of two trainer processes was SIGKILLed mid-step or during start-up."""

from __future__ import annotations

import signal

import pytest

from contract.exits import Exit
from trainer.elastic import peers

# What the survivor raised, as `Type: message` (peers.error_text).
GLOO_RESET = (
    "JaxRuntimeError: UNKNOWN: Gloo AllGather failed: [external/gloo/gloo/transport/tcp/pair.cc:538]"
    " Read error [127.0.0.1]:2976: Connection reset by peer"
)
BARRIER_TIMEOUT = (
    "JaxRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. Id: b1::0. This usually happens because a"
    " task triggered the barrier too early or too slowly. Please look at the task logs (both timed out"
    " and first task) to debug further.\n# of tasks that reached the barrier: 1/2.\nThe first task at"
    " the barrier: 0. Some timed out task names:\n1\n\n\nRPC: /xla.coordination.CoordinationService/Barrier"
    " [type.googleapis.com/tensorflow.CoordinationServiceError='']"
)
KV_TIMEOUT = (
    "JaxRuntimeError: DEADLINE_EXCEEDED: GetKeyValue() timed out with key: nokey and duration: 3s"
    " [type.googleapis.com/tensorflow.CoordinationServiceError='']"
)
# What JAX's coordination-service client logged right before it aborted the survivor (SIGABRT).
FATAL_HEARTBEAT = (
    "F1201 19:09:48.407769   15111 client.h:80] Terminating process because the JAX distributed service"
    " detected fatal errors. This most likely indicates that another task died; see the other task logs"
    " for more details. Disable Python buffering, i.e. `python -u`, to be sure to see all the previous"
    " output. absl::Status: UNAVAILABLE: The following tasks are unhealthy (stopped sending"
    " heartbeats):\n1\nThe tasks have crashed."
)
FATAL_SOCKET_CLOSED = (
    "F1201 19:06:24.869700   10494 client.h:80] Terminating process because the JAX distributed service"
    " detected fatal errors. [...] absl::Status: UNAVAILABLE: Failed to send RPC to coordination service."
    " Either the leader task was preempted/died/restarted unexpectedly or this task is experiencing"
    ' network issues. [...] {grpc_status:14, grpc_message:"Socket closed"}'
)
FATAL_NEVER_JOINED = (
    "F1201 19:10:07.184002   15903 client.h:80] Terminating process because the JAX distributed service"
    " detected fatal errors. [...] absl::Status: DEADLINE_EXCEEDED: Deadline Exceeded\n\n"
    "RPC: /xla.coordination.CoordinationService/RegisterTask\n*** Check failure stack trace: ***"
)


@pytest.mark.parametrize(
    ("text", "lost"),
    [
        (GLOO_RESET, True),  # a peer SIGKILLed mid-step: its TCP pairs are reset
        (BARRIER_TIMEOUT, True),  # a barrier a dead peer never reaches
        (KV_TIMEOUT, True),  # a key a dead peer never writes
        # Gloo's other read error (pair.cc: the peer closed the socket) and its write error.
        ("JaxRuntimeError: UNKNOWN: Gloo AllReduce failed: Connection closed by peer [127.0.0.1]:1", True),
        ("JaxRuntimeError: UNKNOWN: Gloo AllReduce failed: Write error [127.0.0.1]:1: Broken pipe", True),
        ("RuntimeError: train.crash_at_step=3: failing on purpose", False),  # the trainer's own bug
        ("ConnectionRefusedError: [Errno 111] Connection refused", False),  # storage, not a peer
        ("DeadlineExceeded: 504 GET https://storage.googleapis.com/...: timed out", False),
        ("JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory allocating 1073741824 bytes", False),
        ("ValueError: stopped sending heartbeats", False),  # the words alone, from no runtime
        ("JaxRuntimeError: INVALID_ARGUMENT: Gloo AllReduce: mismatched shapes", False),
    ],
)
def test_peer_lost_needs_a_distributed_source_and_a_peer_gone_symptom(text: str, lost: bool) -> None:
    assert peers.peer_lost(text) is lost


def test_error_text_follows_causes_but_not_source_lines() -> None:
    try:
        try:
            raise RuntimeError(GLOO_RESET.removeprefix("JaxRuntimeError: "))
        except RuntimeError as e:
            raise ValueError("restoring step 10 failed") from e
    except ValueError as e:
        text = peers.error_text(e)
    assert text.splitlines()[0] == "ValueError: restoring step 10 failed"
    assert "RuntimeError: UNKNOWN: Gloo AllGather failed" in text
    assert peers.peer_lost(text)


@pytest.mark.parametrize(
    ("returncode", "tail", "code"),
    [
        (-signal.SIGABRT, FATAL_HEARTBEAT, Exit.PEER_LOST),  # a peer stopped heartbeating
        (-signal.SIGABRT, FATAL_SOCKET_CLOSED, Exit.PEER_LOST),  # process 0 (the service) died
        (-signal.SIGABRT, FATAL_NEVER_JOINED, Exit.PEER_LOST),  # a peer never joined in time
        # Aborted once its code was settled (process 0 gone first): that code; settled twice, the last.
        (-signal.SIGABRT, f"{peers.SETTLED.format(code=0)}\n{FATAL_SOCKET_CLOSED}", 0),
        (
            -signal.SIGABRT,
            f"trainer: exit 0 settled\n{peers.SETTLED.format(code=42)}\n{FATAL_SOCKET_CLOSED}",
            42,
        ),
        (-signal.SIGKILL, f"{peers.SETTLED.format(code=0)}\n", 137),  # killed is killed
        (-signal.SIGABRT, "F1201 xla/service/foo.cc:12] Check failed: shape ok", 134),  # an XLA bug
        (-signal.SIGKILL, FATAL_HEARTBEAT, 137),  # killed itself (OOM, the kubelet)
        (-signal.SIGSEGV, "", 139),
        (0, "", 0),
        (1, FATAL_HEARTBEAT, 1),
        (42, "", 42),
        (Exit.PEER_LOST, "", Exit.PEER_LOST),
        (143, "", 143),
    ],
)
def test_supervised_exit(returncode: int, tail: str, code: int) -> None:
    assert peers.supervised_exit(returncode, tail) == code


@pytest.mark.parametrize(
    ("env", "multi"),
    [
        ({}, False),
        ({"RESLICE_NUM_PROCESSES": "1"}, False),
        ({"RESLICE_NUM_PROCESSES": "2"}, True),
        ({"RESLICE_NUM_PROCESSES": "x"}, False),  # distributed.identity reports it as a config error
        ({"TPU_WORKER_HOSTNAMES": "h0"}, False),
        ({"TPU_WORKER_HOSTNAMES": "h0,h1"}, True),
        ({"MEGASCALE_NUM_SLICES": "2"}, True),
    ],
)
def test_multi_process(env: dict, multi: bool) -> None:
    assert peers.multi_process(env) is multi
