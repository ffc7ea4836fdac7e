"""Launching a run: validate and plan before anything is created, then write the run record.

Nothing is submitted, deleted or overwritten until every check has passed: the shape and its whole
shrink ladder are planned, every JobSet name the run could ever need fits its pod names, the run
name is free and the run directory does not belong to another run.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, replace

from launcher.adapters.preset_files import load_catalog
from launcher.adapters.rundir import RunDir
from launcher.core import world as worlds
from launcher.core.errors import ClusterNotReady, UserError
from launcher.core.labels import slice_jobset_name, world_configmap_name
from launcher.core.plan import Plan, Rung, hbm_sections, run_ladder
from launcher.core.policy import rules_for
from launcher.core.presets import Catalog, Shape
from launcher.core.record import Knobs, RunRecord
from launcher.core.render import name_error, render_world_access, run_name_error, run_name_room
from launcher.core.spec import RunSpec, check, grace_period, short_notice
from launcher.core.words import Action, LedgerKind, RunState, TrainerProfile, TrainerState


def check_trainer_config(config: str, overrides: tuple[str, ...]) -> dict:
    """Ask the trainer (`python -m trainer --check`, no JAX) whether the config and overrides are
    valid, through the contract (exit code 2 and one line), not an import; the resolved config.
    A config given as a file must be one here: the launcher checks what it submits, so a config the
    pods read from the image needs a copy at the same path."""
    if ("/" in config or config.endswith((".yaml", ".yml"))) and not os.path.isfile(config):
        raise UserError(f"--config {config}: no such file (a config file must exist where reslice runs)")
    cmd = [sys.executable, "-m", "trainer", "--check", "--config", config]
    for kv in overrides:
        cmd += ["--set", kv]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESLICE_")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60, check=False)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines() or [f"exit code {proc.returncode}"]
        raise UserError(lines[-1].removeprefix("trainer: "))
    return json.loads(proc.stdout)["config"]


def model_parallel(resolved: dict | None, overrides: tuple[str, ...]) -> int:
    """Devices per data-parallel rank: the config's ``mesh.tensor`` (0 means 1). For a config the
    launcher cannot resolve, the last ``mesh.tensor`` override, else 1."""
    if resolved is not None:
        return int(resolved.get("mesh", {}).get("tensor") or 1)
    for kv in reversed(overrides):
        key, _, value = kv.partition("=")
        if key.strip() == "mesh.tensor":
            try:
                return int(value.strip() or 1) or 1
            except ValueError:
                raise UserError(f"--set {kv!r}: mesh.tensor must be an integer") from None
    return 1


def resolve_trainer_config(config: str, overrides: tuple[str, ...], strict: bool = True) -> dict:
    """The trainer config as the trainer resolves it: the one check of `--config` and `--set` that
    every command taking them runs (plan, render, preflight, launch, sweep), so that they accept and
    refuse the same configs. Only the data may be missing here when not ``strict`` (plan, render,
    preflight: a token file that exists only in the image); the config is then resolved with
    synthetic data, which is all the plan needs of it. ``launch`` refuses that too."""
    try:
        return check_trainer_config(config, overrides)
    except UserError as refused:
        if strict:
            raise
        try:
            return check_trainer_config(config, (*overrides, "data.source=synthetic"))
        except UserError:
            raise refused from None


def trainer_model_parallel(config: str, overrides: tuple[str, ...], strict: bool = True) -> int:
    """The model-parallel degree of a trainer config."""
    return model_parallel(resolve_trainer_config(config, overrides, strict), overrides)


def ladder_name_error(spec: RunSpec, ladder: list[Rung], max_segments: int) -> str | None:
    """Why `spec.run` cannot name a run on `ladder`, or None: the longest JobSet name it may need is
    its last segment's (`max_segments` - 1) on a feasible rung, and the advice is the tightest rung's,
    so following it is accepted. A run with a world (in place) needs every slice's JobSet name to fit
    too: a new slice takes the smallest id not in the world it joins, so the ids stay below twice the
    slices (core/world.world_slices). `launch` and `render` both ask this, so they state one limit."""
    run = spec.run
    feasible = [r.shape for r in ladder if r.feasible]
    if not feasible:
        return None
    worst = min(feasible, key=lambda shape: run_name_room(shape, max_segments - 1))
    if err := run_name_error(run, worst, max_segments - 1):
        return err
    if rules_for(spec).WORLD:
        for shape in feasible:
            top = str(2 * shape.slices - 1)
            if err := name_error(slice_jobset_name(run, top), Shape(shape.preset, 1)):
                return err
    return None


def prepare(
    spec: RunSpec,
    preset: str,
    slices: int | None,
    knobs: Knobs,
    now: float | None = None,
    catalog: Catalog | None = None,
) -> tuple[RunRecord, list[Rung]]:
    """The record of a new run and its ladder, or a UserError saying why it cannot run. The presets
    are `catalog`'s, or read here (launch is an edge: the plan and the record never read them)."""
    check(spec)
    catalog = catalog if catalog is not None else load_catalog()
    shape = catalog.shape(preset, slices)
    if spec.trainer != TrainerProfile.MAXTEXT:  # MaxText's batch counts devices (launcher.core.maxtext)
        # The record keeps what the HBM estimate needs of the resolved config, so that every
        # controller pass plans the ladder `plan` shows (core/plan.run_ladder), never a rung whose
        # estimate does not fit.
        resolved = resolve_trainer_config(spec.config, spec.overrides)
        spec = replace(
            spec,
            model_parallel=model_parallel(resolved, spec.overrides),
            trainer_config=hbm_sections(resolved),
        )
    ladder = run_ladder(spec, shape, catalog)
    first = ladder[0]
    if not isinstance(first.plan, Plan):
        raise UserError(f"{shape}: {first.plan.reason}")
    if err := ladder_name_error(spec, ladder, knobs.max_segments):
        raise UserError(err)
    short = short_notice_presets(spec, ladder)
    if short and spec.short_notice_interval is None:
        raise UserError(
            f"an emergency save takes {spec.save_seconds:g} s, more than {', '.join(short)} "
            "give between SIGTERM and SIGKILL: a preemption there loses the work since the last checkpoint. "
            "Give --short-notice-interval N (checkpoint every N steps on that capacity), or use capacity "
            "with a longer notice"
        )
    rec = RunRecord(
        spec=spec,
        preset=shape.preset.name,
        slices=shape.slices,
        knobs=knobs,
        created_at=now if now is not None else time.time(),
        reason="launched",
    )
    return rec, ladder


