"""The MB-ASGD allocation policies (Section IV): KNEE, HELL, filling, the baselines, moldable."""

from __future__ import annotations

import math
import random

import pytest

from specon.sim.asgd.allocation import MOLDABLE_POLICIES, POLICIES, JobView, Settings, SpeedCurve, allocate
from specon.sim.asgd.dnn import ALEXNET, TABLE_III, VGG19
from specon.sim.asgd.mva import MIN_NODES

CURVES = {m.name: SpeedCurve.from_times(m.service_times(), 100) for m in TABLE_III}


def _linear(n: int) -> SpeedCurve:
    # Perfect scaling: w - 1 workers, one second per step per worker.
    return SpeedCurve([math.inf, math.inf] + [1.0 / (w - 1) for w in range(2, n + 1)])


def _random_jobs(rng: random.Random, count: int) -> list[JobView]:
    names = list(CURVES)
    return [
        JobView(i, rng.uniform(1, 1e5), CURVES[rng.choice(names)], done=rng.uniform(0, 0.99))
        for i in range(count)
    ]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("gamma", [0.0, 1.05])
def test_malleable_never_overallocates_and_respects_the_minimum(policy: str, gamma: float) -> None:
    rng = random.Random(hash((policy, gamma)) % 1000)
    for _ in range(60):
        nodes = rng.randrange(0, 120)
        jobs = _random_jobs(rng, rng.randrange(0, 40))
        out = allocate(jobs, nodes, Settings(policy, gamma=gamma))  # type: ignore[arg-type]
        assert set(out) == {j.id for j in jobs}
        assert sum(out.values()) <= nodes
        assert all(w == 0 or w >= MIN_NODES for w in out.values())
        if jobs and nodes >= MIN_NODES:
            assert any(out.values())  # a work-conserving policy runs someone


@pytest.mark.parametrize("policy", MOLDABLE_POLICIES)
def test_moldable_keeps_running_jobs_and_never_overallocates(policy: str) -> None:
    rng = random.Random(5)
    for _ in range(60):
        jobs = _random_jobs(rng, rng.randrange(1, 30))
        nodes = 100
        held, free = [], nodes
        for j in jobs:
            w = rng.choice([0, 0, 2, 5, 12])
            if w <= free:
                free -= w
                held.append(JobView(j.id, j.remaining, j.curve, j.done, w))
            else:
                held.append(j)
        out = allocate(held, nodes, Settings(policy, "moldable"), load=rng.uniform(0, 1))  # type: ignore[arg-type]
        assert sum(out.values()) <= nodes
        for j in held:
            if j.nodes:
                assert out[j.id] == j.nodes
            else:
                assert out[j.id] == 0 or out[j.id] >= MIN_NODES


def test_moldable_waits_for_its_ideal_count() -> None:
    c = CURVES["VGG19"]
    ideal = c.hell(100)
    running = JobView(0, 10.0, c, nodes=100 - ideal + 1)
    waiting = JobView(1, 10.0, c)
    out = allocate([running, waiting], 100, Settings("hell", "moldable"))
    assert out[1] == 0  # one node short: it waits rather than starting smaller
    out = allocate([JobView(0, 10.0, c, nodes=100 - ideal), waiting], 100, Settings("hell", "moldable"))
    assert out[1] == ideal


def test_moldable_knee_takes_fewer_nodes_at_high_load() -> None:
    job = [JobView(0, 1000.0, CURVES["VGG19"])]
    low = allocate(job, 100, Settings("knee", "moldable"), load=0.05)[0]
    high = allocate(job, 100, Settings("knee", "moldable"), load=0.9)[0]
    assert low > high >= MIN_NODES


def test_knee_takes_more_nodes_as_alpha_falls() -> None:
    job = [JobView(0, 1000.0, CURVES["VGG19"])]
    counts = [
        allocate(job, 100, Settings("knee", alpha=a, filling=False))[0] for a in (0.3, 0.1, 0.01, 0.0001)
    ]
    assert counts == sorted(counts) and counts[0] < counts[-1]
    c = CURVES["VGG19"]
    k = c.knee(0.05, 100)
    assert c.delta(k) >= 0.05 > c.delta(k + 1)


