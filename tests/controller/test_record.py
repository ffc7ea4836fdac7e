"""The run record's JSON: a schema version, unknown fields refused in one line, old records read."""

import json

import pytest

from launcher.errors import UserError
from launcher.record import SCHEMA_VERSION, RunRecord, Segment
from launcher.render import RunSpec

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
    assert raw["schema_version"] == SCHEMA_VERSION == 1
    assert RunRecord.from_json(RECORD.to_json()) == RECORD  # tuples come back as tuples, not lists


def test_a_record_from_before_the_version_still_loads() -> None:
    raw = as_dict(RECORD)
    del raw["schema_version"]
    raw["policy"]["preemption_budget"] = 1000  # a knob that is gone
    raw["committed"] = 3  # unknown top-level fields were dropped on read then
    assert RunRecord.from_json(json.dumps(raw)) == RECORD


@pytest.mark.parametrize(
    "section,field",
    [(None, "surprise"), ("spec", "surprise"), ("policy", "preemption_budget"), ("segments", "surprise")],
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
    with pytest.raises(UserError, match=r"schema_version 2 is not one this reslice reads.*upgrade reslice"):
        RunRecord.from_json(json.dumps(raw))
