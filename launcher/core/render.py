"""RunSpec + Shape -> a JobSet for GKE, as a plain dict. Pure: YAML happens at the edge.

What the JobSet must get right, and why (docs/platform.md §2–3):
- one replicated job, one child Job per slice, one pod per host; `exclusive-topology` pins each
  child Job to its own node pool (= one slice);
- the failure policy tells causes apart: a disruption, a trainer that saved and exited 42, or one
  whose peer was lost (exit 43) restarts the JobSet without spending `maxRestarts`; exit 2
  (configuration error) fails it at once; any other failure restarts and counts;
- `BlockingRecreate`, so that new pods never race the terminating ones for the same slice;
- the trainer contract environment (docs/contract.md) and the distributed identity;
- what GKE needs of a TPU pod: the node labels of the slice (machine type included, placement
  policy only when one is named), a JAX coordinator port no TPU host service uses, cpu and memory
  requests (never BestEffort), a grace period the capacity's termination notice really gives.
"""

from __future__ import annotations

import json
import re

from contract import envvars
from contract.exits import Exit
from contract.words import RestartMode
from launcher.core import maxtext
from launcher.core.errors import UserError
from launcher.core.exits import (
    RULE_APP_FAILURE,
    RULE_CONFIG_ERROR,
    RULE_PREEMPTED,
)
from launcher.core.labels import (
    ANNOTATION_EXCLUSIVE,
    ANNOTATION_TAS_PREFERRED,
    ANNOTATION_TAS_REQUIRED,
    ANNOTATION_TAS_SLICE_REQUIRED,
    ANNOTATION_TAS_SLICE_SIZE,
    API_VERSION,
    CONTAINER,
    LABEL_JOB_INDEX,
    LABEL_QUEUE,
    LABEL_RESTART_ATTEMPT,
    LABEL_RUN,
    REPLICATED_JOB,
    jobset_name,
    segment_labels,
    slice_jobset_name,
    slice_labels,
    world_access_name,
    world_configmap_name,
)
from launcher.core.plan import Plan, plan_batch
from launcher.core.presets import LABEL_NODEPOOL, RESOURCE_TPU, Preset, Shape
from launcher.core.spec import (
    RunSpec,
    coordinator_port_error,
    grace_period,
    restart_mode_error,
    run_preset,
    short_notice,
    trainer_overrides,
)
from launcher.core.words import TrainerProfile

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
POD_SUFFIX = 6  # "-xxxxx" that the Job controller appends to generated pod names


def name_error(name: str, shape: Shape) -> str | None:
    """Why `name` cannot be a JobSet of `shape`, or None.

    The webhook rejects a JobSet whose generated pod names (`<js>-<rjob>-<jobIdx>-<podIdx>-xxxxx`)
    are not DNS-1035 labels of at most 63 characters; the longest index decides.
    """
    if not DNS1035.match(name):
        return f"{name!r} is not a DNS-1035 label (lowercase letters, digits and '-', starting with a letter)"
    longest = f"{name}-{REPLICATED_JOB}-{shape.slices - 1}-{shape.preset.hosts - 1}"
    if len(longest) + POD_SUFFIX > 63:
        room = 63 - (len(longest) - len(name)) - POD_SUFFIX
        return (
            f"JobSet name {name!r} is too long for {shape}: its pod names would be "
            f"{len(longest) + POD_SUFFIX} characters (max 63); use at most {room} characters"
        )
    return None


def run_name_room(shape: Shape, segment: int) -> int:
    """The longest run name whose JobSet of segment `segment` on `shape` has pod names of at most 63
    characters: the advice `run_name_error` gives is this number, so following it is accepted."""
    pod = f"-{segment}-{REPLICATED_JOB}-{shape.slices - 1}-{shape.preset.hosts - 1}"
    return 63 - len(pod) - POD_SUFFIX


def run_name_error(run: str, shape: Shape, segment: int) -> str | None:
    """Why `run` cannot name a run that may reach segment `segment` on `shape`, or None."""
    if not DNS1035.match(run):
        return f"run name {run!r} is not a DNS-1035 label (lowercase letters, digits and '-', starting with a letter)"
    room = run_name_room(shape, segment)
    if len(run) > room:
        return (
            f"run name {run!r} ({len(run)} characters) is too long for {shape}: the pod names of its "
            f"segment {segment} would be longer than 63 characters; use at most {room} characters"
        )
    return None


