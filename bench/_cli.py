"""What every benchmark's command line shares: bad options are one line on stderr and exit 2, as
the launcher's and the trainer's are (no usage block, no traceback, and no wait first)."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


def refuse(prog: str, message: str) -> NoReturn:
    """One line naming the benchmark and what is wrong, exit 2."""
    print(f"{prog}: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are `refuse`'s one line (argparse prints its usage block too)."""

    def error(self, message: str) -> NoReturn:
        refuse(self.prog, message)

    def at_least(self, args: argparse.Namespace, low: int, *names: str) -> None:
        """Each option in `names` (dest names) at least `low`: one asked for zero of something has
        nothing to measure, and says so rather than printing a vacuous figure."""
        for name in names:
            value = getattr(args, name)
            if value < low:
                flag = "--" + name.replace("_", "-")
                what = "nothing to measure" if value == 0 else "not a count"
                self.error(f"{flag} {value}: {what} (at least {low})")

    def shape(self, preset: str, slices: int) -> None:
        """`slices` slices of a preset the catalog has (presets/), as a run would be refused them
        (a multislice of single-host slices, say): one line, before anything starts."""
        from launcher.adapters.preset_files import load_catalog
        from launcher.core.errors import UserError

        known = load_catalog()
        if preset not in known:
            self.error(f"--preset {preset}: no such preset ({', '.join(sorted(known))})")
        try:
            known.shape(preset, slices)
        except UserError as e:
            self.error(f"--preset {preset} --slices {slices}: {e}")