def short_notice_presets(spec: RunSpec, ladder: list[Rung]) -> list[str]:
    """`preset (N s)` for every preset of the feasible rungs whose notice cannot hold an emergency save."""
    seen: dict[str, str] = {}
    for rung in ladder:
        p = rung.shape.preset
        if rung.feasible and p.name not in seen and short_notice(spec, p):
            seen[p.name] = f"{p.name} ({min(grace_period(spec, p), p.notice_s)} s)"
    return list(seen.values())


def create_run(kube, rec: RunRecord) -> None:
    """Claim the run directory and write the run record (in place: first the empty world ConfigMap,
    then the ServiceAccount, Role and RoleBinding it owns). Refuses to reuse another run's directory
    or an existing run's name."""
    rundir = RunDir(rec.spec.run_dir)
    existing = rundir.read_text("run.json")
    if existing is not None:
        owner = json.loads(existing).get("run")
        if owner != rec.name:
            raise UserError(
                f"run directory {rec.spec.run_dir} belongs to run {owner!r}; choose another --run-dir"
            )
        status = rundir.status() or {}
        if status.get("state") == TrainerState.FINISHED:
            # Its trainer would find the final step committed and stop at once: a "run" of 0 steps.
            raise UserError(
                f"run {rec.name!r} already finished in {rec.spec.run_dir} (step {status.get('step')}): "
                "launch a new --run, or give another --run-dir"
            )
    if not kube.namespace_exists():  # the cluster is not ready for the run, as preflight says (exit 1)
        raise ClusterNotReady(
            f"namespace {kube.namespace!r} does not exist: `kubectl create namespace {kube.namespace}`"
        )
    if kube.get_record(rec.name) is not None:
        raise UserError(
            f"run {rec.name!r} already exists: `reslice status {rec.name}` (or `reslice stop` it)"
        )
    created = rundir.missing_dirs()
    if existing is None:
        rundir.write_text("run.json", json.dumps({"run": rec.name, "spec": asdict(rec.spec), "preset": rec.preset,
                                                  "slices": rec.slices}, indent=2))  # fmt: skip
    world = None
    try:
        if rules_for(rec.spec).WORLD:
            # Who may read the run's world: created here with the user's credentials, as the run
            # is; the controller needs no right to create accounts or Roles. They are owned by the
            # world ConfigMap, so the controller's one delete of it at the run's end removes them
            # too (the garbage collector), and it needs no right to delete them either.
            cm, made = kube.create_world(worlds.configmap(rec.spec, None))
            world = world_configmap_name(rec.name) if made else None
            if not made and worlds.published_epoch(cm) is not None:
                # An earlier run of this name left its world (its record deleted): the controller
                # would take its epochs for this run's and publish none below them.
                raise ClusterNotReady(
                    f"ConfigMap {world_configmap_name(rec.name)} holds the world of an earlier run named"
                    f" {rec.name!r}: `kubectl delete configmap {world_configmap_name(rec.name)}`, or"
                    " choose another --run"
                )
            kube.ensure_objects(render_world_access(rec.spec, cm))
        kube.create_record(rec)
    except BaseException:
        if world is not None:  # this launch's own: its access objects go with it
            with contextlib.suppress(Exception):
                kube.delete_world(world)
        if existing is None:  # the claim was this launch's own: leave the directory as it was
            rundir.delete("run.json")
            for d in created:
                with contextlib.suppress(OSError):
                    d.rmdir()
        raise
    rundir.log([{"time": rec.created_at, "kind": LedgerKind.LAUNCH, "shape": f"{rec.preset} x{rec.slices}",
                 "global_batch": rec.spec.global_batch}])  # fmt: skip


