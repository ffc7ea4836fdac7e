"""An in-place run against the embedded cluster (simulate mode: pods run no process): what launch
and the controller's first pass create, and a world published once per epoch whoever publishes it."""

import json
from dataclasses import replace

from kubernetes import client

from launcher.adapters.kube import Kube
from launcher.controller.launch import create_run, prepare
from launcher.controller.loop import Controller
from launcher.core import world
from launcher.core.labels import LABEL_RUN
from launcher.core.record import Knobs
from launcher.core.spec import RunSpec
from launcher.embedded.cluster import EmbeddedCluster, NodePoolSpec


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
        assert kube.world("pub-world") is None  # nothing published before the first world is recorded

        Controller(kube).pass_once(["pub"])
        rec = kube.get_record("pub")[0]
        seg = rec.current
        assert seg.index == 0 and seg.slice_ids == ("0", "1")
        assert sorted(j["metadata"]["name"] for j in kube.jobsets("pub")) == ["pub-s0", "pub-s1"]
        cm = kube.world("pub-world")
        doc = json.loads(cm["data"][world.WORLD_KEY])
        assert (doc["epoch"], doc["slices"], doc["coordinator"]) == (0, ["0", "1"], seg.coordinator)
        rv = cm["metadata"]["resourceVersion"]

        # A restarted controller (another process, no cache) does not publish epoch 0 again.
        assert Controller(kube).publish_world(rec) is False
        assert kube.world("pub-world")["metadata"]["resourceVersion"] == rv
        # An older epoch than the published one is never written over it.
        newer = {**cm, "data": {world.WORLD_KEY: json.dumps({**doc, "epoch": 5})}}
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
