"""The trainer's exit codes (docs/contract.md) and the names of the JobSet failure-policy rules that
act on them: a contract between the trainer, the renderer (core/render.py writes the rules) and the
signals (core/signals/ read which one fired)."""

from __future__ import annotations

EXIT_PREEMPTED = 42
EXIT_PEER_LOST = 43  # a host of the segment died under the trainer (docs/contract.md)
EXIT_CONFIG = 2

# The rules' names: core/signals/ reads which one fired.
RULE_CONFIG_ERROR = "configError"
RULE_PREEMPTED = "preempted"
RULE_APP_FAILURE = "appFailure"
