"""End-to-end harness: the embedded cluster, the real controller and the real trainer.

Every e2e test launches a run exactly as `reslice launch` does (prepare + create_run), drives the
controller in a thread (or a separate process, for takeover tests), injects faults through the
embedded cluster, and asserts on the run record, the ledger and the trainer's metrics.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from contract.words import RestartMode
from launcher.adapters.kube import Kube
from launcher.adapters.rundir import RunDir
from launcher.controller.launch import create_run, prepare
from launcher.controller.loop import Controller
from launcher.core.labels import LABEL_RUN
from launcher.core.record import Knobs, RunRecord
from launcher.core.spec import RunSpec
from launcher.embedded.cluster import EmbeddedCluster, NodePoolSpec
from tests.support.once import once
from tests.support.wait import wait_for
from tests.trainer.runs import MODEL

PRESET = "tpu7x-2x2x1"  # one host of 8 JAX devices: single-slice runs
GLOBAL_BATCH = 16
# Several slices need a multi-host preset (GKE multislice). v5p-2x2x2: 2 hosts of 4 devices per
# slice. On simulated CPU devices a multi-process step is its collectives over TCP, one Gloo rank
# per device: half the devices of tpu7x-2x2x2's hosts, half the CPU a step costs (0.19 against 0.40
# CPU s for 2 processes, docs/measurements.md "The test suite"). The demo keeps tpu7x-2x2x2.
MULTI_HOST = "v5p-2x2x2"
MULTI_HOST_BATCH = 32
# Dropless MoE (factor <= 0): which rows a finite buffer drops depends on the expert-parallel
# layout, so only a dropless run has the same losses on every shape. One learning-rate schedule for
# every run, whatever its length (40 steps, as tests/trainer/runs.py's runs): the schedule's
# constants are compiled into the train step, so runs of 20 and 250 steps on one shape, and the
# trainer tests' runs of that shape, load one executable from the suite's compile cache instead of
# compiling one each (a compile costs seconds of CPU per process).
TRAINER_SETTINGS = (
    *MODEL,  # the trainer tests' depth (one layer): see tests/trainer/runs.py
    "train.steps={steps}",
    "checkpoint.interval={interval}",
    "moe.ragged_buffer_factor=0",
    "optim.decay_steps=40",
)


def paced(pause_s: float) -> tuple[str, ...]:
    """The trainer setting that paces a run's steps by the clock (train.debug_step_pause_s): a test
    that needs its run alive across a disruption waits in wall time, not in more steps, whose
    collectives the simulated devices pay for in CPU (docs/measurements.md, "The test suite")."""
    return (f"train.debug_step_pause_s={pause_s:g}",)


@dataclass
class JobSetCensus:
    """The most JobSets of a run that ever existed at once, counted from the store's change stream
    (every ADDED and DELETED, in commit order), so that no overlap falls between two samples."""

    cluster: EmbeddedCluster
    run: str
    most: int = 0
    names: set[str] = field(default_factory=set)
    _live: set[str] = field(default_factory=set)
    _unsubscribe: Callable[[], None] | None = None

    def start(self) -> JobSetCensus:
        self._unsubscribe = self.cluster.store.subscribe(self._on_change)
        return self

    def _on_change(self, event: str, res: Any, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        if res.plural != "jobsets" or (meta.get("labels") or {}).get(LABEL_RUN) != self.run:
            return
        if event == "DELETED":
            self._live.discard(meta["name"])
        else:
            self._live.add(meta["name"])
            self.names.add(meta["name"])
        self.most = max(self.most, len(self._live))

    def stop(self) -> None:
        self.cluster.store.flush(10)  # every change committed so far has reached _on_change
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None


class Harness:
    def __init__(
        self, tmp: Path, pools: int, *, preset: str = PRESET, state_dir: Path | None = None,
        gcs_env: dict | None = None, nodepools: str | None = None, **cluster_kw,
    ):  # fmt: skip
        """`pools` node pools of `preset`, or the `nodepools` spec ("v5p-2x2x2:2,tpu7x-2x2x1:1")."""
        self.tmp = tmp
        self.preset = preset
        (tmp / "pods").mkdir(parents=True, exist_ok=True)
        self.cluster = EmbeddedCluster(
            nodepools=nodepools or [NodePoolSpec(preset, count=pools)],
            mode="process",
            state_dir=state_dir,
            workdir=tmp / "pods",
            log_dir=tmp / "logs",  # each pod's log, left for a failed test's reader
            **cluster_kw,  # e.g. node_monitor_grace_s, default_toleration_s: a NotReady node in seconds
        )
        self.gcs_env = gcs_env or {}
        self._saved_env = {k: os.environ.get(k) for k in self.gcs_env}
        os.environ.update(self.gcs_env)  # kubelet-run trainers inherit this process's environment
        try:
            self.cluster.start()
        except BaseException:
            self._restore_env()
            raise
        self.kube = Kube(self.cluster.api_client(), "default")
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.controller: Controller | None = None

    def close(self) -> None:
        # Closed from a failing test's `finally` (its exception in flight): every pod's threads'
        # stacks go into the kept logs first, to say what a stuck process was waiting on.
        if sys.exc_info()[0] is not None and self.cluster.dump_stacks():
            time.sleep(1.0)
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)
        self.write_objects()
        self.cluster.stop()
        self._restore_env()

    def _restore_env(self) -> None:
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def write_objects(self) -> None:
        """The cluster's objects as the test left them, in ``cluster.json`` beside the pods' logs:
        what a failed test's reader needs (which pod failed, with which exit code, what JobSet and
        the node lifecycle did) once the cluster is gone."""
        kinds = ("pods", "jobs", "jobsets", "nodes", "events", "configmaps")
        try:
            objects: dict = {kind: self.cluster.store.list(self.cluster.res[kind])[0] for kind in kinds}
        except Exception as e:  # a reader's aid: it never fails a test, nor keeps the cluster up
            objects = {"error": f"{type(e).__name__}: {e}"}
        (self.tmp / "cluster.json").write_text(json.dumps(objects, indent=1, default=str))

    def pool(self, i: int) -> str:
        return f"{self.preset}-np-{i}"

    # --- runs ------------------------------------------------------------------------------------

    def launch(
        self, run: str, slices: int, *, steps: int, interval: int = 5, run_dir: str | None = None,
        knobs: Knobs | None = None, extra: tuple[str, ...] = (), max_restarts: int = 3,
        global_batch: int = GLOBAL_BATCH, restart_mode: str = RunSpec.restart_mode, queue: str | None = None,
    ) -> RunRecord:  # fmt: skip
        settings = tuple(s.format(steps=steps, interval=interval) for s in TRAINER_SETTINGS) + extra
        spec = RunSpec(
            run=run,
            run_dir=run_dir or str(self.tmp / run),
            global_batch=global_batch,
            config="tiny",
            overrides=settings,
            grace_period_s=20,
            heartbeat_timeout_s=10,
            max_restarts=max_restarts,
            image_pull_policy="Never",
            restart_mode=restart_mode,
            queue=queue,  # a Kueue LocalQueue: the JobSets are rendered suspended, Kueue admits them
            # In place, the pods read their world from the embedded API server (docs/contract.md).
            world_api=self.cluster.api_client().configuration.host
            if restart_mode == RestartMode.IN_PLACE
            else None,
        )
        knobs = knobs or Knobs(unschedulable_grace_s=20, grow_window_s=4, app_backoff_s=1)
        rec, _ = prepare(spec, self.preset, slices, knobs)
        create_run(self.kube, rec)
        return rec

    def start_controller(self, run: str, resync_s: float = 1.0, lease_s: int = 4) -> Controller:
        self.controller = Controller(self.kube, resync_s=resync_s, lease_s=lease_s)
        t = threading.Thread(
            target=self.controller.run_forever, args=(lambda: [run], self.stop), kwargs={"until_done": True},
            daemon=True,
        )  # fmt: skip
        t.start()
        self.threads.append(t)
        return self.controller

    def controller_process(self, run: str, log: Path, crash_point: str | None = None) -> subprocess.Popen:
        """`reslice watch RUN` in its own process (to be killed like a real controller)."""
        env = {
            **os.environ,
            "KUBECONFIG": str(self.cluster.kubeconfig),
            "RESLICE_RESYNC_S": "1",
            "RESLICE_LEASE_S": "4",
        }
        if crash_point:
            env["RESLICE_CRASH_POINT"] = crash_point
        with log.open("ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "launcher", "watch", run],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def record(self, run: str) -> RunRecord:
        got = self.kube.get_record(run)
        assert got is not None
        return got[0]

    def rundir(self, run: str) -> RunDir:
        rec = self.record(run)
        return RunDir(rec.spec.run_dir, rec.spec.trainer)

    def wait_state(self, run: str, states: set[str], timeout: float) -> RunRecord:
        return wait_for(
            lambda: (r := self.record(run)).state in states and r, timeout, f"{run} to reach {states}"
        )

    def wait_step(self, run: str, step: int, timeout: float) -> None:
        """Until the trainer has committed a checkpoint at or after `step`."""
        wait_for(
            lambda: (self.rundir(run).latest_committed_step() or 0) >= step, timeout, f"{run} step {step}"
        )

    def run_pods(self, run: str) -> list[dict]:
        return self.kube.pods(f"{LABEL_RUN}={run}")


def kept_steps(metrics: list[dict]) -> dict[int, dict]:
    """The computation of each step the run kept (the last one)."""
    out: dict[int, dict] = {}
    for m in sorted(metrics, key=lambda m: m["time"]):
        out[m["step"]] = m
    return out


def assert_same_samples_and_losses(kept: dict[int, dict], reference: dict) -> None:
    """Each kept step trained on the uninterrupted run's samples, its loss within 1e-5 of it."""
    for step, m in kept.items():
        ref = reference[step]
        assert m["data/sample_digest"] == ref["data/sample_digest"], f"step {step}: different samples"
        assert abs(m["learning/loss"] - ref["learning/loss"]) <= 1e-5, (
            step,
            m["learning/loss"],
            ref["learning/loss"],
        )


