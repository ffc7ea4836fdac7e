"""An in-place run's objects (one JobSet per slice, the world's access) and its worlds
(launcher/core/world.py), read back by the trainer's own parser (trainer/elastic/world.py)."""

import itertools
from dataclasses import replace

import pytest

from contract.world import DATA_KEY
from launcher.adapters.preset_files import load_catalog
from launcher.core import world
from launcher.core.errors import UserError
from launcher.core.labels import LABEL_RUN, LABEL_SEGMENT, LABEL_SLICE
from launcher.core.record import Segment
from launcher.core.render import render_jobset, render_slice_jobset, render_world_access
from launcher.core.spec import RESERVED_PORTS, RunSpec, check, launch_restart_mode
from tests.support.schemas import jobset_errors, validate_job_template
from trainer.elastic import world as trainer_world

CATALOG = load_catalog()
PRESET = CATALOG.preset("tpu7x-2x2x2")
SPEC = RunSpec(run="llm", run_dir="gs://bucket/runs/llm", global_batch=64, restart_mode="in-place")


def env_of(js: dict) -> dict:
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["containers"][0]["env"]}


def pod_of(js: dict) -> dict:
    return js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]


def test_a_slice_jobset_is_one_slice_labelled_with_it_and_valid() -> None:
    js = render_slice_jobset(SPEC, PRESET, "1")
    assert js["metadata"]["name"] == "llm-s1"
    assert js["spec"]["replicatedJobs"][0]["replicas"] == 1
    labels = pod_of(js)["metadata"]["labels"]
    assert labels == {LABEL_RUN: "llm", LABEL_SLICE: "1"} and LABEL_SEGMENT not in labels
    assert js["metadata"]["annotations"] == {
        "alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"
    }
    assert jobset_errors(js) == []
    validate_job_template(js)


def test_a_slice_pod_reads_its_world_and_no_world_decides_its_environment() -> None:
    env = env_of(render_slice_jobset(SPEC, PRESET, "3"))
    assert env["RESLICE_RESTART_MODE"] == "in-place"
    assert env["RESLICE_SLICE_ID"] == "3"
    assert env["RESLICE_WORLD_CONFIGMAP"] == "llm-world"
    assert env["RESLICE_WORLD_NAMESPACE"] == "default"
    assert "RESLICE_WORLD_API" not in env  # in a cluster: the in-cluster API
    # What a world decides, the supervisor sets per child (trainer/world.child_env).
    for name in ("RESLICE_COORDINATOR", "RESLICE_NUM_PROCESSES", "RESLICE_SEGMENT", "MEGASCALE_NUM_SLICES"):
        assert name not in env
    embedded = env_of(render_slice_jobset(replace(SPEC, world_api="http://127.0.0.1:6443"), PRESET, "0"))
    assert embedded["RESLICE_WORLD_API"] == "http://127.0.0.1:6443"


def test_the_pods_read_as_the_run_account_bound_to_a_role_limited_to_the_world() -> None:
    sa, role, binding = render_world_access(SPEC)
    assert sa["kind"] == "ServiceAccount" and sa["metadata"]["name"] == "reslice-llm-world"
    (rule,) = role["rules"]
    assert rule["resourceNames"] == ["llm-world"] and rule["resources"] == ["configmaps"]
    assert set(rule["verbs"]) == {"get", "list", "watch"}
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "reslice-llm-world", "namespace": "default"}
    ]
    assert pod_of(render_slice_jobset(SPEC, PRESET, "0"))["spec"]["serviceAccountName"] == "reslice-llm-world"
    # A run that names its account: no ServiceAccount of ours, the binding binds theirs.
    named = replace(SPEC, service_account="trainers")
    role, binding = render_world_access(named)
    assert binding["subjects"][0]["name"] == "trainers"
    assert pod_of(render_slice_jobset(named, PRESET, "0"))["spec"]["serviceAccountName"] == "trainers"


def test_a_slice_on_a_named_pool_drops_exclusive_placement() -> None:
    js = render_slice_jobset(SPEC, PRESET, "0", pool="pool-b")
    assert js["metadata"]["annotations"] == {}
    assert pod_of(js)["spec"]["nodeSelector"]["cloud.google.com/gke-nodepool"] == "pool-b"


def test_the_queue_gives_each_slice_its_own_workload() -> None:
    queued = replace(SPEC, queue="q")
    for i in "01":
        assert (
            render_slice_jobset(queued, PRESET, i)["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "q"
        )


def test_in_place_is_refused_for_maxtext_and_an_unknown_mode_in_one_line() -> None:
    with pytest.raises(UserError, match="maxtext profile's entrypoint has none") as err:
        render_slice_jobset(replace(SPEC, trainer="maxtext"), PRESET, "0")
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="--restart-mode 'sideways': expected one of recreate, in-place"):
        check(replace(SPEC, restart_mode="sideways"))
    with pytest.raises(UserError, match="maxtext"):
        check(replace(SPEC, trainer="maxtext", config="base"))
    check(SPEC)
    check(replace(SPEC, restart_mode="recreate", trainer="maxtext", config="base"))


ONE_SLICE = "one slice: no slice survives a shape change to keep its pods; restarting by recreate"


