"""A start that supersedes a lost node's copy: which nodes are lost (both kubelet heartbeats
stale a lease), and that only their alive pods are deleted, with no grace."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest

from specon.model import ContainerId
from specon.runtime.kubernetes import pods, takeover
from specon.runtime.kubernetes.api import KubeError
from specon.runtime.kubernetes.steering import steer

NOW = 1_800_000_000.0


def stamp(t: float, micro: bool = False) -> str:
    fmt = "%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ"
    return datetime.fromtimestamp(t, UTC).strftime(fmt)


def node(ready: str = "True", beat: float | None = None) -> dict[str, Any]:
    cond: dict[str, Any] = {"type": "Ready", "status": ready}
    if beat is not None:
        cond["lastHeartbeatTime"] = stamp(beat)
    return {"metadata": {"name": "n"}, "status": {"conditions": [cond]}}


def lease(renewed: float, duration: int | None = 40) -> dict[str, Any]:
    spec: dict[str, Any] = {"renewTime": stamp(renewed, micro=True)}
    if duration is not None:
        spec["leaseDurationSeconds"] = duration
    return {"spec": spec}


@pytest.mark.parametrize(
    ("n", "ls", "lost"),
    [
        (node(beat=NOW - 300), lease(NOW - 5), False),  # Lease renewed: the kubelet is there
        (node(beat=NOW - 300), lease(NOW - 41), True),  # both stale a lease: gone
        (node("Unknown", beat=NOW - 45), lease(NOW - 45), True),  # as the node controller says
        (node("False", beat=NOW - 2), lease(NOW - 60), False),  # NotReady but posting: alive
        (node(beat=NOW - 9), lease(NOW - 11, duration=10), False),  # its own lease length
        (node(beat=NOW - 12), lease(NOW - 11, duration=10), True),
        (node(beat=NOW - 50), None, True),  # no Lease (NodeLease off): the status alone
        (node(beat=NOW - 10), None, False),
        (node(), None, False),  # no heartbeat on record: nothing says it stopped
        (None, None, True),  # the Node object is gone
    ],
)
def test_a_node_is_lost_when_its_kubelet_has_been_silent_a_whole_lease(
    n: dict[str, Any] | None, ls: dict[str, Any] | None, lost: bool
) -> None:
    assert pods.node_lost(n, ls, NOW) is lost


def pod(name: str, node_name: str, phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "t", "uid": name}, "spec": {"nodeName": node_name},
            "status": {"phase": phase}}  # fmt: skip


class Api:
    def __init__(self, objects: dict[str, dict[str, Any]]) -> None:
        self.objects = objects
        self.deleted: list[str] = []
        self.recorded: list[str] = []

    async def get(self, method: str, path: str) -> dict[str, Any]:
        assert method == "GET"
        if path not in self.objects:
            raise KubeError(404, "NotFound", f"{path} not found")
        return self.objects[path]

    async def delete(self, manifest: dict[str, Any], *, grace: int) -> None:
        bound = bool(manifest["spec"].get("nodeName"))
        assert (manifest["metadata"]["name"] in self.recorded) is bound, (
            "recorded before it is deleted (if it ran)"
        )
        assert grace == 0, "a lost node's pod goes at once"
        self.deleted.append(manifest["metadata"]["name"])

    async def record(self, manifest: dict[str, Any]) -> None:
        self.recorded.append(manifest["metadata"]["name"])

    def calls(self) -> takeover.Calls:
        return takeover.Calls(self.get, self.delete, self.record)


def dead_and_up() -> Api:
    """Node ``dead`` (its kubelet silent a whole lease) and node ``up`` (its Lease renewed)."""
    now = time.time()
    return Api({
        "/api/v1/nodes/dead": node(beat=now - 300),
        f"{takeover.LEASES}/dead": lease(now - 100),
        "/api/v1/nodes/up": node(beat=now - 300),
        f"{takeover.LEASES}/up": lease(now - 1),
    })  # fmt: skip


async def test_only_alive_pods_on_lost_nodes_are_deleted() -> None:
    api = dead_and_up()
    existing = [pod("a", "dead"), pod("b", "up"), pod("c", "dead", phase="Failed"), pod("d", "here"),
                pod("e", "gone")]  # fmt: skip
    kept = await takeover.take_over(ContainerId("t/j"), existing, "here", True, api.calls())
    assert api.deleted == ["a", "e"]  # "gone": its Node object no longer exists
    assert [p["metadata"]["name"] for p in kept] == ["b", "c", "d"]


async def test_a_copy_still_unbound_and_steered_to_a_lost_node_is_deleted_unrecorded() -> None:
    """Its agent died with the node and will never withdraw it; it never ran."""
    api = dead_and_up()
    pending = [pod(name, "", phase="Pending") for name in ("a", "b")]
    for p, target in zip(pending, ("dead", "up"), strict=True):
        p["spec"] = {}
        steer(p, target)
    kept = await takeover.take_over(ContainerId("t/j"), pending, "here", True, api.calls())
    assert api.deleted == ["a"] and api.recorded == []
    assert [p["metadata"]["name"] for p in kept] == ["b"]


async def test_only_the_node_taken_for_lost_is_taken_over() -> None:
    now = time.time()
    objects = {f"/api/v1/nodes/{n}": node(beat=now - 300) for n in ("dead", "other")}
    objects |= {f"{takeover.LEASES}/{n}": lease(now - 100) for n in ("dead", "other")}
    api = Api(objects)
    kept = await takeover.take_over(ContainerId("t/j"), [pod("a", "other")], "here", "dead", api.calls())
    assert api.deleted == [] and len(kept) == 1  # "other" may be silent, but was not named


async def test_an_api_that_cannot_say_is_an_error_not_a_deletion() -> None:
    class Broken(Api):
        async def get(self, method: str, path: str) -> dict[str, Any]:
            raise KubeError(503, "ServiceUnavailable", "unavailable")

    api = Broken({})
    with pytest.raises(KubeError):
        await takeover.take_over(ContainerId("t/j"), [pod("a", "dead")], "here", True, api.calls())
    assert api.deleted == []
