"""Errors a user can cause and fix. The CLI prints them as one line and exits 2."""


class UserError(Exception):
    """Bad input: an unknown preset, an invalid topology, an infeasible batch, a bad name..."""
