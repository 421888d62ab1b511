"""The manager journal: durable across reopen, in-flight query, marks."""

from __future__ import annotations

from pathlib import Path

from manager.journal import Journal
from specon.migration import Migration, State
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
    j.mark(c, migrated_at=5.0)
    mk = j.mark(c, migrated_at=9.0, rebalanced=True)
    assert (mk.migrated_at, mk.migrations, mk.rebalances) == (5.0, 2, 1)
    j.close()
    assert Journal(tmp_path / "j.db").marks()[c] == mk


def test_meta_roundtrip(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.db")
    assert j.get_meta("k") is None
    j.set_meta("k", "v")
    assert j.get_meta("k") == "v"
