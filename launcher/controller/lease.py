"""The Leases a controller holds: one per run it owns (coordination.k8s.io Lease `reslice-<run>-
controller`), held between renewals and renewed every half lease, so that two controllers never act
on one run. Used by the loop (launcher/controller/loop.py) and by `launch --detach`
(launcher/controller/launch.py, through `lease_name`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from launcher.adapters.kube import Kube


def lease_name(run: str) -> str:
    return f"reslice-{run}-controller"


@dataclass
class Leases:
    kube: Kube
    identity: str
    lease_s: int
    monotonic: Callable[[], float]  # passed in so tests step it
    held: set[str] = field(default_factory=set)
    # Per run: when its Lease was last renewed (monotonic).
    renewed: dict[str, float] = field(default_factory=dict)

    @property
    def renew_every_s(self) -> float:
        """Half the lease: a late pass still renews in time; a renewal is one PUT."""
        return self.lease_s / 2

    def acquire(self, run: str) -> tuple[bool, bool, str | None]:
        """Hold `run`'s Lease, renewing it every `renew_every_s`: between renewals it is held (no one
        may take it before `lease_s` has passed since the last). Returns (held, newly held, the
        previous holder when it was taken over)."""
        now = self.monotonic()
        if run in self.held and now - self.renewed.get(run, -1e9) < self.renew_every_s:
            return True, False, None
        held, previous = self.kube.acquire_lease(lease_name(run), self.identity, self.lease_s)
        if held:
            self.renewed[run] = now
        if held and run not in self.held:
            self.held.add(run)
            return True, True, previous
        if not held:
            self.held.discard(run)
        return held, False, None

    def release(self, run: str) -> None:
        self.kube.release_lease(lease_name(run), self.identity)
        self.held.discard(run)
        self.renewed.pop(run, None)

    def until_renewal(self, default: float) -> float:
        """Seconds until the next renewal is due, `default` when none is held."""
        due = [t + self.renew_every_s - self.monotonic() for r, t in self.renewed.items() if r in self.held]
        return max(0.0, min(due, default=default))

    def forget_all_but(self, runs: Iterable[str]) -> None:
        """Stop renewing the Leases of runs not among `runs` (ended, or deleted): they may lapse."""
        for gone in set(self.renewed) - set(runs):
            self.renewed.pop(gone)
            self.held.discard(gone)