@pytest.mark.parametrize(
    ("mode", "slices", "trainer", "want"),
    [
        ("in-place", 1, "reslice", ("recreate", ONE_SLICE)),  # nothing survives a shape change
        ("in-place", 2, "reslice", ("in-place", None)),
        ("recreate", 1, "reslice", ("recreate", None)),
        ("in-place", 1, "maxtext", ("in-place", None)),  # refused by check, not switched
        ("sideways", 1, "reslice", ("sideways", None)),  # likewise
    ],
)
def test_a_launch_on_one_slice_restarts_by_recreate(mode, slices, trainer, want) -> None:
    assert launch_restart_mode(mode, slices, trainer) == want


def test_recreate_renders_as_before() -> None:
    recreate = replace(SPEC, restart_mode="recreate")
    assert render_jobset(recreate, CATALOG.shape("tpu7x-2x2x2", 2), 3) == render_jobset(
        RunSpec(run="llm", run_dir="gs://bucket/runs/llm", global_batch=64),
        CATALOG.shape("tpu7x-2x2x2", 2),
        3,
    )


@pytest.mark.parametrize(
    "old,surviving,count,want",
    [
        (("0", "1"), {"0"}, 1, ("0",)),  # shrink: the survivor keeps its place
        (("0", "1"), {"1"}, 1, ("1",)),  # the coordinator's slice lost
        (("0",), {"0"}, 2, ("0", "1")),  # grow: a new id after the survivors
        (("1",), {"1"}, 2, ("1", "0")),  # ids are reused once their slice left
        (("0", "1", "2"), {"0", "2"}, 2, ("0", "2")),
        (("0", "1", "2"), {"1", "2"}, 3, ("1", "2", "3")),  # never the id that just left
        (("0", "1"), {"0", "1"}, 2, ("0", "1")),  # same size: same world order
        ((), (), 3, ("0", "1", "2")),
    ],
)
def test_the_next_world_keeps_survivors_in_order_and_fills_with_new_ids(old, surviving, count, want) -> None:
    assert world.world_slices(old, surviving, count) == want


def test_each_epoch_has_a_new_coordinator_port_none_reserved() -> None:
    ports = [world.epoch_port(8476, e) for e in range(20)]
    assert all(a != b for a, b in itertools.pairwise(ports))
    assert not set(ports) & RESERVED_PORTS
    assert world.epoch_port(8490, 0) == 8490


def segment(index: int, slices: tuple[str, ...], coordinator: str) -> Segment:
    return Segment(
        index=index, preset=PRESET.name, slices=len(slices), devices=8 * len(slices), micro_batch=2,
        grad_accum=1, jobset="", submitted_at=0.0, reason="", slice_ids=slices, coordinator=coordinator,
    )  # fmt: skip


def test_the_world_document_is_what_the_trainer_parses() -> None:
    coord = world.coordinator(SPEC, ("2", "0"), 5)
    assert coord == f"llm-s2-slice-0-0.llm-s2:{world.epoch_port(SPEC.coordinator_port, 5)}"
    doc = world.document(SPEC, PRESET, segment(5, ("2", "0"), coord), published=12.5)
    cm = world.configmap(SPEC, doc)
    assert cm["metadata"]["name"] == "llm-world" and world.published_epoch(cm) == 5
    parsed = trainer_world.parse(cm["data"][DATA_KEY])
    assert parsed.epoch == 5 and parsed.slices == ("2", "0") and parsed.coordinator == coord
    assert parsed.num_processes == 2 * PRESET.hosts and parsed.global_batch == 64
    assert parsed.megascale["coordinator_address"] == "llm-s2-slice-0-0.llm-s2"
    me = trainer_world.me_from_env({"RESLICE_SLICE_ID": "0", "JOB_COMPLETION_INDEX": "1"})
    env = trainer_world.child_env(parsed, me, {"RESLICE_RUN": "llm"})
    assert env["RESLICE_SLICE_INDEX"] == "1" and env["RESLICE_SEGMENT"] == "5"
    one = trainer_world.parse(
        world.configmap(SPEC, world.document(SPEC, PRESET, segment(6, ("0",), "127.0.0.1:4000"), 13.0))[
            "data"
        ][DATA_KEY]
    )
    assert one.slices == ("0",) and one.megascale == {}
    # Each slice's attempt: a pod of another attempt of its slice does not join (a rebooted host's
    # slice, restarted after the world was decided); one of the same, or a world without them, does.
    formed = replace(segment(7, ("2", "0"), coord), attempts=(1, 0))
    doc = world.document(SPEC, PRESET, formed, 14.0)
    assert doc["attempts"] == {"2": 1, "0": 0} and "attempts" not in world.document(
        SPEC, PRESET, segment(5, ("2", "0"), coord), 1.0
    )
    seven = trainer_world.parse(world.configmap(SPEC, doc)["data"][DATA_KEY])
    pod_of_2 = {"RESLICE_SLICE_ID": "2", "JOB_COMPLETION_INDEX": "0"}
    for attempt, other in (("1", None), ("2", 1), ("0", 1), ("", None)):
        me = trainer_world.me_from_env({**pod_of_2, "RESLICE_RESTART_ATTEMPT": attempt})
        assert seven.other_attempt(me) == other and parsed.other_attempt(me) is None
    assert world.published_epoch(None) is None and world.published_epoch({"data": {}}) is None
