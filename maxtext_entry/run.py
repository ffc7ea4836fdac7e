"""The child MaxText process and the files around it: status.json and the metrics records
(docs/contract.md, Run directory), the SIGTERM forwarded, the facts `outcome.exit_code` decides on."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from maxtext_entry import checkpoints, metrics, storage
from maxtext_entry.args import Command, ConfigError, for_container
from maxtext_entry.outcome import Outcome, exit_code

TRAIN_MODULE = "maxtext.trainers.pre_train.train"
TAIL_LINES = 200
POLL_S = 1.0
# gs://: the metrics objects are rewritten whole every FLUSH_S, and at the first poll that finds a
# record of a committed step unwritten (`_Metrics.owes`): a segment killed without notice (its node
# pool gone) resumes after its last commit, so the records up to it are the ones it must not lose.
FLUSH_S = 10.0
MAXTEXT_METRICS = "maxtext/metrics"  # MaxText's own metrics lines, copied from its local metrics_file
CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # in a checkout: its root
MAXTEXT_CPU_PORT = 1234  # MaxText's fixed coordinator port on CPU (`initialize_jax_for_cpu`)
# Keys that change with the rung, not the run: left out of the config hash.
RUNG_KEYS = ("per_device_batch_size", "gradient_accumulation_steps", "checkpoint_period", "metrics_file")
RUNG_PREFIXES = ("dcn_", "ici_")


@dataclass(frozen=True)
class Context:
    run_dir: str
    segment: int
    jobset_attempt: int
    process_index: int
    who: metrics.Incarnation
    cpu: bool  # JAX_PLATFORMS=cpu: the embedded cluster's simulated devices
    python: str = ""  # the child's interpreter (`maxtext_python`), found once there is work to do


def context(cmd: Command, env: dict[str, str]) -> Context:
    def num(name: str, default: int = 0) -> int:
        return int(env.get(name) or default)

    micro, accum = (
        int(cmd.keys.get("per_device_batch_size", "1")),
        int(cmd.keys.get("gradient_accumulation_steps", "1")),
    )
    devices = num("RESLICE_GLOBAL_BATCH") // (micro * accum) if micro * accum else 0
    peak = float(env["RESLICE_PEAK_TFLOPS"]) if env.get("RESLICE_PEAK_TFLOPS") else None
    segment, attempt = num("RESLICE_SEGMENT"), num("RESLICE_RESTART_ATTEMPT")
    return Context(
        run_dir=env.get("RESLICE_RUN_DIR") or cmd.keys["base_output_directory"],
        segment=segment,
        jobset_attempt=attempt,
        process_index=num("RESLICE_SLICE_INDEX") * num("RESLICE_HOSTS_PER_SLICE", 1)
        + num("JOB_COMPLETION_INDEX"),
        who=metrics.Incarnation(
            segment, attempt, devices, micro, accum, num("RESLICE_NUM_PROCESSES", 1), peak
        ),
        cpu=env.get("JAX_PLATFORMS") == "cpu",
    )


def maxtext_python(env: dict[str, str], checkout: str = CHECKOUT) -> str:
    """The interpreter that has MaxText: `RESLICE_MAXTEXT_PYTHON`; else this one when it has it (the
    profile's image); else the checkout's `.venv-maxtext` (`python3 dev.py maxtext`), beside this
    package: the embedded kubelet runs `python -m maxtext_entry` on the launcher's own Python 3.11,
    which has no MaxText, from whatever checkout or worktree is on its path."""
    if env.get("RESLICE_MAXTEXT_PYTHON"):
        return env["RESLICE_MAXTEXT_PYTHON"]
    if importlib.util.find_spec("maxtext") is not None:
        return sys.executable
    python = os.path.join(checkout, ".venv-maxtext", "bin", "python")
    if os.path.exists(python):
        return python
    raise ConfigError(
        f"no MaxText here: not importable by {sys.executable}, no {python} (`python3 dev.py maxtext`), "
        "no RESLICE_MAXTEXT_PYTHON"
    )


def child_program(ctx: Context, cmd: Command) -> list[str]:
    """MaxText's pre-training; through `pretrain.py` (run by path: MaxText's interpreter need not
    import this package) when one of its fixes applies: grain input (its ElasticIterator
    checkpointed as one state), or CPU with several processes (a barrier before the first step,
    since Gloo's rendezvous there gives up after 30 s while processes 1..N still compile)."""
    if cmd.keys.get("dataset_type") == "grain" or (ctx.cpu and ctx.who.num_processes > 1):
        return [ctx.python, os.path.join(os.path.dirname(os.path.abspath(__file__)), "pretrain.py")]
    return [ctx.python, "-m", TRAIN_MODULE]


# Set for jaxlib 0.10.2 by the embedded kubelet (launcher/embedded/kubelet/podenv.py, SIMULATED_XLA_FLAGS),
# gone from jaxlib 0.12.0.1 (the MaxText profile's): "Unknown flag in XLA_FLAGS" there.
XLA_FLAGS_GONE = frozenset({"xla_cpu_use_fusion_emitters"})


def child_env(env: dict[str, str], cpu: bool) -> dict[str, str]:
    """MaxText's environment. On CPU MaxText starts JAX's coordinator on `gethostbyname(
    JAX_COORDINATOR_ADDRESS)` + its fixed port 1234 (`initialize_jax_for_cpu`), and JAX binds it on
    every address (`[::]:1234`) unless `JAX_COORDINATOR_BIND_ADDRESS` says otherwise: bound to the
    coordinator's own address instead — process 0's pod address, its own on the embedded cluster
    (one per pod, as on GKE) — two MaxText runs on one machine never take the same port. On TPU
    JAX's own discovery picks address and port, and nothing is changed. XLA flags the profile's
    jaxlib no longer has (XLA_FLAGS_GONE) are dropped: XLA aborts on a flag it does not know, and
    the embedded kubelet sets them for the trainer's jaxlib."""
    out = dict(env)
    if flags := env.get("XLA_FLAGS"):
        out["XLA_FLAGS"] = " ".join(
            f for f in flags.split() if f.lstrip("-").split("=")[0] not in XLA_FLAGS_GONE
        )
    host = env.get("JAX_COORDINATOR_ADDRESS")
    if cpu and host and "JAX_COORDINATOR_BIND_ADDRESS" not in env:
        # Not resolvable (yet): left to MaxText, which retries the lookup itself, and binds everywhere.
        with contextlib.suppress(OSError):
            out["JAX_COORDINATOR_BIND_ADDRESS"] = f"{socket.gethostbyname(host)}:{MAXTEXT_CPU_PORT}"
    return out


def config_hash(cmd: Command) -> str:
    run_keys = {k: v for k, v in cmd.keys.items() if k not in RUNG_KEYS and not k.startswith(RUNG_PREFIXES)}
    text = json.dumps({"config": cmd.config, "keys": run_keys}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def write_status(ctx: Context, cmd: Command, latest: int | None) -> None:
    step = checkpoints.done_steps(latest)
    status = {
        "state": "finished" if step >= cmd.steps else "running",
        "step": step,
        "total_steps": cmd.steps,
        "segment": ctx.segment,
        "config_hash": config_hash(cmd),
        "time": time.time(),
    }
    storage.write_text(storage.join(ctx.run_dir, "status.json"), json.dumps(status))


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class _Metrics:
    """Follows the child's local metrics file (MaxText writes it with `open()`: it stays local) and,
    on process 0, adds the contract's records to `<run_dir>/metrics/` and MaxText's own lines, as
    they are, to `<run_dir>/maxtext/metrics/` (`storage.Sink`: appended locally, rewritten whole on
    gs:// at each `flush`). The step's REQUIRED_RBF log line (`note_output`) joins its record: MaxText
    logs it while training the step, and writes the step's metrics line one step later, so a line
    whose probe value has not been read yet waits for the next pump (`final`: no more will come)."""

    source: str
    who: metrics.Incarnation
    records: storage.Sink | None = None
    raw: storage.Sink | None = None
    offset: int = 0
    lines: int = 0
    pending: str = ""
    held: list[str] = field(default_factory=list)
    unflushed: int | None = None  # the earliest step (0-based) pumped since the last flush
    rbf: dict[int, list[float]] = field(default_factory=dict)  # written by the output reader's thread
    rbf_last: int = -1  # the latest step with a REQUIRED_RBF line: `rbf` is never iterated across threads

    def note_output(self, line: str) -> None:
        if "REQUIRED_RBF" in line and (got := metrics.required_rbf(line)) is not None:
            # A dropless replay of the step logs it again: the first attempt's counts.
            self.rbf.setdefault(got[0], got[1])
            self.rbf_last = max(self.rbf_last, got[0])

    def pump(self, final: bool = False) -> None:
        try:
            with open(self.source) as f:
                f.seek(self.offset)
                chunk = f.read()
                self.offset = f.tell()
        except FileNotFoundError:
            chunk = ""
        text = self.pending + chunk
        *complete, self.pending = text.split("\n")
        todo = self.held + [line for line in complete if line.strip()]
        self.held = []
        records, raw = [], []
        for i, line in enumerate(todo):
            parsed = json.loads(line)
            step = int(parsed["step"])
            if self.rbf_last >= 0 and step not in self.rbf and step > self.rbf_last and not final:
                # Its REQUIRED_RBF line is still in the pipe (had a later step's come, none would).
                self.held = todo[i:]
                break
            records.append(json.dumps(metrics.record(parsed, self.who, time.time(), self.rbf.get(step))))
            raw.append(line)
        self.lines += len(records)
        if records and self.unflushed is None:
            self.unflushed = int(json.loads(raw[0])["step"])
        if self.records is not None and self.raw is not None:
            self.records.add(records)
            self.raw.add(raw)

    def owes(self, latest: int | None) -> bool:
        """A record of a step the latest checkpoint holds is not written yet."""
        return self.unflushed is not None and latest is not None and self.unflushed <= latest

    def flush(self) -> None:
        self.unflushed = None
        for sink in (self.records, self.raw):
            if sink is not None:
                sink.flush(_now_ms())


@dataclass
class _Signals:
    child: subprocess.Popen | None = None
    sigterm: bool = False
    committed_at_signal: int | None = None
    directory: str = ""
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))

    def handle(self, signum: int, _frame: object) -> None:
        if signum == signal.SIGTERM and not self.sigterm:
            self.sigterm = True
            self.committed_at_signal = checkpoints.latest(self.directory)
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)  # MaxText saves at JAX's next preemption sync point


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _pass_through(stream, tail: collections.deque, follow: _Metrics) -> None:
    for line in iter(stream.readline, ""):
        sys.stderr.write(line)
        tail.append(line)
        follow.note_output(line)


