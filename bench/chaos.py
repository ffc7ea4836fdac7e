"""Chaos: seeded random fault schedules against a small elastic run, and the run's invariants.

    .venv/bin/python -m bench.chaos [--seeds 20] [--faults 4] [--steps 50] [--interval 5] [--restart-mode in-place] [--keep DIR]
    (or: python3 dev.py bench chaos ...)

Each seed draws, with random.Random(seed), a schedule of faults from: a spot preemption notice, a
pod killed (exit 137), a host crashed without notice and down a few seconds (its node NotReady
meanwhile), a host that crashed and rebooted at once (`reboot-host`: `crash-host --down 0`, its pod
then Failed as upstream's kubelet reports it, a host disruption the run does not count), a drain,
an auto-repair, a node pool removed and restored, the controller killed (SIGKILL) and restarted, a
second controller, and a Kueue eviction (`kueue-evict`: the run's JobSets are Kueue Workloads of a
LocalQueue, launcher/embedded/kueue.py admits them; one is suspended, then admitted again a few
seconds on). They hit a 2-slice run of the `tiny` config on the e2e tests' multi-host preset
(tests/e2e/harness.py `MULTI_HOST`, v5p-2x2x2) over 2 node pools (`--shape single`: one
single-host slice; the embedded cluster, the real trainer, `reslice watch` processes), spread over
the run: fault i of n waits for the checkpoint at step ~(i + 1) * steps / (n + 1). After the run,
per seed:

- finished: the run Finished, its last committed checkpoint and last kept step are the final step;
- segments: indexed 0..n-1, each submitted after the previous ended, resuming at or after it;
- one JobSet: never two of the run's JobSets at once, from every ADDED/DELETED the store committed,
  and "launched once": no segment's JobSet created twice (`--restart-mode in-place`, one JobSet per
  slice: never more of them than the run's slices; "one world": no step of a world recorded after
  the first step of the next, from the metrics; "published once": every world epoch written to
  the world ConfigMap once, in increasing order, whatever controller was killed or started);
- checkpoints: every step-named checkpoint directory is committed (half-written ones are gone);
- losses: each step's loss equals an uninterrupted run's (computed once) within 1e-5, with the same
  `data/sample_digest`;
- /dev/shm clean: once the seed's processes have exited, nothing of the run is left in /dev/shm
  (its snapshot folders, its pods' Memory volumes).

A rich table per seed (with the steps recomputed, i.e. trained twice: in flight on a host a fault
took; the steps lost, i.e. missing from the run's records or trained to another loss than the
uninterrupted run's, 0 whenever the seed holds; and the peak RSS of the seed's controllers, of its
pods' main processes, the in-place supervisors, and of this process, which holds the embedded
cluster), then a summary: "N/N held", the steps recomputed and lost in all, and each peak RSS
at the first and last seed and its range, to see it flat over a soak; exit 1 when a seed did not
hold. Options that cannot run (zero seeds or faults, fewer steps than two checkpoints) are one
line and exit 2. The checks are pure functions (tests/launcher/test_bench_chaos.py). ``--keep
DIR``: a seed that did not hold leaves its run directory, its controllers' logs and its pods' logs
in ``DIR/seed-N`` (otherwise they go with the seed's embedded cluster).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench._cli import Parser
from contract.words import RestartMode
from contract.world import DATA_KEY as WORLD_KEY
from launcher.core.errors import UserError
from launcher.core.labels import LABEL_RUN, world_configmap_name
from launcher.core.record import Knobs
from launcher.core.words import PodPhase, RunState
from launcher.embedded.kueue import Kueue
from tests.e2e.harness import (
    GLOBAL_BATCH,
    MULTI_HOST,
    MULTI_HOST_BATCH,
    PRESET,
    Harness,
    kept_steps,
    recomputed,
    reference_run,
    wait_for,
)

RUN = "chaos"
TOLERANCE = 1e-5
FAULTS = (
    "preempt", "kill-pod", "crash-host", "reboot-host", "drain", "repair", "remove", "kill-controller",
    "second-controller", "kueue-evict",
)  # fmt: skip
QUEUE = "chaos"  # the run's Kueue LocalQueue: its JobSets are Kueue's Workloads, admitted by it
# A crashed host stays down this long (s, drawn per fault) and its node turns NotReady after
# NODE_GRACE_S: the node monitor's grace period, 40 s upstream, shortened as the run is.
HOST_DOWN_S = (4.0, 12.0)
NODE_GRACE_S = 2.0
ONCE = {"kill-pod", "second-controller"}  # two pod kills could rightly spend the failure budget
# (preset, slices, global batch) on 2 node pools. `elastic` shrinks and grows (4 trainer processes);
# `single` (one host, one slice: 1 process) only moves between pools, for a slow machine.
SHAPES = {"elastic": (MULTI_HOST, 2, MULTI_HOST_BATCH), "single": (PRESET, 1, GLOBAL_BATCH)}


# ---- the invariants: pure ------------------------------------------------------------------------


def finished_problems(state: str, committed: list[int], kept: list[int], steps: int) -> list[str]:
    out = []
    if state != RunState.FINISHED:
        out.append(f"state {state}, not {RunState.FINISHED}")
    if not committed or committed[-1] != steps:
        out.append(f"last committed checkpoint {committed[-1] if committed else None}, not {steps}")
    if kept != list(range(1, steps + 1)):
        missing = sorted(set(range(1, steps + 1)) - set(kept))
        out.append(f"kept steps are not 1..{steps} (missing {missing[:5]})")
    return out


@dataclass(frozen=True)
class Seg:
    index: int
    submitted_at: float
    ended_at: float | None
    start_step: int | None
    end_step: int | None


def segment_problems(segs: list[Seg]) -> list[str]:
    out = []
    if [s.index for s in segs] != list(range(len(segs))):
        out.append(f"segment indexes {[s.index for s in segs]}")
    for prev, nxt in itertools.pairwise(segs):
        if prev.ended_at is None or nxt.submitted_at < prev.ended_at:
            out.append(f"segment {nxt.index} submitted before segment {prev.index} ended")
        if (nxt.start_step or 0) < (prev.end_step or 0) or (nxt.start_step or 0) < (prev.start_step or 0):
            out.append(f"segment {nxt.index} resumed at {nxt.start_step}, behind segment {prev.index}")
    if segs and segs[-1].ended_at is None:
        out.append(f"segment {segs[-1].index} never ended")
    return out


def overlap_problems(events: list[tuple[str, str]]) -> list[str]:
    """(event type, JobSet name) in commit order: at most one of the run's JobSets exists at a time."""
    live: set[str] = set()
    out = []
    for etype, name in events:
        if etype == "ADDED":
            if live:
                out.append(f"{name} created while {', '.join(sorted(live))} existed")
            live.add(name)
        elif etype == "DELETED":
            live.discard(name)
    return out


