"""specon.testing.builders: the shared snapshot and workload builders of the tests and benchmarks."""

from __future__ import annotations

import pytest

from specon import model as m
from specon.sim.cluster import JobPlan, WorkerSpec, Workload
from specon.sim.trace import Trace
from specon.testing.builders import (
    BIG,
    NOW,
    category,
    cluster,
    container,
    job_plan,
    snapshot,
    trace,
    worker,
    workload,
)


def test_worker_defaults_to_big_capacity_and_takes_every_field() -> None:
    assert worker("w") == m.WorkerSnapshot(m.WorkerId("w"), capacity=BIG)
    w = worker(
        "w", cpu=2.0, memory=3, gpu=0, usage=0.5, ready=False, heartbeat_age=7.0,
        labels={"zone": "a"}, taints=["x"],
    )  # fmt: skip
    assert w == m.WorkerSnapshot(
        m.WorkerId("w"), m.Resources(2.0, 3, 0), 0.5, ready=False, heartbeat_age=7.0,
        labels=(("zone", "a"),), taints=("x",),
    )  # fmt: skip
    assert worker("w", labels=[("zone", "a")]).labels == (("zone", "a"),)


def test_container_defaults_to_converged_without_requests() -> None:
    assert container("c", "w") == m.ContainerSnapshot(
        m.ContainerId("c"), m.WorkerId("w"), m.Category.CONVERGED
    )
    c = container(
        "c", "w", "PC", t_cc=1.0, migrated=True, t_migrated=2.0, migrations=1, rebalances=2,
        cpu=1.5, memory=4, gpu=1, selector={"zone": "a"}, tolerations=["t"], movable=False,
    )  # fmt: skip
    assert c == m.ContainerSnapshot(
        m.ContainerId("c"), m.WorkerId("w"), m.Category.PROGRESSING, t_cc=1.0, migrated=True, t_migrated=2.0,
        migrations=1, rebalances=2, requests=m.Resources(1.5, 4, 1), selector=(("zone", "a"),),
        tolerations=("t",), movable=False,
    )  # fmt: skip


@pytest.mark.parametrize("cat", list(m.Category))
def test_category_reads_members_short_names_and_values(cat: m.Category) -> None:
    assert category(cat) is cat
    assert category(cat.short) is cat
    assert category(cat.value) is cat


def test_an_unknown_category_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown category 'XX'"):
        category("XX")


def test_snapshot_freezes_its_inputs() -> None:
    ws, cs = [worker("a")], [container("c", "a")]
    assert snapshot(ws, cs) == m.ClusterSnapshot(NOW, (ws[0],), (cs[0],))
    assert snapshot([], now=5.0) == m.ClusterSnapshot(5.0, (), ())


def test_cluster_from_a_spec() -> None:
    s = cluster({"w0": ["PC", "CC"], "w1": [], "w2": [m.Category.WATCHING]})
    assert [w.id for w in s.workers] == ["w0", "w1", "w2"]
    assert all(w.capacity == BIG for w in s.workers)
    assert [(c.id, c.worker, c.category.short) for c in s.containers] == [
        ("w0-c0", "w0", "PC"),
        ("w0-c1", "w0", "CC"),
        ("w2-c0", "w2", "WC"),
    ]
    assert all(c.t_cc is None and not c.migrated and c.migrations == 0 for c in s.containers)
    assert s.now == NOW


def test_cluster_stamps_names_and_worker_factory() -> None:
    s = cluster(
        {"a": ["CC", "CC"], "b": ["CC"]},
        now=9.0,
        ids="c{i}{k}",
        t_cc=lambda i, k: 10.0 * i + k,
        migrated=True,
        t_migrated=lambda i, k: -1.0,
        migrations=1,
        make_worker=lambda w: worker(w, ready=False),
    )
    assert s.now == 9.0
    assert not any(w.ready for w in s.workers)
    assert [(c.id, c.t_cc, c.t_migrated) for c in s.containers] == [
        ("c00", 0.0, -1.0),
        ("c01", 1.0, -1.0),
        ("c10", 10.0, -1.0),
    ]
    assert all(c.migrated and c.migrations == 1 for c in s.containers)


def test_trace_job_plan_and_workload() -> None:
    t = trace([3.0, 2.0, 1.0], stride=5)
    assert t == Trace("m", 15, 1.0, (3.0, 2.0, 1.0), "test", 5)
    assert trace([1.0], model="x", cost=0.5, steps=7, source="s") == Trace("x", 7, 0.5, (1.0,), "s")
    assert job_plan("j", t) == JobPlan("j", "m", 0.0, t, 15, 1.0, m.WorkerId("w1"))
    assert job_plan("j", t, submit=2.0, steps=30, cost=0.1, worker=None) == JobPlan(
        "j", "m", 2.0, t, 30, 0.1, None
    )
    jobs = [job_plan("b", t, submit=1.0), job_plan("a", t, worker="w2")]
    wl = workload(2, jobs)
    assert wl == Workload((WorkerSpec(m.WorkerId("w1")), WorkerSpec(m.WorkerId("w2"))), tuple(jobs))
    assert [j.id for j in wl.jobs] == ["a", "b"]  # Workload's own submission order
    assert workload({"x": 2.0}, []).workers == (WorkerSpec(m.WorkerId("x"), 2.0),)
