"""`reslice preflight`: can this cluster run this run? Asked before anything is created.

The cluster is read once (`read_facts`: discovery, a few GETs and the node list, through the
official client); the checks are pure functions over that snapshot (`launcher/core/capacity/checks.py`); the one
check that acts is the write probe, a pod on the target node pools (`launcher/preflight/probe.py`). `launch`
reads the same snapshot and refuses on the rows no waiting fixes (`refuse_unready`). Upstream
sources for every row: docs/preflight.md.
"""

from __future__ import annotations

from rich.table import Table

from launcher.adapters.kube import Forbidden, Kube
from launcher.adapters.preset_files import load_catalog
from launcher.core.capacity import checks
from launcher.core.capacity.checks import SKIP, Check, ClusterFacts, Request
from launcher.core.errors import ClusterNotReady, UserError
from launcher.core.inputs import quantity
from launcher.core.plan import ladder_shapes, shrink_ladder
from launcher.core.presets import LABEL_NODEPOOL, Shape
from launcher.core.spec import RunSpec
from launcher.preflight.probe import PROBE_ROW, probe_check, probe_pod, run_probe

JOBSET_API = "/apis/jobset.x-k8s.io/v1alpha2"
KUEUE_API = "/apis/kueue.x-k8s.io/v1beta1"
MARK = {
    checks.OK: "[green]✓[/green]",
    checks.WARN: "[yellow]![/yellow]",
    checks.FAIL: "[red]✗[/red]",
    checks.SKIP: "[dim]–[/dim]",
}


def ladder(
    shape: Shape,
    global_batch: int | None,
    max_micro_batch: int,
    max_grad_accum: int | None,
    model_parallel: int = 1,
    trainer_config: dict | None = None,
) -> tuple[tuple[Shape, ...], tuple[tuple[Shape, str], ...]]:
    """(the shapes to check, the requested one first; the shapes of the ladder the run never takes,
    with why). Without a global batch every shape GKE can run is checked. With one, the batch plan
    divides by ``model_parallel``, and given the trainer config a rung whose HBM estimate exceeds
    its HBM is one the run never takes (as `reslice plan`). UserError if the requested shape is
    infeasible itself."""
    if global_batch is None:
        if shape.error:
            raise UserError(shape.error)
        shapes = ladder_shapes(shape, load_catalog())
        return tuple(s for s in shapes if not s.error), tuple((s, _why(s, "")) for s in shapes if s.error)
    rungs = shrink_ladder(
        shape,
        global_batch,
        max_micro_batch,
        max_grad_accum,
        catalog=load_catalog(),
        model_parallel=model_parallel,
        trainer_config=trainer_config,
    )
    if not rungs[0].feasible:
        raise UserError(rungs[0].reason if shape.error else f"{shape}: {rungs[0].reason}")
    feasible = tuple(r.shape for r in rungs if r.feasible)
    return feasible, tuple((r.shape, _why(r.shape, r.reason)) for r in rungs if not r.feasible)


def _why(shape: Shape, reason: str) -> str:
    # Shape.error's text advises whoever asked for the shape; a rung of the ladder needs only the rule.
    if shape.error:
        return f"GKE multislice needs multi-host slices, and {shape.preset.name} is one host"
    return reason


def check_requests(spec: RunSpec) -> None:
    """UserError for a --cpu-request/--memory-request that is not a quantity: every check that
    compares it (quotas, node allocatable) would otherwise guess."""
    quantity("--cpu-request", spec.cpu_request)
    quantity("--memory-request", spec.memory_request)


