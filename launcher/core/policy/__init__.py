"""(run record, observation) -> one decision: the controller's policy. Pure: no client, no clock, no
disk (the presets come in as a catalog). `decide` is called by the controller's pass
(launcher/controller/loop.py); `rules_for` by whatever needs to know what a run's restart mode brings
(the pass, launch, the snapshot, `reslice render`).

A run's restart mode (`RunSpec.restart_mode`, words.RestartMode) is decided here, once: `rules_for`
maps it to its rule book, one module each.

- recreate.py: a segment is one JobSet; a shape change ends it and starts the next, every pod new.
- in_place.py: a segment is a world of slices, each its own JobSet; a shape change is one NEW_WORLD
  decision, and the surviving slices keep their pods (docs/contract.md "World (in-place restarts)").
- shared.py: what both use: the Decision, rule 1 (the trainer finished), what holds a new segment
  back, choosing its rung, ending the live segment in the record.

`decide` also says whether the decided record's world may be published (`Decision.publish`, the
mode's `publishable`: in place, once Kueue admitted every slice it names; docs/gke.md "Kueue").

Callers ask the rule book (`rules_for(spec).WORLD`: does the run have a world to publish?) rather
than compare the mode, so a third mode is one more module and one more line in BY_MODE.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from contract.words import RestartMode
from launcher.core.plan import Rung
from launcher.core.policy import in_place, recreate
from launcher.core.policy.shared import Decision, Rule
from launcher.core.presets import Catalog
from launcher.core.record import RunRecord
from launcher.core.signals import observation as signals
from launcher.core.spec import RunSpec
from launcher.core.words import Action

__all__ = ["BY_MODE", "Decision", "Rules", "decide", "rules_for"]


class Rules(Protocol):
    """A restart mode's rule book: the module recreate.py or in_place.py (a module satisfies a
    Protocol by its names)."""

    MODE: RestartMode
    # True: a segment is a world of slices, each its own JobSet, published in the run's world
    # ConfigMap to the pods' supervisors; False: a segment is one JobSet, recreated whole.
    WORLD: bool
    RULES: tuple[Rule, ...]  # in the order `decide` runs them

    def bookkeep(self, rec: RunRecord, obs: signals.Observation) -> RunRecord:
        """The facts the observation adds to the record before the rules run."""
        ...

    def publishable(self, rec: RunRecord, obs: signals.Observation) -> bool:
        """Whether the live segment's world may be published (never, without a world)."""
        ...


BY_MODE: dict[RestartMode, Rules] = {
    RestartMode.RECREATE: recreate,
    RestartMode.IN_PLACE: in_place,
}


def rules_for(spec: RunSpec) -> Rules:
    """The rule book of the run's restart mode. `spec.restart_mode` is checked when the run is
    launched (core/spec.check), so an unknown one here is a bug: KeyError."""
    return BY_MODE[RestartMode(spec.restart_mode)]


def decide(rec: RunRecord, obs: signals.Observation, ladder: list[Rung], catalog: Catalog) -> Decision:
    """The one decision of this pass for the run, with the record to write before acting: the first
    rule of its mode's RULES that decides."""
    if rec.terminal:
        return Decision(Action.WAIT, f"run is {rec.state}: {rec.reason}", rec)
    rules = rules_for(rec.spec)
    rec = rules.bookkeep(rec, obs)
    for rule in rules.RULES:
        if (decision := rule(rec, obs, ladder, catalog)) is not None:
            return replace(decision, publish=rules.publishable(decision.record, obs))
    raise AssertionError("the last rule always decides")
