"""The data-order property the MaxText profile stands on (docs/maxtext.md, Data order), on the grain
both venvs pin (0.2.18) and a real ArrayRecord file: MaxText's grain pipeline with
`grain_use_elastic_iterator=true` (shuffle by seed, repeat, then grain's ElasticIterator) gives step
s the same global batch on any number of processes, and a state saved on 2 processes resumes on 1
(and 1 on 4) with the batches of an uninterrupted run. The default per-process iterator does not."""

from __future__ import annotations

import grain.python as grain  # as MaxText imports it
import pytest
from array_record.python.array_record_module import ArrayRecordWriter
from grain.experimental import ElasticIterator

RECORDS, GLOBAL_BATCH, SEED, STEPS = 96, 8, 7, 6


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> grain.ArrayRecordDataSource:
    path = tmp_path_factory.mktemp("data") / "train.array_record"
    writer = ArrayRecordWriter(str(path), "group_size:1")
    for i in range(RECORDS):
        writer.write(i.to_bytes(8, "little"))
    writer.close()
    return grain.ArrayRecordDataSource([str(path)])


def _dataset(source) -> grain.MapDataset:
    # MaxText's _apply_mapdataset_transforms with elastic=True, then a 1:1 map as its preprocessing.
    ds = grain.MapDataset.source(source).shuffle(seed=SEED).repeat(1)
    return ds.map(lambda b: int.from_bytes(b, "little"))


def _elastic(source, shards: int, state: dict | None = None) -> list:
    its = [
        iter(
            ElasticIterator(
                _dataset(source), GLOBAL_BATCH, grain.ShardOptions(shard_index=i, shard_count=shards)
            )
        )
        for i in range(shards)
    ]
    if state is not None:
        for it in its:
            it.set_state(state)
    return its


def _global_batches(its: list, steps: int) -> list[list[int]]:
    # A step's global batch is every process's host batch; the mean loss does not depend on the order.
    return [sorted(x for it in its for x in next(it).tolist()) for _ in range(steps)]


def test_step_s_reads_the_same_global_batch_on_any_process_count(source) -> None:
    reference = _global_batches(_elastic(source, 1), STEPS)
    assert len({x for batch in reference for x in batch}) == STEPS * GLOBAL_BATCH  # no sample twice
    for shards in (2, 4, 8):
        assert _global_batches(_elastic(source, shards), STEPS) == reference


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 4), (4, 2)])
def test_a_state_saved_on_one_process_count_resumes_on_another(source, before: int, after: int) -> None:
    reference = _global_batches(_elastic(source, 1), STEPS)
    its = _elastic(source, before)
    first = _global_batches(its, 3)
    states = [it.get_state() for it in its]
    assert all(s == {"global_next_index": 3 * GLOBAL_BATCH} for s in states)  # one global index
    assert first + _global_batches(_elastic(source, after, states[0]), STEPS - 3) == reference


def test_the_default_per_process_iterator_does_not_resume_on_another_count(source) -> None:
    """MaxText's default (grain_use_elastic_iterator=false): each process reads ds[i::n] and keeps
    its own position, so process 0's state on 2 processes, restored on 1, skips or repeats data."""
    reference = _global_batches(_elastic(source, 1), STEPS)

    def host(index: int, count: int):
        return iter(_dataset(source)[index::count].to_iter_dataset().batch(GLOBAL_BATCH // count))

    two = [host(0, 2), host(1, 2)]
    _global_batches(two, 3)
    one = host(0, 1)
    one.set_state(two[0].get_state())
    assert sorted(next(one).tolist()) != reference[3]
