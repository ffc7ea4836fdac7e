"""What only a TPU host shows in the in-place path: a forked trainer's environment, and the chip handed on.

    python -m bench.tpu_handoff [--handoffs 5] [--steps 3] [--devices 1] [--set KEY=VALUE ...] [--workdir DIR] [--timeout 900] [--json]

Runs the real in-place supervisor (``trainer.elastic.follower.supervise_world``) around the real
trainer (``tiny``), one pod of a one-slice, one-host world published in a file
(``RESLICE_WORLD_FILE``; ``--set``: the trainer's overrides, e.g. ``model.dense_layers=2`` for a
dense model): a single-process world, so no socket is opened (a TPU host of this kind
may allow none, even on loopback). Two pods, one after the other:

1. **Fresh**: world 0 has an ``env`` of its own (``RESLICE_SET=[]``, which changes nothing), so its
   trainer is a fresh interpreter (``exec``) that imports in its world's environment, as a
   trainer started by itself does; it trains ``--steps`` steps and finishes. Its environment at
   ``trainer.loop.run`` is written down.
2. **Hand-offs**: worlds 0, 1, ..., ``--handoffs`` are published one after the other, each once the
   trainer of the previous one has trained ``--steps`` steps of its segment: the supervisor ends
   that trainer (SIGTERM: it saves and exits 42) and forks the next, with the trainer's imports
   (``import jax``: ``cloud_tpu_init`` on a TPU host) done once in the supervisor before its first
   child. Then a world without the pod's slice ends the pod (exit 0).

It prints whether the first forked trainer's environment equals the fresh one's (the
variables that differ, and those ``cloud_tpu_init`` sets, on both sides), then one line per
hand-off (was the trainer forked with the imports done, how long the previous one took to exit after its SIGTERM,
first step after the world was published, the chip's wait) and every libtpu lock error the pods
reported (``Internal error when accessing libtpu multi-process lockfile``). Exit 0 when the
environments are equal and every hand-off trained without a lock error, else 1. ``--json``: one
JSON object on the last line. On a CPU host it does the same without a chip (no lock file: no wait).
Figures: docs/measurements.md, "On a TPU".
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

from bench._cli import Parser
from launcher.embedded.kubelet.podenv import SIMULATED_XLA_FLAGS
from trainer.elastic import follower, supervisor

ROOT = Path(__file__).resolve().parents[1]
RUN = "handoff"
# What cloud_tpu_init (jax/_src/cloud_tpu_init.py) and libtpu's import set on a TPU host.
TPU_KEYS = (
    "LIBTPU_INIT_ARGS", "TPU_LIBRARY_PATH", "TPU_ML_PLATFORM", "TPU_ML_PLATFORM_VERSION", "GRPC_VERBOSITY",
    "ENABLE_RUNTIME_UPTIME_TELEMETRY", "TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS",
    "TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES", "TF_CPP_MIN_LOG_LEVEL", "TPU_SKIP_MDS_QUERY",
)  # fmt: skip
# Variables that name a pod or a child's own pipe, not the world: they differ between the two pods.
OWN_KEYS = (
    supervisor.RUNNING_ENV, "RESLICE_MEMORY_DIR", "RESLICE_MEMORY_ROOT", "RESLICE_WORLD_FILE",
    "RESLICE_SET",  # the fresh pod's world's own
)  # fmt: skip


def _host_env(env: dict[str, str]) -> dict[str, str]:
    """`env` without what bench/__init__.py sets for the simulated CPU hosts (JAX on CPU, XLA:CPU's
    quick-compile flags): these trainers run on whatever this host has, its TPU if any."""
    out = {k: v for k, v in env.items() if k != "JAX_PLATFORMS"}
    flags = out.get("XLA_FLAGS", "")
    for name, value in SIMULATED_XLA_FLAGS:
        flags = flags.replace(f"--{name}={value}", "")
    out["XLA_FLAGS"] = " ".join(flags.split())
    if not out["XLA_FLAGS"]:
        del out["XLA_FLAGS"]
    return out


def _train(record: Path, argv: list[str]) -> int:
    """A pod's trainer child: the trainer's own ``main``, its environment written to `record` as
    ``trainer.loop.run`` gets it, and whether its imports were done before it (by the supervisor)."""
    forked = "jax" in sys.modules
    from trainer import __main__ as entry
    from trainer import loop

    real = loop.run

    def run(cfg: Any, env: Mapping[str, str], *rest: Any) -> int:
        import jax

        from trainer.telemetry import metrics

        # The supervisor imports the event writer before its first child, a fresh trainer with
        # its first record (and the import sets CRC32C_SW_MODE): both have it here.
        metrics.preload_tensorboard(cfg.run_dir)

        device = jax.devices()[0]
        line = {"pid": os.getpid(), "forked": forked, "env": dict(env), "t": time.time(),
                "platform": device.platform, "device_kind": device.device_kind}  # fmt: skip
        with open(record, "a") as f:
            f.write(json.dumps(line) + "\n")
        return real(cfg, env, *rest)

    loop.run = run  # type: ignore[assignment]  # the same call: it passes what it is given on to the real one
    return entry.main(argv)


def _pod(record: Path, argv: list[str]) -> int:
    """A pod's supervisor (``--pod``), with trainer.__main__'s ``preload``; a fresh trainer is
    this module again with ``--child``."""
    env = _host_env(dict(os.environ))  # bench/__init__.py set its own again on this import
    os.environ.clear()
    os.environ.update(env)
    from trainer import __main__ as entry

    def fresh(child_env: Mapping[str, str]) -> NoReturn:
        argv_child = [sys.executable, "-m", "bench.tpu_handoff", "--child", str(record), "--", *argv]
        os.execve(sys.executable, argv_child, child_env)

    return follower.supervise_world(
        lambda: _train(record, argv), os.environ, preload=entry._preload, fresh=fresh
    )


class Pod:
    """One pod's supervisor process (this module with ``--pod``) following `world_file`."""

    def __init__(self, work: Path, name: str, steps: int, chip_wait: float, sets: list[str]) -> None:
        self.dir = work / name
        self.dir.mkdir(parents=True)
        self.world_file, self.record, self.log = (
            self.dir / "world.json",
            self.dir / "env.jsonl",
            self.dir / "pod.log",
        )
        self.run_dir = self.dir / "run"
        env = {k: v for k, v in _host_env(dict(os.environ)).items() if not k.startswith("RESLICE_")}
        # Added to, not replaced: a TPU host's JAX may be importable through PYTHONPATH alone.
        path = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        env.update(
            PYTHONPATH=path, RESLICE_RUN=RUN, RESLICE_RESTART_MODE="in-place", RESLICE_SLICE_ID="a",
            JOB_COMPLETION_INDEX="0", RESLICE_WORLD_FILE=str(self.world_file),
            RESLICE_CHIP_WAIT_S=str(chip_wait),
            RESLICE_MEMORY_ROOT=str(self.dir),
        )  # fmt: skip
        argv = ["--config", "tiny", "--set", f"run_dir={self.run_dir}", "--set", f"train.steps={steps}",
                "--set", "metrics.log_every=1", "--set", "checkpoint.interval=1000",
                *(a for kv in sets for a in ("--set", kv))]  # fmt: skip
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bench.tpu_handoff", "--pod", str(self.record), "--", *argv],
                env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
            )  # fmt: skip

    def publish(
        self, epoch: int, devices: int, slices: tuple[str, ...] = ("a",), env: dict[str, str] | None = None
    ) -> float:
        published = time.time()
        doc = {"run": RUN, "epoch": epoch, "slices": list(slices), "hosts_per_slice": 1,
               "coordinator": "127.0.0.1:1", "global_batch": 16, "micro_batch": 16 // devices, "grad_accum": 1,
               "published": published, **({"env": env} if env else {})}  # fmt: skip
        tmp = self.world_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.world_file)  # whole, as the contract asks of a file publisher
        return published

    def envs(self) -> list[dict]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines() if line.strip()]

    def records(self, segment: int) -> list[dict]:
        out = []
        for path in sorted((self.run_dir / "metrics").glob("*.jsonl")):
            for line in path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line being written
                if rec.get("segment") == segment:
                    out.append(rec)
        return out

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_until(self, what: str, ready: Callable[[], Any], deadline: float) -> Any:
        while time.monotonic() < deadline:
            if (got := ready()) is not None:
                return got
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the pod exited {self.proc.returncode} waiting for {what}:\n{self.output()[-4000:]}"
                )
            time.sleep(0.2)
        raise RuntimeError(f"timed out waiting for {what}:\n{self.output()[-4000:]}")

    def wait(self, deadline: float) -> int:
        try:
            return self.proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"the pod did not exit:\n{self.output()[-4000:]}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()


