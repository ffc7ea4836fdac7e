"""The names of the JobSet failure-policy rules that act on the trainer's exit codes
(contract/exits.py): a contract between the renderer (core/render.py writes the rules) and the
signals (core/signals/ read which one fired)."""

from __future__ import annotations

# The rules' names: core/signals/ reads which one fired.
RULE_CONFIG_ERROR = "configError"
RULE_PREEMPTED = "preempted"
RULE_APP_FAILURE = "appFailure"
