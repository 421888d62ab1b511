"""Waiting for the scheduler to place a restored copy (``placement.placed``), on a scripted
API and a fake clock: placed, withdrawn past the deadline, bound at the last moment."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from specon.model import ContainerId
from specon.runtime.base import StartFailed
from specon.runtime.kubernetes.placement import placed
from specon.runtime.kubernetes.steering import steer
from specon.runtime.kubernetes.writes import PodRef

JOB = ContainerId("training.j1")
MESSAGE = "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) didn't match Pod's node affinity."


def copy_for(node: str, *, bound: str | None = None, why: str | None = None) -> dict[str, Any]:
    pod: dict[str, Any] = {"metadata": {"name": "j1-g2", "namespace": "training", "uid": "u2"}, "spec": {}}
    steer(pod, node)
    if bound:
        pod["spec"]["nodeName"] = bound
    if why:
        pod["status"] = {
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why}
            ]
        }
    return pod


class Cluster:
    """The copy as reads see it, one answer per read (the last repeats); a fake clock that
    each read moves on ``step`` seconds."""

    def __init__(self, answers: list[dict[str, Any] | None], step: float = 1.0) -> None:
        self.answers = answers
        self.reads = 0
        self.now = 0.0
        self.step = step
        self.withdrawn: list[PodRef] = []
        self.on_withdraw: Callable[[], None] | None = None

    async def read(self, ref: PodRef) -> dict[str, Any] | None:
        self.now += self.step
        answer = self.answers[min(self.reads, len(self.answers) - 1)]
        self.reads += 1
        return answer

    async def withdraw(self, ref: PodRef) -> None:
        self.withdrawn.append(ref)
        if self.on_withdraw is not None:
            self.on_withdraw()

    async def placed(self, deadline: float = 10.0) -> dict[str, Any]:
        return await placed(
            JOB,
            copy_for("node-2"),
            "node-2",
            read=self.read,
            withdraw=self.withdraw,
            deadline=deadline,
            clock=lambda: self.now,
        )


@pytest.fixture(autouse=True)
def no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    async def instant(_: float) -> None:
        return None

    monkeypatch.setattr("specon.runtime.kubernetes.placement.asyncio.sleep", instant)


async def test_a_copy_the_scheduler_binds_here_is_restored() -> None:
    cluster = Cluster([copy_for("node-2"), copy_for("node-2", bound="node-2")])
    got = await cluster.placed()
    assert got["spec"]["nodeName"] == "node-2" and cluster.withdrawn == []


async def test_a_copy_left_unschedulable_past_the_deadline_is_withdrawn_with_the_schedulers_reason() -> None:
    cluster = Cluster([copy_for("node-2", why=MESSAGE)])
    with pytest.raises(
        StartFailed, match=r"not scheduled onto node-2 within 10 s \(0/2 nodes.*Insufficient cpu"
    ) as err:
        await cluster.placed()
    assert "withdrawn" in str(err.value)
    assert cluster.withdrawn == [PodRef("training", "j1-g2", "u2")]
    assert 10.0 <= cluster.now <= 12.0  # no read long past the deadline


async def test_a_copy_no_scheduler_looks_at_is_withdrawn_too() -> None:
    cluster = Cluster([copy_for("node-2")])
    with pytest.raises(StartFailed, match="no scheduler bound it"):
        await cluster.placed()
    assert len(cluster.withdrawn) == 1


async def test_a_copy_bound_as_it_was_withdrawn_is_restored_after_all() -> None:
    """The withdrawal deletes only the copy as it was read: bound meanwhile, it stays."""
    answers: list[dict[str, Any] | None] = [copy_for("node-2", why=MESSAGE)]
    cluster = Cluster(answers)
    cluster.on_withdraw = lambda: answers.append(copy_for("node-2", bound="node-2"))
    cluster.reads = 0
    got = await cluster.placed()
    assert got["spec"]["nodeName"] == "node-2" and len(cluster.withdrawn) == 1


async def test_a_copy_deleted_or_replaced_while_waiting_fails_the_start() -> None:
    for answer in (
        None,
        {**copy_for("node-2"), "metadata": {"name": "j1-g2", "namespace": "training", "uid": "u9"}},
    ):
        with pytest.raises(StartFailed, match="deleted before it was scheduled"):
            await Cluster([copy_for("node-2"), answer]).placed()
    with pytest.raises(StartFailed, match="bound to node-3, not to node-2"):
        await Cluster([copy_for("node-2", bound="node-3")]).placed()