def read_facts(kube: Kube, req: Request) -> ClusterFacts:
    spec, ns = req.spec, req.spec.namespace
    forbidden: dict[str, str] = {}

    def get(fact: str, path: str) -> dict | None:
        try:
            return kube.get(path)
        except Forbidden as e:
            forbidden[fact] = str(e)
            return None

    def served(fact: str, path: str) -> tuple[str, ...] | None:
        doc = get(fact, path)
        return None if doc is None else tuple(r["name"] for r in doc.get("resources") or [])

    deployment = None
    for name in checks.JOBSET_DEPLOYMENTS:
        path = f"/apis/apps/v1/namespaces/{checks.JOBSET_NAMESPACE}/deployments/{name}"
        if (deployment := get("jobset_deployment", path)) is not None:
            break
    try:
        embedded = kube.get("/embedded/v1/info")
    except Forbidden:  # a real API server, refusing a path it does not serve anyway
        embedded = None
    kueue = served("kueue", KUEUE_API) if spec.queue else None
    lq_path = f"{KUEUE_API}/namespaces/{ns}/localqueues/{spec.queue}"
    pc_path = f"/apis/scheduling.k8s.io/v1/priorityclasses/{spec.priority_class}"
    sa_path = f"/api/v1/namespaces/{ns}/serviceaccounts/{spec.service_account}"
    quotas = get("quotas", f"/api/v1/namespaces/{ns}/resourcequotas") or {}
    return ClusterFacts(
        jobset_resources=served("jobset", JOBSET_API),
        jobset_deployment=deployment,
        embedded=embedded,
        kueue_resources=kueue,
        local_queue=get("local_queue", lq_path) if kueue else None,
        namespace=get("namespace", f"/api/v1/namespaces/{ns}"),
        priority_class=get("priority_class", pc_path) if spec.priority_class else None,
        service_account=get("service_account", sa_path) if spec.service_account else None,
        quotas=tuple(quotas.get("items") or ()),
        nodes=tuple(kube.nodes()),
        forbidden=forbidden,
    )


def preflight(kube: Kube, req: Request, *, probe: bool = True, probe_timeout_s: float = 300.0) -> list[Check]:
    """Every row, the write probe's last."""
    facts = read_facts(kube, req)
    return [*checks.run_checks(facts, req), _probe(kube, facts, req, probe, probe_timeout_s)]


def _probe(kube: Kube, facts: ClusterFacts, req: Request, asked: bool, timeout_s: float) -> Check:
    if not asked:
        return Check(PROBE_ROW, SKIP, "not run (--no-probe)")
    if facts.namespace is None:
        return Check(PROBE_ROW, SKIP, "not run: no namespace to run it in")
    preset = req.shape.preset
    pools, _ = checks.pools_of(facts, req.spec, req.shape)  # where the trainers of segment 0 can run
    if not any(p.usable for p in pools):
        return Check(PROBE_ROW, SKIP, f"not run: no usable node pool of {preset.name} to run it on")
    pin = None
    if facts.embedded is not None:
        # Simulated embedded pools run no processes: the probe would never end there.
        real = {p["name"] for p in facts.embedded.get("nodepools") or [] if not p.get("simulate")}
        usable = [p.name for p in pools if p.usable and p.name in real]
        if not usable:
            return Check(
                PROBE_ROW, SKIP, "not run: the embedded node pools here are simulated (no processes)"
            )
        pin = {LABEL_NODEPOOL: usable[0]}
    return probe_check(run_probe(kube, probe_pod(req.spec, preset, pin), timeout_s), req.spec.run_dir)


def refuse_unready(kube: Kube, req: Request) -> None:
    """What `launch` asks before it creates anything: ClusterNotReady (exit 1) with one line."""
    check_requests(req.spec)
    blockers = checks.launch_blockers(read_facts(kube, req), req)
    if blockers:
        what = "; ".join(" ".join(f"{c.name}: {c.found}".split()) for c in blockers)
        raise ClusterNotReady(
            f"this cluster cannot run {req.shape}: {what} (`reslice preflight` says how to fix it;"
            " --no-preflight launches anyway)"
        )


def failed(rows: list[Check]) -> bool:
    return any(c.status == checks.FAIL for c in rows)


def table(rows: list[Check], title: str) -> Table:
    t = Table(title=title)
    t.add_column("", width=1)
    t.add_column("check", no_wrap=True)
    t.add_column("found", overflow="fold")
    t.add_column("fix", overflow="fold")
    for c in rows:
        t.add_row(MARK[c.status], c.name, c.found, c.fix)
    return t
