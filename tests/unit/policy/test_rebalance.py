"""Algorithm 3 (rebalancing): trigger, paper and balanced modes, movability, feasibility."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specon.config import RebalanceConfig
from specon.model import ClusterSnapshot, ContainerId, Resources, WorkerId
from specon.policy.decisions import Move
from specon.policy.placement import fits
from specon.policy.rebalance import plan_rebalance, should_rebalance
from specon.testing import builders
from specon.testing.builders import container, snapshot, worker

TIMEOUT = 20.0
NOW = 1000.0


def _stamp(i: int, k: int) -> float:
    return 100.0 * i + k


def cluster(loads: list[int], *, ready: bool = True) -> ClusterSnapshot:
    """Workers w0.. with the given loads. Container wI-cK has t_cc = t_migrated = 100 I + K:
    a higher worker index or a higher K converged later, i.e. has a smaller d."""
    return builders.cluster(
        {f"w{i}": ["CC"] * n for i, n in enumerate(loads)},
        now=NOW,
        t_cc=_stamp,
        migrated=True,
        t_migrated=_stamp,
        make_worker=lambda w: worker(w, ready=ready),
    )


def plan(s: ClusterSnapshot, **cfg: object) -> list[Move]:
    return plan_rebalance(s, cfg=RebalanceConfig(**cfg), worker_timeout=TIMEOUT)  # type: ignore[arg-type]


def loads_after(s: ClusterSnapshot, moves: list[Move]) -> list[int]:
    where = {c.id: c.worker for c in s.containers}
    for m in moves:
        assert where[m.container] == m.source
        where[m.container] = m.target
    counts = Counter(where.values())
    return [counts[w.id] for w in s.workers]


CASES = [([3, 0, 0, 0], [1, 1, 1, 0]), ([5, 1, 1, 1], [2, 2, 2, 2]), ([8, 2, 2, 2], [4, 4, 3, 3])]


@pytest.mark.parametrize(("before", "after"), CASES)
def test_paper_mode_never_acts_on_the_spec_examples(before: list[int], after: list[int]) -> None:
    assert plan(cluster(before), mode="paper") == []


@pytest.mark.parametrize(("before", "after"), CASES)
def test_balanced_mode_evens_the_spec_examples(before: list[int], after: list[int]) -> None:
    s = cluster(before)
    moves = plan(s, mode="balanced")
    assert loads_after(s, moves) == after
    assert all(m.reason == "rebalance" and m.scores == {} for m in moves)


def test_balanced_moves_the_smallest_d_of_the_most_loaded_worker() -> None:
    # w0-c2 has the latest t_cc on w0, so the smallest d.
    s = cluster([3, 0])
    assert plan(s) == [Move(ContainerId("w0-c2"), WorkerId("w0"), WorkerId("w1"), "rebalance")]


def test_balanced_breaks_ties_among_most_loaded_workers_by_smallest_d() -> None:
    # w0 and w1 both hold 3; w1's containers converged later (smaller d) -> w1 gives first.
    s = cluster([3, 3, 0])
    moves = plan(s)
    assert moves[0] == Move(ContainerId("w1-c2"), WorkerId("w1"), WorkerId("w2"), "rebalance")
    assert loads_after(s, moves) == [2, 2, 2]


def test_duration_from_migrated_uses_the_migrated_stamp() -> None:
    s = cluster([3, 0])
    # Reverse the migrated stamps: now w0-c0 was marked most recently (smallest d).
    s = replace(s, containers=tuple(replace(c, t_migrated=500.0 - i) for i, c in enumerate(s.containers)))
    assert plan(s, duration_from="migrated")[0].container == "w0-c0"
    assert plan(s, duration_from="converged")[0].container == "w0-c2"


def test_equal_d_breaks_ties_by_container_id() -> None:
    s = cluster([3, 0])
    same = tuple(replace(c, t_cc=7.0) for c in reversed(s.containers))
    assert plan(replace(s, containers=same))[0].container == "w0-c0"


def test_containers_without_d_or_already_rebalanced_stay() -> None:
    s = cluster([4, 0])
    c0, c1, c2, c3 = s.containers
    s = replace(
        s,
        containers=(c0, replace(c1, t_cc=None), replace(c2, rebalances=1), replace(c3, t_cc=float("nan"))),
    )
    assert [m.container for m in plan(s)] == ["w0-c0"]
    # Raising the limit makes w0-c2 movable again (and it has the smaller d).
    assert [m.container for m in plan(s, max_rebalances_per_container=2)] == ["w0-c2", "w0-c0"]


def test_balanced_stops_when_the_most_loaded_worker_has_nothing_movable() -> None:
    s = cluster([5, 4, 0])
    s = replace(s, containers=tuple(c if c.worker == "w1" else replace(c, t_cc=None) for c in s.containers))
    assert plan(s) == []


def test_a_target_that_cannot_host_is_skipped() -> None:
    s = cluster([3, 0, 0])
    s = replace(s, workers=(s.workers[0], replace(s.workers[1], taints=("drain",)), s.workers[2]))
    moves = plan(s)
    # w1 never takes one; after [2, 0, 1] only w1 is at most max - 2, so the rest are dropped.
    assert [m.target for m in moves] == ["w2"]
    assert loads_after(s, moves) == [2, 0, 1]


def test_a_full_worker_is_skipped_and_resource_use_is_tracked_across_moves() -> None:
    # w1 has room for exactly one 1-core container, w2 for plenty.
    s = cluster([6, 0, 0])
    s = replace(
        s,
        workers=(s.workers[0], replace(s.workers[1], capacity=Resources(1.0, 1 << 40)), s.workers[2]),
        containers=tuple(replace(c, requests=Resources(1.0)) for c in s.containers),
    )
    moves = plan(s)
    assert loads_after(s, moves) == [3, 1, 2]
    assert Counter(m.target for m in moves) == {"w1": 1, "w2": 2}


def test_unready_and_unreachable_workers_are_left_out_of_w() -> None:
    s = cluster([4, 0, 0, 6])
    s = replace(
        s,
        workers=(
            s.workers[0],
            replace(s.workers[1], ready=False),
            s.workers[2],
            replace(s.workers[3], heartbeat_age=TIMEOUT),
        ),
    )
    moves = plan(s)
    assert {m.target for m in moves} == {"w2"}
    assert {m.source for m in moves} == {"w0"}
    assert loads_after(s, moves) == [2, 0, 2, 6]
    # Paper mode over W = {w0, w2}: bf = 4 // 2 = 2, idle w2 takes one.
    assert loads_after(s, plan(s, mode="paper")) == [3, 0, 1, 6]


def test_paper_idle_branch_gives_each_idle_worker_the_next_smallest_d() -> None:
    # bf = 9 // 5 = 1: each idle worker takes one; D is shared, so each gets a different one.
    s = cluster([5, 4, 0, 0, 0])
    moves = plan(s, mode="paper")
    # Smallest d overall: w1's latest (w1-c3), then w1-c2, then w1-c1.
    assert [(m.container, m.target) for m in moves] == [("w1-c3", "w2"), ("w1-c2", "w3"), ("w1-c1", "w4")]


def test_paper_idle_branch_needs_bf_above_zero() -> None:
    assert plan(cluster([1, 1, 1, 0, 0]), mode="paper") == []  # bf = 3 // 5 = 0


def test_paper_busy_branch_fills_targets_below_bf_minus_one_from_non_targets() -> None:
    # sum 14, |W| 4 -> bf 3; targets: |w| < 2 -> w2, w3 (load 1 each).
    s = cluster([6, 6, 1, 1])
    moves = plan(s, mode="paper")
    # Smallest d on non-target workers: w1-c5 then w1-c4 (w1's stamps are later than w0's).
    assert [(m.container, m.source, m.target) for m in moves] == [
        ("w1-c5", "w1", "w2"),
        ("w1-c4", "w1", "w3"),
    ]
    assert loads_after(s, moves) == [6, 4, 2, 2]


def test_paper_mode_takes_the_smallest_d_container_that_fits() -> None:
    s = cluster([4, 4, 0])
    big = {"w1-c3"}  # the smallest d overall, but too big for w2
    s = replace(
        s,
        workers=(s.workers[0], s.workers[1], replace(s.workers[2], capacity=Resources(2.0, 1 << 40))),
        containers=tuple(replace(c, requests=Resources(4.0 if c.id in big else 1.0)) for c in s.containers),
    )
    assert [m.container for m in plan(s, mode="paper")] == ["w1-c2"]


def test_mode_off_plans_nothing() -> None:
    assert plan(cluster([9, 0]), mode="off") == []


def test_no_eligible_worker_plans_nothing() -> None:
    assert plan(cluster([3, 0], ready=False)) == []
    assert plan(snapshot([], now=NOW)) == []


def test_containers_on_unknown_workers_are_ignored() -> None:
    s = cluster([3, 0])
    orphan = replace(s.containers[0], id=ContainerId("orphan"), worker=WorkerId("gone"), t_cc=999.0)
    s = replace(s, containers=(*s.containers, orphan))
    assert [m.container for m in plan(s)] == ["w0-c2"]


def test_should_rebalance_triggers() -> None:
    s = cluster([2, 1])
    cfg = RebalanceConfig(when="all_migrated")
    assert should_rebalance(s, cfg)  # all migrated
    not_all = replace(s, containers=(replace(s.containers[0], migrated=False), *s.containers[1:]))
    assert not should_rebalance(not_all, cfg)
    assert should_rebalance(not_all, RebalanceConfig(when="always"))
    assert not should_rebalance(cluster([0, 0]), cfg)  # nothing live, nothing to do
    assert not should_rebalance(s, RebalanceConfig(mode="off", when="always"))


def test_plan_ignores_container_order_in_the_snapshot() -> None:
    s = cluster([7, 3, 0, 1, 0])
    shuffled = list(s.containers)
    random.Random(4).shuffle(shuffled)
    for mode in ("balanced", "paper"):
        assert plan(s, mode=mode) == plan(replace(s, containers=tuple(shuffled)), mode=mode)


# -- properties ---------------------------------------------------------------------


@st.composite
def _cluster(draw: st.DrawFn) -> ClusterSnapshot:
    n_workers = draw(st.integers(1, 7))
    workers = [
        worker(
            f"w{i}",
            cpu=draw(st.sampled_from([2.0, 4.0, 64.0])),
            memory=1 << 40,
            gpu=draw(st.sampled_from([0, 4])),
            ready=draw(st.sampled_from([True, True, True, False])),
            heartbeat_age=draw(st.sampled_from([0.0, 0.0, 0.0, 30.0])),
            taints=draw(st.sampled_from([(), (), (), ("x",)])),
        )
        for i in range(n_workers)
    ]
    containers = []
    for i in range(n_workers):
        for k in range(draw(st.integers(0, 9))):
            containers.append(
                container(
                    f"w{i}-c{k}",
                    f"w{i}",
                    "CC",
                    t_cc=draw(st.one_of(st.none(), st.sampled_from([1.0, 2.0, 3.0]), st.floats(0, NOW))),
                    rebalances=draw(st.sampled_from([0, 0, 0, 1])),
                    cpu=draw(st.sampled_from([0.0, 0.5, 1.0])),
                    gpu=draw(st.sampled_from([0, 0, 1])),
                    tolerations=draw(st.sampled_from([(), ("x",)])),
                )
            )
    return snapshot(workers, containers, now=NOW)


def _eligible_spread(s: ClusterSnapshot, where: dict[ContainerId, WorkerId]) -> int:
    eligible = [w.id for w in s.workers if w.ready and w.heartbeat_age < TIMEOUT]
    counts = Counter(where.values())
    loads = [counts[w] for w in eligible]
    return max(loads) - min(loads) if loads else 0


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(s=_cluster(), mode=st.sampled_from(["balanced", "paper"]))
def test_plans_are_feasible_deterministic_and_move_each_container_once(s: ClusterSnapshot, mode: str) -> None:
    moves = plan(s, mode=mode)
    assert moves == plan(s, mode=mode)
    assert len({m.container for m in moves}) == len(moves)
    by_id = {c.id: c for c in s.containers}
    where = {c.id: c.worker for c in s.containers}
    spread = _eligible_spread(s, where)
    for m in moves:
        c = by_id[m.container]
        assert c.rebalances < 1 and c.t_cc is not None
        assert where[m.container] == m.source != m.target
        target = s.worker(m.target)
        assert target.ready and target.heartbeat_age < TIMEOUT
        used = sum((by_id[x].requests for x, w in where.items() if w == m.target), Resources())
        assert fits(c, target, used)
        where[m.container] = m.target
        if mode == "balanced":
            new_spread = _eligible_spread(s, where)
            assert new_spread <= spread
            spread = new_spread


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(loads=st.lists(st.integers(0, 12), min_size=1, max_size=8))
def test_balanced_reaches_spread_one_when_everything_can_move(loads: list[int]) -> None:
    s = cluster(loads)
    after = loads_after(s, plan(s))
    assert max(after) - min(after) <= 1
    assert sum(after) == sum(loads)


def test_a_job_that_opted_out_of_moves_is_never_rebalanced() -> None:
    s = cluster([3, 0])
    pinned = tuple(replace(c, movable=False) for c in s.containers)
    assert plan(replace(s, containers=pinned)) == []
