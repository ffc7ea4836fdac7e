"""Errors a user can cause and fix. The CLI prints each as one line: exit 2 for bad input, 1 for a
cluster that cannot run the command."""

import contextlib


class UserError(Exception):
    """Bad input: an unknown preset, an invalid topology, an infeasible batch, a bad name..."""


class ClusterNotReady(Exception):
    """The command is fine, the cluster cannot run it (no JobSet, no node pools of the shape...).
    The CLI prints one line and exits 1: what needs changing is the cluster, not the command."""


def environment_error(e: BaseException) -> tuple[int, str] | None:
    """(exit code, one line) for a failure of the user's environment that reached the CLI: exit 1 when
    the cluster cannot be reached (the command is right), 2 when a setting the user gave is wrong.
    None for anything else: that is a bug, and its traceback is wanted."""
    import urllib3
    from kubernetes.client.rest import ApiException
    from kubernetes.config.config_exception import ConfigException

    if isinstance(e, urllib3.exceptions.HTTPError):
        reason = getattr(e, "reason", None) or e
        return 1, f"the cluster is unreachable: {' '.join(str(reason).split())[:200]}"
    if isinstance(e, ApiException):
        return 1, f"the cluster refused a request: {e.status} {' '.join(str(e.reason).split())[:200]}"
    if isinstance(e, ConfigException):
        return 2, f"kubeconfig: {' '.join(str(e).split())[:200]}"
    with contextlib.suppress(ImportError):  # google-auth comes with the gs:// extras
        from google.auth.exceptions import DefaultCredentialsError

        if isinstance(e, DefaultCredentialsError):
            return 2, (
                "no Google Cloud credentials for the gs:// run directory: "
                "run `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS)"
            )
    if isinstance(e, OSError) and e.strerror:
        where = f" {e.filename}" if e.filename else ""
        return 2, f"cannot use{where}: {e.strerror}"
    return None