def plan_for(spec: RunSpec, shape: Shape) -> Plan:
    plan = plan_batch(
        spec.global_batch, shape.devices, spec.max_micro_batch, spec.max_grad_accum, spec.model_parallel
    )
    if not isinstance(plan, Plan):
        raise UserError(f"{shape}: {plan.reason}")
    return plan


def failure_policies(spec: RunSpec) -> tuple[dict, dict]:
    """(Job podFailurePolicy, JobSet failurePolicy).

    The Job turns each cause into a failure reason and message; the JobSet maps them to actions.
    Every job failure caused by a podFailurePolicy rule has reason `PodFailurePolicy`, so the
    config-error rule must come first and match on the message the Job controller writes
    ("Container trainer for pod ns/p failed with exit code 2 matching FailJob rule at index 2").
    """
    pod_failure_policy = {
        "rules": [
            {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": CONTAINER,
                    "operator": "In",
                    "values": [int(Exit.PREEMPTED), int(Exit.PEER_LOST)],  # the API wants them ascending
                },
            },
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": [int(Exit.CONFIG)]},
            },
        ]
    }
    jobset_failure_policy = {
        "maxRestarts": spec.max_restarts,
        "restartStrategy": "BlockingRecreate",
        "rules": [
            {
                "name": RULE_CONFIG_ERROR,
                "action": "FailJobSet",
                "onJobFailureReasons": ["PodFailurePolicy"],
                "onJobFailureMessagePatterns": [f"failed with exit code {Exit.CONFIG} matching FailJob rule"],
            },
            {
                # Disruptions, exit 42 and exit 43: the controller tells them apart by the pods.
                "name": RULE_PREEMPTED,
                "action": "RestartJobSetAndIgnoreMaxRestarts",
                "onJobFailureReasons": ["PodFailurePolicy"],
            },
            # Empty reasons match any failure: crashes, OOM, BackoffLimitExceeded.
            {"name": RULE_APP_FAILURE, "action": "RestartJobSet"},
        ],
    }
    return pod_failure_policy, jobset_failure_policy


SHM_MOUNT = "/dev/shm"  # where the pod's Memory emptyDir is mounted


def _env(name: str, value: object) -> dict:
    return {"name": name, "value": str(value)}


def _field_env(name: str, path: str) -> dict:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def trainer_env(spec: RunSpec, shape: Shape, segment: int, plan: Plan) -> list[dict]:
    js = jobset_name(spec.run, segment)
    # Slice 0, host 0 is process 0; its stable DNS name comes from enableDNSHostnames.
    host0 = f"{js}-{REPLICATED_JOB}-0-0.{js}"
    preset = shape.preset
    env = [
        _env(envvars.RUN, spec.run),
        _env(envvars.SEGMENT, segment),
        _env(envvars.RUN_DIR, spec.run_dir),
        _env(envvars.GLOBAL_BATCH, spec.global_batch),
        _env(envvars.MICRO_BATCH, plan.micro_batch),
        _env(envvars.GRAD_ACCUM, plan.grad_accum),
        _env(envvars.NUM_SLICES, shape.slices),
        _env(envvars.CONFIG, spec.config),
        _env(envvars.SET, json.dumps(trainer_overrides(spec, preset))),
        _env(envvars.COORDINATOR, f"{host0}:{spec.coordinator_port}"),
        _env(envvars.NUM_PROCESSES, shape.hosts),
        _env(envvars.HOSTS_PER_SLICE, preset.hosts),
        _field_env(envvars.SLICE_INDEX, f"metadata.labels['{LABEL_JOB_INDEX}']"),
        _field_env(envvars.RESTART_ATTEMPT, f"metadata.labels['{LABEL_RESTART_ATTEMPT}']"),
        _env(envvars.PEAK_TFLOPS, preset.peak_tflops_per_chip / preset.devices_per_chip),
    ]
    if spec.heartbeat_timeout_s is not None:
        env.append(_env(envvars.HEARTBEAT_TIMEOUT_S, spec.heartbeat_timeout_s))
    env.append(_env(envvars.INIT_TIMEOUT_S, spec.init_timeout_s))
    if shape.slices > 1:
        env += [
            _env(envvars.MEGASCALE_COORDINATOR_ADDRESS, host0),
            _env(envvars.MEGASCALE_NUM_SLICES, shape.slices),
            _field_env(envvars.MEGASCALE_SLICE_ID, f"metadata.labels['{LABEL_JOB_INDEX}']"),
            _env(envvars.MEGASCALE_PORT, spec.megascale_port),
        ]
    env += [_env(k, v) for k, v in spec.env]
    return env


