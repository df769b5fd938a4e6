"""Reading the shared counter table: the fast read gives what the table's own read gives."""

from __future__ import annotations

import pickle

from lightning_speedpack.core import stages
from lightning_speedpack.data_xray.pipeline import delta, read_table


def _table() -> stages.CounterTable:
    # Five rows as a loader's probe has them: rows 1 and 3 taken, the others never.
    table = stages.CounterTable(rows=5)
    first = stages.activate(table, 1)
    first.add_fetch(0.25, 8, 0.125)
    for done in (1.0, 2.0, 3.0):
        first.add_collate(0.0625, done)
    for name in ("decode", "augment", "decode"):
        first.add_stage(name, 0.5, 4)
    third = stages.activate(table, 3)
    third.add_fetch(0.5, 16)
    for i in range(stages.MAX_STAGES + 1):  # one stage more than the slots: overflow
        third.add_stage(f"stage {i}", 0.125, 1)
    stages.deactivate()
    return table


def test_the_fast_read_gives_every_row_as_the_tables_own_read() -> None:
    table = _table()
    rows = read_table(table)
    assert rows == table.read()
    assert [row.pid != 0 for row in rows] == [False, True, False, True, False]
    assert rows[1].stages == {"decode": (1.0, 8.0), "augment": (0.5, 4.0)}
    assert rows[1].done_time(2) == 3.0
    assert rows[3].overflow
    assert len(rows[3].stages) == stages.MAX_STAGES
    # in a DataLoader worker the table arrives pickled: its views are made again
    assert read_table(pickle.loads(pickle.dumps(table))) == rows


def test_a_snapshot_changed_by_its_reader_is_not_the_next_reads() -> None:
    # LoaderFitProbes.mark() zeroes the pid of the fit's own rows in its snapshot; an untaken
    # row's snapshot is a new object each read, so no change to one reaches the next
    table = _table()
    first = read_table(table)
    first[1].pid = 0
    first[0].stages["changed"] = (1.0, 1.0)
    first[0].ring[0] = 5.0
    second = read_table(table)
    assert second[0].pid == 0
    assert second[1].pid != 0
    assert second[0].stages == {}
    assert second[0].ring[0] == 0.0
    assert second == table.read()


def test_two_reads_make_the_window_between_them() -> None:
    table = _table()
    before = read_table(table)
    stages.activate(table, 4).add_fetch(0.5, 32)  # a new process takes a row between the reads
    stages.deactivate()
    windows = delta(before, read_table(table), 1.0, 2.0, live=[1, 3, 4])
    # the rows that did nothing since add nothing; the new one counts from its start
    assert [(d.row, d.samples) for d in windows if d.samples] == [(4, 32.0)]
