"""Writing a job's restore record while another writer changes it (``PodCalls.write_record``):
the recorder's first sight of a restored pod and a save of that pod race on the real API
server; here an in-memory server makes each interleaving happen on cue."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from specon.model import ContainerId
from specon.runtime.base import SaveFailed
from specon.runtime.kubernetes.api import KubeError
from specon.runtime.kubernetes.calls import RECORD_TRIES, PodCalls, record_path
from specon.runtime.kubernetes.pods import ANN_GENERATION, LABEL_JOB
from specon.runtime.kubernetes.restore import record_of
from tests.unit.runtime.kubernetes.test_pods import CONTRACT, pod

JOB = ContainerId("ml.j1")
PATH = record_path(JOB)


def of_generation(n: int) -> dict[str, Any]:
    p = pod(f"j1-g{n}", labels={LABEL_JOB: "j1", "specon.io/managed": "true"}, env=CONTRACT)
    p["metadata"].setdefault("annotations", {})[ANN_GENERATION] = str(n)
    p["metadata"]["uid"] = f"u-{n}"
    return p


class Server:
    """One pod and at most one PodTemplate, with resourceVersions checked as the API server
    checks them; ``before[(method, n)]`` runs just before that method's n-th call (from 1)."""

    def __init__(self, live: dict[str, Any]) -> None:
        self.live = live
        self.record: dict[str, Any] | None = None
        self.version = 0
        self.calls: dict[str, int] = {}
        self.before: dict[tuple[str, int], Callable[[], None]] = {}

    def store(self, record: dict[str, Any]) -> None:
        self.version += 1
        self.record = copy.deepcopy(record)
        self.record["metadata"]["resourceVersion"] = str(self.version)

    def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> Any:
        self.calls[method] = self.calls.get(method, 0) + 1
        if hook := self.before.get((method, self.calls[method])):
            hook()
        if method == "GET" and "/pods/" in path:
            return copy.deepcopy(self.live)
        assert path.startswith(PATH.rsplit("/", 1)[0])
        if method == "GET":
            if self.record is None:
                raise KubeError(404, "NotFound", "no record")
            return copy.deepcopy(self.record)
        if method == "POST":
            if self.record is not None:
                raise KubeError(409, "AlreadyExists", "exists")
            self.store(body)
            return self.record
        if method == "PUT":
            if self.record is None:
                raise KubeError(404, "NotFound", "no record")
            if body["metadata"].get("resourceVersion") != self.record["metadata"]["resourceVersion"]:
                raise KubeError(409, "Conflict", "the object has been modified")
            self.store(body)
            return self.record
        raise AssertionError(method)


def other_writer(server: Server, generation: int) -> Callable[[], None]:
    return lambda: server.store(record_of(of_generation(generation)))


def recorded_generation(server: Server) -> str:
    assert server.record is not None
    return str(server.record["template"]["metadata"]["annotations"][ANN_GENERATION])


def test_a_record_changed_between_read_and_update_is_read_again_and_replaced() -> None:
    server = Server(of_generation(2))
    other_writer(server, 1)()  # an earlier save's record
    server.before[("PUT", 1)] = other_writer(server, 2)  # the recorder, meanwhile
    PodCalls(server, "specon.io/managed=true").write_record(JOB, of_generation(2))  # type: ignore[arg-type]
    assert server.calls["PUT"] == 2 and recorded_generation(server) == "2"
    assert server.record is not None
    assert server.record["metadata"]["annotations"]["specon.io/pod-uid"] == "u-2"


def test_a_record_deleted_between_create_and_read_is_created_again() -> None:
    server = Server(of_generation(3))
    other_writer(server, 2)()
    server.before[("GET", 2)] = lambda: setattr(server, "record", None)  # 1st GET: the pod
    PodCalls(server, "specon.io/managed=true").write_record(JOB, of_generation(3))  # type: ignore[arg-type]
    assert server.calls["POST"] == 2 and recorded_generation(server) == "3"


def test_a_newer_copys_record_is_never_replaced_by_an_older_one() -> None:
    server = Server(of_generation(2))
    other_writer(server, 1)()
    server.before[("PUT", 1)] = other_writer(server, 3)  # the job moved on meanwhile
    PodCalls(server, "specon.io/managed=true").write_record(JOB, of_generation(2))  # type: ignore[arg-type]
    assert recorded_generation(server) == "3"


def test_a_record_that_keeps_changing_fails_the_save_and_the_pod_keeps_running() -> None:
    server = Server(of_generation(2))
    other_writer(server, 1)()
    for n in range(1, RECORD_TRIES + 1):
        server.before[("PUT", n)] = other_writer(server, 1)
    with pytest.raises(SaveFailed, match=r"Conflict.*the pod keeps running"):
        PodCalls(server, "specon.io/managed=true").write_record(JOB, of_generation(2))  # type: ignore[arg-type]
    assert server.calls["PUT"] == RECORD_TRIES
