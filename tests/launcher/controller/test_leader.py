"""`reslice watch --all` with two replicas (in-cluster mode): each run is owned through a
Lease, so only one replica ever acts on it; when the owner dies without releasing it, the other
takes over after the lease expires and the ledger says so."""

import threading

from launcher.adapters.kube import Kube
from launcher.adapters.rundir import RunDir
from launcher.controller.launch import create_run, prepare
from launcher.controller.loop import Controller
from launcher.core.record import Knobs
from launcher.core.spec import RunSpec
from launcher.embedded.cluster import EmbeddedCluster, NodePoolSpec
from tests.e2e.harness import wait_for

CONTROLLERS: dict[str, Controller] = {}


def replica(kube: Kube, identity: str, stop: threading.Event) -> threading.Thread:
    c = CONTROLLERS[identity] = Controller(kube, identity=identity, resync_s=0.3, lease_s=3)
    t = threading.Thread(
        target=c.run_forever, args=(lambda: [r.name for r in kube.records() if not r.terminal], stop)
    )
    t.start()
    return t


def diagnose(run_dir: str) -> str:
    """What to read when a wait times out: the ledger's tail and each replica's last error."""
    keys = ("controller", "kind", "action", "reason")
    tail = [{k: e.get(k) for k in keys} for e in RunDir(run_dir).ledger()[-6:]]
    return f"ledger tail {tail}; last errors { ({n: c.last_error for n, c in CONTROLLERS.items()}) }"


def test_two_replicas_never_act_at_once(tmp_path):
    with EmbeddedCluster(nodepools=[NodePoolSpec("tpu7x-2x2x2", count=3)], mode="simulate") as cluster:
        kube = Kube(cluster.api_client(), "default")
        spec = RunSpec(run="dual", run_dir=str(tmp_path / "dual"), global_batch=96, grace_period_s=1)
        create_run(kube, prepare(spec, "tpu7x-2x2x2", 3, Knobs(unschedulable_grace_s=5))[0])
        stop_a, stop_b = threading.Event(), threading.Event()
        a = replica(kube, "replica-a", stop_a)
        wait_for(lambda: kube.jobsets("dual"), 20, "segment 0 from replica a")
        b = replica(kube, "replica-b", stop_b)  # a standby: the lease is a's
        cluster.remove("tpu7x-2x2x2-np-2")
        wait_for(lambda: len(kube.get_record("dual")[0].segments) == 2, 30, "the first shrink")
        stop_a.set()  # replica a dies without releasing its lease
        a.join(timeout=10)
        cluster.remove("tpu7x-2x2x2-np-1")
        try:
            wait_for(lambda: len(kube.get_record("dual")[0].segments) == 3, 30, "the second shrink, by b")
        except AssertionError as e:
            raise AssertionError(f"{e}: {diagnose(spec.run_dir)}") from None
        stop_b.set()
        b.join(timeout=10)
        rec = kube.get_record("dual")[0]
    assert [s.slices for s in rec.segments] == [3, 2, 1]
    ledger = RunDir(spec.run_dir).ledger()
    acts = [(e["controller"], e["action"], e["segment"]) for e in ledger if e.get("kind") == "act"]
    takeover = next(i for i, e in enumerate(ledger) if e.get("kind") == "takeover")
    assert ledger[takeover]["previous"] == "replica-a" and ledger[takeover]["holder"] == "replica-b"
    before = {e["controller"] for e in ledger[:takeover] if e.get("kind") in {"act", "wait", "observe"}}
    after = {e["controller"] for e in ledger[takeover:] if e.get("kind") in {"act", "wait", "observe"}}
    assert before == {"replica-a"} and after == {"replica-b"}
    assert acts == [
        ("replica-a", "start-segment", 0),
        ("replica-a", "end-segment", 0),
        ("replica-a", "start-segment", 1),
        ("replica-b", "end-segment", 1),
        ("replica-b", "start-segment", 2),
    ]
