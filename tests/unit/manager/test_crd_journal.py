"""The Migration journal (``specon_manager.k8s_crd_journal``) against an in-memory API that keeps
what the real one does of a custom resource with a status subresource (a create and an update
drop the status, ``/status`` changes only it, a stale ``resourceVersion`` is a 409): every field
has its place, the marks spread over their shards, the carry-over from ConfigMaps. The real API
server: tests/k8s/test_crd_journal.py."""

from __future__ import annotations

import copy
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from specon_manager.k8s_crd_journal import MARK_SHARDS, PLACES, CrdJournal, from_resource, sections, shard_of
from specon_manager.k8s_journal import JournalError, KubeJournal
from specon_manager.leader import FencedJournal, NotLeaderError

from specon.coordinator.effects import PutMark, PutMigration, write
from specon.coordinator.migration import Mark, Migration, State
from specon.model import ContainerId, WorkerId
from specon.runtime.kubernetes.api import KubeApi, KubeError
from specon.wire import codec

ROOT_CRD = yaml.safe_load(
    (Path(__file__).resolve().parents[3] / "manifests" / "base" / "crd.yaml").read_text()
)

SAVED = Migration(
    "m1", ContainerId("training.job-1"), WorkerId("node-1"), WorkerId("node-2"), "converged", State.SAVED,
    decided_at=10.0, updated_at=12.5, checkpoint="/data/ckpt-5.json", checkpoint_step=5, stopped_at=11.0,
    attempts=1, spec='{"id": "x"}', lost_steps=2,
)  # fmt: skip


def states() -> list[Migration]:
    running = SAVED.to(State.RESTORING, at=13.0).to(State.RUNNING, at=14.0, started_at=14.25)
    failed = SAVED.to(State.FAILED, at=15.0, error="start refused")
    return [
        replace(SAVED, state=State.DECIDED, checkpoint=None, checkpoint_step=None, spec=None,
                stopped_at=None),
        replace(SAVED, state=State.SAVING), SAVED, running, running.to(State.DONE, at=15.0), failed,
        failed.to(State.ROLLED_BACK, at=16.0),
    ]  # fmt: skip


class ResourceApi(KubeApi):
    """Objects in memory by path, with resourceVersions and a status subresource."""

    def __init__(self) -> None:  # no client: nothing is sent
        self.objects: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.calls: list[str] = []
        self.conflict_once: set[str] = set()

    def request(self, method: str, path: str, *, query: Any = None, body: Any = None, **_: Any) -> Any:
        self.calls.append(f"{method} {path}")
        status = path.endswith("/status")
        key = path.removesuffix("/status")
        if method == "GET" and query is not None:  # a list
            wanted = dict(t.split("=") for t in query["labelSelector"].split(","))
            items = [o for p, o in self.objects.items() if p.rsplit("/", 1)[0] == path
                     and wanted.items() <= (o["metadata"].get("labels") or {}).items()]  # fmt: skip
            return {"items": copy.deepcopy(items)}
        if method == "POST":
            key = f"{path}/{body['metadata']['name']}"
        if method != "POST" and key not in self.objects:
            raise KubeError(404, "NotFound", key)
        if method == "GET":
            return copy.deepcopy(self.objects[key])
        if method == "DELETE":
            want = ((body or {}).get("preconditions") or {}).get("resourceVersion")
            if want is not None and want != self.objects[key]["metadata"]["resourceVersion"]:
                raise KubeError(409, "Conflict", key)
            del self.objects[key]
            return {}
        if method == "POST" and key in self.objects:
            raise KubeError(409, "AlreadyExists", key)
        new = copy.deepcopy(body)
        if method == "PUT":
            if key in self.conflict_once:
                self.conflict_once.discard(key)
                raise KubeError(409, "Conflict", key)
            old = self.objects[key]
            if new["metadata"].get("resourceVersion") != old["metadata"]["resourceVersion"]:
                raise KubeError(409, "Conflict", key)
            if "/apis/specon.io/" in key:  # the status subresource's split
                new = {**old, "status": new.get("status")} if status else {**new, "status": old.get("status")}
        elif "/apis/specon.io/" in key:
            new.pop("status", None)
        self.version += 1
        new["metadata"]["resourceVersion"] = str(self.version)
        self.objects[key] = {k: v for k, v in new.items() if v is not None}
        return copy.deepcopy(self.objects[key])