def recomputed(metrics: list[dict]) -> int:
    return len(metrics) - len({m["step"] for m in metrics})


# The length of the shared reference runs (`shared_reference`): every test's run is as long or
# shorter, and a shorter run matches a longer one's first steps (one schedule, TRAINER_SETTINGS).
REFERENCE_STEPS = 30


def shared_reference(
    factory: pytest.TempPathFactory, global_batch: int, steps: int = REFERENCE_STEPS
) -> dict[int, dict]:
    """`reference_run` of `steps` at `global_batch`, made once per session for every file and
    worker that asks (tests/support/once.py)."""
    return once(
        factory,
        f"reference-{steps}-steps-{global_batch}",
        lambda folder: reference_run(folder, steps, global_batch=global_batch),
    )


def reference_run(
    tmp: Path, steps: int, interval: int = 5, global_batch: int = GLOBAL_BATCH
) -> dict[int, dict]:
    """The uninterrupted run: the trainer alone, one process of 8 devices, same global batch."""
    settings = [s.format(steps=steps, interval=interval) for s in TRAINER_SETTINGS]
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "JAX_NUM_CPU_DEVICES": "8",
        "RESLICE_RUN_DIR": str(tmp),
        "RESLICE_GLOBAL_BATCH": str(global_batch),
        "RESLICE_MICRO_BATCH": str(global_batch // 8),
        "RESLICE_GRAD_ACCUM": "1",
        "RESLICE_CONFIG": "tiny",
        "RESLICE_SET": json.dumps(settings),
    }
    subprocess.run([sys.executable, "-m", "trainer"], env=env, check=True, capture_output=True, timeout=300)
    return kept_steps(RunDir(str(tmp)).metrics())