def submit_first_segment(kube, run: str) -> str:
    """For `launch --detach`: one reconcile pass under the run's lease, so that segment 0's JobSet
    exists before the command returns, then the lease is released for whoever watches the run.
    Returns who that is, in words."""
    from launcher.controller.lease import lease_name
    from launcher.controller.loop import Controller

    controller = Controller(kube)
    if controller.own(run):
        controller.pass_once([run])
        controller.release(run)
        holder = None
    else:
        holder = kube.lease_holder(lease_name(run))
    if holder:
        return f"controller {holder} holds the run's lease: it runs the run"
    watchers = sorted(kube.live_lease_holders(exclude=controller.identity))
    if watchers:
        return (
            f"a controller is active in namespace {kube.namespace} ({', '.join(watchers)}): "
            "`reslice watch --all` picks the run up at its next pass"
        )
    return (
        "no controller watches this run yet: segment 0 runs, but nothing shrinks, grows or restarts it "
        f"until `reslice watch {run}` runs, or the in-cluster controller (`kubectl apply -k manifests/controller`)"
    )


def stop_run(kube, run: str, reason: str = "stopped by the user") -> list[str]:
    """Mark the run Stopped (compare-and-swap, so no controller starts another segment), then
    delete its JobSets. The record and the run directory stay. `reslice stop` and the sweep (a run
    that left the sweep's shape) call it."""
    from dataclasses import replace

    from kubernetes.utils.retry import Backoff, retry_on_conflict

    from launcher.adapters.kube import Conflict

    def mark_stopped() -> RunRecord:
        got = kube.get_record(run)
        if got is None:
            raise UserError(f"no run named {run!r} in namespace {kube.namespace}")
        rec, rv = got
        if not rec.terminal:
            kube.update_record(
                replace(rec, state=RunState.STOPPED, reason=reason, finished_at=time.time()), rv
            )
        return rec

    try:  # client-go's RetryOnConflict, with 10 tries: a busy controller rewrites the record each pass
        rec = retry_on_conflict(mark_stopped, Backoff(steps=10, duration=0.01, factor=1.0, jitter=0.1))
    except Conflict:  # still changing: delete the JobSets all the same, as asked
        rec = kube.get_record(run)[0]
    deleted = [j["metadata"]["name"] for j in kube.jobsets(run) if kube.delete_jobset(j["metadata"]["name"])]
    if rules_for(rec.spec).WORLD:  # with its access objects (owned by it)
        kube.delete_world(world_configmap_name(run))
    RunDir(rec.spec.run_dir).log([{"time": time.time(), "kind": LedgerKind.ACT, "action": Action.STOP, "reason": reason,
                                   "state": RunState.STOPPED}])  # fmt: skip
    return deleted
