"""The MVA throughput model of one async-SGD job (MB-ASGD Section III)."""

from __future__ import annotations

import itertools
import math
import random
from itertools import combinations

import pytest

from specon.sim.asgd import mva
from specon.sim.asgd.mva import METHODS, ServiceTimes, curve, throughput

PAPER = ServiceTimes(worker=0.029, uplink=0.072, server=0.018, downlink=0.072)  # Fig. 7's profile


def _random_times(rng: random.Random) -> ServiceTimes:
    return ServiceTimes(*(10 ** rng.uniform(-3, 1) for _ in range(4)))


@pytest.mark.parametrize("method", METHODS)
def test_one_worker_is_one_over_the_cycle(method: mva.Method) -> None:
    assert throughput(PAPER, 1, method) == pytest.approx(1 / (0.029 + 0.072 + 0.018 + 0.072))


def test_two_workers_exact_by_hand() -> None:
    # All stations 1 s. With one task each shared station holds 1/4; the second task's
    # response at each shared station is 1 * (1 + 1/4), the worker's 1: cycle 4.75.
    t = ServiceTimes(1.0, 1.0, 1.0, 1.0)
    assert throughput(t, 2, "exact") == pytest.approx(2 / 4.75)
    # Eq. (2): links 1 + (1/4 - 1/2 * 1/4) = 1.125, the FCFS server 1.25: cycle 4.5.
    assert throughput(t, 2, "approx") == pytest.approx(2 / 4.5)
    # Link utilisation 0.25 < 0.8: g = 0, hybrid is approx.
    assert throughput(t, 2, "hybrid") == pytest.approx(2 / 4.5)


def test_three_workers_exact_by_hand() -> None:
    t = ServiceTimes(2.0, 1.0, 1.0, 1.0)
    # m=1: cycle 5, each shared queue 1/5. m=2: shared T = 1.2, cycle 5.6, X = 2/5.6,
    # N = 1.2 * 2/5.6. m=3: shared T = 1 + N, cycle 2 + 3 T.
    n2 = 1.2 * 2 / 5.6
    assert throughput(t, 3, "exact") == pytest.approx(3 / (2 + 3 * (1 + n2)))


def test_exact_matches_the_multiclass_recursion() -> None:
    # K classes of population 1 (the paper's form) against the single-class recursion.
    t = ServiceTimes(0.05, 0.03, 0.01, 0.04)
    k = 4
    shared = {"u": t.uplink, "s": t.server, "d": t.downlink}
    memo: dict[frozenset[int], dict[str, float]] = {frozenset(): dict.fromkeys(shared, 0.0)}
    x_total = 0.0
    for size in range(1, k + 1):
        for sub in _subsets(range(k), size):
            n = dict.fromkeys(shared, 0.0)
            x_total = 0.0
            for c in sub:
                prev = memo[sub - {c}]
                ts = {st: s * (1 + prev[st]) for st, s in shared.items()}
                x = 1 / (t.worker + sum(ts.values()))
                x_total += x
                for st in shared:
                    n[st] += x * ts[st]
            memo[sub] = n
    assert throughput(t, k, "exact") == pytest.approx(x_total)


def _subsets(items: range, size: int) -> list[frozenset[int]]:
    return [frozenset(c) for c in combinations(items, size)]


def test_exact_is_monotone_and_every_method_is_bounded() -> None:
    rng = random.Random(7)
    for _ in range(200):
        t = _random_times(rng)
        ex = curve(t, 30, "exact")
        assert all(b >= a * (1 - 1e-12) for a, b in itertools.pairwise(ex))
        for method in METHODS:
            assert max(curve(t, 30, method)) <= (1 / t.bottleneck) * (1 + 1e-9)


def test_saturates_at_the_bottleneck() -> None:
    t = ServiceTimes(0.001, 0.5, 0.01, 0.2)
    assert throughput(t, 200, "exact") == pytest.approx(2.0, rel=1e-2)
    assert throughput(t, 200, "approx") == pytest.approx(2.0, rel=1e-6)


def test_hybrid_lies_between_exact_and_approx() -> None:
    rng = random.Random(3)
    for _ in range(200):
        t = _random_times(rng)
        c = {m: curve(t, 25, m) for m in METHODS}
        for ex, ap, hy in zip(c["exact"], c["approx"], c["hybrid"], strict=True):
            assert min(ex, ap) * (1 - 1e-9) <= hy <= max(ex, ap) * (1 + 1e-9)


def test_hybrid_switches_to_sharing_at_high_link_load() -> None:
    # Network-bound: links far above 0.8, hybrid leaves approx and goes towards exact.
    t = ServiceTimes(0.001, 0.1, 0.001, 0.1)
    ex, ap, hy = (throughput(t, 6, m) for m in METHODS)
    assert ex < hy < ap
    assert mva.g(0.5) == 0.0 and mva.g(0.9) == pytest.approx(0.5) and mva.g(1.2) == 1.0


def test_speedup_efficiency_and_relative_speedup() -> None:
    xs = curve(PAPER, 4)
    assert mva.speedup(PAPER, 1) == 1.0
    assert mva.speedup(PAPER, 4) == pytest.approx(xs[3] / xs[0])
    assert mva.efficiency(PAPER, 1) == 0.5  # one worker and the PS: two nodes
    assert mva.efficiency(PAPER, 4) == pytest.approx(xs[3] / xs[0] / 5)
    assert mva.relative_speedup(PAPER, 1) == math.inf
    assert mva.relative_speedup(PAPER, 3) == pytest.approx(1 - xs[1] / xs[2])
    assert mva.relative_speedup(PAPER, 2) > 0


@pytest.mark.parametrize(
    "values",
    [(0.0, 1.0, 1.0, 1.0), (1.0, -1.0, 1.0, 1.0), (1.0, 1.0, math.nan, 1.0), (1.0, 1.0, 1.0, math.inf)],
)
def test_bad_times_are_a_value_error(values: tuple[float, float, float, float]) -> None:
    with pytest.raises(ValueError, match="service time"):
        ServiceTimes(*values)


@pytest.mark.parametrize("workers", [0, -3, 2.5, True])
def test_bad_worker_count_is_a_value_error(workers: int) -> None:
    with pytest.raises(ValueError, match="workers"):
        throughput(PAPER, workers)
    with pytest.raises(ValueError, match="workers"):
        curve(PAPER, workers)


def test_bad_method_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="method"):
        throughput(PAPER, 2, "bogus")  # type: ignore[arg-type]
