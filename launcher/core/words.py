"""The domain's words, one StrEnum each: what a run record, a decision, an observation and the ledger
say. Their values are the strings the record (a ConfigMap), the ledger (events.jsonl) and the
reports hold, whatever version wrote them, so a StrEnum member and the plain string compare, hash and
serialise alike. The words the trainer speaks too (RestartMode, StateSource) are contract/words.py's.

Imported by the core (record, policy, signals, accounting) and by whatever compares or writes these
words above it; tests/launcher/test_house_rules.py fails on a literal compared to one of them
outside this module."""

from __future__ import annotations

from enum import StrEnum


class RunState(StrEnum):
    """A run record's `state`."""

    PENDING = "Pending"  # recorded, segment 0 not submitted yet
    RUNNING = "Running"  # a segment is live (or being submitted)
    RESHAPING = "Reshaping"  # a segment is ending to change shape; the next one follows
    WAITING = "WaitingForCapacity"  # no shape in the ladder fits what the cluster has
    FINISHED = "Finished"
    FAILED = "Failed"
    STOPPED = "Stopped"


class EndKind(StrEnum):
    """Why a segment ended (`Segment.end_kind`): written by the policy alone."""

    FINISHED = "finished"  # the trainer reported the final step
    FAILED = "failed"  # the run failed with it (a configuration error, a JobSet completed early)
    APP_FAILURE = "app-failure"  # JobSet gave up on application failures, or the budget is spent
    CAPACITY_LOST = "capacity-lost"  # shrinking, or moving to another node pool
    GROW = "grow"  # a larger shape has fitted for the grow window
    # Its JobSet disappeared behind the controller's back. ("Lost" is kept for capacity: node pools
    # gone or unhealthy; "gone" for the pools whose nodes were deleted.)
    DISAPPEARED = "disappeared"
    # In place: JobSet began a new attempt of a slice of its world (JobSet's restart, counted in
    # its `restarts`); the same slices, a new world. ("Restart" is kept for the restart mode.)
    NEW_ATTEMPT = "new-attempt"
    # A JobSet gave up (its own maxRestarts) on a host disruption: never the run's failure, so the
    # next segment starts at once, uncharged (docs/design.md "A rebooted host").
    HOST_DISRUPTION = "host-disruption"
    # Kueue suspended its JobSet (or one of its world's slice JobSets): evicted or preempted, or not
    # admitted within the grace period (docs/gke.md "Kueue"). The next segment is smaller.
    EVICTED = "evicted"


class Action(StrEnum):
    """What a decision asks the controller to do (`policy.Decision.action`)."""

    WAIT = "wait"
    START_SEGMENT = "start-segment"  # record a new segment, then create its JobSet
    CREATE_JOBSET = "create-jobset"  # create the current segment's JobSet again (its creation was cut short)
    END = "end-segment"  # record why the segment ends, then delete its JobSet
    DELETE = "delete"  # delete a JobSet the record already says is over
    FINISH = "finish"
    FAIL = "fail"
    STOP = "stop"  # `reslice stop` (controller/launch.py), never a decision of the policy
    # In place: record the next world (a segment), delete only the leaving slices' JobSets, create
    # only the new slices', and publish it to the pods' supervisors.
    NEW_WORLD = "new-world"


class WaitReason(StrEnum):
    """Why a run waits for capacity instead of starting or reshaping a segment (`Decision.wait`, the
    ledger's `wait` key, `RunRecord.waiting`): the on-call person's first question."""

    # No feasible rung of the ladder fits what the cluster has (nodes, or in a Kueue queue the
    # slices admitted).
    NO_ROOM = "no-room"
    # Some rung fits the cluster, but none of those holds the run: their batch plan or the trainer
    # config's HBM estimate does not fit (launcher/core/plan.py), so the run never goes there.
    ONLY_INFEASIBLE = "only-infeasible-shapes-fit"
    # Kueue has not admitted (unsuspended) the slice JobSets a world needs yet (docs/gke.md "Kueue").
    ADMISSION = "kueue-admission"


