"""The manager journal: durable across reopen, in-flight query, marks."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from specon_manager.journal import Journal, mark_from_row, migration_from_row, migration_to_row

from specon.coordinator.migration import Mark, Migration, State
from specon.model import ContainerId, WorkerId


def _m(mid: str, state: State) -> Migration:
    return Migration(
        mid, ContainerId(f"job-{mid}"), WorkerId("a"), WorkerId("b"), "converged", state, 1.0, 1.0
    )


def test_migrations_survive_reopen_and_in_flight_filters_terminal(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.db")
    j.put(_m("1", State.SAVING))
    j.put(_m("2", State.DONE))
    j.put(_m("3", State.FAILED))
    j.close()
    j2 = Journal(tmp_path / "j.db")
    assert [m.id for m in j2.in_flight()] == ["1", "3"]
    got = j2.get("1")
    assert got == _m("1", State.SAVING)
    assert j2.get("nope") is None
    assert len(j2.all()) == 3


def test_put_replaces_state(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.db")
    m = _m("1", State.DECIDED)
    j.put(m)
    j.put(m.to(State.SAVING, at=2.0))
    got = j.get("1")
    assert got is not None and got.state is State.SAVING and got.updated_at == 2.0


def test_marks_count_and_keep_first_migrated_time(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.db")
    c = ContainerId("job")
    j.put_mark(Mark(c, 5.0, 1, 0))
    mk = Mark(c, 5.0, 2, 1)
    j.put_mark(mk)
    assert j.marks() == {c: mk}
    j.close()
    assert Journal(tmp_path / "j.db").marks()[c] == mk


def test_meta_roundtrip(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.db")
    assert j.get_meta("k") is None
    j.set_meta("k", "v")
    assert j.get_meta("k") == "v"


def test_a_journal_written_before_the_codec_still_reads(tmp_path: Path) -> None:
    """Rows as the hand-written converter stored them (state as its value, ids as text)."""
    path = tmp_path / "old.db"
    Journal(path).close()  # the schema, unchanged
    db = sqlite3.connect(path)
    db.execute(
        "INSERT INTO migrations (id, container, source, target, reason, state, decided_at, updated_at,"
        " checkpoint, checkpoint_step, stopped_at, started_at, error, attempts, spec)"
        " VALUES ('m1', 'j1', 'w0', 'w1', 'converged', 'saved', 10, 12.5, '/v/ckpt-5.json', 5,"
        ' 11.0, NULL, NULL, 1, \'{"id": "j1"}\')'
    )
    db.execute("INSERT INTO marks (container, migrated_at, migrations, rebalances) VALUES ('j1', 10.0, 2, 1)")
    db.execute("INSERT INTO marks (container) VALUES ('j2')")
    db.commit()
    db.close()
    j = Journal(path)
    want = Migration(
        "m1",
        ContainerId("j1"),
        WorkerId("w0"),
        WorkerId("w1"),
        "converged",
        State.SAVED,
        decided_at=10.0,
        updated_at=12.5,
        checkpoint="/v/ckpt-5.json",
        checkpoint_step=5,
        stopped_at=11.0,
        attempts=1,
        spec='{"id": "j1"}',
    )
    assert j.get("m1") == want and j.in_flight() == [want]
    assert j.marks() == {
        ContainerId("j1"): Mark(ContainerId("j1"), 10.0, 2, 1),
        ContainerId("j2"): Mark(ContainerId("j2"), None, 0, 0),
    }
    j.put(want)  # and what it writes now is the same row
    assert j.all() == [want]
    j.close()


def test_rows_round_trip_through_the_codec_and_a_bad_row_names_its_columns() -> None:
    m = Migration(
        "m1", ContainerId("j1"), WorkerId("w0"), WorkerId("w1"), "rebalance", State.FAILED, error="x"
    )
    row = migration_to_row(m)
    assert row[:6] == ("m1", "j1", "w0", "w1", "rebalance", "failed")
    assert migration_from_row(row) == m
    bad = ("m2", "j1", "w0", "w1", "moved", "lost", *row[6:])
    with pytest.raises(ValueError, match=r"corrupt journal row 'm2': reason: .*; state: must be one of"):
        migration_from_row(bad)
    assert mark_from_row(("j1", None, 0, 3)) == Mark(ContainerId("j1"), None, 0, 3)
