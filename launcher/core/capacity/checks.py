"""The preflight checks: pure functions over one snapshot of the cluster (`ClusterFacts`).

Each returns a `Check`: a row with what was found and, when it does not hold, the fix. The snapshot
is read by `launcher/preflight/gate.py`; the write probe's row is `launcher/preflight/probe.py`'s. Upstream sources
for what is checked: docs/preflight.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from launcher.core.capacity.pools import Pool, create_command, names, pools_for
from launcher.core.capacity.quota import HOST_RESOURCES, shortfalls
from launcher.core.plan import Plan
from launcher.core.presets import Shape
from launcher.core.render import placement, pod_spec
from launcher.core.spec import RunSpec, run_preset
from launcher.core.words import TrainerProfile

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"

JOBSET_NAMESPACE = "jobset-system"
# The release manifests (kustomize namePrefix `jobset-` on `controller-manager`) and the Helm chart
# (`<release>-controller`, release `jobset` as its install docs name it).
JOBSET_DEPLOYMENTS = ("jobset-controller-manager", "jobset-controller")
JOBSET_MIN = (0, 12)
JOBSET_INSTALL = (
    "kubectl apply --server-side -f "
    "https://github.com/kubernetes-sigs/jobset/releases/download/v0.12.0/manifests.yaml"
)


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # OK | WARN | FAIL | SKIP
    found: str
    fix: str = ""


@dataclass(frozen=True)
class Request:
    """What must fit: the run's spec and its shapes, the requested one first."""

    spec: RunSpec
    ladder: tuple[Shape, ...]
    # Shapes of the shrink ladder the run never takes, with why (a multislice of a single-host
    # preset, a global batch the devices cannot divide): shown, but no node pools are needed for them.
    skipped: tuple[tuple[Shape, str], ...] = ()

    @property
    def shape(self) -> Shape:
        return self.ladder[0]


@dataclass(frozen=True)
class ClusterFacts:
    """Everything the checks look at, read once. None: the server has no such object or API."""

    jobset_resources: tuple[str, ...] | None = None  # what jobset.x-k8s.io/v1alpha2 serves
    jobset_deployment: dict | None = None
    embedded: dict | None = None  # /embedded/v1/info: only the embedded cluster answers it
    kueue_resources: tuple[str, ...] | None = None
    local_queue: dict | None = None
    namespace: dict | None = None
    priority_class: dict | None = None
    service_account: dict | None = None
    quotas: tuple[dict, ...] = ()
    nodes: tuple[dict, ...] = ()
    forbidden: dict[str, str] = field(default_factory=dict)  # fact -> why it could not be read


def check_jobset_api(facts: ClusterFacts) -> Check:
    name = "JobSet API"
    if facts.jobset_resources is not None and "jobsets" in facts.jobset_resources:
        return Check(name, OK, "jobsets.jobset.x-k8s.io served at v1alpha2")
    why = facts.forbidden.get("jobset", "jobset.x-k8s.io/v1alpha2 is not served (no JobSet CRD)")
    return Check(name, FAIL, why, f"install JobSet v0.12 or later: {JOBSET_INSTALL}")


def image_version(image: str) -> tuple[int, int, int] | None:
    """(0, 12, 0) from `registry.k8s.io/jobset/jobset:v0.12.0[@sha256:...]`; None without a version tag."""
    tag = image.split("@", 1)[0].rpartition("/")[2].partition(":")[2]
    m = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", tag)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


