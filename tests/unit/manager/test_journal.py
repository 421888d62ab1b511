"""The manager journals (SQLite and Kubernetes ConfigMaps): durable records, in-flight query,
marks, and records in the formats written before they went through the codec."""

from __future__ import annotations

import copy
import json
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from specon_manager.journal import Journal, mark_from_row, migration_from_row, migration_to_row
from specon_manager.k8s_journal import KubeJournal

from specon.coordinator.effects import PutMark, write
from specon.coordinator.migration import Mark, Migration, State
from specon.model import ContainerId, WorkerId
from specon.runtime.kubernetes.api import KubeApi, KubeError


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


def _ended(mid: str, state: State, at: float) -> Migration:
    return replace(_m(mid, state), updated_at=at)


def test_forget_deletes_ended_migrations_past_retention_but_the_newest_and_the_open(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.db")
    for mid, state, at in [("old1", State.DONE, 10.0), ("old2", State.ROLLED_BACK, 20.0),
                           ("old3", State.DONE, 30.0), ("new", State.DONE, 95.0)]:  # fmt: skip
        j.put(_ended(mid, state, at))
    j.put(_m("open", State.SAVING))  # in flight since t=1: never forgotten
    assert j.forget(100.0, 50.0, keep_newest=2) == 2  # old3 is one of the two newest ended
    assert sorted(m.id for m in j.all()) == ["new", "old3", "open"]
    assert j.forget(100.0, 50.0, keep_newest=0) == 1
    assert sorted(m.id for m in j.all()) == ["new", "open"]
    j.close()
    assert sorted(m.id for m in Journal(tmp_path / "j.db").all()) == ["new", "open"]


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


def test_a_batch_is_written_in_one_transaction_and_nothing_of_a_failed_one_is_kept(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.db")
    marks = [PutMark(i + 1, Mark(ContainerId(f"c{i}"), home=WorkerId("w0"))) for i in range(3)]
    assert write(j, marks) == 3
    assert set(Journal(tmp_path / "j.db").marks()) == {"c0", "c1", "c2"}  # durable: another reader sees it

    class Broken:
        def __iter__(self) -> Any:
            yield PutMark(4, Mark(ContainerId("c3")))
            raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        write(j, Broken())
    assert "c3" not in Journal(tmp_path / "j.db").marks()  # rolled back with the batch
    assert write(j, [PutMark(5, Mark(ContainerId("c4")))]) == 5  # and the journal goes on


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
    assert mark_from_row(("j1", None, 0, 3, None, 0, 0)) == Mark(ContainerId("j1"), None, 0, 3)
    assert mark_from_row(("j2", 1.0, 1, 0, "w1", 1, 2)) == Mark(
        ContainerId("j2"), 1.0, 1, 0, WorkerId("w1"), True, 2
    )


# --- the Kubernetes journal's records (ConfigMaps), against an in-memory API -------------------


class ConfigMapApi(KubeApi):
    """ConfigMaps in memory: create, read, replace and list by label, as the journal calls them."""

    def __init__(self) -> None:
        self.maps: dict[str, dict[str, Any]] = {}

    def request(self, method: str, path: str, *, query: Any = None, body: Any = None, **_: Any) -> Any:
        name = path.rsplit("/", 1)[1]
        if method == "GET" and name == "configmaps":
            wanted = dict(term.split("=") for term in query["labelSelector"].split(","))
            items = [cm for cm in self.maps.values() if wanted.items() <= cm["metadata"]["labels"].items()]
            return {"items": copy.deepcopy(items)}
        if method == "GET":
            if name not in self.maps:
                raise KubeError(404, "NotFound", name)
            return copy.deepcopy(self.maps[name])
        if method == "DELETE":
            if self.maps.pop(name, None) is None:
                raise KubeError(404, "NotFound", name)
            return {}
        assert method in ("POST", "PUT"), method
        self.maps[body["metadata"]["name"]] = copy.deepcopy(body)
        return body


def kube_journal() -> tuple[KubeJournal, ConfigMapApi]:
    api = ConfigMapApi()
    return KubeJournal(api, "specon", mirror_pods=False), api


# What the hand-written converter stored before the records went through the codec (keys sorted,
# state as its value, a float field as the int it was given).
OLD_MIGRATION = (
    '{"attempts": 1, "checkpoint": "/data/ckpt-5.json", "checkpoint_step": 5, "container": "ml.job-1", '
    '"decided_at": 10, "error": null, "id": "m1", "reason": "converged", "source": "node-1", '
    '"spec": "{\\"id\\": \\"x\\"}", "started_at": null, "state": "saved", "stopped_at": 11.0, '
    '"target": "node-2", "updated_at": 12.5}'
)
OLD_MARK = '{"migrated_at": 5.0, "migrations": 2, "rebalances": 1}'
SAVED = Migration(
    "m1",
    ContainerId("ml.job-1"),
    WorkerId("node-1"),
    WorkerId("node-2"),
    "converged",
    State.SAVED,
    decided_at=10.0,
    updated_at=12.5,
    checkpoint="/data/ckpt-5.json",
    checkpoint_step=5,
    stopped_at=11.0,
    attempts=1,
    spec='{"id": "x"}',
)


def test_configmaps_written_before_the_codec_still_read_and_are_written_the_same() -> None:
    j, api = kube_journal()
    labels = {"specon.io/record": "migration", "specon.io/in-flight": "true"}
    api.maps[j.migration_name("m1")] = {
        "metadata": {"labels": labels},
        "data": {"migration.json": OLD_MIGRATION},
    }
    api.maps["specon-marks"] = {"metadata": {"labels": {}}, "data": {"ml.job-1": OLD_MARK}}
    assert j.get("m1") == SAVED and j.in_flight() == [SAVED] and j.all() == [SAVED]
    assert j.marks() == {ContainerId("ml.job-1"): Mark(ContainerId("ml.job-1"), 5.0, 2, 1)}
    j.put(SAVED)
    j.put_mark(Mark(ContainerId("ml.job-1"), 5.0, 2, 1))
    stored = json.loads(api.maps[j.migration_name("m1")]["data"]["migration.json"])
    assert stored == json.loads(OLD_MIGRATION) and list(stored) == sorted(stored)
    assert api.maps["specon-marks"]["data"] == {"ml.job-1": OLD_MARK}


def test_kube_journal_forgets_ended_migrations_by_the_same_rule() -> None:
    j, api = kube_journal()
    j.put(_ended("old", State.DONE, 10.0))
    j.put(_ended("new", State.DONE, 95.0))
    j.put(_m("open", State.SAVING))
    assert j.forget(100.0, 50.0, keep_newest=0) == 1
    assert sorted(m.id for m in j.all()) == ["new", "open"]
    assert j.migration_name("old") not in api.maps


def test_kube_journal_round_trips_through_the_codec() -> None:
    j, _ = kube_journal()
    m = Migration("m2", ContainerId("b"), WorkerId("n1"), WorkerId("n3"), "rebalance", decided_at=9.0)
    j.put(m)
    j.put(SAVED.to(State.FAILED, at=13.0, error="lost").to(State.ROLLED_BACK, at=14.0))
    assert j.get("m2") == m and [x.id for x in j.in_flight()] == ["m2"]
    assert [x.id for x in j.all()] == ["m2", "m1"]  # by decided_at
    marks = [Mark(ContainerId("a"), None, 0, 3), Mark(ContainerId("b"), 1.5, 1, 0)]
    for mk in marks:
        j.put_mark(mk)
    assert j.marks() == {mk.container: mk for mk in marks}


def test_kube_journal_skips_a_corrupt_record_and_ignores_a_newer_managers_keys() -> None:
    j, api = kube_journal()
    labels = {"specon.io/record": "migration", "specon.io/in-flight": "true"}
    newer = json.loads(OLD_MIGRATION) | {"priority": 3}
    api.maps["a"] = {"metadata": {"labels": labels}, "data": {"migration.json": json.dumps(newer)}}
    broken = json.loads(OLD_MIGRATION) | {"id": "m9", "state": "lost"}
    api.maps["b"] = {"metadata": {"labels": labels}, "data": {"migration.json": json.dumps(broken)}}
    api.maps["c"] = {"metadata": {"labels": labels}, "data": {"migration.json": "{not json"}}
    assert j.in_flight() == [SAVED]


def test_a_corrupt_mark_keeps_what_it_can_and_defaults_the_rest() -> None:
    j, api = kube_journal()
    data = {
        "a": '{"migrated_at": "soon", "migrations": 2, "rebalances": 1}',
        "b": "{not json",
        "c": "[1, 2]",
        "d": '{"migrations": 4}',  # fields left out take their defaults
    }
    api.maps["specon-marks"] = {"metadata": {"labels": {}}, "data": data}
    assert j.marks() == {
        ContainerId("a"): Mark(ContainerId("a"), None, 2, 1),
        ContainerId("b"): Mark(ContainerId("b")),
        ContainerId("c"): Mark(ContainerId("c")),
        ContainerId("d"): Mark(ContainerId("d"), None, 4, 0),
    }
