"""The one RFC 3339 helper: what the API server writes (metav1.Time) and what it may read back."""

import datetime as dt

import pytest

from launcher.core import rfc3339


def test_stamps_are_whole_seconds_in_utc_with_z() -> None:
    assert rfc3339.stamp(1_700_000_000.9) == "2023-11-14T22:13:20Z"  # truncated, as metav1.Time
    plus_two = dt.timezone(dt.timedelta(hours=2))
    assert rfc3339.stamp(dt.datetime(2024, 1, 1, 2, 0, 5, tzinfo=plus_two)) == "2024-01-01T00:00:05Z"
    assert rfc3339.stamp().endswith("Z")


def test_parse_reads_z_offsets_and_micro_time() -> None:
    assert rfc3339.seconds("2023-11-14T22:13:20Z") == 1_700_000_000
    assert rfc3339.seconds("2023-11-15T00:13:20+02:00") == 1_700_000_000
    assert rfc3339.seconds("2023-11-14T22:13:20.250000Z") == 1_700_000_000.25  # an Event's eventTime
    assert rfc3339.parse("2023-11-14T22:13:20Z").tzinfo is not None
    assert rfc3339.parse(None) is None and rfc3339.seconds("") is None
    with pytest.raises(ValueError):
        rfc3339.parse("yesterday")