def placement(spec: RunSpec, preset: Preset) -> dict:
    """Where a pod of `preset` runs and as whom: the part of the pod spec that the trainer pods and
    the preflight write probe (launcher/preflight/probe.py) share, so the probe tests what the trainers get."""
    preset = run_preset(spec, preset)
    tolerations = [{"key": RESOURCE_TPU, "operator": "Exists", "effect": "NoSchedule"}]
    if preset.spot:
        tolerations.append(
            {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
        )
    pod = {
        "hostNetwork": True,
        "dnsPolicy": "ClusterFirstWithHostNet",
        "nodeSelector": preset.node_selector(),
        "tolerations": tolerations,
    }
    if spec.priority_class:
        pod["priorityClassName"] = spec.priority_class
    if spec.service_account:
        pod["serviceAccountName"] = spec.service_account
    return pod


def container_command(spec: RunSpec, shape: Shape, segment: int, plan: Plan) -> tuple[list[str], list[dict]]:
    """The trainer container's command and environment for the run's trainer profile."""
    env = trainer_env(spec, shape, segment, plan)
    if spec.trainer != TrainerProfile.MAXTEXT:
        return ["python", "-m", "trainer"], env
    js = jobset_name(spec.run, segment)
    interval = spec.short_notice_interval if short_notice(spec, shape.preset) else None
    keys = maxtext.maxtext_keys(spec.run_dir, spec.overrides, shape, plan, interval)
    host0 = f"{js}-{REPLICATED_JOB}-0-0.{js}"
    job_index = f"metadata.labels['{LABEL_JOB_INDEX}']"
    return maxtext.command(spec.config, keys), env + maxtext.distributed_env(host0, shape, job_index)


def pod_spec(spec: RunSpec, shape: Shape, segment: int, plan: Plan, pool: str | None = None) -> dict:
    command, env = container_command(spec, shape, segment, plan)
    return _pod(spec, shape.preset, command, env, pool)


def _pod(spec: RunSpec, preset: Preset, command: list[str], env: list[dict], pool: str | None) -> dict:
    where = placement(spec, preset)
    if pool:
        where["nodeSelector"] = {**where["nodeSelector"], LABEL_NODEPOOL: pool}
    chips = {RESOURCE_TPU: str(preset.chips_per_host)}
    host = preset.requests()
    requests = {
        **chips,
        "cpu": spec.cpu_request or host["cpu"],
        "memory": spec.memory_request or host["memory"],
    }
    pod = {
        "restartPolicy": "Never",
        "hostNetwork": where["hostNetwork"],
        "dnsPolicy": where["dnsPolicy"],
        "terminationGracePeriodSeconds": grace_period(spec, preset),
        "nodeSelector": where["nodeSelector"],
        "tolerations": where["tolerations"],
        "containers": [
            {
                "name": CONTAINER,
                "image": spec.image,
                "imagePullPolicy": spec.image_pull_policy,
                "command": command,
                "env": env,
                "ports": [{"containerPort": spec.coordinator_port, "name": "coordinator"}],
                # Requests without cpu/memory limits: Burstable, never BestEffort, and the trainer
                # may use the rest of its host.
                "resources": {"requests": requests, "limits": dict(chips)},
                "volumeMounts": [{"name": "dshm", "mountPath": SHM_MOUNT}],
            }
        ],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
    }
    return {**pod, **where}  # the rest of `where` (priority class, service account) goes last


def render_jobset(spec: RunSpec, shape: Shape, segment: int = 0, pool: str | None = None) -> dict:
    """The JobSet of segment `segment` of the run on `shape`. Raises UserError if impossible.

    `pool`: the node pool of a one-slice segment (the controller names one it sees free). Its pods
    then select that pool and the JobSet drops exclusive placement, which would hold every follower
    pod back until its leader is scheduled: JobSet's pod webhook rejects followers until then and
    the Job controller creates them again a second or more later (docs/platform.md §2)."""
    if pool and shape.slices != 1:
        raise ValueError(f"a JobSet of {shape.slices} slices cannot name one node pool")
    name = jobset_name(spec.run, segment)
    if err := shape.error or coordinator_port_error(spec.coordinator_port):
        raise UserError(err)
    if err := run_name_error(spec.run, shape, segment):
        raise UserError(err)
    plan = plan_for(spec, shape)
    pod = pod_spec(spec, shape, segment, plan, pool)
    return _jobset(spec, name, segment_labels(spec.run, segment), shape, pod, pool)


def _jobset(spec: RunSpec, name: str, labels: dict, shape: Shape, pod: dict, pool: str | None) -> dict:
    """A JobSet of `shape.slices` Jobs (one per slice, a pod per host), each pod `pod`; exclusive
    node-pool placement unless `pool` names one. A segment's JobSet and an in-place slice's alike."""
    pod_failure_policy, jobset_failure_policy = failure_policies(spec)
    jobset_labels = dict(labels)
    queued = {}
    if spec.queue:
        jobset_labels[LABEL_QUEUE] = spec.queue
        # Created suspended, as Kueue's webhook makes a JobSet of a queue (kueue
        # pkg/controller/jobframework/defaults.go ApplyDefaultForSuspend): no pod starts before
        # Kueue admits it (jobframework/reconciler.go startJob unsuspends it), wherever the
        # webhook's namespace selector does not reach.
        queued = {"suspend": True}
    template_meta: dict = {"labels": dict(labels)}
    if annotations := tas_annotations(spec, shape):
        template_meta["annotations"] = annotations
    return {
        "apiVersion": API_VERSION,
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": spec.namespace,
            "labels": jobset_labels,
            "annotations": {} if pool else {ANNOTATION_EXCLUSIVE: LABEL_NODEPOOL},
        },
        "spec": {
            **queued,
            "ttlSecondsAfterFinished": spec.ttl_after_finished_s,
            "network": {"enableDNSHostnames": True, "subdomain": name},
            "failurePolicy": jobset_failure_policy,
            "successPolicy": {"operator": "All"},
            "replicatedJobs": [
                {
                    "name": REPLICATED_JOB,
                    "replicas": shape.slices,
                    "template": {
                        "metadata": {"labels": dict(labels)},
                        "spec": {
                            "parallelism": shape.preset.hosts,
                            "completions": shape.preset.hosts,
                            "completionMode": "Indexed",
                            "backoffLimit": 0,
                            "podFailurePolicy": pod_failure_policy,
                            "template": {"metadata": template_meta, "spec": pod},
                        },
                    },
                }
            ],
        },
    }


