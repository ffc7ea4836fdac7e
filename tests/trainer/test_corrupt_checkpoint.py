"""A committed checkpoint that does not restore costs one checkpoint interval, not the run.

One short run commits steps 2, 4, 6 and 8. Then step 8's meta is garbage, step 6's arrays are
truncated and step 4 has no `state/`: the resume sets each aside (one line each, moved, never
deleted) and resumes from step 2 with the losses of a clean resume from step 2. Local runs are
in-process (real JAX on the 8 simulated devices, real Orbax); the gs:// one is a subprocess against
the real fake-gcs-server, fed the same committed steps (its losses within float rounding of the
in-process ones: the test's process compiles at -O0, tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorstore as ts

from launcher.controller.loop import Controller
from tests.support.fake_gcs import FakeGCS
from tests.trainer import runs
from trainer.__main__ import main
from trainer.config import ConfigError
from trainer.state import checkpoint, compile_cache
from trainer.state.checkpoint import UNUSABLE_DIR, UNUSABLE_REASON

# decay_steps fixed: the resumed run may train further (train.steps=10) and stay the same run.
SETS = [
    *runs.MODEL,
    "checkpoint.interval=2",
    "checkpoint.keep=10",
    "optim.decay_steps=10",
    "metrics.log_every=1000",
]
CORRUPT = {8: "meta garbage", 6: "truncated arrays", 4: "missing state"}


def _train(run_dir: Path, steps: int, monkeypatch: pytest.MonkeyPatch) -> int:
    for k in [k for k in os.environ if k.startswith("RESLICE_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("RESLICE_RUN_DIR", str(run_dir))
    monkeypatch.setenv("RESLICE_GLOBAL_BATCH", "16")
    args = ["--config", "tiny", *(a for s in [*SETS, f"train.steps={steps}"] for a in ("--set", s))]
    return main(args)


def corrupt(ckpt: Path) -> None:
    """The three kinds of damage, one per committed step above step 2."""
    (ckpt / "8" / "meta" / "metadata").write_text("\x00garbage{")
    for f in (ckpt / "6" / "state").glob("ocdbt.process_*/d/*"):  # the arrays' data files
        if f.stat().st_size > 10_000:
            with open(f, "r+b") as fh:
                fh.truncate(100)
    shutil.rmtree(ckpt / "4" / "state")


def _newest_losses(files: dict[str, str]) -> dict[int, float]:
    """The losses the newest incarnation computed (its metrics file sorts last)."""
    newest = sorted(files)[-1]
    return runs.losses(runs.parse_metrics({newest: files[newest]}))


@pytest.fixture(scope="module")
def committed(tmp_path_factory: pytest.TempPathFactory, cpu8: list) -> Path:
    run_dir = tmp_path_factory.mktemp("base")
    with pytest.MonkeyPatch.context() as mp:
        assert _train(run_dir, 8, mp) == 0
    assert runs.committed(run_dir) == [2, 4, 6, 8]
    return run_dir


@pytest.fixture(scope="module")
def clean_resume(committed: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    run_dir = tmp_path_factory.mktemp("clean") / "run"
    shutil.copytree(committed, run_dir)
    for step in CORRUPT:
        shutil.rmtree(run_dir / "checkpoints" / str(step))
    with pytest.MonkeyPatch.context() as mp:
        assert _train(run_dir, 10, mp) == 0
    losses = _newest_losses(runs.metrics_files(run_dir))
    assert sorted(losses) == list(range(3, 11))
    return losses


def test_unusable_steps_are_set_aside_and_the_run_resumes_from_the_previous_one(
    committed: Path, clean_resume: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(committed, run_dir)
    corrupt(run_dir / "checkpoints")
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as warned:  # a trainer would print them to stderr
        warnings.simplefilter("always")
        assert _train(run_dir, 10, monkeypatch) == 0
    assert not [w for w in warned if "never awaited" in str(w.message)], [str(w.message) for w in warned]
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if "is unusable" in line]
    assert [int(line.split("checkpoints/")[1].split()[0]) for line in lines] == [8, 6, 4]
    assert "Traceback" not in out.out + out.err and len((out.out + out.err).splitlines()) < 12
    assert "resumed step 2 " in out.out
    assert _newest_losses(runs.metrics_files(run_dir)) == clean_resume
    # Moved, never deleted: every file of each step is kept beside its reason.
    aside = {int(p.name.split("-")[0]): p for p in (run_dir / UNUSABLE_DIR).iterdir() if p.is_dir()}
    assert sorted(aside) == [4, 6, 8]
    for step, p in aside.items():
        original = {
            f.relative_to(committed / "checkpoints" / str(step))
            for f in (committed / "checkpoints" / str(step)).rglob("*")
        }
        kept = {f.relative_to(p) for f in p.rglob("*")} - {Path(UNUSABLE_REASON)}
        assert kept == (original if step != 4 else {f for f in original if f.parts[0] != "state"})
    status = json.loads((run_dir / "status.json").read_text())
    assert [u["step"] for u in status["unusable_checkpoints"]] == [8, 6, 4]
    # The controller ledgers each once, from the status.json it reads every pass.
    controller = Controller(kube=None)
    entries = controller._new_unusable(status)
    assert [(e["kind"], e["step"]) for e in entries] == [("unusable-checkpoint", s) for s in (8, 6, 4)]
    assert all(e["moved_to"] and e["reason"] for e in entries) and controller._new_unusable(status) == []
    assert runs.committed(run_dir) == [2, 4, 6, 8, 10]


def test_no_usable_step_is_exit_2_in_one_line(
    committed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(committed, run_dir)
    for step in (2, 4, 6, 8):
        (run_dir / "checkpoints" / str(step) / "meta" / "metadata").write_text("not json")
    capsys.readouterr()
    assert _train(run_dir, 10, monkeypatch) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no usable checkpoint" in err[0]
    assert len([p for p in (run_dir / UNUSABLE_DIR).iterdir() if p.is_dir()]) == 4  # all kept, none deleted


def test_on_gcs_too(committed: Path, clean_resume: dict, gcs: FakeGCS, tmp_path: Path) -> None:
    prefix = "corrupt"
    local = tmp_path / "run"
    shutil.copytree(committed, local)
    shutil.rmtree(local / "metrics")  # the resume's metrics file is then the only one
    corrupt(local / "checkpoints")
    for f in local.rglob("*"):
        if f.is_file():
            gcs.write_object("reslice", f"{prefix}/{f.relative_to(local)}", f.read_bytes())
    env = runs.env_for(f"gs://reslice/{prefix}", 8, extra=gcs.env)
    rc, out = runs.run(
        env, tmp_path / "resume.log", [a for s in [*SETS, "train.steps=10"] for a in ("--set", s)]
    )
    assert rc == 0, out[-3000:]
    assert out.count("is unusable") == 3 and "resumed step 2 " in out and "Traceback" not in out
    names = [n for n in gcs.list_objects("reslice", f"{prefix}/metrics/") if n.endswith(".jsonl")]
    files = {n: gcs.read_object("reslice", n).decode() for n in names}
    # The same steps as the clean resume's, within float rounding, not bit for bit: this resume is a
    # trainer process (XLA at -O1), the clean one ran in the test's process (-O0, tests/conftest.py),
    # and the two programs round differently. A resume from any other step is off by far more.
    resumed = _newest_losses(files)
    assert sorted(resumed) == sorted(clean_resume)
    assert all(abs(resumed[s] - clean_resume[s]) <= 1e-5 for s in resumed), (resumed, clean_resume)
    aside = {
        n.split("/")[2] for n in gcs.list_objects("reslice", f"{prefix}/{UNUSABLE_DIR}/") if n.count("/") > 2
    }
    assert sorted(int(a.split("-")[0]) for a in aside) == [4, 6, 8]


def test_a_read_abandoned_by_a_failed_restore_stays_quiet_when_it_completes_later(monkeypatch) -> None:
    # What tensorstore does with a read of gs:// in flight when Orbax gave up on the restore: on
    # completion it calls back into Orbax's closed event loop (an unraisable RuntimeError). Once a
    # restore was abandoned, that says nothing, even after the restores are over; anything else
    # unraisable still reaches the hook that was there before.
    printed: list = []
    monkeypatch.setattr(sys, "unraisablehook", printed.append)
    closed = asyncio.new_event_loop()
    closed.close()
    with checkpoint._quiet_abandoned_reads(lambda: True):
        promise, future = ts.Promise.new()
        future.add_done_callback(lambda _: closed.call_soon_threadsafe(print))
    promise.set_result(1)  # the read completes after the restores
    other_promise, other = ts.Promise.new()
    other.add_done_callback(lambda _: 1 / 0)
    other_promise.set_result(1)
    assert [type(u.exc_value) for u in printed] == [ZeroDivisionError]


def _without_one_leaf(tree: dict) -> dict:
    """`tree` short of its first leaf (depth first): an abstract state this checkpoint's arrays do
    not restore into, as an entry written by another version of a library would be."""
    key, value = next(iter(tree.items()))
    rest = {k: v for k, v in tree.items() if k != key}
    return {key: _without_one_leaf(value), **rest} if isinstance(value, dict) and len(value) > 1 else rest


def test_a_stale_cached_abstract_state_costs_a_trace_not_the_checkpoint(tmp_path: Path) -> None:
    ckpt = checkpoint.Checkpointer(str(tmp_path), 3, False)
    state = {"b": {"value": jnp.ones((2, 3))}, "w": {"value": jnp.arange(8.0)}}
    ckpt.save(2, state, {"step": 2, "config_hash": "h"})
    ckpt.wait()
    traced = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), state)
    retraced: list[int] = []

    def retrace() -> dict:
        retraced.append(1)
        return traced

    step, restored = ckpt.usable_start(10, _without_one_leaf(traced), lambda s, m: None, retrace)
    assert (step, retraced, ckpt.set_aside) == (2, [1], [])
    np.testing.assert_array_equal(restored["b"]["value"], state["b"]["value"])
    # An abstract state traced already has nothing to fall back on: the step is judged unusable.
    with pytest.raises(ConfigError, match="no usable checkpoint"):
        ckpt.usable_start(10, _without_one_leaf(traced), lambda s, m: None)
    assert [a["step"] for a in ckpt.set_aside] == [2] and (tmp_path / UNUSABLE_DIR).is_dir()
    ckpt.close()


def test_a_resume_past_a_stale_compile_cache_entry_keeps_every_checkpoint(
    committed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(committed, run_dir)
    cached = compile_cache.abstract_state

    def stale_entry(program: dict, mesh: Any, build: Callable, rebuild: bool = False) -> dict:
        abstract = cached(program, mesh, build, rebuild)
        return abstract if rebuild else _without_one_leaf(abstract)

    monkeypatch.setattr(compile_cache, "abstract_state", stale_entry)
    capsys.readouterr()
    assert _train(run_dir, 10, monkeypatch) == 0
    out = capsys.readouterr().out
    assert out.count("does not restore into the compile cache's abstract state") == 1
    assert "resumed step 8 " in out and "is unusable" not in out
    assert not (run_dir / UNUSABLE_DIR).exists() and runs.committed(run_dir) == [2, 4, 6, 8, 10]


def test_closing_waits_for_orbaxs_removal_of_unfinished_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Orbax removes an earlier incarnation's unfinished steps in a thread it starts with the
    manager; a trainer that exits at once (a refused checkpoint: exit 2) must not end the interpreter
    under it (its executor then raises into stderr: a traceback after the one line)."""
    from orbax.checkpoint._src.path import temporary_paths

    removed: list[int] = []

    async def slow_cleanup(*_args: Any, **_kwargs: Any) -> None:
        await asyncio.sleep(0.5)
        removed.append(1)

    monkeypatch.setattr(temporary_paths, "cleanup_temporary_paths", slow_cleanup)
    ckpt = checkpoint.Checkpointer(str(tmp_path), keep=3)
    assert removed == []  # still running
    ckpt.close()
    assert removed == [1]


def test_an_abandoned_read_never_started_is_collected_quietly() -> None:
    # What an abandoned restore leaves: a read's coroutine never awaited, held in a reference cycle
    # (Orbax's futures and tasks), so that only the collection at the end of the block frees it.
    async def read() -> None:
        pass

    hook = sys.unraisablehook
    try:
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            with checkpoint._quiet_abandoned_reads(lambda: True):
                cycle: list = [read()]
                cycle.append(cycle)
                del cycle
    finally:
        sys.unraisablehook = hook  # the block leaves its late hook for the process's life
    assert not [w for w in warned if "never awaited" in str(w.message)], [str(w.message) for w in warned]
