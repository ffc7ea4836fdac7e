"""``python -m tests.trainer.worldfake``: the in-place supervisor (``trainer.elastic.follower.supervise_world``)
around a fake trainer, for tests/trainer/test_supervisor_world.py.

The supervisor is the real one: it reads the pod's environment, follows the world source, forks.
Only the trainer is fake: its "imports" (``_preload``, which the supervisor runs once, as it runs the
trainer's) append a line (``preload``: the supervisor's pid and how many threads it had then), and
with ``FAKE_FRESH_WORLDS=1`` in the pod, a world with ``env`` of its own gets a fresh interpreter
(``_fresh``: this module again, which trains at once, having imported nothing ahead; without it
such a world is forked like any, its ``env`` being the fake's orders); each child appends one JSON line to ``$FAKE_RECORD`` when it starts
(its pid, the contract variables it got, the pid that did its imports, whether its first-step pipe
is open) and one when it ends (how), and otherwise does what
its world's ``env`` tells it: ``FAKE_EXIT`` = exit with that code after ``FAKE_AFTER_S`` seconds;
``FAKE_ABORT`` = abort (SIGABRT) after ``FAKE_AFTER_S`` seconds, having written to stderr what an
exception thrown in Gloo's transport writes (``gloo``) or nothing (``plain``);
``FAKE_ON_TERM`` = the code it exits with on SIGTERM (42 by default, as the trainer after its save;
``hang``: it goes on, as a trainer whose step in flight waits for a peer that is gone).
``FAKE_WORKERS=1``: it starts what a Grain loader with workers starts (a spawned worker process
and a shared memory block, so multiprocessing's resource tracker too) and records them.
``FAKE_IMPORT_ENV=1``: its "imports" change the environment as ``import jax`` does on a TPU host
(``cloud_tpu_init``: set when absent, one appended to), and its start record holds its whole
environment (``environ``).
``FAKE_LOCK=1``: it takes libtpu's lock on ``$RESLICE_LIBTPU_LOCKFILE`` as the TPU backend does when
it starts, for its life; held by another process, it fails as libtpu does (its error on stderr, exit 1).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sys
import threading
import time

from contract import envvars
from trainer.elastic import follower, supervisor

KEYS = (
    "RESLICE_WORLD_EPOCH",
    "RESLICE_SEGMENT",
    "RESLICE_COORDINATOR",
    "RESLICE_NUM_PROCESSES",
    "RESLICE_NUM_SLICES",
    "RESLICE_SLICE_INDEX",
    "JOB_COMPLETION_INDEX",
    "RESLICE_MICRO_BATCH",
    "RESLICE_GRAD_ACCUM",
    "MEGASCALE_NUM_SLICES",
    "MEGASCALE_SLICE_ID",
    supervisor.CHILD_ENV,
    envvars.INCARNATION,
)


def _record(**fields: object) -> None:
    line = json.dumps({"pid": os.getpid(), "t": time.time(), **fields}) + "\n"
    with open(os.environ["FAKE_RECORD"], "a") as f:  # one short append per line: lines stay whole
        f.write(line)


# What cloud_tpu_init sets on a TPU host (jax/_src/cloud_tpu_init.py), and how.
IMPORT_DEFAULTS = {
    "TPU_ML_PLATFORM": "JAX",
    "GRPC_VERBOSITY": "ERROR",
    "TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS": "60",
}
IMPORT_FLAG = " --xla_tpu_use_enhanced_launch_barrier=true"


def _imports() -> None:
    for key, value in IMPORT_DEFAULTS.items():
        os.environ.setdefault(key, value)
    os.environ["LIBTPU_INIT_ARGS"] = os.environ.get("LIBTPU_INIT_ARGS", "") + IMPORT_FLAG


# What std::terminate writes for an exception thrown in Gloo's TCP transport (a kept pod log).
GLOO_ABORT = (
    b"terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
    b"  what():  [enforce fail at external/gloo/gloo/transport/tcp/pair.cc:459] op.preamble.length <="
    b" op.nbytes. 2048 vs 8. Received data size doesn't match expected size.\n"
)

_held: list[int] = []  # the lock file's descriptor, open for the process's life (as libtpu's)
_imported_by: list[int] = []  # the pid that did this process's imports


def _preload() -> None:
    """The supervisor's ``preload``, as trainer.__main__'s: the imports, once for every child."""
    _record(event="preload", threads=threading.active_count())
    _imported()


def _imported() -> None:
    if os.environ.get("FAKE_IMPORT_ENV"):
        _imports()
    _imported_by.append(os.getpid())


def _fresh(env: dict[str, str]) -> None:
    """The supervisor's ``fresh``, as trainer.__main__'s: this module again, in `env`."""
    os.execve(sys.executable, [sys.executable, "-m", "tests.trainer.worldfake"], env)


def _take_chip() -> bool:
    fd = os.open(os.environ[envvars.LIBTPU_LOCKFILE], os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        print(
            f"RuntimeError: Unable to initialize backend 'tpu': {follower.LOCK_ERROR}",
            file=sys.stderr,
            flush=True,
        )
        return False
    _held.append(fd)
    return True


def train() -> int:
    # Before anything is recorded, as the trainer's own (trainer.__main__: before its imports): a
    # test that saw this child start may signal it at once.
    on_term = os.environ.get("FAKE_ON_TERM", "42")

    def term(_signum: int, _frame: object) -> None:
        if on_term == "hang":  # a step in flight that waits for a peer that is gone
            _record(event="sigterm", how="hangs")
            return
        _record(event="end", how="sigterm", code=int(on_term))
        os._exit(int(on_term))

    signal.signal(signal.SIGTERM, term)
    if not _imported_by:  # a fresh interpreter: not forked from the supervisor's imports
        _imported()
    if os.environ.get("FAKE_LOCK") and not _take_chip():
        _record(event="lockfail")
        return 1
    environ = {"environ": dict(os.environ)} if os.environ.get("FAKE_IMPORT_ENV") else {}
    try:
        running_fd = os.fstat(int(os.environ[supervisor.RUNNING_ENV])) is not None
    except (KeyError, OSError):
        running_fd = False
    _record(
        event="start",
        env={k: os.environ[k] for k in KEYS if k in os.environ},
        imported_by=_imported_by[0],
        running_fd=running_fd,
        **environ,
    )
    if os.environ.get("FAKE_WORKERS"):
        _start_workers()
    supervisor.notify_running()  # as the trainer after its first step
    if "FAKE_ABORT" in os.environ:
        time.sleep(float(os.environ.get("FAKE_AFTER_S", "0")))
        _record(event="end", how="abort")
        if os.environ["FAKE_ABORT"] == "gloo":  # as a trainer whose peer died mid-collective
            os.write(2, GLOO_ABORT)
        os.abort()
    if "FAKE_EXIT" in os.environ:
        time.sleep(float(os.environ.get("FAKE_AFTER_S", "0")))
        code = int(os.environ["FAKE_EXIT"])
        _record(event="end", how="exit", code=code)
        return code
    while True:
        time.sleep(0.02)


def _start_workers() -> None:
    import multiprocessing
    from multiprocessing import resource_tracker, shared_memory

    block = shared_memory.SharedMemory(create=True, size=4096)  # registered with the tracker
    worker = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(600,), daemon=True)
    worker.start()
    tracker = resource_tracker._resource_tracker._pid  # no public accessor
    _record(event="workers", worker=worker.pid, tracker=tracker, shm=block.name)


if __name__ == "__main__":
    if os.environ.get(supervisor.CHILD_ENV):  # exec'd by _fresh: train, as trainer.__main__ would
        sys.exit(train())
    # Worlds give the fake its orders in their env: forked as any world unless the pod asks for
    # trainer.__main__'s fresh interpreters (FAKE_FRESH_WORLDS=1).
    fresh = _fresh if os.environ.get("FAKE_FRESH_WORLDS") else None
    sys.exit(follower.supervise_world(train, os.environ, preload=_preload, fresh=fresh))