def check_jobset_controller(facts: ClusterFacts) -> Check:
    name, dep = "JobSet controller", facts.jobset_deployment
    wanted = "v" + ".".join(map(str, JOBSET_MIN))
    if dep is None:
        if facts.embedded is not None:
            version = facts.embedded.get("jobset_version", "?")
            return Check(name, OK, f"embedded cluster: its JobSet controller follows {version}")
        if "jobset_deployment" in facts.forbidden:
            return Check(
                name, WARN, f"version not checked: {facts.forbidden['jobset_deployment']}",
                f"make sure it is JobSet {wanted}+: kubectl -n {JOBSET_NAMESPACE} get deployments -o wide",
            )  # fmt: skip
        return Check(
            name, FAIL, f"no Deployment {' or '.join(JOBSET_DEPLOYMENTS)} in namespace {JOBSET_NAMESPACE}",
            f"install JobSet {wanted} or later: {JOBSET_INSTALL}",
        )  # fmt: skip
    where = f"{JOBSET_NAMESPACE}/{dep['metadata']['name']}"
    containers = dep.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or [{}]
    image = next((c for c in containers if c.get("name") == "manager"), containers[0]).get("image", "")
    version = image_version(image)
    available = (dep.get("status") or {}).get("availableReplicas") or 0
    if version is not None and version[:2] < JOBSET_MIN:
        return Check(name, FAIL, f"{where} runs {image}, older than {wanted}", f"upgrade: {JOBSET_INSTALL}")
    if not available:
        return Check(
            name, FAIL, f"{where} ({image}) has no available replica",
            f"kubectl -n {JOBSET_NAMESPACE} describe deployment {dep['metadata']['name']}",
        )  # fmt: skip
    if version is None:
        return Check(
            name, WARN, f"{where} runs {image}: no version in its tag", f"make sure it is JobSet {wanted}+"
        )
    return Check(name, OK, f"{where} runs {image} ({available} available)")


def check_namespace(facts: ClusterFacts, ns: str) -> Check:
    if facts.namespace is None:
        why = facts.forbidden.get("namespace", f"namespace {ns} does not exist")
        return Check("namespace", FAIL, why, f"kubectl create namespace {ns} (or choose another --namespace)")
    phase = (facts.namespace.get("status") or {}).get("phase", "Active")
    if phase != "Active":
        return Check("namespace", FAIL, f"namespace {ns} is {phase}", "choose another --namespace")
    return Check("namespace", OK, f"{ns} exists")


def check_service_account(facts: ClusterFacts, spec: RunSpec) -> Check:
    sa, ns = spec.service_account, spec.namespace
    if facts.service_account is not None:
        return Check("service account", OK, f"{ns}/{sa} exists")
    why = facts.forbidden.get("service_account", f"no ServiceAccount {sa} in namespace {ns}")
    return Check("service account", FAIL, why, f"kubectl -n {ns} create serviceaccount {sa}")


def check_priority_class(facts: ClusterFacts, name: str) -> Check:
    if (pc := facts.priority_class) is not None:
        return Check("priority class", OK, f"{name} (value {pc.get('value')})")
    why = facts.forbidden.get("priority_class", f"no PriorityClass {name}: the API server refuses the pods")
    return Check(
        "priority class", FAIL, why, "create it (kubectl get priorityclasses) or drop --priority-class"
    )


