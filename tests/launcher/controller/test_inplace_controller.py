"""An in-place run against the embedded cluster (simulate mode: pods run no process): what launch
and the controller's first pass create, and a world published once per epoch whoever publishes it."""

import json
from dataclasses import replace

from kubernetes import client

from contract.world import DATA_KEY
from launcher.adapters.kube import Kube
from launcher.controller.launch import create_run, prepare, stop_run
from launcher.controller.loop import Controller
from launcher.core import world
from launcher.core.labels import LABEL_RUN, world_configmap_name
from launcher.core.record import Knobs
from launcher.core.spec import RunSpec
from launcher.core.words import LedgerKind, RunState
from launcher.embedded.cluster import EmbeddedCluster, NodePoolSpec
from tests.e2e.harness import wait_for


def test_launch_and_first_pass_create_the_slices_and_publish_world_0_once(tmp_path) -> None:
    with EmbeddedCluster(nodepools=[NodePoolSpec("tpu7x-2x2x2", count=2)], mode="simulate") as cluster:
        kube = Kube(cluster.api_client(), "default")
        spec = RunSpec(run="pub", run_dir=str(tmp_path / "pub"), global_batch=32, restart_mode="in-place")
        rec, _ = prepare(spec, "tpu7x-2x2x2", 2, Knobs())
        create_run(kube, rec)
        role = client.RbacAuthorizationV1Api(cluster.api_client()).read_namespaced_role(
            "reslice-pub-world", "default"
        )
        assert role.rules[0].resource_names == ["pub-world"]
        empty = kube.world("pub-world")  # created by launch, empty: it owns the access objects
        assert empty["data"] == {} and world.published_epoch(empty) is None
        assert role.metadata.owner_references[0].uid == empty["metadata"]["uid"]

        ctl = LedgerSpy(kube)
        ctl.pass_once(["pub"])
        # The world went out before the decision's ledger line (on gs:// an append is 3 requests).
        assert ctl.world_at_act == [0]
        rec = kube.get_record("pub")[0]
        seg = rec.current
        assert seg.index == 0 and seg.slice_ids == ("0", "1")
        assert sorted(j["metadata"]["name"] for j in kube.jobsets("pub")) == ["pub-s0", "pub-s1"]
        cm = kube.world("pub-world")
        doc = json.loads(cm["data"][DATA_KEY])
        assert (doc["epoch"], doc["slices"], doc["coordinator"]) == (0, ["0", "1"], seg.coordinator)
        rv = cm["metadata"]["resourceVersion"]

        # A restarted controller (another process, no cache) does not publish epoch 0 again.
        assert Controller(kube).publish_world(rec) is False
        assert kube.world("pub-world")["metadata"]["resourceVersion"] == rv
        # An older epoch than the published one is never written over it.
        newer = {**cm, "data": {DATA_KEY: json.dumps({**doc, "epoch": 5})}}
        kube.publish_world(newer, rv)
        assert Controller(kube).publish_world(rec) is False
        assert world.published_epoch(kube.world("pub-world")) == 5
        # The record's next world is published, once.
        nxt = replace(seg, index=6, coordinator="pub-s0-slice-0-0.pub-s0:8491")
        later = replace(rec, segments=(*rec.segments[:-1], nxt))
        assert Controller(kube).publish_world(later) is True
        assert Controller(kube).publish_world(later) is False
        assert world.published_epoch(kube.world("pub-world")) == 6
        pods = kube.pods(f"{LABEL_RUN}=pub")
        assert pods and {p["spec"].get("serviceAccountName") for p in pods} == {"reslice-pub-world"}

        # The run ends (recorded by an earlier pass whose controller then stopped): the next pass
        # deletes the world, and the garbage collector what it owns.
        got, rv = kube.get_record("pub")
        kube.update_record(replace(got, state=RunState.FAILED, reason="test", finished_at=got.created_at), rv)
        ctl.pass_once(["pub"])  # the run's Lease holder
        assert kube.world("pub-world") is None
        wait_for(lambda: not access_left(cluster, "pub"), 10, "the world's access objects deleted")

        # `reslice stop` deletes them too (the user's credentials, no controller needed).
        spec2 = replace(spec, run="pub2", run_dir=str(tmp_path / "pub2"))
        create_run(kube, prepare(spec2, "tpu7x-2x2x2", 2, Knobs())[0])
        assert access_left(cluster, "pub2") == ["Role", "RoleBinding", "ServiceAccount"]
        stop_run(kube, "pub2")
        assert kube.world("pub2-world") is None
        wait_for(lambda: not access_left(cluster, "pub2"), 10, "the stopped run's access objects deleted")


class LedgerSpy(Controller):
    """A controller that notes the published epoch when it writes an act line to the ledger."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.world_at_act: list[int | None] = []

    def _log(self, rundir, entries) -> None:
        if any(e.get("kind") == LedgerKind.ACT for e in entries):
            self.world_at_act.append(world.published_epoch(self.kube.world(world_configmap_name("pub"))))
        super()._log(rundir, entries)


def access_left(cluster: EmbeddedCluster, run: str) -> list[str]:
    """Which of the run's world ServiceAccount, Role and RoleBinding exist."""
    api = cluster.api_client()
    rbac, core = client.RbacAuthorizationV1Api(api), client.CoreV1Api(api)
    name = f"reslice-{run}-world"
    left = []
    for kind, read in (
        ("Role", rbac.read_namespaced_role),
        ("RoleBinding", rbac.read_namespaced_role_binding),
        ("ServiceAccount", core.read_namespaced_service_account),
    ):
        try:
            read(name, "default")
            left.append(kind)
        except client.ApiException as e:
            assert e.status == 404
    return left