def tas_annotations(spec: RunSpec, shape: Shape) -> dict[str, str]:
    """Kueue's topology-aware scheduling request on the pod template (`--tas-topology`), per slice:
    Kueue admits a JobSet's replicated Job as one podset (kueue pkg/controller/jobs/jobset/
    jobset_controller.go PodSets, each Job a subgroup by job index). A JobSet of one slice (in place,
    or one slice in recreate) asks for all its pods in one domain of the level; one of several
    slices asks for each slice of `hosts` pods in one (podset-slice-required-topology with
    podset-slice-size, kueue site/static/examples/jobs/sample-jobset-tas-sliced.yaml), since the
    slices are separate ICI domains. Preferred: the podset's pods in one domain if they fit, Kueue
    going up the levels otherwise (there is no per-slice preference)."""
    level = spec.tas_topology
    if not level:
        return {}
    if spec.tas_preferred:
        return {ANNOTATION_TAS_PREFERRED: level}
    if shape.slices == 1:
        return {ANNOTATION_TAS_REQUIRED: level}
    return {ANNOTATION_TAS_SLICE_REQUIRED: level, ANNOTATION_TAS_SLICE_SIZE: str(shape.preset.hosts)}


# --- in-place runs (docs/contract.md "World (in-place restarts)") -----------------------------------