def check_queue(facts: ClusterFacts, spec: RunSpec) -> Check:
    name, q, ns = "Kueue LocalQueue", spec.queue, spec.namespace
    if facts.kueue_resources is None or "localqueues" not in facts.kueue_resources:
        why = facts.forbidden.get("kueue", "Kueue is not installed (kueue.x-k8s.io/v1beta1 is not served)")
        return Check(name, FAIL, why, "install Kueue (kueue.sigs.k8s.io/docs/installation) or drop --queue")
    if (lq := facts.local_queue) is None:
        why = facts.forbidden.get("local_queue", f"no LocalQueue {q} in namespace {ns}")
        return Check(
            name, FAIL, why, f"create it or choose another --queue (kubectl -n {ns} get localqueues)"
        )
    target = (lq.get("spec") or {}).get("clusterQueue", "?")
    for cond in (lq.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Active" and cond.get("status") == "False":
            return Check(
                name, FAIL, f"{q} -> ClusterQueue {target} is inactive: {cond.get('message', '')}",
                f"kubectl get clusterqueue {target} -o yaml (its status says why)",
            )  # fmt: skip
    return Check(name, OK, f"{q} -> ClusterQueue {target}")


def check_run_dir(run_dir: str, embedded: bool) -> Check:
    if run_dir.startswith("gs://"):
        return Check("run directory", OK, f"{run_dir} (whether the pods may write it: the write probe)")
    if embedded:
        return Check("run directory", OK, f"{run_dir}: a local path; the embedded cluster's pods run here")
    return Check(
        "run directory", FAIL, f"{run_dir} is a local path, on a cluster whose pods share no disk with it",
        "use --run-dir gs://BUCKET/PATH",
    )  # fmt: skip


def check_image(spec: RunSpec, embedded: bool) -> Check:
    """The image must hold the profile's program: reslice's trainer image has no MaxText, and the
    MaxText image no `trainer` package (launcher.core.maxtext.IMAGES; docker/). Told by the image's name,
    the names docker/ builds under; the write probe then runs the profile's program in it."""
    from launcher.core.maxtext import IMAGES, image_name

    name = "trainer image"
    if embedded:
        return Check(
            name, OK, f"{spec.image}: the embedded cluster runs the {spec.trainer} profile as local processes"
        )
    other = {image_name(img): profile for profile, img in IMAGES.items() if profile != spec.trainer}
    if (wrong := other.get(image_name(spec.image))) is not None:
        return Check(
            name, FAIL, f"{spec.image} is the {wrong} profile's image; --trainer {spec.trainer} runs "
            f"`{' '.join(_program(spec.trainer))}`, which it does not hold",
            f"give the {spec.trainer} profile's image (--image REGISTRY/{image_name(IMAGES[spec.trainer])}:TAG, "
            "built from docker/: docs/gke.md), or leave --image out",
        )  # fmt: skip
    return Check(
        name, OK, f"{spec.image} for the {spec.trainer} profile (`{' '.join(_program(spec.trainer))}`)"
    )


def _program(trainer: str) -> list[str]:
    from launcher.core.maxtext import probe_command

    return probe_command(trainer, "")[:3]


def trainer_pod(spec: RunSpec, shape: Shape) -> dict:
    """A trainer pod of `shape` as rendered: its resources are what quotas count and what a node's
    allocatable must hold (the plan feeds only its environment, and the profile only its command:
    rendered as reslice's, which needs no MaxText keys such as `steps` that preflight is not given)."""
    return {
        "spec": pod_spec(replace(spec, trainer=TrainerProfile.RESLICE), shape, 0, Plan(shape.devices, 1, 1))
    }


def host_requests(spec: RunSpec, shape: Shape) -> dict[str, str]:
    """The cpu and memory one trainer pod of `shape` requests (google.com/tpu is the pool's shape)."""
    requests = trainer_pod(spec, shape)["spec"]["containers"][0]["resources"]["requests"]
    return {k: v for k, v in requests.items() if k in HOST_RESOURCES}


def check_quota(quotas: tuple[dict, ...], req: Request) -> Check:
    """Fails only on a hard limit the shape exceeds; a quota that is full now is a warning."""
    name, ns, shape = "resource quota", req.spec.namespace, req.shape
    over, short = shortfalls(quotas, trainer_pod(req.spec, shape), shape.hosts, str(shape))
    if over:
        fix = f"raise the quota (kubectl -n {ns} edit resourcequota NAME) or ask for fewer slices"
        return Check(name, FAIL, "; ".join(over + short), fix)
    if short:
        return Check(name, WARN, "; ".join(short), "the pods wait (Pending) until the quota has room")
    return Check(name, OK, f"{len(quotas)} in {ns}, none short for {shape}" if quotas else f"none in {ns}")


def run_shape(spec: RunSpec, shape: Shape) -> Shape:
    """`shape` as the run selects its nodes: with the placement policy the run names for its preset."""
    return Shape(run_preset(spec, shape.preset), shape.slices)


def pools_of(facts: ClusterFacts, spec: RunSpec, shape: Shape) -> tuple[list[Pool], list[str]]:
    """The node pools that could host `shape`'s slices for this run: its selector, tolerations, requests."""
    preset = run_preset(spec, shape.preset)
    tolerations = placement(spec, preset)["tolerations"]
    return pools_for(preset, facts.nodes, tolerations, host_requests(spec, shape))


def check_rung(shape: Shape, pools: list[Pool], near: list[str], first: bool) -> Check:
    """Enough usable node pools for `shape`? Short fails the requested shape and warns for a smaller
    one: the run cannot shrink onto it and waits for capacity instead."""
    usable = [p for p in pools if p.usable]
    if len(usable) >= shape.slices:
        return Check(f"node pools for {shape}", OK, f"{len(usable)} fit: {names(usable)}")
    return Check(f"node pools for {shape}", FAIL if first else WARN, *_shortfall(shape, pools, near, usable))


def rung_skipped(shape: Shape, why: str) -> Check:
    """A shape of the ladder the run never takes: not a node-pool requirement, so neither ✓ nor ✗."""
    return Check(f"node pools for {shape}", SKIP, f"none needed: the run never takes this shape ({why})")


def rung_exists(shape: Shape, pools: list[Pool], near: list[str]) -> Check:
    """Do `shape`'s node pools exist at all, healthy now or not? (What `launch` refuses on.)"""
    whole = [p for p in pools if p.whole]
    if len(whole) >= shape.slices:
        return Check(f"node pools for {shape}", OK, f"{len(whole)} exist: {names(whole)}")
    return Check(f"node pools for {shape}", FAIL, *_shortfall(shape, pools, near, whole))


def _shortfall(shape: Shape, pools: list[Pool], near: list[str], fit: list[Pool]) -> tuple[str, str]:
    preset = shape.preset
    each = f"{preset.hosts} node{'s' if preset.hosts > 1 else ''} each"
    pools_word = "node pool" if shape.slices == 1 else "node pools"
    found = [f"needs {shape.slices} {pools_word} of {preset.name} ({each}), {len(fit)} fit"]
    found[0] += f": {names(fit)}" if fit else ""
    found += [p.why_not() for p in pools if p not in fit]
    found += [f"not {preset.name}: {n}" for n in near]
    fixes = []
    # A pool whose only fault is the run's request counts as there: more of them would not help.
    if (missing := shape.slices - len([p for p in pools if not p.problems])) > 0:
        fixes.append(f"create {missing} more node pool(s): {create_command(preset)}")
    if any(p.problems for p in pools):
        fixes.append("fix or delete the pools with lasting problems (labels, size, taints)")
    if any(p.too_small for p in pools):
        fixes.append(
            "request at most the nodes' allocatable (--cpu-request/--memory-request, or the preset's"
            " cpu_request/memory_request; kubectl describe node NODE shows Allocatable)"
        )
    if any(p.whole and p.unhealthy for p in pools):
        fixes.append("wait for the unhealthy nodes (or repair them)")
    return "; ".join(found), "; ".join(fixes)


def _named_objects(facts: ClusterFacts, spec: RunSpec) -> list[Check]:
    """The rows for what the run names, when it names it: service account, priority class, queue."""
    rows = []
    if spec.service_account:
        rows.append(check_service_account(facts, spec))
    if spec.priority_class:
        rows.append(check_priority_class(facts, spec.priority_class))
    if spec.queue:
        rows.append(check_queue(facts, spec))
    return rows


def run_checks(facts: ClusterFacts, req: Request) -> list[Check]:
    """Every row but the write probe's, in the order they are shown."""
    spec = req.spec
    rows = [check_jobset_api(facts), check_jobset_controller(facts), check_namespace(facts, spec.namespace)]
    rows += _named_objects(facts, spec)
    rows.append(check_quota(facts.quotas, req))
    for i, s in enumerate(req.ladder):
        shape = run_shape(spec, s)
        rows.append(check_rung(shape, *pools_of(facts, spec, shape), first=i == 0))
    rows += [rung_skipped(s, why) for s, why in req.skipped]
    rows.append(check_run_dir(spec.run_dir, facts.embedded is not None))
    rows.append(check_image(spec, facts.embedded is not None))
    return rows


def launch_blockers(facts: ClusterFacts, req: Request) -> list[Check]:
    """The failing rows `launch` refuses on: what no waiting fixes. Node pools that exist but are
    unhealthy now (NotReady, preempted) are the controller's business, and so is a quota that is
    full now but large enough."""
    spec = req.spec
    shape = run_shape(spec, req.shape)
    rows = [
        check_jobset_api(facts),
        check_namespace(facts, spec.namespace),
        rung_exists(shape, *pools_of(facts, spec, shape)),
        check_run_dir(spec.run_dir, facts.embedded is not None),
        check_image(spec, facts.embedded is not None),
        check_quota(facts.quotas, req),
        *_named_objects(facts, spec),
    ]
    return [c for c in rows if c.status == FAIL]