class Phase(StrEnum):
    """The phase of a segment's JobSet, as the signals read it."""

    ABSENT = "absent"
    DELETING = "deleting"
    PENDING = "pending"
    RUNNING = "running"
    RESTARTING = "restarting"
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"


class Cause(StrEnum):
    """The cause of a JobSet restart, as the failed pods of the attempt tell it."""

    PREEMPTION = "preemption"  # a DisruptionTarget, or the trainer saved and exited 42
    PEER_LOST = "peer-lost"  # the trainer exited 43: a host of the segment died under it
    APP_FAILURE = "app-failure"  # a trainer failed on its own (any other exit, no disruption)
    # Its host went away under it (rebooted, or its kubelet could not admit it again): the kubelet
    # reports a container it cannot find (`HostLoss`), never the trainer's own exit.
    HOST_DISRUPTION = "host-disruption"


class HostLoss(StrEnum):
    """What a pod's status says when its container went away with its host rather than exiting on
    its own (docs/design.md "A rebooted host"). The values are upstream's own reasons:
    kubernetes/kubernetes pkg/kubelet/kubelet_pods.go (`convertToAPIContainerStatuses`) and
    pkg/kubelet/status/status_manager.go (`TerminatePod`) write CONTAINER_UNKNOWN, exit code 137, for a
    container last seen Running that the runtime no longer has (a reboot); containerd, when it kept
    the container's record across the reboot, reports it exited with RUNTIME_UNKNOWN, exit code 255;
    the kubelet's admission after a restart fails a pod it cannot admit again (a device plugin not
    yet registered) with the pod reason UNEXPECTED_ADMISSION."""

    CONTAINER_UNKNOWN = "ContainerStatusUnknown"
    RUNTIME_UNKNOWN = "Unknown"
    UNEXPECTED_ADMISSION = "UnexpectedAdmissionError"


class FailureKind(StrEnum):
    """Why JobSet gave up on a segment (`signals.Failure.kind`)."""

    CONFIG_ERROR = "config-error"  # the trainer exited 2: the config-error rule failed the JobSet
    MAX_RESTARTS = "max-restarts"
    OTHER = "other"


class PodPhase(StrEnum):
    """Kubernetes' pod phases, the ones the signals and the probe compare."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class TrainerState(StrEnum):
    """The trainer's `state` in its status file (docs/contract.md)."""

    RUNNING = "running"
    FINISHED = "finished"


class LedgerKind(StrEnum):
    """The `kind` of a ledger line (the run directory's events.jsonl)."""

    OBSERVE = "observe"
    ACT = "act"
    WAIT = "wait"
    CONFLICT = "conflict"
    TAKEOVER = "takeover"
    LEASE = "lease"
    UNUSABLE_CHECKPOINT = "unusable-checkpoint"
    LAUNCH = "launch"
    RELAUNCH = "relaunch"  # a sweep relaunched a run
    RESTORE = "restore"  # where a trainer incarnation's state came from (its status.json)


class DropUnit(StrEnum):
    """What a sweep's dropped fraction counts (`sweep.results.FactorResult.drop_unit`)."""

    ROWS = "rows"  # reslice's trainer counts the (token, expert) rows it dropped
    LAYER_STEPS = "layer-steps"  # MaxText: (step, MoE layer) pairs whose buffer overflowed


class TrainerProfile(StrEnum):
    """The trainer a run runs (`RunSpec.trainer`, `--trainer`): reslice's own (trainer/) or MaxText
    (docs/maxtext.md)."""

    RESLICE = "reslice"
    MAXTEXT = "maxtext"


class PodRuntime(StrEnum):
    """How the embedded cluster's kubelet runs a pod's containers (`reslice demo --runtime`, `reslice
    cluster up --runtime`): as local processes of the container's command, or as `podman run` of the
    container's image (docs/embedded.md "Runtimes")."""

    PROCESS = "process"
    PODMAN = "podman"
