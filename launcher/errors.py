"""Errors a user can cause and fix. The CLI prints each as one line: exit 2 for bad input, 1 for a
cluster that cannot run the command."""


class UserError(Exception):
    """Bad input: an unknown preset, an invalid topology, an infeasible batch, a bad name..."""


class ClusterNotReady(Exception):
    """The command is fine, the cluster cannot run it (no JobSet, no node pools of the shape...).
    The CLI prints one line and exits 1: what needs changing is the cluster, not the command."""