def test_knee_on_linear_scaling_takes_the_budget() -> None:
    # Every node helps, by at least 1 %, up to 100 nodes: the knee is the whole budget.
    assert allocate([JobView(0, 50.0, _linear(60))], 40, Settings("knee", filling=False))[0] == 40


def test_hell_minimises_service_over_efficiency() -> None:
    c = CURVES["AlexNet"]
    w = allocate([JobView(0, 1.0, c)], 100, Settings("hell", filling=False))[0]
    metric = [k * c.step_time[k] ** 2 for k in range(MIN_NODES, 101)]
    assert w == MIN_NODES + metric.index(min(metric))
    assert w < c.knee(0.01, 100)  # HELL is the thriftier (the paper's Section V-B)


def test_greedy_serves_the_shortest_first() -> None:
    c = CURVES["VGG19"]
    w = c.hell(100)
    jobs = [JobView(i, r, c) for i, r in enumerate([9e4, 1e3, 5e4, 2e4, 7e3])]
    out = allocate(jobs, 2 * w, Settings("hell", filling=False))
    assert {i for i, n in out.items() if n} == {1, 4}


def test_filling_hands_idle_nodes_to_the_shortest_job() -> None:
    c = CURVES["AlexNet"]
    jobs = [JobView(0, 100.0, c), JobView(1, 1e4, c)]
    plain = allocate(jobs, 100, Settings("hell", filling=False))
    filled = allocate(jobs, 100, Settings("hell"))
    assert sum(plain.values()) < sum(filled.values()) <= 100
    assert filled[0] > plain[0] and filled[1] == plain[1]


def test_srpt_gives_the_shortest_everything_that_helps() -> None:
    lin = _linear(101)
    out = allocate([JobView(0, 10.0, lin), JobView(1, 20.0, lin)], 100, Settings("srpt"))
    assert out == {0: 100, 1: 0}


def test_waterfill_spreads_evenly() -> None:
    lin = _linear(101)
    out = allocate([JobView(i, 10.0 * (i + 1), lin) for i in range(4)], 100, Settings("waterfill"))
    assert sorted(out.values()) == [25, 25, 25, 25]
    out = allocate([JobView(i, 1.0, lin) for i in range(60)], 100, Settings("waterfill"))
    assert sum(1 for v in out.values() if v) == 50  # the first 50 in arrival order, two each


def test_gamma_favours_new_jobs() -> None:
    c = CURVES["VGG19"]
    w = c.hell(100)
    old = JobView(0, 400.0, c, done=0.9)  # 4000 steps in all, 400 left
    new = JobView(1, 600.0, c, done=0.0)
    assert allocate([old, new], w, Settings("hell", filling=False, gamma=0.0))[0] == w
    assert allocate([old, new], w, Settings("hell", filling=False, gamma=1.05))[1] == w


def test_large_models_get_their_knees() -> None:
    assert CURVES[VGG19.name].hell(100) > CURVES[ALEXNET.name].hell(100)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"policy": "fifo"}, "policy"),
        ({"mode": "rigid"}, "mode"),
        ({"policy": "srpt", "mode": "moldable"}, "moldable"),
        ({"alpha": -0.1}, "alpha"),
        ({"alpha_low": 0.5, "alpha_high": 0.1}, "alpha_low"),
        ({"gamma": math.nan}, "gamma"),
    ],
)
def test_bad_settings_are_a_value_error(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Settings(**kwargs)  # type: ignore[arg-type]


def test_bad_input_is_a_value_error() -> None:
    c = CURVES["NiN"]
    with pytest.raises(ValueError, match="nodes"):
        allocate([], -1, Settings())
    with pytest.raises(ValueError, match="unique"):
        allocate([JobView(0, 1.0, c), JobView(0, 2.0, c)], 10, Settings())
    with pytest.raises(ValueError, match="remaining"):
        allocate([JobView(0, math.inf, c)], 10, Settings())
    with pytest.raises(ValueError, match="holds 1 nodes"):
        allocate([JobView(0, 1.0, c, nodes=1)], 10, Settings())
    with pytest.raises(ValueError, match="more than the cluster"):
        allocate([JobView(0, 1.0, c, nodes=20)], 10, Settings("hell", "moldable"))
    with pytest.raises(ValueError, match="inf below"):
        SpeedCurve([1.0, 1.0, 1.0])
