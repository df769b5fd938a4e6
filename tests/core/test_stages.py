"""Named stages: no-ops without a profiler; recorded into the process's own row with one."""

from __future__ import annotations

import pickle

import pytest

from lightning_speedpack.core import stages
from lightning_speedpack.core.stages import CounterTable, record_stage, stage


@pytest.fixture(autouse=True)
def _inactive() -> None:
    stages.deactivate()
    yield
    stages.deactivate()


def test_without_a_profiler_a_stage_records_nothing() -> None:
    table = CounterTable(rows=1)
    with stage("decode"):
        pass
    record_stage("decode", 1.0)
    assert table.read()[0].stages == {}
    assert stage("decode") is stage("decode")


def test_context_manager_decorator_and_batched_records_add_up() -> None:
    table = CounterTable(rows=3)
    stages.activate(table, row=2)

    @stage("augment")
    def augment(x: int) -> int:
        return x + 1

    for i in range(5):
        with stage("decode"):
            augment(i)
    record_stage("cache_read", 0.5, count=32)
    stages.deactivate()
    row = table.read()[2]
    assert row.stages["decode"][1] == 5
    assert row.stages["augment"][1] == 5
    assert row.stages["cache_read"] == (0.5, 32.0)
    assert row.stages["decode"][0] >= row.stages["augment"][0] > 0
    assert table.read()[0].stages == {}


def test_more_stages_than_slots_set_the_overflow_flag() -> None:
    table = CounterTable(rows=1)
    stages.activate(table, row=0)
    for i in range(stages.MAX_STAGES + 2):
        with stage(f"s{i}"):
            pass
    stages.deactivate()
    row = table.read()[0]
    assert row.overflow
    assert len(row.stages) == stages.MAX_STAGES


def test_the_table_pickles_as_shared_memory() -> None:
    table = CounterTable(rows=2)
    copy = pickle.loads(pickle.dumps(table))
    assert copy.values.shape == table.values.shape
    copy.cells[1, 0] = 7.0  # the numpy views are rebuilt over the unpickled tensors
    assert float(copy.values[1, 0]) == 7.0


@pytest.mark.parametrize("bad", ["", 3, None])
def test_a_stage_needs_a_name(bad: object) -> None:
    with pytest.raises(TypeError, match="non-empty str"):
        stage(bad)  # type: ignore[arg-type]


def test_rows_are_checked() -> None:
    with pytest.raises(ValueError, match="rows"):
        CounterTable(rows=0)
    with pytest.raises(ValueError, match="row"):
        stages.activate(CounterTable(rows=1), row=1)