def inplace_env(spec: RunSpec, preset: Preset, slice_id: str) -> list[dict]:
    """The pod environment of an in-place run: what stays the same in every world. What a world
    decides (process ids, coordinator, batch plan, `MEGASCALE_*`) the supervisor sets in each child
    from the published world (trainer/world.child_env)."""
    env = [
        _env(envvars.RUN, spec.run),
        _env(envvars.RUN_DIR, spec.run_dir),
        _env(envvars.CONFIG, spec.config),
        _env(envvars.SET, json.dumps(trainer_overrides(spec, preset))),
        _env(envvars.RESTART_MODE, RestartMode.IN_PLACE),
        _env(envvars.SLICE_ID, slice_id),
        # The snapshots' RAM: the pod's Memory emptyDir (below), which goes with the pod.
        _env(envvars.MEMORY_ROOT, SHM_MOUNT),
        _env(envvars.WORLD_CONFIGMAP, world_configmap_name(spec.run)),
        _env(envvars.WORLD_NAMESPACE, spec.namespace),
        _field_env(envvars.RESTART_ATTEMPT, f"metadata.labels['{LABEL_RESTART_ATTEMPT}']"),
        _env(envvars.PEAK_TFLOPS, preset.peak_tflops_per_chip / preset.devices_per_chip),
    ]
    if spec.world_api:
        env.append(_env(envvars.WORLD_API, spec.world_api))
    if spec.heartbeat_timeout_s is not None:
        env.append(_env(envvars.HEARTBEAT_TIMEOUT_S, spec.heartbeat_timeout_s))
    env.append(_env(envvars.INIT_TIMEOUT_S, spec.init_timeout_s))
    env += [_env(k, v) for k, v in spec.env]
    return env


def world_account(spec: RunSpec) -> str:
    """The ServiceAccount an in-place run's pods read their world as: the run's own, or the one the
    person named (`--service-account`), which the run's RoleBinding then binds."""
    return spec.service_account or world_access_name(spec.run)


def render_slice_jobset(spec: RunSpec, preset: Preset, slice_id: str, pool: str | None = None) -> dict:
    """The JobSet of one slice of an in-place run: replicas 1, its pods labelled with the slice, not
    a segment, so that a shape change deletes only a lost slice's JobSet and creates only a new
    one's. Exclusive placement as a segment's JobSet has it: JobSet's pod webhook gives each leader
    pod an anti-affinity to every pod with a `job-key` other than its own Job's, in any namespace,
    so two slice JobSets' Jobs never share a node pool (docs/platform.md §2). `pool`: as in
    `render_jobset`, a node pool the controller names (exclusive placement then dropped). Raises
    UserError if impossible."""
    if err := restart_mode_error(RestartMode.IN_PLACE, spec.trainer):
        raise UserError(err)
    shape = Shape(preset, 1)
    name = slice_jobset_name(spec.run, slice_id)
    if err := shape.error or coordinator_port_error(spec.coordinator_port):
        raise UserError(err)
    if err := name_error(name, shape):
        raise UserError(err)
    pod = _pod(spec, preset, ["python", "-m", "trainer"], inplace_env(spec, preset, slice_id), pool)
    pod["serviceAccountName"] = world_account(spec)
    return _jobset(spec, name, slice_labels(spec.run, slice_id), shape, pod, pool)


def render_world_access(spec: RunSpec, owner: dict | None = None) -> list[dict]:
    """What lets an in-place run's pods read their world and nothing else: a ServiceAccount (unless
    the run names one), a Role limited to the world ConfigMap by `resourceNames` (which holds for
    `list` and `watch` because the supervisor sends the `metadata.name` field selector:
    docs/contract.md), and the RoleBinding between them. All labelled with the run, and owned by
    `owner` (the world ConfigMap as created, with its uid) when given: the garbage collector
    deletes them once the controller deletes the world at the run's end (docs/contract.md)."""
    name = world_access_name(spec.run)
    meta: dict = {"name": name, "namespace": spec.namespace, "labels": {LABEL_RUN: spec.run}}
    if owner is not None:
        # No blockOwnerDeletion: setting it needs the right to update the owner's finalizers.
        meta["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
            }
        ]
    out: list[dict] = []
    if not spec.service_account:
        out.append({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": dict(meta)})
    out.append(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": dict(meta),
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "resourceNames": [world_configmap_name(spec.run)],
                    "verbs": ["get", "list", "watch"],
                }
            ],
        }
    )
    out.append(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": dict(meta),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [
                {"kind": "ServiceAccount", "name": world_account(spec), "namespace": spec.namespace}
            ],
        }
    )
    return out
