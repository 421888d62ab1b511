"""Algorithm 2 (target selection): scoring, T, the R tie-breaks, feasibility, refusals."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specon.config import PlacementConfig, Weights
from specon.model import (
    Category,
    ClusterSnapshot,
    ContainerId,
    ContainerSnapshot,
    Resources,
    WorkerId,
    WorkerSnapshot,
)
from specon.policy.decisions import Move, RefusalReason, Refuse, Stay
from specon.policy.placement import ClusterIndex, fits, ranked_homes, select_home, select_target, tolerates
from specon.testing.builders import container, snapshot, worker

PC, WC, CC = Category.PROGRESSING, Category.WATCHING, Category.CONVERGED
TIMEOUT = 20.0


def fill(wid: str, *, pc: int = 0, wc: int = 0, cc: int = 0) -> list[ContainerSnapshot]:
    """Background containers on ``wid`` in the given categories."""
    cats = [PC] * pc + [WC] * wc + [CC] * cc
    return [container(f"{wid}-bg{i}", wid, cat) for i, cat in enumerate(cats)]


def decide(s: ClusterSnapshot, cid: str = "req", **cfg: object) -> Stay | Move | Refuse:
    return select_target(s, ContainerId(cid), cfg=PlacementConfig(**cfg), worker_timeout=TIMEOUT)  # type: ignore[arg-type]


def test_paper_fig9_scores_pick_worker_1() -> None:
    # Fig. 9: Job-14 on Worker-2; scores of Worker-1..4 were 63, 88, 92, 72 (weights 2/1.5/1).
    s = snapshot(
        [worker(f"worker-{i}") for i in range(1, 5)],
        [
            *fill("worker-1", pc=20, wc=10, cc=8),  # 40 + 15 + 8
            *fill("worker-2", pc=30, wc=12, cc=9),  # 60 + 18 + 9, + 1 for the requester
            container("req", "worker-2", CC),
            *fill("worker-3", pc=30, wc=14, cc=11),  # 60 + 21 + 11
            *fill("worker-4", pc=24, wc=12, cc=6),  # 48 + 18 + 6
        ],
    )
    d = decide(s)
    assert isinstance(d, Move)
    assert (d.source, d.target, d.reason) == ("worker-2", "worker-1", "converged")
    assert dict(d.scores) == {"worker-1": 63.0, "worker-2": 88.0, "worker-3": 92.0, "worker-4": 72.0}


def test_source_among_the_minimum_stays() -> None:
    s = snapshot(
        [worker("a", usage=0.9), worker("b", usage=0.1)],
        [container("req", "a"), *fill("a", pc=1), *fill("b", pc=1, cc=1)],
    )
    d = decide(s)
    assert d == Stay(ContainerId("req"), WorkerId("a"), d.scores)  # type: ignore[union-attr]
    assert dict(d.scores) == {"a": 3.0, "b": 3.0}  # type: ignore[union-attr]


def test_requester_counts_as_cc_on_its_source_whatever_it_reports() -> None:
    # Reported PC, the requester would score 2 and lose to b's 1; as CC it ties and stays.
    s = snapshot([worker("a"), worker("b")], [container("req", "a", PC), *fill("b", cc=1)])
    d = decide(s)
    assert isinstance(d, Stay)
    assert d.scores["a"] == 1.0


@pytest.mark.parametrize("category", [Category.DIVERGING, Category.STALLED])
def test_diverging_and_stalled_weigh_like_progressing(category: Category) -> None:
    s = snapshot(
        [worker("a"), worker("b"), worker("c")],
        [container("req", "c"), *fill("c", pc=5), container("x", "a", category), *fill("b", wc=1)],
    )
    d = decide(s)
    assert isinstance(d, Move)
    assert d.scores["a"] == 2.0
    assert d.target == "b"  # 1.5 beats 2.0


def test_scores_within_tolerance_tie_and_r_decides() -> None:
    # a: 2/1.0 = 2.0; b: 2/(1 - 5e-13) = 2.000000000001 -> a tie under 1e-9, not under 0.
    s = snapshot(
        [
            worker("a", cpu=1.0, memory=1 << 30, gpu=0, usage=0.8),
            worker("b", cpu=1.0 - 5e-13, memory=1 << 30, gpu=0, usage=0.2),
            worker("src", cpu=1.0, memory=1 << 30, gpu=0),
        ],
        [*fill("a", pc=1), *fill("b", pc=1), container("req", "src"), *fill("src", pc=3)],
    )
    tied = decide(s, score="per_capacity")
    assert isinstance(tied, Move)
    assert 0 < tied.scores["b"] - tied.scores["a"] < 1e-11
    assert tied.target == "b"  # lower usage among the tied
    strict = decide(s, score="per_capacity", tolerance=0.0)
    assert isinstance(strict, Move)
    assert strict.target == "a"


def test_t_tie_breaks_usage_then_active_containers_then_id() -> None:
    bg = [container("req", "src"), *fill("src", pc=5)]
    # Lowest usage wins even with more containers.
    s = snapshot(
        [worker("src"), worker("a", usage=0.5), worker("b", usage=0.4)],
        [*bg, *fill("a", pc=1), *fill("b", cc=2)],
    )
    assert decide(s).target == "b"  # type: ignore[union-attr]
    # Equal usage: fewest active containers (1 PC scores like 2 CC).
    s = snapshot(
        [worker("src"), worker("a", usage=0.4), worker("b", usage=0.4)],
        [*bg, *fill("a", cc=2), *fill("b", pc=1)],
    )
    assert decide(s).target == "b"  # type: ignore[union-attr]
    # Equal usage and load: the lower worker id.
    s = snapshot([worker("src"), worker("b"), worker("a")], [*bg, *fill("a", pc=1), *fill("b", pc=1)])
    assert decide(s).target == "a"  # type: ignore[union-attr]


def test_per_capacity_divides_by_cpu_cores() -> None:
    s = snapshot(
        [
            worker("big", cpu=16.0, memory=1 << 40, gpu=0),
            worker("small", cpu=2.0, memory=1 << 40, gpu=0),
            worker("src", cpu=1.0, memory=1 << 40, gpu=0),
        ],
        [*fill("big", pc=4), *fill("small", pc=2), container("req", "src"), *fill("src", pc=8)],
    )
    assert decide(s).target == "small"  # type: ignore[union-attr]  # count: 4 < 8
    d = decide(s, score="per_capacity")
    assert isinstance(d, Move)
    assert d.target == "big"  # 8/16 < 4/2
    assert d.scores["big"] == 0.5


def test_per_capacity_ranks_zero_capacity_last_without_crashing() -> None:
    s = snapshot(
        [worker("zero", cpu=0.0, memory=1 << 40, gpu=0), worker("one", cpu=1.0, memory=1 << 40, gpu=0)],
        [container("req", "one"), *fill("one", pc=3)],
    )
    d = decide(s, score="per_capacity")
    assert isinstance(d, Stay)
    assert d.scores["zero"] == float("inf")


@pytest.mark.parametrize(
    ("target", "requester"),
    [
        pytest.param(worker("t", cpu=1.0, memory=1 << 40, gpu=1), {}, id="cpu"),
        pytest.param(worker("t", cpu=64.0, memory=1 << 20, gpu=1), {}, id="memory"),
        pytest.param(worker("t", cpu=64.0, memory=1 << 40, gpu=0), {}, id="gpu"),
        pytest.param(worker("t", labels=(("zone", "b"),)), {"selector": (("zone", "a"),)}, id="selector"),
        pytest.param(worker("t", taints=("gpu-only",)), {}, id="taint"),
        pytest.param(worker("t", taints=("x", "y")), {"tolerations": ("x",)}, id="one-taint-untolerated"),
    ],
)
def test_infeasible_workers_are_not_candidates(target: WorkerSnapshot, requester: dict[str, object]) -> None:
    req = container("req", "src", cpu=2.0, memory=1 << 30, gpu=1, **requester)  # type: ignore[arg-type]
    z = worker("z", labels=(("zone", "a"),))
    s = snapshot([target, worker("src"), z], [req, *fill("src", pc=3), *fill("z", pc=1)])
    d = decide(s)
    assert isinstance(d, Move)
    assert d.target == "z"  # t (score 0) is skipped, the next best is z


def test_free_capacity_subtracts_containers_already_there() -> None:
    hog = container("hog", "t", CC, cpu=3.0)
    req = container("req", "src", cpu=2.0)
    s = snapshot([worker("t", cpu=4.0, memory=1 << 40, gpu=0), worker("src")], [hog, req, *fill("src", pc=3)])
    assert isinstance(decide(s), Stay)  # t would score 1 < 7 but has 1 core free
    s = replace(s, containers=(replace(hog, requests=Resources(2.0)), *s.containers[1:]))
    assert decide(s).target == "t"  # type: ignore[union-attr]


def test_tolerated_taint_and_matching_selector_are_feasible() -> None:
    req = container("req", "src", selector=(("zone", "a"),), tolerations=("gpu-only",))
    t = worker("t", labels=(("zone", "a"), ("os", "linux")), taints=("gpu-only",))
    s = snapshot([t, worker("src", labels=(("zone", "a"),))], [req, *fill("src", pc=2)])
    assert decide(s).target == "t"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("toleration", "taint", "ok"),
    [
        ("gpu", "gpu", True),  # Exists, effect-less (the plain-key form)
        ("gpu", "gpu=a100:NoSchedule", True),  # Exists: any value, any effect
        ("gpu:NoSchedule", "gpu=a100:NoSchedule", True),
        ("gpu:NoExecute", "gpu=a100:NoSchedule", False),  # the effect must match
        ("gpu:NoSchedule", "gpu", False),  # an effect-less taint needs an effect-less toleration
        ("gpu=a100", "gpu=a100:NoExecute", True),  # Equal
        ("gpu=h100", "gpu=a100:NoExecute", False),
        ("gpu=", "gpu:NoSchedule", True),  # Equal to the empty value
        ("gpu=", "gpu=a100:NoSchedule", False),
        ("gpu=a100", "gpu:NoSchedule", False),
        ("other", "gpu:NoSchedule", False),
        ("*", "anything=at-all:NoExecute", True),  # Exists without a key: every taint
        ("*:NoSchedule", "gpu=a100:NoSchedule", True),
        ("*:NoSchedule", "gpu=a100:NoExecute", False),
        ("node.kubernetes.io/unschedulable:NoSchedule", "node.kubernetes.io/unschedulable:NoSchedule", True),
    ],
)
def test_tolerates_follows_kubernetes(toleration: str, taint: str, ok: bool) -> None:
    assert tolerates(toleration, taint) is ok
    req = container("req", "src", tolerations=(toleration,))
    assert fits(req, worker("t", taints=(taint,)), Resources()) is ok


def test_every_taint_needs_a_toleration() -> None:
    t = worker("t", taints=("gpu=a100:NoSchedule", "dedicated=ml:NoExecute"))
    assert not fits(container("req", "src", tolerations=("gpu",)), t, Resources())
    assert fits(container("req", "src", tolerations=("gpu", "dedicated=ml")), t, Resources())
    assert fits(container("req", "src", tolerations=("*",)), t, Resources())


def test_source_is_a_candidate_even_if_it_no_longer_fits_new_rules() -> None:
    # The source is over-committed and tainted, yet the container already runs there.
    req = container("req", "src", cpu=8.0)
    s = snapshot(
        [worker("src", cpu=1.0, memory=0, gpu=0, taints=("drain",)), worker("t", cpu=1.0, memory=0, gpu=0)],
        [req],
    )
    assert isinstance(decide(s), Stay)


@pytest.mark.parametrize(
    "bad",
    [{"ready": False}, {"heartbeat_age": TIMEOUT}, {"heartbeat_age": 99.0}, {"heartbeat_age": float("nan")}],
    ids=["not-ready", "age-equals-timeout", "age-over-timeout", "age-nan"],
)
def test_unready_or_unreachable_workers_are_not_candidates(bad: dict[str, object]) -> None:
    s = snapshot(
        [worker("t", **bad), worker("z"), worker("src")],  # type: ignore[arg-type]
        [container("req", "src"), *fill("src", pc=1), *fill("z", cc=1)],
    )
    d = decide(s)
    assert isinstance(d, Move)
    assert d.target == "z"
    assert "t" not in d.scores


def test_unreachable_source_moves_to_a_feasible_worker() -> None:
    s = snapshot(
        [worker("src", heartbeat_age=60.0), worker("t")], [container("req", "src"), *fill("t", pc=4)]
    )
    d = decide(s)
    assert isinstance(d, Move)
    assert (d.source, d.target) == ("src", "t")


def test_unreachable_source_and_nothing_feasible_is_refused() -> None:
    req = container("req", "src", cpu=2.0)
    s = snapshot([worker("src", ready=False), worker("t", cpu=1.0, memory=0, gpu=0)], [req])
    d = decide(s)
    assert isinstance(d, Refuse)
    assert d.reason is RefusalReason.NO_CANDIDATE


def test_refusals() -> None:
    s = snapshot([worker("a")], [container("req", "a", migrations=1), container("orphan", "gone")])
    unknown = decide(s, "nope")
    assert isinstance(unknown, Refuse)
    assert unknown.reason is RefusalReason.UNKNOWN_CONTAINER
    limited = decide(s)
    assert isinstance(limited, Refuse)
    assert limited.reason is RefusalReason.MIGRATION_LIMIT
    assert isinstance(decide(s, max_migrations_per_container=2), Stay)
    orphan = decide(s, "orphan")
    assert isinstance(orphan, Refuse)
    assert orphan.reason is RefusalReason.UNKNOWN_SOURCE


def test_weights_come_from_the_config() -> None:
    s = snapshot(
        [worker("a"), worker("b"), worker("src")],
        [*fill("a", pc=1), *fill("b", wc=1, cc=1), container("req", "src"), *fill("src", pc=2)],
    )
    assert decide(s).target == "a"  # type: ignore[union-attr]  # 2 < 1.5 + 1
    d = decide(s, weights=Weights(progressing=3.0, watching=1.1, converged=1.0))
    assert isinstance(d, Move)
    assert d.target == "b"  # 2.1 < 3


def test_index_is_reused_and_must_match_the_snapshot() -> None:
    s = snapshot([worker("a"), worker("b")], [container("req", "a"), *fill("a", pc=2)])
    idx = ClusterIndex.of(s)
    cfg = PlacementConfig()
    assert select_target(s, ContainerId("req"), cfg=cfg, worker_timeout=TIMEOUT, index=idx) == decide(s)
    other = replace(s, now=2000.0)
    with pytest.raises(ValueError, match="different snapshot"):
        select_target(other, ContainerId("req"), cfg=cfg, worker_timeout=TIMEOUT, index=idx)


@pytest.mark.parametrize(
    "s",
    [
        snapshot([worker("a"), worker("a")], []),
        snapshot([worker("a")], [container("x", "a"), container("x", "a")]),
    ],
    ids=["workers", "containers"],
)
def test_duplicate_ids_are_a_clear_error(s: ClusterSnapshot) -> None:
    with pytest.raises(ValueError, match="more than once"):
        ClusterIndex.of(s)


# -- properties ---------------------------------------------------------------------

_workers = st.lists(
    st.builds(
        WorkerSnapshot,
        id=st.sampled_from([WorkerId(f"w{i}") for i in range(6)]),
        capacity=st.builds(
            Resources, cpu=st.sampled_from([0.0, 2.0, 4.0, 8.0]), memory=st.just(16), gpu=st.integers(0, 1)
        ),
        usage=st.floats(0, 1),
        ready=st.sampled_from([True, True, True, False]),
        heartbeat_age=st.sampled_from([0.0, 0.0, 5.0, 5.0, TIMEOUT, 30.0]),
        labels=st.sampled_from([(), (("zone", "a"),)]),
        taints=st.sampled_from([(), (), ("t",)]),
    ),
    min_size=1,
    max_size=6,
    unique_by=lambda w: w.id,
)


@st.composite
def _cluster(draw: st.DrawFn) -> ClusterSnapshot:
    workers = draw(_workers)
    ids = [w.id for w in workers]
    n = draw(st.integers(1, 16))
    containers = [
        container(
            f"c{i}",
            draw(st.sampled_from(ids)),
            draw(st.sampled_from(list(Category))),
            cpu=draw(st.sampled_from([0.0, 1.0, 2.0])),
            memory=draw(st.integers(0, 8)),
            gpu=draw(st.integers(0, 1)),
            selector=draw(st.sampled_from([(), (("zone", "a"),)])),
            tolerations=draw(st.sampled_from([(), ("t",)])),
        )
        for i in range(n)
    ]
    return snapshot(workers, containers)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(s=_cluster(), score=st.sampled_from(["count", "per_capacity"]))
def test_select_target_never_returns_an_infeasible_or_unready_target(s: ClusterSnapshot, score: str) -> None:
    idx = ClusterIndex.of(s)
    cfg = PlacementConfig(score=score)  # type: ignore[arg-type]
    eligible = {s.workers[p].id for p in idx.eligible(TIMEOUT).nonzero()[0]}
    for c in s.containers:
        d = select_target(s, c.id, cfg=cfg, worker_timeout=TIMEOUT, index=idx)
        assert d == select_target(s, c.id, cfg=cfg, worker_timeout=TIMEOUT)  # deterministic
        if isinstance(d, Move):
            assert d.source == c.worker
            assert d.target != c.worker
            assert d.target in eligible
            assert fits(c, s.worker(d.target), idx.used(idx.position[d.target]))
            feasible = [
                w for w in eligible if w == c.worker or fits(c, s.worker(w), idx.used(idx.position[w]))
            ]
            assert d.scores[d.target] <= min(d.scores[w] for w in feasible) + cfg.tolerance
        elif isinstance(d, Stay):
            assert d.worker == c.worker
            assert c.worker in eligible
        else:
            assert d.reason is RefusalReason.NO_CANDIDATE
            assert c.worker not in eligible


def test_a_job_that_opted_out_of_moves_is_told_to_stay() -> None:
    c = container("c", "w0", CC, t_cc=1.0, movable=False)
    busy = container("p", "w0", PC)
    bare = [worker(w, cpu=0.0, memory=0, gpu=0) for w in ("w0", "w1")]  # no capacity at all
    snap = snapshot(bare, [c, busy], now=10.0)
    assert isinstance(select_target(snap, c.id, cfg=PlacementConfig(), worker_timeout=20.0), Stay)


def test_ranked_homes_start_with_select_homes_choice_then_go_by_score() -> None:
    cfg = PlacementConfig()
    s = snapshot(
        [worker("a", usage=0.5), worker("b", usage=0.1), worker("c"), worker("d"), worker("full", cpu=0.5)],
        [*fill("a", pc=1), *fill("b", pc=1), *fill("c", pc=2), *fill("d", pc=3)],
    )
    idx = ClusterIndex.of(s)
    job = container("new", "", PC, cpu=1.0)
    ranked = ranked_homes(idx, job, cfg=cfg, worker_timeout=TIMEOUT, limit=10)
    # a and b tie on score (T); b has the lower usage and is select_home's choice. "full"
    # scores best (no jobs) but cannot fit the job's CPU.
    assert ranked == ["b", "a", "c", "d"]
    assert select_home(idx, job, cfg=cfg, worker_timeout=TIMEOUT) == "b"
    assert ranked_homes(idx, job, cfg=cfg, worker_timeout=TIMEOUT, limit=3) == ["b", "a", "c"]
    assert ranked_homes(idx, job, cfg=cfg, worker_timeout=TIMEOUT, limit=1) == ["b"]
    stale = snapshot([worker("a", heartbeat_age=TIMEOUT * 2)])
    assert ranked_homes(ClusterIndex.of(stale), job, cfg=cfg, worker_timeout=TIMEOUT, limit=3) == []