def slice_jobset_problems(events: list[tuple[str, str]], slices: int) -> list[str]:
    """In place, (event type, JobSet name) in commit order: never more of the run's JobSets at once
    than its slices (one per slice)."""
    live: set[str] = set()
    out = []
    for etype, name in events:
        if etype == "ADDED":
            live.add(name)
            if len(live) > slices:
                out.append(f"{name} created while {', '.join(sorted(live - {name}))} existed")
        elif etype == "DELETED":
            live.discard(name)
    return out


def relaunch_problems(events: list[tuple[str, str]]) -> list[str]:
    """By recreate, (event type, JobSet name) in commit order: each segment's JobSet is created
    once (a restarted controller that launched a segment again would create its name twice)."""
    seen: set[str] = set()
    out = []
    for etype, name in events:
        if etype == "ADDED":
            if name in seen:
                out.append(f"{name} created twice")
            seen.add(name)
    return out


def world_publication_problems(pubs: list[tuple[int, float]]) -> list[str]:
    """In place, the world ConfigMap's (epoch, published) in commit order: each epoch published
    once (one `published` stamp), and never one at or below an earlier epoch (a restarted
    controller republishing, or two controllers racing, would show here)."""
    stamps: dict[int, float] = {}
    out = []
    last = -1
    for epoch, published in pubs:
        if epoch in stamps:
            if stamps[epoch] != published:
                out.append(f"world {epoch} published twice")
            continue
        if epoch < last:
            out.append(f"world {epoch} published after world {last}")
        stamps[epoch] = published
        last = max(last, epoch)
    return out


def shm_problems(before: set[str], after: set[str], pods: set[str]) -> list[str]:
    """What the seed left in /dev/shm once its processes had exited: the run's snapshot folders
    (``reslice-chaos-...``, trainer/state/memdir.py) or its pods' Memory volumes (``reslice-<pod
    uid>``, the embedded kubelet's). Names there before the seed, or of other runs, are not its."""
    mine = {f"reslice-{uid}" for uid in pods}
    left = sorted(n for n in after - before if n.startswith(f"reslice-{RUN}-") or n in mine)
    return [f"/dev/shm/{n} left behind" for n in left[:3]] + (
        [f"... {len(left) - 3} more"] if len(left) > 3 else []
    )