def crd_journal() -> tuple[CrdJournal, ResourceApi]:
    api = ResourceApi()
    return CrdJournal(api, "specon", mirror_pods=False), api


def test_every_field_has_one_place_and_the_crd_declares_it() -> None:
    assert set(PLACES) == {codec.wire_key(f) for f in fields(Migration)}
    assert len(set(PLACES.values())) == len(PLACES)
    schema = ROOT_CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    for section, name in PLACES.values():
        assert name in schema[section]["properties"], (section, name)
    assert set(schema["spec"]["required"]) == {n for s, n in PLACES.values() if s == "spec"}


@pytest.mark.parametrize("m", states(), ids=lambda m: m.state.value)
def test_every_state_round_trips_through_the_resource(m: Migration) -> None:
    spec, status = sections(m)
    assert from_resource({"spec": spec, "status": status}) == m
    assert ("downtime" in status) == (m.downtime is not None)
    j, _ = crd_journal()
    j.put(m)
    assert j.get(m.id) == m and (j.in_flight() == [m]) == m.in_flight and j.all() == [m]


def test_an_object_without_status_is_as_decided_and_a_bad_one_is_skipped() -> None:
    spec, _ = sections(SAVED)
    assert from_resource({"spec": spec}) == Migration(
        "m1", ContainerId("training.job-1"), WorkerId("node-1"), WorkerId("node-2"), "converged",
        State.DECIDED, 10.0, 10.0,
    )  # fmt: skip
    with pytest.raises(ValueError, match="reason"):
        from_resource({"spec": {**spec, "reason": "bored"}})
    j, api = crd_journal()
    j.put(SAVED)
    api.objects[f"{j._base}/specon-m1"]["spec"]["reason"] = "bored"
    assert j.all() == [] and j.get("m1") is None


def test_writes_go_through_the_status_subresource_and_relabel_once_ended() -> None:
    j, api = crd_journal()
    *_, done = states()[:5]
    j.put(states()[0])
    path = f"{j._base}/specon-m1"
    assert api.calls[-2:] == [f"POST {j._base}", f"PUT {path}/status"]
    assert api.objects[path]["metadata"]["labels"]["specon.io/in-flight"] == "true"
    api.calls.clear()
    j.put(done)
    assert api.calls == [f"GET {path}", f"PUT {path}/status", f"PUT {path}"]
    assert api.objects[path]["metadata"]["labels"]["specon.io/in-flight"] == "false"
    api.calls.clear()
    j.put(done)  # unchanged: read, nothing written
    assert api.calls == [f"GET {path}"]
    api.conflict_once.add(path)
    j.put(SAVED)  # a spec change is possible, and a 409 is redone
    assert j.get("m1") == SAVED and j.conflicts == 1


def test_forget_keeps_the_open_and_the_newest() -> None:
    j, _ = crd_journal()
    for mid, at in (("a", 10.0), ("b", 20.0), ("c", 95.0)):
        j.put(replace(states()[4], id=mid, updated_at=at))
    j.put(replace(SAVED, id="open"))
    assert j.forget(100.0, 50.0, keep_newest=1) == 2
    assert sorted(m.id for m in j.all()) == ["c", "open"]


def test_marks_spread_over_their_shards_one_write_per_shard() -> None:
    j, api = crd_journal()
    marks = [Mark(ContainerId(f"ns.job-{i}"), float(i), 1, 0, WorkerId("n1"), i % 2 == 0, i % 3)
             for i in range(1000)]  # fmt: skip
    j.put_marks(marks)
    shards = [p for p in api.objects if "/configmaps/specon-marks-" in p]
    assert (
        len(shards) == MARK_SHARDS
        and sum(c.startswith("PUT") or c.startswith("POST") for c in api.calls) == 64
    )
    assert j.marks() == {mk.container: mk for mk in marks}
    j.put_mark(replace(marks[7], rebalances=5))
    assert j.marks()[marks[7].container].rebalances == 5
    assert shard_of("ns.job-7") == shard_of("ns.job-7") and 0 <= shard_of("x") < MARK_SHARDS
    j.set_meta("epoch", "3")
    assert j.get_meta("epoch") == "3" and len(j.marks()) == 1000