def compare(fresh: dict[str, str], forked: dict[str, str]) -> dict:
    """The two environments without OWN_KEYS: equal, and the variables that differ."""
    a = {k: v for k, v in fresh.items() if k not in OWN_KEYS}
    b = {k: v for k, v in forked.items() if k not in OWN_KEYS}
    return {
        "equal": a == b,
        "only_fresh": sorted(a.keys() - b.keys()),
        "only_forked": sorted(b.keys() - a.keys()),
        "changed": sorted(k for k in a.keys() & b.keys() if a[k] != b[k]),
        "tpu": {k: [fresh.get(k), forked.get(k)] for k in TPU_KEYS if k in fresh or k in forked},
    }


_STARTED = re.compile(
    r"trainer: world epoch (\d+): .*?(?:exited (-?\d+) ([\d.]+) s after SIGTERM)?, started ([\d.]+) s after it was seen"
)


def handoffs(pod: Pod, published: dict[int, float]) -> list[dict]:
    """One row per world of the hand-off pod, from its log, its env records and its metrics."""
    log = pod.output()
    starts = {int(m[1]): m for m in _STARTED.finditer(log)}
    envs = {int(e["env"]["RESLICE_WORLD_EPOCH"]): e for e in pod.envs()}
    rows = []
    for epoch in sorted(published):
        recs = pod.records(epoch)
        m, e = starts.get(epoch), envs.get(epoch)
        rows.append({
            "epoch": epoch, "forked": bool(e and e["forked"]), "steps": len(recs),
            "previous_exit": int(m[2]) if m and m[2] else None,
            "previous_exit_s": float(m[3]) if m and m[3] else None,
            "first_step_s": round(recs[0]["time"] - published[epoch], 3) if recs else None,
            "device": f"{e['platform']}:{e['device_kind']}" if e else None,
        })  # fmt: skip
    return rows


