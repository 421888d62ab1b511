"""The manager's decision pass, shared with the simulator: budget, order, one decision, rebalance gate."""

from __future__ import annotations

import dataclasses

from specon.config import Policy, RebalanceConfig, default_policy
from specon.model import Category, ClusterSnapshot, ContainerId, WorkerId
from specon.policy.decisions import Move, RefusalReason, Stay
from specon.policy.scheduler import InFlight, decide_pass
from specon.testing import builders
from specon.testing.builders import worker

PC, CC = Category.PROGRESSING, Category.CONVERGED


def snap(*loads: list[Category], migrated: bool = False, now: float = 100.0) -> ClusterSnapshot:
    """Workers w0.. (no capacity: nothing here requests any) holding containers cIJ, t_cc = 50 + J."""
    return builders.cluster(
        {f"w{i}": cats for i, cats in enumerate(loads)},
        now=now,
        ids="c{i}{k}",
        t_cc=lambda i, k: 50.0 + k,
        migrated=migrated,
        migrations=int(migrated),
        make_worker=lambda w: worker(w, cpu=0.0, memory=0, gpu=0),
    )


def pol(**migration: int) -> Policy:
    p = default_policy()
    return dataclasses.replace(p, migration=dataclasses.replace(p.migration, **migration))


C = ContainerId


def test_one_decision_per_pass_the_rest_wait() -> None:
    s = snap([CC, CC, PC], [])
    p = decide_pass(s, requests=[C("c00"), C("c01")], in_flight=[], policy=pol())
    assert isinstance(p.decision, Move) and p.decision.container == "c00" and p.decision.target == "w1"
    assert p.deferred == ("c01",) and p.answered == ("c00",)
    assert p.rebalance is None  # requests wait: no rebalancing in the same pass


def test_stay_when_the_source_scores_lowest() -> None:
    p = decide_pass(snap([CC], [PC, PC]), requests=[C("c00")], in_flight=[], policy=pol())
    assert isinstance(p.decision, Stay)


def test_containers_in_flight_are_dropped_and_budget_defers() -> None:
    s = snap([CC, CC, PC], [], [])
    flights = [InFlight(C("c00"), WorkerId("w0"), WorkerId("w1"))]
    p = decide_pass(s, requests=[C("c00"), C("c01")], in_flight=flights, policy=pol(max_concurrent=2))
    assert p.dropped == ("c00",)
    # w0 already takes part in one migration (per-worker limit 1): c01 waits.
    assert p.deferred == ("c01",) and p.decision is None
    p = decide_pass(s, requests=[C("c01")], in_flight=flights, policy=pol(max_concurrent=1))
    assert p.deferred == ("c01",)


def test_a_busy_target_defers_the_move() -> None:
    s = snap([CC, PC], [], [CC, PC])
    flights = [InFlight(C("c20"), WorkerId("w2"), WorkerId("w1"))]
    p = decide_pass(s, requests=[C("c00")], in_flight=flights, policy=pol(max_concurrent=3))
    assert p.decision is None and p.deferred == ("c00",)


def test_refusals_do_not_end_the_pass() -> None:
    s = snap([CC, CC, PC], [])
    p = decide_pass(s, requests=[C("nope"), C("c00")], in_flight=[], policy=pol())
    assert [r.reason for r in p.refused] == [RefusalReason.UNKNOWN_CONTAINER]
    assert p.decision is not None and p.decision.container == "c00"


def test_rebalance_only_when_idle_and_triggered() -> None:
    s = snap([CC, CC, CC], [], migrated=True)
    p = decide_pass(s, requests=[], in_flight=[], policy=pol())
    assert p.rebalance is not None and p.rebalance.target == "w1" and p.rebalance.reason == "rebalance"
    flights = [InFlight(C("x"), WorkerId("w0"), WorkerId("w1"))]
    assert decide_pass(s, requests=[], in_flight=flights, policy=pol()).rebalance is None
    off = dataclasses.replace(default_policy(), rebalance=RebalanceConfig(mode="off"))
    assert decide_pass(s, requests=[], in_flight=[], policy=off).rebalance is None
