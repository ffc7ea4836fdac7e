"""The MaxText profile's entrypoint in the container (docs/maxtext.md): `python -m maxtext_entry --
[CONFIG.yml] key=value ...` runs MaxText's pre-training as a child process and turns its outcome into
the exit codes of docs/contract.md, writing the run directory's `status.json` and metrics records.

Standard library only for a local run directory, etils' epath for a gs:// one (`storage`), and
nothing of `launcher` or `trainer` (an import-linter contract): it runs
in the MaxText image (Python 3.12, requirements/maxtext.lock), next to MaxText, not next to reslice.
"""
