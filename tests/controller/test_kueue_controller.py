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
