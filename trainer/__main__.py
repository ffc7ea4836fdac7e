"""``python -m trainer --config <name|path> [--set key=value ...]``; see docs/contract.md."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
from collections.abc import Iterator, Mapping
from typing import NoReturn

from contract import envvars
from contract.exits import Exit
from contract.words import RestartMode

# The supervisor of a multi-process trainer needs no more than these: it starts its child sooner.
from trainer.elastic import follower, peers, supervisor, world
from trainer.telemetry import stacks

# `--hbm`'s name before it said what it measures (HBM, not the RAM of the snapshots): still accepted.
DEPRECATED_HBM_FLAG = "--memory"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse prints usage too)
        print(f"trainer: usage error: {message}", file=sys.stderr)
        sys.exit(Exit.CONFIG)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.deprecated_hbm:
        print(f"trainer: {DEPRECATED_HBM_FLAG} is deprecated: it is now --hbm", file=sys.stderr, flush=True)
        args.hbm = True
    one_shot = args.hbm or args.probe_write or args.check  # these never join a process group
    if not one_shot and not os.environ.get(supervisor.CHILD_ENV):
        supervised = _supervise(argv)
        if supervised is not None:
            return supervised
    if one_shot:
        return _one_shot(args)
    return _train(args)


def _parser() -> _Parser:
    parser = _Parser(prog="python -m trainer", description="reslice JAX MoE trainer")
    parser.add_argument(
        "--config", help="named config (tiny, small, olmoe-1b) or YAML path; default RESLICE_CONFIG"
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. train.steps=100"
    )
    parser.add_argument(
        "--check", action="store_true", help="validate the config, print it as JSON and exit (no JAX)"
    )
    parser.add_argument(
        "--probe-write", metavar="DIR", help="write and delete a probe object under DIR and exit (no JAX)"
    )
    parser.add_argument(
        "--hbm",
        action="store_true",
        help="compile the train step for this environment's devices ahead of time (nothing allocated)"
        " and print its per-device HBM as JSON",
    )
    # The flag's former name, for the scripts that still pass it: out of --help, and it says so.
    parser.add_argument(
        DEPRECATED_HBM_FLAG, action="store_true", dest="deprecated_hbm", help=argparse.SUPPRESS
    )
    return parser


def _supervise(argv: list[str] | None) -> int | None:
    """A trainer that is no supervisor's child: the exit code of its supervisor, in place (a world
    supervisor, even for a one-process world: the next may have more) or for a multi-process
    trainer; None for a lone process, which trains itself."""
    try:
        in_place = world.restart_mode(os.environ) is RestartMode.IN_PLACE
    except world.WorldError as e:
        print(f"trainer: {e}", file=sys.stderr, flush=True)
        return Exit.CONFIG
    if in_place:  # even a one-process world: the next may have more
        return follower.supervise_world(lambda: main(argv), os.environ, preload=_preload, fresh=_exec_trainer)
    if peers.multi_process(os.environ):
        return supervisor.supervise(lambda: main(argv))
    return None


def _one_shot(args: argparse.Namespace) -> int:
    """``--hbm``, ``--probe-write`` or ``--check``: the work done and printed, no process group."""
    from trainer.config import ConfigError

    if args.hbm:
        try:
            from trainer import config, hbm

            cfg = config.resolve(args.config, args.set, os.environ)
            print(json.dumps(hbm.aot_hbm(cfg)), flush=True)
        except ConfigError as e:
            print(f"trainer: config error: {e}", file=sys.stderr, flush=True)
            return Exit.CONFIG
        return Exit.FINISHED
    if args.probe_write:  # what the `reslice preflight` pod runs on the target node pools
        from trainer.state import storage

        try:
            print(f"trainer: wrote and deleted {storage.probe_write(args.probe_write)}", flush=True)
        except ConfigError as e:
            print(f"trainer: {e}", file=sys.stderr, flush=True)
            return Exit.CONFIG
        return Exit.FINISHED
    # --check: what `reslice launch` asks before it creates anything
    try:
        from trainer import config

        cfg = config.resolve(args.config, args.set, os.environ)
    except ConfigError as e:
        print(f"trainer: config error: {e}", file=sys.stderr, flush=True)
        return Exit.CONFIG
    print(json.dumps({"config_hash": config.config_hash(cfg), "config": cfg.to_dict()}))
    return Exit.FINISHED


def _train(args: argparse.Namespace) -> int:
    """Train (``trainer.loop.run``): the exit code, or out at once without JAX's shutdown barrier
    where a peer may be gone or still starting."""
    from trainer.config import ConfigError
    from trainer.elastic.watchdog import Preemption
    from trainer.telemetry.startup import Timeline

    preemption = Preemption()  # before the slow imports: SIGTERM means Exit.PREEMPTED
    # An in-place pod's later trainers start at their fork: the container's start is long past.
    later = supervisor.later_incarnation(os.environ)
    timeline = Timeline(supervised=bool(os.environ.get(supervisor.CHILD_ENV)) and not later)
    try:
        _import_trainer()  # in place, done already: the child is a fork of a supervisor that did it
        from trainer import config, loop
        from trainer.elastic import distributed

        timeline.mark("imports")
        cfg = config.resolve(args.config, args.set, os.environ)
        code = loop.run(cfg, os.environ, preemption, timeline)
        if code == Exit.PREEMPTED and not preemption.stepped and distributed.joined():
            # Preempted before the first step, the peers anywhere in their start-up (compiling, at
            # the start barrier): JAX's shutdown barrier would hold this host until they all exit.
            # Nothing to save; the peers learn of it from the coordination service (Exit.PEER_LOST).
            _exit_now(code)
        return code
    except ConfigError as e:
        print(f"trainer: config error: {e}", file=sys.stderr, flush=True)
        from trainer.elastic import distributed

        if peers.multi_process(os.environ) and distributed.joined():
            # Mid-run (a token id outside the vocabulary in a record being read): the peers wait in
            # the step's collectives for this process, so skip JAX's shutdown barrier, as below.
            _exit_now(Exit.CONFIG)
        return Exit.CONFIG
    except Exception as e:
        from trainer.elastic import distributed

        lost = peers.multi_process(os.environ) and peers.peer_lost(peers.error_text(e))
        if not (lost or distributed.joined()):
            raise
        import traceback

        # After a failure in a multi-process run, JAX's exit handler would wait at the shutdown
        # barrier for a peer that may be gone until the heartbeat timeout
        # (RESLICE_HEARTBEAT_TIMEOUT_S), holding this host and delaying the restart: leave now. A
        # lost peer is a disruption, with its own exit code; anything else is this process's own
        # failure.
        traceback.print_exc()
        if lost:
            print(
                f"trainer: a peer is lost (its collectives or the coordination service failed):"
                f" exit {Exit.PEER_LOST} without the shutdown barrier",
                flush=True,
            )
            _exit_now(Exit.PEER_LOST)
        print("trainer: failed in a multi-process run: exiting without the shutdown barrier", flush=True)
        _exit_now(Exit.FAILED)
    finally:
        if preemption is not None:
            preemption.restore()


def _import_trainer() -> None:
    """The trainer's imports: JAX, Flax, Orbax, Grain and the trainer's own modules."""
    from trainer.telemetry.startup import no_rocm_plugin_scan

    with _imports_without_gc(), no_rocm_plugin_scan(os.environ):
        from trainer import loop  # noqa: F401  (imports the rest of the trainer)
        from trainer.elastic import distributed  # noqa: F401


def _preload() -> None:
    """The in-place supervisor's ``preload``: the trainer's imports, once for the pod's every child
    (``follower.supervise_world``), and the metrics' event writer, which process 0 would otherwise
    import with its first record, inside the first step (which child will be process 0 is not
    known before its world)."""
    _import_trainer()
    from trainer.telemetry import metrics

    metrics.preload_tensorboard(os.environ.get(envvars.RUN_DIR))


def _exec_trainer(env: Mapping[str, str]) -> NoReturn:
    """Replace this process with a fresh trainer in `env` (the in-place supervisor's ``fresh``: a
    world with variables of its own, which the imports may read). Same interpreter, same arguments;
    ``CHILD_ENV`` in `env` makes it train rather than supervise."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


@contextlib.contextmanager
def _imports_without_gc() -> Iterator[None]:
    """JAX, Flax, Orbax and Grain's imports make about a million objects and next to no garbage,
    yet trigger the cyclic collector over and over: without it they take markedly less CPU
    (docs/measurements.md, "Figures behind the code's constants"), on every start-up. What they made
    stays for the process's life, so it is frozen: later collections (through training) skip it."""
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def _exit_now(code: int) -> NoReturn:
    import multiprocessing

    sys.stdout.flush()
    sys.stderr.flush()
    for child in multiprocessing.active_children():  # data loader workers, if any
        child.kill()
    os._exit(code)


if __name__ == "__main__":
    stacks.on_usr1()
    sys.exit(main())
