"""`python -m maxtext_entry -- [CONFIG.yml] key=value ...` (docs/maxtext.md), and
`python -m maxtext_entry --probe-write RUN_DIR` (the write probe of `reslice preflight`)."""

from __future__ import annotations

import os
import sys
from dataclasses import replace

from contract.exits import Exit
from maxtext_entry import checkpoints
from maxtext_entry.args import ConfigError, parse
from maxtext_entry.probe import StorageError, probe_write
from maxtext_entry.run import context, maxtext_python, supervise, write_status


def probe(run_dir: str) -> int:
    """Write and delete one object under the run directory, and find MaxText's interpreter: what a
    MaxText pod needs before it trains (exit 0), else one line naming the fix (exit 2)."""
    try:
        wrote = probe_write(run_dir)
        python = maxtext_python(dict(os.environ))
    except (StorageError, ConfigError) as e:
        print(f"maxtext_entry: {e}", file=sys.stderr)
        return Exit.CONFIG
    print(f"maxtext_entry: wrote and deleted {wrote}; MaxText runs on {python}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--probe-write"]:
        if len(argv) != 2:
            print("maxtext_entry: usage error: --probe-write RUN_DIR", file=sys.stderr)
            return Exit.CONFIG
        return probe(argv[1])
    if argv[:1] == ["--"]:
        argv = argv[1:]
    try:
        cmd = parse(argv)
        ctx = context(cmd, dict(os.environ))
        if ctx.process_index == 0:
            # Before MaxText's minutes of start-up: a run directory this node cannot write is the
            # configuration's fault (exit 2), with the fix, as for reslice's trainer.
            probe_write(ctx.run_dir)
    except (ConfigError, StorageError, ValueError) as e:
        print(f"maxtext_entry: config error: {e}", file=sys.stderr)
        return Exit.CONFIG
    latest = checkpoints.latest(cmd.checkpoint_dir)
    if checkpoints.done_steps(latest) >= cmd.steps:
        # MaxText itself exits 1 for a finished run ("Requested training up to step N, but a
        # checkpoint already exists"): a restarted finished segment is finished, not a crash.
        if ctx.process_index == 0:
            write_status(ctx, cmd, latest)
        print(f"maxtext_entry: all {cmd.steps} steps are committed; nothing to train", file=sys.stderr)
        return Exit.FINISHED
    try:
        python = maxtext_python(dict(os.environ))
    except ConfigError as e:
        print(f"maxtext_entry: config error: {e}", file=sys.stderr)
        return Exit.CONFIG
    return supervise(cmd, replace(ctx, python=python))


if __name__ == "__main__":
    sys.exit(main())