def supervise(cmd: Command, ctx: Context) -> int:
    """Run MaxText to its end and return the contract's exit code."""
    directory = cmd.checkpoint_dir
    final = cmd.steps - 1  # MaxText's 0-based index of the last step
    workdir = tempfile.mkdtemp(prefix="maxtext-entry-")
    local_metrics = os.path.join(workdir, "metrics.jsonl")  # MaxText's own metrics_file: local
    follow = _Metrics(local_metrics, ctx.who)
    if ctx.process_index == 0:
        prefix, started = f"{ctx.segment:04d}-{ctx.jobset_attempt:03d}", _now_ms()
        follow.records = storage.Sink(storage.join(ctx.run_dir, "metrics"), prefix, ".jsonl", started)
        follow.raw = storage.Sink(storage.join(ctx.run_dir, MAXTEXT_METRICS), prefix, ".jsonl", started)
        write_status(ctx, cmd, checkpoints.latest(directory))
    sig = _Signals(directory=directory)
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, sig.handle)
    child_cmd = for_container(cmd, local_metrics, ctx.cpu)
    sig.child = subprocess.Popen(
        [*child_program(ctx, cmd), *child_cmd.argv()],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env(dict(os.environ), ctx.cpu),
        preexec_fn=_die_with_parent,
    )
    reader = threading.Thread(target=_pass_through, args=(sig.child.stdout, sig.tail, follow), daemon=True)
    reader.start()
    seen = checkpoints.latest(directory)
    flushed = time.monotonic()
    while True:
        try:
            returncode = sig.child.wait(timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            pass
        follow.pump()
        latest = checkpoints.latest(directory)
        if follow.owes(latest) or time.monotonic() - flushed >= FLUSH_S:
            follow.flush()  # gs://: the records of committed steps at once, the others every FLUSH_S
            flushed = time.monotonic()
        if ctx.process_index == 0 and latest != seen:
            write_status(ctx, cmd, latest)
        seen = latest
    reader.join(timeout=10)
    follow.pump(final=True)
    follow.flush()
    latest = checkpoints.latest(directory)
    if ctx.process_index == 0:
        write_status(ctx, cmd, latest)
    before = -1 if sig.committed_at_signal is None else sig.committed_at_signal
    outcome = Outcome(
        returncode=returncode,
        final_committed=latest is not None and latest >= final,
        sigterm=sig.sigterm,
        committed_after_signal=sig.sigterm and latest is not None and latest > before,
        steps_trained=follow.lines,
        output_tail="".join(sig.tail),
    )
    code = exit_code(outcome)
    print(
        f"maxtext_entry: MaxText exited {returncode}; latest committed step {latest}; exit {code}",
        file=sys.stderr,
    )
    return code