def test_the_configmap_journal_is_carried_over_once_and_a_changed_one_again() -> None:
    j, api = crd_journal()
    old = KubeJournal(api, "specon", mirror_pods=False)
    old.put(SAVED)
    old.put(replace(states()[4], id="m2"))
    old.put_mark(Mark(ContainerId("a"), 1.0, 1, 0))
    assert j.in_flight() == [SAVED] and (j.carried.migrations, j.carried.in_flight, j.carried.marks) == (
        2,
        1,
        1,
    )
    left = [p.rsplit("/", 1)[1] for p in api.objects if "/configmaps/" in p]
    assert left == [j.shard_name("a")]
    assert j.marks() == {ContainerId("a"): Mark(ContainerId("a"), 1.0, 1, 0)}
    assert j.in_flight() == [SAVED] and j.carried.migrations == 0
    # An older manager that still wrote meanwhile: its newer record is carried over too.
    old.put(SAVED.to(State.RESTORING, at=20.0))
    assert j.in_flight() == [SAVED.to(State.RESTORING, at=20.0)]


def test_a_batch_of_marks_is_one_write_per_shard_in_the_order_written() -> None:
    j, api = crd_journal()
    marks = [Mark(ContainerId(f"ns.job-{i}"), None, 0, 0, WorkerId("n1")) for i in range(500)]
    writes = [PutMark(i, mk) for i, mk in enumerate(marks, 1)]
    assert (
        write(j, [*writes, PutMigration(501, SAVED), PutMark(502, replace(marks[0], finished=True))]) == 502
    )
    posts = [c for c in api.calls if c.startswith(("POST", "PUT"))]
    assert len(posts) == MARK_SHARDS + 2 + 1  # the shards, the migration (object, status), one shard
    assert posts[MARK_SHARDS].startswith("POST /apis/specon.io/")  # the marks before it went first
    assert j.marks() == {mk.container: mk for mk in [replace(marks[0], finished=True), *marks[1:]]}
    # A failure inside writes none of the marks held back (the whole batch is retried).
    with pytest.raises(RuntimeError), j.transaction():
        j.put_mark(Mark(ContainerId("ns.never")))
        raise RuntimeError("stop")
    assert ContainerId("ns.never") not in j.marks()
    j.put_mark(Mark(ContainerId("ns.now")))  # outside a transaction: at once
    assert ContainerId("ns.now") in j.marks()


def test_a_cluster_without_the_crd_is_named_as_such() -> None:
    class NoCrd(ResourceApi):
        def request(self, method: str, path: str, **kw: Any) -> Any:
            if path.startswith("/apis/specon.io/"):
                raise KubeError(404, "NotFound", "the server could not find the requested resource")
            return super().request(method, path, **kw)

    with pytest.raises(JournalError, match=r"\(migrations.specon.io\) is not installed: kubectl apply -k"):
        CrdJournal(NoCrd(), "specon").all()


def test_the_fenced_journal_batches_too_and_a_lost_lease_writes_nothing() -> None:
    j, api = crd_journal()
    leading = True
    fenced = FencedJournal(j, lambda: leading)
    marks = [Mark(ContainerId(f"ns.job-{i}")) for i in range(300)]
    write(fenced, [PutMark(i, mk) for i, mk in enumerate(marks, 1)])
    assert len([c for c in api.calls if c.startswith(("POST", "PUT"))]) == MARK_SHARDS
    leading = False
    api.calls.clear()
    with pytest.raises(NotLeaderError):
        write(fenced, [PutMark(1, replace(marks[0], finished=True))])
    assert not [c for c in api.calls if c.startswith(("POST", "PUT"))]
