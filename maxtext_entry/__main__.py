"""`python -m maxtext_entry -- [CONFIG.yml] key=value ...` (docs/maxtext.md)."""

from __future__ import annotations

import os
import sys
from dataclasses import replace

from maxtext_entry import checkpoints
from maxtext_entry.args import ConfigError, parse
from maxtext_entry.outcome import EXIT_CONFIG, EXIT_FINISHED
from maxtext_entry.run import context, maxtext_python, supervise, write_status


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--"]:
        argv = argv[1:]
    try:
        cmd = parse(argv)
        ctx = context(cmd, dict(os.environ))
    except (ConfigError, ValueError) as e:
        print(f"maxtext_entry: config error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    latest = checkpoints.latest(cmd.checkpoint_dir)
    if checkpoints.done_steps(latest) >= cmd.steps:
        # MaxText itself exits 1 for a finished run ("Requested training up to step N, but a
        # checkpoint already exists"): a restarted finished segment is finished, not a crash.
        if ctx.process_index == 0:
            write_status(ctx, cmd, latest)
        print(f"maxtext_entry: all {cmd.steps} steps are committed; nothing to train", file=sys.stderr)
        return EXIT_FINISHED
    try:
        python = maxtext_python(dict(os.environ))
    except ConfigError as e:
        print(f"maxtext_entry: config error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    return supervise(cmd, replace(ctx, python=python))


if __name__ == "__main__":
    sys.exit(main())
