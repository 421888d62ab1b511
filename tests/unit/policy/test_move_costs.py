"""The learned move costs (specon.policy.move_costs) and their use by the work model."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from specon.config import Policy, default_policy, peer_priority
from specon.model import RUNTIME_LABEL, ContainerId, ContainerSnapshot, Resources
from specon.policy import work
from specon.policy.decisions import Move, Stay
from specon.policy.move_costs import (
    DEFAULT_BACKEND,
    MAX_BUCKET,
    MAX_CELLS,
    MoveCosts,
    Observation,
    backend_of,
    bucket_name,
    size_bucket,
)
from specon.policy.scheduler import costs_of, decide_pass, learner_of
from specon.testing.builders import container, snapshot, worker

GIB = 1 << 30
NOW = 1000.0


def _down(backend: str, x: float, bucket: int = 0) -> Observation:
    return Observation(backend, bucket, downtime=x)


def test_without_observations_the_estimate_is_the_prior() -> None:
    costs = MoveCosts(8.4, 2.5, weight=5)
    e = costs.estimate("local", 0)
    assert (e.downtime, e.restore_cpu, e.moves) == (8.4, 2.5, 0)


def test_the_estimate_is_the_shrinkage_mean_with_the_prior_as_pseudo_moves() -> None:
    costs = MoveCosts(8.4, 2.5, weight=5)
    for x in (1.0, 2.0, 3.0):
        costs.observe(_down("local", x))
    # Backend: (5 * 8.4 + 6) / 8 = 6.0; the cell shrinks to that: (5 * 6 + 6) / 8 = 4.5.
    e = costs.estimate("local", 0)
    assert e.downtime == pytest.approx(4.5)
    assert e.restore_cpu == 2.5  # no restore CPU measured: it stays at its prior
    assert e.moves == 3
    # Many moves outweigh the prior (the window keeps the last 50): the backend's
    # (5 * 8.4 + 50) / 55, the cell's (5 * that + 50) / 55.
    for _ in range(200):
        costs.observe(_down("local", 1.0))
    backend = (5 * 8.4 + 50) / 55
    assert costs.estimate("local", 0).downtime == pytest.approx((5 * backend + 50) / 55)


def test_a_new_job_size_on_a_known_backend_starts_from_that_backend() -> None:
    costs = MoveCosts(8.4, 2.5, weight=1)
    for _ in range(9):
        costs.observe(_down("docker", 2.0, bucket=0))
    known = costs.estimate("docker", 0).downtime
    new_size = costs.estimate("docker", 3).downtime
    assert new_size == pytest.approx((8.4 + 18.0) / 10)  # the backend's own estimate
    assert known < new_size < 8.4
    assert costs.estimate("kubernetes", 0).downtime == 8.4  # another backend: the prior


def test_bad_observations_are_counted_and_never_learned() -> None:
    costs = MoveCosts(8.4, 2.5)
    for bad in (math.nan, math.inf, -1.0, 1e9):
        assert costs.observe(_down("local", bad)) is None
    assert costs.observe(Observation("local", 0)) is None  # nothing measured
    assert costs.skipped == 5
    assert costs.cells() == {}
    assert costs.estimate("local", 0).downtime == 8.4


def test_learning_off_keeps_the_policy_figures() -> None:
    costs = MoveCosts(8.4, 2.5, learn=False)
    assert costs.observe(_down("local", 1.0)) is None
    assert costs.estimate("local", 0).downtime == 8.4


def test_memory_is_bounded_per_cell_and_in_cells() -> None:
    costs = MoveCosts(8.4, 2.5, weight=0, window=4)
    for x in (100.0, 100.0, 1.0, 1.0, 1.0, 1.0):  # only the last 4 count
        costs.observe(_down("local", x))
    assert costs.estimate("local", 0).downtime == pytest.approx(1.0)
    for i in range(MAX_CELLS + 10):
        costs.observe(_down(f"b{i}", 1.0))
    assert len(costs.cells()) == MAX_CELLS
    assert costs.skipped > 0


def test_the_estimate_is_deterministic_and_restore_cpu_learns_where_measured() -> None:
    def run() -> tuple[float, float]:
        c = MoveCosts(3.1, 0.34, weight=2)
        for i in range(30):
            c.observe(Observation("local", i % 3, downtime=1.0 + i * 0.1, restore_cpu=0.5))
        e = c.estimate("local", 1)
        return e.downtime, e.restore_cpu

    assert run() == run()
    assert run()[1] > 0.34


def test_size_buckets_backends_and_their_names() -> None:
    assert size_bucket(0) == 0 and size_bucket(GIB - 1) == 0
    assert size_bucket(GIB) == 1 and size_bucket(3 * GIB) == 2 and size_bucket(1 << 60) == MAX_BUCKET
    assert [bucket_name(b) for b in (0, 1, 2, MAX_BUCKET)] == ["<1GiB", "1-2GiB", "2-4GiB", ">=128GiB"]
    assert backend_of({RUNTIME_LABEL: "docker"}) == "docker"
    assert backend_of(((RUNTIME_LABEL, "kubernetes"),)) == "kubernetes"
    assert backend_of({}) == DEFAULT_BACKEND


def _srpt() -> Policy:
    """The shipped policy with shortest remaining work first on the node (the work model's
    arithmetic below assumes it)."""
    return replace(default_policy(), priority=peer_priority("srpt"))


def _job(cid: str, wid: str, left: float, memory: int = 0) -> ContainerSnapshot:
    c = replace(container(cid, wid, "PC"), remaining_work=left, since=0.0)
    return replace(c, requests=Resources(cpu=0.0, memory=memory))


def test_the_work_model_charges_what_was_learned_for_the_target_and_size() -> None:
    # Moving x (40 s) off a worker where y (30 s) runs first saves x its 30 s wait: worth it
    # at a 3 s downtime, not at a learned 35 s onto docker workers.
    docker = worker("b", cpu=1, labels={RUNTIME_LABEL: "docker"})
    snap = snapshot([worker("a", cpu=1), docker], [_job("x", "a", 40.0), _job("y", "a", 30.0)], now=NOW)
    policy = _srpt()
    move = Move(ContainerId("x"), "a", "b", reason="rebalance")  # type: ignore[arg-type]
    static = costs_of(policy)
    before = work.move_gain(snap, move, static)
    assert before is not None and before > 0
    learned = learner_of(policy)
    for _ in range(50):
        learned.observe(_down("docker", 35.0))
    after = work.move_gain(snap, move, costs_of(policy, learned))
    assert after is not None and after < 0
    # The same learning on another backend leaves this move's cost alone.
    other = learner_of(policy)
    for _ in range(50):
        other.observe(_down("kubernetes", 35.0))
    assert work.move_gain(snap, move, costs_of(policy, other)) == pytest.approx(before)
    # learn_costs: false ignores what was learned.
    off = replace(policy, migration=replace(policy.migration, learn_costs=False))
    assert work.move_gain(snap, move, costs_of(off, learned)) == pytest.approx(before)


def test_the_gate_follows_the_learned_costs() -> None:
    cc = replace(container("c", "a", "CC", t_cc=NOW - 100), remaining_work=20.0, since=0.0)
    snap = snapshot(
        [worker("a", cpu=1), worker("b", cpu=1)],
        [cc, _job("p1", "a", 500.0), _job("p2", "a", 500.0)],
        now=NOW,
    )
    policy = _srpt()
    cheap = decide_pass(snap, requests=[ContainerId("c")], in_flight=[], policy=policy, rebalance=False)
    assert isinstance(cheap.decision, Move)
    learned = learner_of(policy)
    for _ in range(50):
        learned.observe(_down(DEFAULT_BACKEND, 200.0))
    dear = decide_pass(
        snap, requests=[ContainerId("c")], in_flight=[], policy=policy, rebalance=False, learned=learned
    )
    assert isinstance(dear.decision, Stay)