def main() -> int:
    if "--pod" in sys.argv[1:2]:  # a pod's supervisor, started by this benchmark
        return _pod(Path(sys.argv[2]), sys.argv[4:])
    if "--child" in sys.argv[1:2]:  # a fresh trainer, exec'd by a pod's supervisor
        env = _host_env(dict(os.environ))  # bench/__init__.py set its own again on this import
        os.environ.clear()
        os.environ.update(env)
        return _train(Path(sys.argv[2]), sys.argv[4:])
    parser = Parser(prog="python -m bench.tpu_handoff", description=__doc__.split("\n\n")[0])
    parser.add_argument("--handoffs", type=int, default=5, help="hand-offs of the chip in the second pod")
    parser.add_argument(
        "--steps", type=int, default=3, help="steps each trainer trains before the next world"
    )
    parser.add_argument("--devices", type=int, default=1, help="the host's JAX devices (a v5e chip: 1)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a trainer override (tiny's), repeatable",
    )
    parser.add_argument("--workdir", help="where the pods write (default: a temporary directory, removed)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for the whole benchmark")
    parser.add_argument("--json", action="store_true", help="one JSON object on the last line")
    args = parser.parse_args()
    parser.at_least(args, 1, "handoffs", "steps", "devices")
    if args.timeout <= 0:
        parser.error(f"--timeout {args.timeout}: no time to run in (more than 0)")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tpu-handoff-"))
    deadline = time.monotonic() + args.timeout
    pods: list[Pod] = []
    try:
        # 1. A fresh trainer, which imports in its world's environment.
        fresh = Pod(work, "fresh", args.steps, chip_wait=60, sets=args.set)
        pods.append(fresh)
        fresh.publish(0, args.devices, env={"RESLICE_SET": "[]"})
        if (code := fresh.wait(deadline)) != 0:
            raise RuntimeError(f"the fresh pod exited {code}:\n{fresh.output()[-4000:]}")
        (fresh_env,) = fresh.envs()
        # 2. Hand-offs between trainers forked with the supervisor's imports done.
        total = 100_000  # never reached: each trainer is ended by the next world
        pod = Pod(work, "handoffs", total, chip_wait=60, sets=args.set)
        pods.append(pod)
        published: dict[int, float] = {}
        for epoch in range(args.handoffs + 1):
            published[epoch] = pod.publish(epoch, args.devices)
            pod.wait_until(
                f"{args.steps} steps of world {epoch}",
                functools.partial(lambda e: True if len(pod.records(e)) >= args.steps else None, epoch),
                deadline,
            )
        pod.publish(args.handoffs + 1, args.devices, slices=("elsewhere",))  # leaves this slice out
        pod_code = pod.wait(deadline)
        forked_env = next(e for e in pod.envs() if e["env"]["RESLICE_WORLD_EPOCH"] == "0")
        env_check = compare(fresh_env["env"], forked_env["env"])
        env_check["fresh_imported_itself"] = not fresh_env["forked"]
        env_check["forked_with_imports"] = forked_env["forked"]
        rows = handoffs(pod, published)
        logs = fresh.output() + pod.output()
        lock_errors = logs.count(follower.LOCK_ERROR)
        waits = re.findall(r"trainer: the chip is free after ([\d.]+) s", logs)
        retries = len(re.findall(r"starting epoch \d+'s trainer again", logs))
    except RuntimeError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1
    finally:
        for p in pods:
            p.kill()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    ok_handoffs = sum(1 for r in rows[1:] if r["steps"] >= args.steps)
    print(f"device: {forked_env['platform']} ({forked_env['device_kind']})")
    print(
        f"environment: a trainer forked with the imports done {'equals' if env_check['equal'] else 'DIFFERS FROM'}"
        f" a fresh one's (forked with them: {env_check['forked_with_imports']};"
        f" the fresh one imported itself: {env_check['fresh_imported_itself']})"
    )
    for key in ("only_fresh", "only_forked", "changed"):
        if env_check[key]:
            print(f"  {key}: {', '.join(env_check[key])}")
    for key, (a, b) in env_check["tpu"].items():
        print(f"  {key}: fresh {a!r}, forked {b!r}")
    waited = f" ({', '.join(waits)} s)" if waits else ""
    print(f"hand-offs: {ok_handoffs} of {args.handoffs} trained; lock errors {lock_errors}, chip waits {len(waits)}"
          f"{waited}, retries {retries}; the pod exited {pod_code}")  # fmt: skip
    for r in rows:
        print(
            f"  world {r['epoch']}: {'forked with the imports' if r['forked'] else 'imported itself'}, {r['steps']} steps,"
            f" previous trainer exited {r['previous_exit']} {r['previous_exit_s']} s after SIGTERM,"
            f" first step {r['first_step_s']} s after publication"
        )
    good = (
        env_check["equal"] and env_check["fresh_imported_itself"] and env_check["forked_with_imports"]
        and ok_handoffs == args.handoffs and lock_errors == 0 and pod_code == 0
    )  # fmt: skip
    if args.json:
        print(json.dumps({"env": env_check, "handoffs": rows, "ok_handoffs": ok_handoffs, "lock_errors": lock_errors,
                          "chip_waits_s": [float(w) for w in waits], "retries": retries, "pod_exit": pod_code,
                          "ok": good}))  # fmt: skip
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
