"""The suite's scheduling hint (tests/conftest.py, LONGEST_FIRST) names files that exist: a renamed
file would otherwise drop out of it silently and run last again."""

from __future__ import annotations

from tests.conftest import LONGEST_FIRST, ROOT


def test_every_file_named_longest_first_exists_once() -> None:
    assert [name for name in LONGEST_FIRST if not (ROOT / name).is_file()] == []
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
