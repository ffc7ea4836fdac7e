"""The run record's JSON: a schema version, unknown fields refused in one line, old records read
(version 0 and 1: the knobs under `policy`)."""

import json
from dataclasses import replace

import pytest

from launcher.core.errors import UserError
from launcher.core.record import SCHEMA_VERSION, Knobs, RunRecord, Segment
from launcher.core.spec import RunSpec
from launcher.core.words import EndKind

SEGMENT = Segment(
    index=0, preset="tpu7x-2x2x2", slices=2, devices=16, micro_batch=2, grad_accum=1,
    jobset="demo-0", submitted_at=5.0, reason="launched", nodepools=("np-0", "np-1"),
)  # fmt: skip
RECORD = RunRecord(
    spec=RunSpec(
        run="demo",
        run_dir="/tmp/demo",
        global_batch=32,
        overrides=("train.steps=5",),
        env=(("A", "1"),),
        placement_policies=(("tpu7x-2x2x2", "compact"),),
    ),
    preset="tpu7x-2x2x2",
    slices=2,
    segments=(SEGMENT,),
    app_failures=1,
)


def as_dict(rec: RunRecord) -> dict:
    return json.loads(rec.to_json())


def test_a_record_round_trips_with_its_schema_version() -> None:
    raw = as_dict(RECORD)
    assert raw["schema_version"] == SCHEMA_VERSION == 6
    assert "knobs" in raw and "policy" not in raw  # the rules are launcher/core/policy/; these are knobs
    assert RunRecord.from_json(RECORD.to_json()) == RECORD  # tuples come back as tuples, not lists


def v1(rec: RunRecord) -> dict:
    """What reslice wrote at schema_version 1: the knobs under `policy`."""
    raw = as_dict(rec)
    raw["schema_version"], raw["policy"] = 1, raw.pop("knobs")
    return raw


def test_a_record_from_before_the_version_still_loads() -> None:
    raw = v1(replace(RECORD, knobs=Knobs(unschedulable_grace_s=7)))
    del raw["schema_version"]
    raw["policy"]["preemption_budget"] = 1000  # a knob that is gone
    raw["committed"] = 3  # unknown top-level fields were dropped on read then
    assert RunRecord.from_json(json.dumps(raw)) == replace(RECORD, knobs=Knobs(unschedulable_grace_s=7))


def test_a_segment_keeps_its_node_pool_and_a_version_2_record_has_none() -> None:
    pinned = RECORD.with_segment(replace(RECORD.segments[0], pool="pool-b", nodepools=("pool-b",)))
    assert RunRecord.from_json(pinned.to_json()).segments[0].pool == "pool-b"
    raw = as_dict(RECORD)
    raw["schema_version"] = 2
    del raw["segments"][0]["pool"]  # version 2 had no such field
    assert RunRecord.from_json(json.dumps(raw)).segments[0].pool is None


def test_an_in_place_segment_keeps_its_world_and_a_version_3_record_has_none() -> None:
    spec = replace(RECORD.spec, restart_mode="in-place")
    seg = replace(
        RECORD.segments[0], slice_ids=("0", "2"), coordinator="127.0.0.1:41234", joining=("1",), lost=("3",)
    )
    world = replace(RECORD, spec=spec).with_segment(seg)
    back = RunRecord.from_json(world.to_json())
    assert back == world and back.segments[0].slice_ids == ("0", "2")
    raw = as_dict(RECORD)
    raw["schema_version"] = 3
    for key in ("slice_ids", "coordinator", "joining", "lost"):
        del raw["segments"][0][key]
    for key in ("restart_mode", "world_api"):
        del raw["spec"][key]
    old = RunRecord.from_json(json.dumps(raw))
    assert old.spec.restart_mode == "recreate" and old.segments[0].slice_ids == ()
    assert back.segments[0].lost == ("3",) and old.segments[0].lost == ()


def test_a_record_written_before_the_end_kinds_were_renamed_reads_them_in_the_new_words() -> None:
    """EndKind.DISAPPEARED was "lost" and EndKind.NEW_ATTEMPT "restart": a record in the cluster
    from before says so in the old spelling, and reads back in the new."""
    rec = replace(RECORD, segments=(replace(RECORD.segments[0], ended_at=6.0, end_kind=EndKind.DISAPPEARED),))
    raw = as_dict(rec)
    assert raw["segments"][0]["end_kind"] == "disappeared"
    for old, new in (("lost", EndKind.DISAPPEARED), ("restart", EndKind.NEW_ATTEMPT)):
        raw["segments"][0]["end_kind"] = old
        assert RunRecord.from_json(json.dumps(raw)).segments[0].end_kind == new
    assert RunRecord.from_json(rec.to_json()) == rec


def test_a_version_1_record_loads_its_knobs_from_policy() -> None:
    rec = replace(RECORD, knobs=Knobs(unschedulable_grace_s=7, grow=False))
    assert RunRecord.from_json(json.dumps(v1(rec))) == rec
    stray = {**v1(rec), "knobs": {}}  # version 1 never wrote `knobs`
    with pytest.raises(UserError, match=r"unknown field\(s\) record\.knobs"):
        RunRecord.from_json(json.dumps(stray))


@pytest.mark.parametrize(
    "section,field",
    [
        (None, "surprise"),
        ("spec", "surprise"),
        ("knobs", "preemption_budget"),
        ("segments", "surprise"),
        (None, "policy"),
    ],
)
def test_an_unknown_field_is_refused_in_one_line(section, field) -> None:
    raw = as_dict(RECORD)
    target = raw if section is None else raw[section][0] if section == "segments" else raw[section]
    target[field] = 1
    with pytest.raises(UserError) as err:
        RunRecord.from_json(json.dumps(raw))
    where = f"{section or 'record'}.{field}"
    assert f"unknown field(s) {where}" in str(err.value) and "'demo'" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_newer_schema_is_refused() -> None:
    raw = {**as_dict(RECORD), "schema_version": SCHEMA_VERSION + 1}
    with pytest.raises(UserError, match=r"schema_version 7 is not one this reslice reads.*upgrade reslice"):
        RunRecord.from_json(json.dumps(raw))