def world_overlap_problems(metrics: Sequence[Mapping[str, Any]]) -> list[str]:
    """In place, never two worlds training at once: every step a world recorded is before the
    first step of the next world (segment) that trained."""
    spans: dict[int, tuple[float, float]] = {}
    for m in metrics:
        lo, hi = spans.get(m["segment"], (m["time"], m["time"]))
        spans[m["segment"]] = (min(lo, m["time"]), max(hi, m["time"]))
    out = []
    for a, b in itertools.pairwise(sorted(spans)):
        if spans[a][1] > spans[b][0]:
            out.append(f"world {a} recorded a step {spans[a][1] - spans[b][0]:.3f} s after world {b}'s first")
    return out


def checkpoint_problems(names: list[str], committed: list[int]) -> list[str]:
    """Names under checkpoints/: a step-named one must be committed (Orbax's temporary ones aside)."""
    done = set(committed)
    return [f"checkpoint {n} is not committed" for n in names if n.isdigit() and int(n) not in done]


def loss_problems(
    kept: Mapping[int, Mapping[str, Any]], reference: Mapping[int, Mapping[str, Any]], tol: float = TOLERANCE
) -> list[str]:
    out = []
    for step, m in sorted(kept.items()):
        ref = reference.get(step)
        if ref is None:
            out.append(f"step {step}: not in the reference run")
            continue
        if m["data/sample_digest"] != ref["data/sample_digest"]:
            out.append(f"step {step}: sample digest differs")
        if abs(m["learning/loss"] - ref["learning/loss"]) > tol:
            out.append(f"step {step}: loss {m['learning/loss']:.7f} vs {ref['learning/loss']:.7f}")
    return out


def schedule(seed: int, n: int) -> list[tuple[str, float]]:
    """(fault, extra delay in seconds) for the seed: the same schedule on every machine."""
    rng = random.Random(seed)
    out: list[tuple[str, float]] = []
    while len(out) < n:
        fault = rng.choice(FAULTS)
        if fault in ONCE and any(f == fault for f, _ in out):
            continue
        out.append((fault, round(rng.uniform(0.0, 3.0), 1)))
    return out


# ---- one seed --------------------------------------------------------------------------------------


def peak_mib(pid: int, field: str = "VmHWM") -> float | None:
    """The process's peak resident set (VmHWM; or `field`, e.g. VmRSS: now), MiB; None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def shm_names() -> set[str]:
    try:
        return {p.name for p in Path("/dev/shm").iterdir()}
    except OSError:
        return set()


@dataclass
class Memory:
    """The seed's peak RSS, sampled every second: of its controllers (`reslice watch`) and of its
    pods' main processes (in place, the supervisors, each alive for the whole run; by recreate,
    the trainers or their supervisor). This process holds the embedded cluster: its resident set
    now is read at the seed's end (its peak would only ever grow)."""

    controllers: float = 0.0
    pods: float = 0.0

    def sample(self, chaos: Chaos) -> None:
        for proc in list(chaos.controllers):
            if proc.poll() is None and (got := peak_mib(proc.pid)) is not None:
                self.controllers = max(self.controllers, got)
        for run in chaos.h.cluster.kubelet.runs():
            for proc in list(run.procs.values()):
                if proc.poll() is None and (got := peak_mib(proc.pid)) is not None:
                    self.pods = max(self.pods, got)

    def follow(self, chaos: Chaos, stop: threading.Event) -> None:
        while not stop.wait(1.0):
            with contextlib.suppress(Exception):  # a pod that ended between the look and the read
                self.sample(chaos)


