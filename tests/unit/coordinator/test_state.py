"""ClusterState: the manager's picture of the cluster built from heartbeats (no I/O, no clock)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specon.coordinator.migration import Mark, Migration, State
from specon.coordinator.state import ClusterState
from specon.model import Category, ContainerId, Resources, WorkerId
from specon.wire.gpu import GpuUse
from tests.unit.manager_fakes import START, FakeAgent, FakeClock, report

CC, PC, WC = Category.CONVERGED, Category.PROGRESSING, Category.WATCHING
A, B = WorkerId("a"), WorkerId("b")
C1 = ContainerId("c1")
TIMEOUT = 20.0


_PATH = {
    State.SAVING: (State.SAVING,),
    State.SAVED: (State.SAVING, State.SAVED),
    State.RESTORING: (State.SAVING, State.SAVED, State.RESTORING),
    State.FAILED: (State.SAVING, State.FAILED),
}


def _migration(state: State) -> Migration:
    """c1 moving a -> b, walked legally to ``state``."""
    m = Migration("m1", C1, A, B, "converged", State.DECIDED, START, START)
    for s in _PATH[state]:
        m = m.to(s, at=START)
    return m


def test_a_reordered_heartbeat_is_ignored_and_counted() -> None:
    clock = FakeClock()
    a = FakeAgent("a", clock)
    old = a.heartbeat(report("c1", PC), usage=0.2)
    new = a.heartbeat(report("c1", WC), usage=0.7)
    s = ClusterState()
    assert s.ingest(new, clock())
    clock.advance(1.0)
    assert not s.ingest(old, clock())  # arrives late: older seq
    assert not s.ingest(new, clock())  # a repeat of the same seq is stale too
    assert s.stale_heartbeats == 2 and s.heartbeats == 1
    assert s.workers[A].usage == 0.7
    assert s.workers[A].last_seen == START
    assert s.containers[C1].report.category is WC


@settings(max_examples=50, deadline=None)
@given(st.permutations(range(6)))
def test_whatever_the_arrival_order_the_newest_heartbeat_wins(order: list[int]) -> None:
    clock = FakeClock()
    a = FakeAgent("a", clock)
    beats = [a.heartbeat(report("c1", PC), usage=i / 10) for i in range(6)]
    s = ClusterState()
    for i in order:
        s.ingest(beats[i], clock())
    assert s.workers[A].usage == 0.5 and s.workers[A].seq == 6


def test_agent_clock_skew_is_translated_for_t_cc() -> None:
    clock = FakeClock()
    ahead = FakeAgent("a", clock, skew=3600.0)  # agent clock an hour ahead of the manager's
    converged_at = ahead.now() - 40.0  # the agent stamped t_cc 40 s ago, on its own clock
    s = ClusterState()
    s.ingest(ahead.heartbeat(report("c1", CC, t_cc=converged_at)), clock())
    snap = s.snapshot(clock(), timeout=TIMEOUT, marks={})
    assert snap.containers[0].t_cc == START - 40.0
    assert s.container_status({})[0].t_cc == START - 40.0


def test_t_cc_survives_a_move_to_an_agent_that_reports_none() -> None:
    clock = FakeClock()
    a, b = FakeAgent("a", clock, skew=-7.0), FakeAgent("b", clock)
    s = ClusterState()
    s.ingest(a.heartbeat(report("c1", CC, t_cc=a.now() - 10.0)), clock())
    clock.advance(30.0)
    s.ingest(b.heartbeat(report("c1", CC, migrated=True)), clock())
    assert s.containers[C1].worker == B
    assert s.containers[C1].t_cc == START - 10.0


def test_a_container_missing_from_its_workers_heartbeat_becomes_stopped() -> None:
    clock = FakeClock()
    a = FakeAgent("a", clock)
    s = ClusterState()
    s.ingest(a.heartbeat(report("c1"), report("c2")), clock())
    s.ingest(a.heartbeat(report("c2")), clock())
    assert s.containers[C1].report.phase == "stopped"
    assert s.running_on(C1) is None
    assert s.running_on(ContainerId("c2")) == A
    assert [c.id for c in s.snapshot(clock(), timeout=TIMEOUT, marks={}).containers] == ["c2"]
    assert s.worker_status(clock(), TIMEOUT)[0].containers == ("c2",)


def test_the_old_hosts_stale_stopped_entry_does_not_hide_the_new_running_copy() -> None:
    clock = FakeClock()
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    s = ClusterState()
    s.ingest(a.heartbeat(report("c1")), clock())
    s.ingest(b.heartbeat(report("c1", CC, migrated=True)), clock())
    s.ingest(a.heartbeat(report("c1", phase="stopped")), clock())
    assert s.running_on(C1) == B
    # And a leaves it out altogether later: still running on b.
    s.ingest(a.heartbeat(), clock())
    assert s.running_on(C1) == B


def test_a_job_its_gpu_sharing_suspended_keeps_its_place_and_stays() -> None:
    clock = FakeClock()
    a = FakeAgent("a", clock)
    s = ClusterState()
    gone = dataclasses.replace(report("c1", phase="stopped"), requests=Resources(gpu=1))
    suspended = dataclasses.replace(gone, gpu=GpuUse(devices=(0,), memory=2**30, state="suspended"))
    s.ingest(a.heartbeat(suspended), clock())
    (view,) = s.snapshot(clock(), timeout=TIMEOUT, marks={}).containers
    assert (view.id, view.worker, view.requests.gpu, view.movable) == (C1, A, 1, False)
    s.ingest(a.heartbeat(gone), clock())  # resumed elsewhere or ended: no longer held here
    assert s.snapshot(clock(), timeout=TIMEOUT, marks={}).containers == ()


def test_finished_containers_leave_the_snapshot() -> None:
    clock = FakeClock()
    a = FakeAgent("a", clock)
    s = ClusterState()
    s.ingest(a.heartbeat(report("c1", CC, phase="finished")), clock())
    assert s.finished(C1)
    assert s.snapshot(clock(), timeout=TIMEOUT, marks={}).containers == ()
    assert s.containers[C1].finished_at == START


def test_category_history_grows_only_on_change() -> None:
    clock = FakeClock()
    a = FakeAgent("a", clock)
    s = ClusterState()
    for cat in (PC, PC, WC, WC, CC, PC):
        s.ingest(a.heartbeat(report("c1", cat)), clock())
        clock.advance(30.0)
    history = s.container_status({})[0].history
    assert [c for _, c in history] == [PC, WC, CC, PC]
    assert [t for t, _ in history] == [START, START + 60.0, START + 120.0, START + 150.0]


def test_in_flight_containers_count_on_their_target_until_the_migration_fails() -> None:
    clock = FakeClock()
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    s = ClusterState()
    s.ingest(b.heartbeat(), clock())
    s.ingest(a.heartbeat(report("c1", CC), report("c2")), clock())
    marks = {C1: Mark(C1, migrated_at=START, migrations=1)}
    for state in (State.SAVING, State.SAVED, State.RESTORING):
        snap = s.snapshot(clock(), timeout=TIMEOUT, marks=marks, in_flight=[_migration(state)])
        assert [c.id for c in snap.on(B)] == ["c1"], state
        assert [c.id for c in snap.on(A)] == ["c2"], state
    # Saved: c1 has stopped on a and is running nowhere, yet it still counts (on b).
    s.ingest(a.heartbeat(report("c2")), clock())
    snap = s.snapshot(clock(), timeout=TIMEOUT, marks=marks, in_flight=[_migration(State.SAVED)])
    moved = snap.on(B)
    assert [c.id for c in moved] == ["c1"]
    assert moved[0].category is CC and moved[0].migrated and moved[0].migrations == 1
    snap = s.snapshot(clock(), timeout=TIMEOUT, marks=marks, in_flight=[_migration(State.FAILED)])
    assert snap.on(B) == ()


def test_marks_freeze_a_container_in_cc_in_the_snapshot() -> None:
    clock = FakeClock()
    a = FakeAgent("a", clock)
    s = ClusterState()
    s.ingest(a.heartbeat(report("c1", PC)), clock())
    c = s.snapshot(clock(), timeout=TIMEOUT, marks={C1: Mark(C1, START - 5.0, 1, 1)}).containers[0]
    assert (c.category, c.migrated, c.t_migrated, c.migrations, c.rebalances) == (CC, True, START - 5.0, 1, 1)
    status = s.container_status({C1: Mark(C1, START - 5.0, 1, 1)})[0]
    assert status.migrated and status.category is PC  # the status shows what the agent reports


def test_reachability_follows_heartbeat_age_and_goodbye() -> None:
    clock = FakeClock()
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    s = ClusterState()
    s.ingest(a.heartbeat(), clock())
    clock.advance(TIMEOUT - 1.0)
    s.ingest(b.heartbeat(), clock())
    assert s.alive(clock(), TIMEOUT) == {A, B}
    clock.advance(1.0)
    assert s.alive(clock(), TIMEOUT) == {B}
    status = {w.id: w for w in s.worker_status(clock(), TIMEOUT)}
    assert not status[A].reachable and status[A].heartbeat_age == TIMEOUT
    s.goodbye(B)
    assert s.alive(clock(), TIMEOUT) == frozenset()
    snap = s.snapshot(clock(), timeout=TIMEOUT, marks={})
    assert [w.ready for w in snap.workers] == [True, False]
    # A restarted agent is welcome back.
    s.ingest(b.heartbeat(), clock())
    assert s.alive(clock(), TIMEOUT) == {B}


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2),  # worker
            st.lists(
                st.tuples(st.integers(0, 5), st.sampled_from(list(Category)), st.booleans()), max_size=4
            ),
            st.floats(0.0, 3.0),  # seconds before this heartbeat
        ),
        max_size=25,
    )
)
def test_the_incremental_view_is_the_snapshot_built_from_scratch(
    beats: list[tuple[int, list[tuple[int, Category, bool]], float]],
) -> None:
    """``view`` rebuilds only what changed; it must always equal ``snapshot`` (up to order)."""
    clock = FakeClock()
    agents = [FakeAgent(f"w{i}", clock) for i in range(3)]
    state = ClusterState()
    marks: dict[ContainerId, Mark] = {}
    for w, containers, dt in beats:
        clock.advance(dt)
        reps = {
            c: report(f"c{c}", cat, t_cc=START - 100.0 * c if mig else None) for c, cat, mig in containers
        }
        state.ingest(agents[w].heartbeat(*reps.values()), clock())
        view = state.view(clock(), marks=marks)
        full = state.snapshot(clock(), timeout=20.0, marks=marks)
        assert sorted(view.containers, key=lambda c: c.id) == list(full.containers)
        assert view.workers == full.workers
