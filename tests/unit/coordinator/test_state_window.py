"""ClusterState keeps each job's last loss window: reports carry it only when it changed."""

from __future__ import annotations

import dataclasses

from specon.coordinator.state import ClusterState
from specon.model import Category, ContainerId
from specon.wire.status import LossWindow
from tests.unit.manager_fakes import FakeAgent, FakeClock, report

C1 = ContainerId("c1")
W1 = LossWindow(first_step=0, last_step=10, loss=(2.0, 1.0), steps_per_second=1.0)
W2 = LossWindow(first_step=0, last_step=20, loss=(2.0, 1.0, 0.5), steps_per_second=1.0)


def test_a_window_is_kept_until_a_report_brings_a_new_one_and_across_a_move() -> None:
    clock = FakeClock()
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    s = ClusterState()
    with_window = dataclasses.replace(report("c1"), window=W1)
    s.ingest(a.heartbeat(with_window), clock())
    s.ingest(a.heartbeat(report("c1", Category.WATCHING)), clock())  # no window: unchanged since
    (c,) = s.container_status({})
    assert c.window == W1 and c.category is Category.WATCHING
    s.ingest(a.heartbeat(dataclasses.replace(report("c1"), window=W2)), clock())
    assert s.container_status({})[0].window == W2
    # Moved to b, whose agent has no window of it yet: the last one stands until b sends one.
    s.ingest(a.heartbeat(), clock())
    s.ingest(b.heartbeat(report("c1")), clock())
    (moved,) = s.container_status({})
    assert moved.worker == "b" and moved.window == W2
