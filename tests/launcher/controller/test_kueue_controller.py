"""A queued in-place run against the embedded cluster (simulate mode: pods run no process), the
controller's passes driven one by one: world 0 is recorded and its slice JobSets created suspended,
and it is published only once Kueue (launcher/embedded/kueue.py) has admitted every slice it names."""

from launcher.adapters.kube import Kube
from launcher.controller.launch import create_run, prepare
from launcher.controller.loop import Controller
from launcher.core import world
from launcher.core.labels import world_configmap_name
from launcher.core.record import Knobs
from launcher.core.spec import RunSpec
from launcher.core.words import Action, WaitReason
from launcher.embedded.cluster import EmbeddedCluster, NodePoolSpec
from launcher.embedded.kueue import Kueue
from tests.support.wait import wait_for


def test_world_0_is_published_only_once_kueue_admitted_its_slices(tmp_path) -> None:
    with EmbeddedCluster(nodepools=[NodePoolSpec("tpu7x-2x2x2", count=2)], mode="simulate") as cluster:
        kube = Kube(cluster.api_client(), "default")
        spec = RunSpec(
            run="kq", run_dir=str(tmp_path / "kq"), global_batch=32, restart_mode="in-place", queue="team-a"
        )
        create_run(kube, prepare(spec, "tpu7x-2x2x2", 2, Knobs())[0])
        kueue = Kueue(cluster.api_client(), held={"kq-s0", "kq-s1"})
        ctl = Controller(kube)
        decisions = []
        ctl.on_pass = lambda r: decisions.append(r.decision)
        epoch = lambda: world.published_epoch(kube.world(world_configmap_name("kq")))  # noqa: E731

        ctl.pass_once(["kq"])
        assert decisions[-1].action == Action.START_SEGMENT and not decisions[-1].publish
        jobsets = kube.jobsets("kq")
        assert sorted(j["metadata"]["name"] for j in jobsets) == ["kq-s0", "kq-s1"]
        assert all(j["spec"]["suspend"] for j in jobsets)  # as Kueue's webhook makes them
        for _ in range(3):
            ctl.pass_once(["kq"])
        assert epoch() is None and decisions[-1].wait == WaitReason.ADMISSION
        assert kube.pods("reslice.dev/run=kq") == []

        kueue.release("kq-s0")
        kueue.reconcile()
        ctl.pass_once(["kq"])
        assert epoch() is None  # slice 1 still held: world 0 would never form

        kueue.release("kq-s1")
        kueue.reconcile()

        def published() -> bool:
            ctl.pass_once(["kq"])
            return epoch() == 0

        wait_for(published, 30, "world 0 published once both slices are admitted")
        assert kube.get_record("kq")[0].current.index == 0  # the same world, not a new one


def test_under_a_provisioning_request_the_grow_asks_kueue_before_the_nodes_exist(tmp_path) -> None:
    """A queued run whose slice's node pool is deleted goes on on the other slice; the grow rule
    creates the lost slice's JobSet again at once, with no node for it (a ProvisioningRequest
    creates them after the admission check, kueue pkg/controller/admissionchecks/provisioning);
    Kueue admits it once the capacity is provisioned, and the slice joins when its pods run."""
    with EmbeddedCluster(nodepools=[NodePoolSpec("tpu7x-2x2x2", count=2)], mode="simulate") as cluster:
        kube = Kube(cluster.api_client(), "default")
        spec = RunSpec(
            run="dws", run_dir=str(tmp_path / "dws"), global_batch=32, restart_mode="in-place", queue="team-a"
        )
        create_run(kube, prepare(spec, "tpu7x-2x2x2", 2, Knobs(unschedulable_grace_s=600))[0])
        kueue = Kueue(cluster.api_client())
        ctl = Controller(kube)
        worlds = lambda: [s.slice_ids for s in kube.get_record("dws")[0].segments]  # noqa: E731

        def until(cond, what: str, timeout: float = 60):
            def step():
                kueue.reconcile()
                ctl.pass_once(["dws"])
                return cond()

            wait_for(step, timeout, what)

        until(lambda: kube.get_record("dws")[0].current.running_at is not None, "world 0 running")
        lost = next(
            cluster.node_pool_of[p["spec"]["nodeName"]]
            for p in kube.pods("reslice.dev/run=dws,reslice.dev/slice=1")
        )
        kueue.hold("dws-s1")  # its next admission waits for the ProvisioningRequest
        cluster.remove(lost)
        until(lambda: worlds()[-1] == ("0",), "the world on slice 0")
        # The grow rule asks Kueue at once: slice 1's JobSet queued, while no node could hold it.
        until(lambda: "dws-s1" in {j["metadata"]["name"] for j in kube.jobsets("dws")}, "slice 1 queued")
        assert kube.get_record("dws")[0].current.joining == ("1",)
        assert (
            next(j for j in kube.jobsets("dws") if j["metadata"]["name"] == "dws-s1")["spec"]["suspend"]
            is True
        )
        cluster.restore(lost)  # provisioned; the admission check turns Ready
        kueue.release("dws-s1")
        until(lambda: worlds()[-1] == ("0", "1"), "slice 1 joined")
