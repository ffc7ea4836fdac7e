"""The in-place rules with Kueue (docs/gke.md "Kueue"): each slice JobSet is its own Workload, held
with `spec.suspend` until admitted and suspended again when evicted. (record, observation) -> one
decision, case by case, with the builders of test_policy_inplace.py. The recreate mode's cases are
in test_policy.py's table ("suspended by Kueue ...")."""

from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

from launcher.core.record import RunRecord
from launcher.core.words import Action, EndKind, WaitReason
from tests.launcher.core.objects import T0
from tests.launcher.core.test_policy_inplace import (
    SPEC,
    decide,
    launched,
    observe,
    on_world,
    slice_jobset,
    slice_pods,
)

QUEUED = replace(SPEC, queue="team-a")


def queued(rec: RunRecord) -> RunRecord:
    return replace(rec, spec=QUEUED)


def world_0_not_run() -> RunRecord:
    """World 0 of slices 0 and 1, recorded at T0, never run: Kueue has not admitted all of it."""
    rec = queued(on_world(("0", "1")))
    return rec.with_segment(replace(rec.current, running_at=None, submitted_at=T0))


def slices(running: dict[str, str], suspended: tuple[str, ...] = ()) -> dict:
    """The observation's JobSets and pods: `running` slice -> its pool; `suspended` slices' JobSets
    held by Kueue, their pods gone (JobSet suspended their Jobs, the Job controller deleted them)."""
    return {
        "jobsets": [slice_jobset(s) for s in running] + [slice_jobset(s, suspend=True) for s in suspended],
        "pods": [p for s, where in running.items() for p in slice_pods(s, where)],
    }


@dataclass(frozen=True)
class Want:
    action: Action
    publish: bool
    wait: WaitReason | None = None
    world: tuple[str, ...] | None = None  # the next world's slices (NEW_WORLD)
    joining: tuple[str, ...] = ()
    create: tuple[str, ...] = ()
    delete: tuple[str, ...] = ()
    end_kind: EndKind | None = None


@dataclass(frozen=True)
class Case:
    name: str
    record: Callable[[], RunRecord]
    now: float
    observed: dict
    want: Want
    pools: int = 2


CASES = [
    Case(
        "the first world is recorded and its JobSets created, not published: Kueue admits them first",
        lambda: queued(launched()),
        T0 + 1,
        slices({}),
        Want(Action.START_SEGMENT, publish=False, create=("0", "1")),
    ),
    Case(
        "world 0 waits for Kueue to admit its slices, unpublished",
        world_0_not_run,
        T0 + 10,
        slices({}, suspended=("0", "1")),
        Want(Action.WAIT, publish=False, wait=WaitReason.ADMISSION),
    ),
    Case(
        "one slice admitted, the other not yet: world 0 still waits within the grace period",
        world_0_not_run,
        T0 + 30,
        slices({"0": "np-0"}, suspended=("1",)),
        Want(Action.WAIT, publish=False, wait=WaitReason.ADMISSION),
    ),
    Case(
        "the other not admitted within the grace period: the run starts on the admitted slice, the"
        " other stays queued and joins when admitted",
        world_0_not_run,
        T0 + 61,
        slices({"0": "np-0"}, suspended=("1",)),
        Want(Action.NEW_WORLD, publish=True, world=("0",), joining=("1",), end_kind=EndKind.EVICTED),
    ),
    Case(
        "none admitted within the grace period: nothing to start on, the run waits for admission",
        world_0_not_run,
        T0 + 61,
        slices({}, suspended=("0", "1")),
        Want(Action.WAIT, publish=False, wait=WaitReason.ADMISSION),
    ),
    Case(
        "a slice of a running world evicted (suspended again): the survivor goes on at once, the"
        " evicted slice's JobSet stays queued",
        lambda: queued(on_world(("0", "1"), nodepools=("np-0", "np-1"))),
        T0 + 100,
        slices({"0": "np-0"}, suspended=("1",)),
        Want(Action.NEW_WORLD, publish=True, world=("0",), joining=("1",), end_kind=EndKind.EVICTED),
    ),
    Case(
        "every slice of the world evicted: no world to form on none, the run waits for Kueue (the"
        " world stays published: admitted again, the slices' new pods start in it)",
        lambda: queued(on_world(("0", "1"), nodepools=("np-0", "np-1"))),
        T0 + 100,
        slices({}, suspended=("0", "1")),
        Want(Action.WAIT, publish=False, wait=WaitReason.ADMISSION),
    ),
    Case(
        "the same without a queue (a JobSet suspended by hand): it leaves the world all the same",
        lambda: on_world(("0", "1"), nodepools=("np-0", "np-1")),
        T0 + 100,
        slices({"0": "np-0"}, suspended=("1",)),
        Want(Action.NEW_WORLD, publish=True, world=("0",), joining=("1",), end_kind=EndKind.EVICTED),
    ),
    Case(
        "the evicted slice queued while the survivor trains: wait, the world published",
        lambda: queued(on_world(("0",), joining=("1",))),
        T0 + 100,
        slices({"0": "np-0"}, suspended=("1",)),
        Want(Action.WAIT, publish=True, joining=("1",)),
    ),
    Case(
        "admitted again and its pods running: it rejoins, at the same global batch",
        lambda: queued(on_world(("0",), joining=("1",))),
        T0 + 100,
        slices({"0": "np-0", "1": "np-1"}),
        Want(Action.NEW_WORLD, publish=True, world=("0", "1"), end_kind=EndKind.GROW),
    ),
    Case(
        "in a queue the grow asks Kueue at once, with no node for the slice yet (a ProvisioningRequest"
        " creates it after admission)",
        lambda: queued(on_world(("0",))),
        T0 + 100,
        slices({"0": "np-0"}),
        Want(Action.CREATE_JOBSET, publish=True, create=("1",), joining=("1",)),
        pools=1,
    ),
    Case(
        "without a queue the grow still waits for nodes to fit",
        lambda: on_world(("0",)),
        T0 + 100,
        slices({"0": "np-0"}),
        Want(Action.WAIT, publish=True),
        pools=1,
    ),
    Case(
        "a slice admitted late (its admission check passed) but its pods not scheduled yet: not"
        " dropped for the nodes seen now, only after the grace period",
        lambda: queued(on_world(("0",), joining=("1",))),
        T0 + 100,
        {
            "jobsets": [slice_jobset("0"), slice_jobset("1")],
            "pods": slice_pods("0", "np-0") + slice_pods("1", None, unschedulable_since=T0 + 90),
        },
        Want(Action.WAIT, publish=True, joining=("1",)),
        pools=1,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_kueue_in_place(case: Case) -> None:
    rec = case.record()
    d = decide(rec, observe(rec, {}, pools=case.pools, now=case.now, **case.observed))
    want = case.want
    assert (d.action, d.publish, d.wait) == (want.action, want.publish, want.wait), d.reason
    assert (d.slices_create, d.slices_delete) == (want.create, want.delete), d.reason
    seg = d.record.current
    if want.world is not None:
        assert seg.slice_ids == want.world and seg.index == rec.current.index + 1
        assert d.record.segments[-2].end_kind == want.end_kind
        # The same global batch on every world.
        assert (
            seg.devices // seg.slices * len(want.world) * seg.micro_batch * seg.grad_accum
            == QUEUED.global_batch
        )
    assert seg.joining == want.joining
