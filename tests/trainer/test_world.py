"""trainer.elastic.world: the world document, this pod's identity and the child's environment (pure)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.elastic import world, world_source
from trainer.elastic.world import Me, RestartMode, WorldError


def doc(**over: object) -> dict:
    base = {
        "run": "llm",
        "epoch": 3,
        "slices": ["s0", "s1", "s2"],
        "hosts_per_slice": 2,
        "coordinator": "llm-s1-0.llm:8476",
        "global_batch": 48,
        "micro_batch": 2,
        "grad_accum": 1,
        "megascale": {"coordinator_address": "llm-s1-0.llm", "port": 8080},
    }
    base.update(over)
    return base


def text(**over: object) -> str:
    return json.dumps(doc(**over))


POD = {
    "RESLICE_RUN": "llm",
    "RESLICE_SLICE_ID": "s2",
    "JOB_COMPLETION_INDEX": "1",
    "RESLICE_SLICE_INDEX": "2",
    "RESLICE_NUM_PROCESSES": "6",
    "RESLICE_COORDINATOR": "stale:1",
    "MEGASCALE_NUM_SLICES": "3",
    "MEGASCALE_SLICE_ID": "2",
    "MEGASCALE_COORDINATOR_ADDRESS": "stale",
    "MEGASCALE_PORT": "1",
    "JAX_NUM_CPU_DEVICES": "8",
}


# (slices, my slice, my host) -> (process id = RESLICE_SLICE_INDEX × hosts + host, processes, slices)
@pytest.mark.parametrize(
    ("slices", "me", "slice_index", "processes"),
    [
        (["s0", "s1", "s2"], Me("s2", 1), 2, 6),  # the full world
        (["s0", "s2"], Me("s2", 1), 1, 4),  # s1 lost: s2 compacts down
        (["s2"], Me("s2", 0), 0, 2),  # alone: one slice, no multislice
        (["s2", "s0"], Me("s0", 1), 1, 4),  # the published order decides, not the id
        (["s1", "s3", "s2"], Me("s3", 0), 1, 6),  # a new slice joins in the middle
    ],
)
def test_child_env_compacts_process_ids(slices: list[str], me: Me, slice_index: int, processes: int) -> None:
    env = world.child_env(world.parse(text(slices=slices)), me, {**POD, "RESLICE_SLICE_ID": me.slice_id})
    assert env["RESLICE_SLICE_INDEX"] == str(slice_index)
    assert env["JOB_COMPLETION_INDEX"] == str(me.host)
    assert env["RESLICE_NUM_PROCESSES"] == str(processes)
    assert env["RESLICE_NUM_SLICES"] == str(len(slices))
    assert env["RESLICE_HOSTS_PER_SLICE"] == "2"
    assert env["RESLICE_COORDINATOR"] == "llm-s1-0.llm:8476"
    assert env["RESLICE_WORLD_EPOCH"] == env["RESLICE_SEGMENT"] == "3"
    assert (env["RESLICE_GLOBAL_BATCH"], env["RESLICE_MICRO_BATCH"], env["RESLICE_GRAD_ACCUM"]) == (
        "48",
        "2",
        "1",
    )
    assert env["JAX_NUM_CPU_DEVICES"] == "8"  # the pod's own stays
    if len(slices) > 1:
        assert env["MEGASCALE_NUM_SLICES"] == str(len(slices))
        assert env["MEGASCALE_SLICE_ID"] == str(slice_index)
        assert env["MEGASCALE_COORDINATOR_ADDRESS"] == "llm-s1-0.llm"
        assert env["MEGASCALE_PORT"] == "8080"
    else:  # no stale multislice settings from the pod's first world
        assert not any(k.startswith("MEGASCALE_") for k in env)


def test_child_env_world_env_segment_and_the_computed_keys_win() -> None:
    w = world.parse(text(segment=7, env={"RESLICE_SET": '["train.steps=9"]', "XLA_FLAGS": "--x"}))
    env = world.child_env(w, Me("s1", 0), POD)
    assert env["RESLICE_SET"] == '["train.steps=9"]' and env["XLA_FLAGS"] == "--x"
    assert env["RESLICE_NUM_PROCESSES"] == "6"
    assert env["RESLICE_SEGMENT"] == "7" and env["RESLICE_WORLD_EPOCH"] == "3"


@pytest.mark.parametrize(
    "name",
    ["RESLICE_RUN_DIR", "RESLICE_NUM_PROCESSES", "RESLICE_COORDINATOR", "PATH", "LD_PRELOAD", "PYTHONPATH"],
)
def test_a_world_env_sets_only_what_the_allow_list_names(name: str) -> None:
    # Whoever can write the world ConfigMap must not point every trainer's run directory (or its
    # identity, or what it loads) elsewhere: one line, exit 2 (the supervisor's WorldError).
    with pytest.raises(WorldError, match=rf"env\.{name} is not one a world may set \(RESLICE_SET, JAX_\*"):
        world.parse(text(env={name: "/elsewhere"}))
    ok = world.parse(
        text(env={"RESLICE_SET": "[]", "JAX_TRACEBACK_FILTERING": "off", "LIBTPU_INIT_ARGS": "-x"})
    )
    assert set(ok.env) == {"RESLICE_SET", "JAX_TRACEBACK_FILTERING", "LIBTPU_INIT_ARGS"}


def test_the_pod_may_widen_the_allow_list() -> None:
    allowed = world.env_allowed({"RESLICE_WORLD_ENV_ALLOW": "FAKE_, MY_FLAG"})
    w = world.parse(text(env={"FAKE_EXIT": "43", "MY_FLAG": "1"}), allowed)
    assert w.env == {"FAKE_EXIT": "43", "MY_FLAG": "1"}
    with pytest.raises(WorldError, match=r"env\.MY_FLAG2"):
        world.parse(text(env={"MY_FLAG2": "1"}), allowed)


def test_the_heartbeat_is_read_and_optional() -> None:
    assert world.parse(text()).heartbeat is None
    assert world.parse(text(heartbeat=1764870010)).heartbeat == 1764870010.0


@pytest.mark.parametrize(
    ("waited", "beat_age", "wait"),
    [
        (10.0, None, True),  # within RESLICE_PEER_LOST_WAIT_S: always
        (119.0, 500.0, True),
        (120.0, None, False),  # past it, no heartbeat ever seen: the slice restarts (exit 43)
        (300.0, 5.0, True),  # past it, the controller beats: a slice being recreated, minutes long
        (300.0, 59.0, True),
        (300.0, 60.0, False),  # the beat went stale: the controller is gone
        (3599.0, 1.0, True),
        (3600.0, 1.0, False),  # a controller that beats for good holds the pods no longer than the bound
    ],
)
def test_survivors_wait_while_the_controller_beats_and_no_longer_than_the_bound(
    waited: float, beat_age: float | None, wait: bool
) -> None:
    assert world.keep_waiting(waited, 120.0, beat_age, 3600.0) is wait


def test_child_env_gives_every_process_of_a_world_one_jobset_attempt() -> None:
    # Slice s0's JobSet was restarted (its pods' restart-attempt label is 1), s1's was not: the
    # world's processes must still agree on the start barrier's id (segment, attempt).
    w = world.parse(text())
    restarted = world.child_env(w, Me("s0", 0), {**POD, "RESLICE_RESTART_ATTEMPT": "1"})
    survivor = world.child_env(w, Me("s1", 1), {**POD, "RESLICE_RESTART_ATTEMPT": "0"})
    assert restarted["RESLICE_RESTART_ATTEMPT"] == survivor["RESLICE_RESTART_ATTEMPT"] == "0"
    assert restarted["RESLICE_SEGMENT"] == survivor["RESLICE_SEGMENT"]


def test_child_env_refuses_a_pod_outside_the_world() -> None:
    w = world.parse(text(slices=["s0", "s1"]))
    with pytest.raises(WorldError, match="not in world epoch 3"):
        world.child_env(w, Me("s2", 0), POD)
    with pytest.raises(WorldError, match="host index 2 is outside"):
        world.child_env(w, Me("s1", 2), POD)
    with pytest.raises(WorldError, match="run 'other'"):
        world.child_env(w, Me("s1", 0), {**POD, "RESLICE_RUN": "other"})


def test_lost_slices_are_read_as_ids_and_default_to_none() -> None:
    assert world.parse(text()).lost == ()
    assert world.parse(text(lost=[3, "s1"])).lost == ("3", "s1")


def test_integer_slice_ids_match_the_slice_index_env() -> None:
    w = world.parse(text(slices=[0, 1], megascale={"coordinator_address": "h"}))
    me = world.me_from_env({"RESLICE_SLICE_INDEX": "1", "JOB_COMPLETION_INDEX": "0"})
    assert me == Me("1", 0)
    assert world.child_env(w, me, {})["RESLICE_SLICE_INDEX"] == "1"
    assert "MEGASCALE_PORT" not in world.child_env(w, me, {})


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("{", "not JSON"),
        ("[]", "JSON object"),
        (text(run=""), "'run'"),
        (text(epoch=-1), "'epoch' must be an integer >= 0"),
        (text(epoch="3"), "'epoch' must be an integer"),
        (text(epoch=True), "'epoch' must be an integer"),
        (text(slices=[]), "'slices'"),
        (text(slices=["a", "a"]), "a slice twice"),
        (text(slices=["a", None]), "slice id"),
        (text(hosts_per_slice=0), "'hosts_per_slice'"),
        (text(coordinator="nohost"), "'coordinator' must be 'host:port'"),
        (text(coordinator="h:x"), "'coordinator'"),
        (text(micro_batch=0), "'micro_batch'"),
        (text(megascale={}), "megascale.coordinator_address"),
        (text(megascale={"coordinator_address": {"x": 1}}), "megascale.coordinator_address must be"),
        (text(env={"1BAD": "x"}), "env.1BAD"),
        (text(published="now"), "'published'"),
        (text(heartbeat="now"), "'heartbeat' must be unix seconds"),
        (text(heartbeat=True), "'heartbeat'"),
        (text(lost="s1"), "'lost' must be a list of slice ids"),
        (text(lost=["s1", "s1"]), "'lost' lists a slice twice"),
        (text(lost=[True]), "slice id"),
        (text(attempts=[1]), "'attempts' must be an object"),
        (text(attempts={"s9": 0}), "attempts.s9 must be an integer >= 0 of one of its slices"),
        (text(attempts={"s0": -1}), "attempts.s0 must be"),
        (text(attempts={"s0": True}), "attempts.s0 must be"),
    ],
)
def test_parse_names_what_is_wrong(document: str, message: str) -> None:
    with pytest.raises(WorldError, match=message):
        world.parse(document)


def test_me_and_restart_mode_from_env() -> None:
    assert world.me_from_env({"RESLICE_SLICE_ID": "pool-a", "RESLICE_SLICE_INDEX": "0"}) == Me("pool-a", 0)
    with pytest.raises(WorldError, match="RESLICE_SLICE_ID"):
        world.me_from_env({})
    with pytest.raises(WorldError, match="JOB_COMPLETION_INDEX"):
        world.me_from_env({"RESLICE_SLICE_ID": "a", "JOB_COMPLETION_INDEX": "x"})
    assert world.me_from_env({"RESLICE_SLICE_ID": "a", "RESLICE_RESTART_ATTEMPT": "3"}) == Me("a", 0, 3)
    with pytest.raises(WorldError, match="RESLICE_RESTART_ATTEMPT='x' is not a restart attempt"):
        world.me_from_env({"RESLICE_SLICE_ID": "a", "RESLICE_RESTART_ATTEMPT": "x"})
    assert world.restart_mode({}) is RestartMode.RECREATE
    assert world.restart_mode({"RESLICE_RESTART_MODE": "in-place"}) is RestartMode.IN_PLACE
    with pytest.raises(WorldError, match="'sideways' is not one of recreate, in-place"):
        world.restart_mode({"RESLICE_RESTART_MODE": "sideways"})


def test_source_from_env(tmp_path: Path) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    assert isinstance(world_source.from_env({"RESLICE_WORLD_FILE": "/w.json"}, sa), world_source.FileSource)
    with pytest.raises(WorldError, match="RESLICE_WORLD_CONFIGMAP"):
        world_source.from_env({}, sa)
    with pytest.raises(WorldError, match="RESLICE_WORLD_NAMESPACE"):
        world_source.from_env({"RESLICE_WORLD_CONFIGMAP": "w"}, sa)
    (sa / "namespace").write_text("team\n")
    (sa / "token").write_text("secret-token\n")
    with pytest.raises(WorldError, match="KUBERNETES_SERVICE_HOST"):
        world_source.from_env({"RESLICE_WORLD_CONFIGMAP": "w"}, sa)
    # In a pod: the in-cluster endpoint, over TLS, with the service account's token.
    src = world_source.from_env(
        {
            "RESLICE_WORLD_CONFIGMAP": "w",
            "KUBERNETES_SERVICE_HOST": "10.0.0.1",
            "KUBERNETES_SERVICE_PORT": "443",
        },
        sa,
    )
    assert isinstance(src, world_source.ConfigMapSource)
    assert src.describe() == "ConfigMap team/w at https://10.0.0.1:443"
    assert src.endpoint.headers()["Authorization"] == "Bearer secret-token"
    # An explicit plain-HTTP endpoint (the embedded cluster): never the token.
    src = world_source.from_env(
        {
            "RESLICE_WORLD_CONFIGMAP": "w",
            "RESLICE_WORLD_API": "http://127.0.0.1:1234",
            "RESLICE_WORLD_NAMESPACE": "ns",
        },
        sa,
    )
    assert src.describe() == "ConfigMap ns/w at http://127.0.0.1:1234"
    assert "Authorization" not in src.endpoint.headers()
    with pytest.raises(WorldError, match="RESLICE_WORLD_API"):
        world_source.from_env(
            {"RESLICE_WORLD_CONFIGMAP": "w", "RESLICE_WORLD_API": "ftp://x", "RESLICE_WORLD_NAMESPACE": "n"},
            sa,
        )