@dataclass
class Chaos:
    h: Harness
    tmp: Path
    rng: random.Random
    kueue: Kueue | None = None
    controllers: list[Any] = field(default_factory=list)
    timers: list[threading.Timer] = field(default_factory=list)
    done: list[tuple[float, str, str]] = field(default_factory=list)  # (t, fault, target)

    def controller(self) -> None:
        n = len(self.controllers) + 1
        self.controllers.append(self.h.controller_process(RUN, self.tmp / f"controller-{n}.log"))

    def running_pod(self) -> dict | None:
        """A running trainer pod, once there is one; None when the run ended meanwhile."""

        def pick():
            if self.h.record(RUN).state in (RunState.FINISHED, RunState.FAILED, RunState.STOPPED):
                return {"ended": True}
            pods = [
                p
                for p in self.h.run_pods(RUN)
                if p["status"].get("phase") == PodPhase.RUNNING and not p["metadata"].get("deletionTimestamp")
            ]
            return self.rng.choice(sorted(pods, key=lambda p: p["metadata"]["name"])) if pods else None

        got = wait_for(pick, 300, "a running trainer pod")
        return None if "ended" in got else got

    def inject(self, fault: str) -> str:
        h = self.h
        if fault == "kueue-evict":
            # Kueue preempts one of the run's admitted Workloads (suspends its JobSet) and admits it
            # again a few seconds on, as when the higher-priority Workload that took the quota ends.
            live = [
                js["metadata"]["name"]
                for js in h.cluster.store.list(h.cluster.res["jobsets"])[0]
                if (js["metadata"].get("labels") or {}).get(LABEL_RUN) == RUN
                and not js["metadata"].get("deletionTimestamp")
                and not (js.get("spec") or {}).get("suspend")
            ]
            if not live or self.kueue is None:
                return "skipped: no admitted JobSet"
            name = self.rng.choice(sorted(live))
            try:
                self.kueue.evict(name)
            except Exception as e:  # deleted between the look and the update
                return f"skipped: {type(e).__name__}"
            kueue = self.kueue
            self._later(lambda: kueue.release(name))
            return name
        if fault == "kill-controller":
            live = [p for p in self.controllers if p.poll() is None]
            victim = self.rng.choice(live) if live else None
            if victim is not None:
                victim.kill()
                victim.wait(10)
            self.controller()
            return f"pid {victim.pid if victim else '-'}"
        if fault == "second-controller":
            self.controller()
            return f"{sum(p.poll() is None for p in self.controllers)} running"
        pod = self.running_pod()
        if pod is None:
            return "skipped: the run finished first"
        node = pod["spec"]["nodeName"]
        pool = h.cluster.node_pool_of[node]
        if fault == "kill-pod":
            try:
                h.cluster.kill_pod("default", pod["metadata"]["name"])
            except UserError as e:  # it ended between the look and the kill
                return f"skipped: {e}"
            return pod["metadata"]["name"]
        if fault in ("crash-host", "reboot-host"):
            down_s = self.rng.uniform(*HOST_DOWN_S) if fault == "crash-host" else 0.0
            try:
                h.cluster.crash_host("default", pod["metadata"]["name"], down_s=down_s)
            except UserError as e:
                return f"skipped: {e}"
            return f"{pod['metadata']['name']} ({node})"
        if fault == "drain":
            h.cluster.drain(node, wait=False)
            self._later(lambda: h.cluster.uncordon(node))
            return node
        if fault == "repair":
            h.cluster.repair(node)
            return node
        if fault == "preempt":
            h.cluster.preempt(pool, grace_s=15, wait=True)
            self._later(lambda: h.cluster.restore(pool))
            return pool
        h.cluster.remove(pool)
        self._later(lambda: h.cluster.restore(pool))
        return pool

    def _later(self, undo: Callable[[], Any]) -> None:
        """The capacity comes back a few seconds on, while the controller is reacting."""

        def run() -> None:
            # e.g. the drained node was repaired meanwhile: nothing to uncordon
            with contextlib.suppress(UserError):
                undo()

        t = threading.Timer(self.rng.uniform(2.0, 8.0), run)
        t.start()
        self.timers.append(t)


def run_seed(
    seed: int,
    n_faults: int,
    steps: int,
    interval: int,
    reference: dict,
    tmp: Path,
    shape: str,
    restart_mode: str = RestartMode.RECREATE,
    keep: Path | None = None,
) -> dict:
    preset, slices, batch = SHAPES[shape]
    h = Harness(tmp, pools=2, preset=preset, node_monitor_grace_s=NODE_GRACE_S)
    events: list[tuple[str, str]] = []
    restarts: dict[str, int] = {}  # JobSet → the most status.restarts it reached
    worlds: list[tuple[int, float]] = []  # the world ConfigMap's (epoch, published), as written
    pods: set[str] = set()  # the run's pods' uids
    world_cm = world_configmap_name(RUN)

    def census(etype: str, res: Any, obj: dict) -> None:
        meta = obj["metadata"]
        if res.plural == "configmaps" and meta["name"] == world_cm and etype != "DELETED":
            with contextlib.suppress(KeyError, ValueError, TypeError):
                doc = json.loads((obj.get("data") or {})[WORLD_KEY])
                worlds.append((int(doc["epoch"]), float(doc["published"])))
        if (meta.get("labels") or {}).get(LABEL_RUN) != RUN:
            return
        if res.plural == "pods":
            pods.add(meta["uid"])
        if res.plural == "jobsets":
            events.append((etype, meta["name"]))
            got = (obj.get("status") or {}).get("restarts") or 0
            restarts[meta["name"]] = max(restarts.get(meta["name"], 0), got)

    shm_before = shm_names()
    unsubscribe = h.cluster.store.subscribe(census)
    kueue = Kueue(h.cluster.api_client())
    admit = threading.Thread(target=kueue.run, args=(h.stop,), daemon=True, name="kueue")
    admit.start()
    h.threads.append(admit)
    chaos = Chaos(h, tmp, random.Random(seed), kueue)
    memory = Memory()
    sampler = threading.Thread(target=memory.follow, args=(chaos, h.stop), daemon=True, name="rss")
    sampler.start()
    h.threads.append(sampler)
    t0 = time.monotonic()
    try:
        knobs = Knobs(unschedulable_grace_s=20, grow_window_s=1, app_backoff_s=1)
        h.launch(
            RUN, slices=slices, steps=steps, interval=interval, knobs=knobs, global_batch=batch,
            restart_mode=restart_mode, queue=QUEUE,
        )  # fmt: skip
        chaos.controller()
        error = None
        try:
            for i, (fault, delay) in enumerate(schedule(seed, n_faults)):
                # Spread over the run, each on a checkpoint (the trainer starts in seconds, then runs
                # fast: waiting for "one more checkpoint" would crowd the faults into the first steps).
                at = max(interval, (i + 1) * steps // (n_faults + 1) // interval * interval)
                h.wait_step(RUN, at, timeout=300)
                if (h.rundir(RUN).latest_committed_step() or 0) + interval >= steps:
                    break  # the run is about to finish: later faults would find nothing to hit
                time.sleep(delay)
                target = chaos.inject(fault)
                chaos.done.append((time.monotonic() - t0, fault, target))
            h.wait_state(RUN, {RunState.FINISHED, RunState.FAILED, RunState.STOPPED}, timeout=600)
        except AssertionError as e:  # a wait timed out: the run is stuck, the seed did not hold
            error = str(e)
        for t in chaos.timers:
            t.join()
        h.cluster.settle()
        memory.sample(chaos)
        rec, rundir = h.record(RUN), h.rundir(RUN)
        metrics, committed, names = rundir.metrics(), rundir.committed_steps(), rundir.list_dir("checkpoints")
    finally:
        unsubscribe()
        for p in chaos.controllers:
            if p.poll() is None:
                p.kill()
        if keep is not None:  # the pods' logs go with the cluster: beside the run directory first
            shutil.copytree(h.cluster.kubelet.runtime.log_dir, tmp / "pod-logs", dirs_exist_ok=True)
        h.close()
    # The seed's processes have exited: nothing of the run may be left in /dev/shm (RAM on a TPU
    # host). A supervisor's last cleanup may still be under way for a moment.
    deadline = time.monotonic() + 10
    while (leftovers := shm_problems(shm_before, shm_names(), pods)) and time.monotonic() < deadline:
        time.sleep(0.5)
    kept = kept_steps(metrics)
    segs = [Seg(s.index, s.submitted_at, s.ended_at, s.start_step, s.end_step) for s in rec.segments]
    checks = {
        "finished": ([error] if error else []) + finished_problems(rec.state, committed, sorted(kept), steps),
        "segments": segment_problems(segs),
        **(
            {"one JobSet": overlap_problems(events), "launched once": relaunch_problems(events)}
            if restart_mode == RestartMode.RECREATE
            else {
                "a JobSet per slice": slice_jobset_problems(events, slices),
                "one world": world_overlap_problems(metrics),
                "published once": world_publication_problems(worlds),
            }
        ),
        "checkpoints": checkpoint_problems(names, committed),
        "losses": loss_problems(kept, reference),
        "/dev/shm clean": leftovers,
    }
    if keep is not None and any(checks.values()):
        shutil.copytree(tmp, keep / f"seed-{seed}", dirs_exist_ok=True)
    return {
        "seed": seed,
        "faults": chaos.done,
        "checks": checks,
        "segments": len(rec.segments),
        "restarts": sum(restarts.values()),
        "recomputed": recomputed(metrics),  # steps trained twice (in flight at a fault, then again)
        # Steps of the run lost for good: without a record, or trained on other data or to another loss.
        "lost": len(set(range(1, steps + 1)) - set(kept)) + len(checks["losses"]),
        "seconds": time.monotonic() - t0,
        "rss_mib": {
            "controller": round(memory.controllers, 1),
            "pods": round(memory.pods, 1),
            "bench": round(peak_mib(os.getpid(), "VmRSS") or 0.0, 1),
        },
    }


def seed_table(r: dict) -> Table:
    held = all(not p for p in r["checks"].values())
    rss = r["rss_mib"]
    title = (
        f"seed {r['seed']}: {'held' if held else 'NOT HELD'} in {r['seconds']:.0f} s "
        f"({r['segments']} segments, {r['restarts']} JobSet restarts, {r['recomputed']} steps recomputed,"
        f" {r['lost']} lost"
        f" over {len(r['faults'])} faults; peak RSS MiB: controller {rss['controller']:.0f},"
        f" supervisors {rss['pods']:.0f}; this process at the end {rss['bench']:.0f})"
    )
    table = Table(title=title, title_justify="left")
    table.add_column("t (s)", justify="right")
    table.add_column("fault / invariant")
    table.add_column("target / result")
    for t, fault, target in r["faults"]:
        table.add_row(f"{t:.0f}", fault, target)
    for name, problems in r["checks"].items():
        table.add_row(
            "",
            name,
            "held" if not problems else "; ".join(problems[:3]),
            style=None if not problems else "red",
        )
    return table


def main() -> None:
    ap = Parser(prog="python -m bench.chaos")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--faults", type=int, default=4, help="faults per seed")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--interval", type=int, default=5, help="checkpoint interval (steps)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="elastic")
    ap.add_argument(
        "--restart-mode", choices=[m.value for m in RestartMode], default=RestartMode.RECREATE.value
    )
    ap.add_argument(
        "--keep", type=Path, metavar="DIR", help="what a seed that did not hold leaves, in DIR/seed-N"
    )
    args = ap.parse_args()
    ap.at_least(args, 1, "seeds", "faults", "steps", "interval")
    if args.steps < 2 * args.interval:
        # Each fault waits for a checkpoint and none comes once the next would be the last.
        ap.error(f"--steps {args.steps} < 2 × --interval {args.interval}: no fault could land")
    if args.restart_mode == RestartMode.IN_PLACE and SHAPES[args.shape][1] == 1:
        ap.error("--restart-mode in-place needs a shape of several slices (--shape elastic)")
    console = Console(width=140)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        batch = SHAPES[args.shape][2]
        reference = reference_run(Path(tmp) / "reference", args.steps, args.interval, batch)
        console.log(f"uninterrupted reference run: {time.monotonic() - t0:.0f} s")
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            r = run_seed(
                seed,
                args.faults,
                args.steps,
                args.interval,
                reference,
                Path(tmp) / f"seed-{seed}",
                args.shape,
                args.restart_mode,
                args.keep,
            )
            results.append(r)
            console.print(seed_table(r))
    held = sum(all(not p for p in r["checks"].values()) for r in results)
    per_seed = sum(r["seconds"] for r in results) / max(1, len(results))
    faults = sum(len(r["faults"]) for r in results)
    again = sum(r["recomputed"] for r in results)
    console.print(
        f"{held}/{len(results)} held ({per_seed:.0f} s per seed; {faults} faults injected;"
        f" {again / max(1, faults):.2f} steps recomputed per fault)"
    )
    console.print(f"steps recomputed: {again}; steps lost: {sum(r['lost'] for r in results)}")
    for who, key in (
        ("the controllers' peak", "controller"),
        ("the supervisors' peak", "pods"),
        ("this process's (the embedded cluster) at each seed's end", "bench"),
    ):
        got = [r["rss_mib"][key] for r in results]
        console.print(
            f"RSS of {who}, MiB: first seed {got[0]:.0f}, last {got[-1]:.0f}, "
            f"lowest {min(got):.0f}, highest {max(got):.0f}"
        )
    if held < len(results):
        raise SystemExit(1)  # a seed that did not hold fails the command, for scripts and CI


if __name__ == "__main__":
    main()
