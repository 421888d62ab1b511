"""Decision latency: Algorithm 2 (select_target) and Algorithm 3 (plan_rebalance) at scale.

Snapshots are built outside the timed region; each figure is the median of several runs.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable

from bench.figures import Figure
from specon.config import PlacementConfig, RebalanceConfig
from specon.model import Category, ClusterSnapshot, WorkerSnapshot
from specon.policy.placement import ClusterIndex, select_target
from specon.policy.rebalance import plan_rebalance
from specon.testing.builders import container, snapshot, worker

TIMEOUT = 20.0
CATEGORIES = (Category.PROGRESSING, Category.WATCHING, Category.CONVERGED)


def _workers(n: int, rng: random.Random) -> tuple[WorkerSnapshot, ...]:
    return tuple(
        worker(
            f"worker-{i:05d}",
            cpu=64.0,
            memory=256 << 30,
            gpu=0,
            usage=rng.random(),
            heartbeat_age=rng.uniform(0, 10),
        )
        for i in range(n)
    )


def _snapshot(n_workers: int, hosts: list[int], rng: random.Random) -> ClusterSnapshot:
    """Container i runs on worker hosts[i]; categories and converged stamps are random."""
    workers = _workers(n_workers, rng)
    containers = (
        container(
            f"job-{i:06d}",
            workers[w].id,
            rng.choice(CATEGORIES),
            t_cc=rng.uniform(0, 900),
            migrated=True,
            cpu=2.0,
            memory=4 << 30,
        )
        for i, w in enumerate(hosts)
    )
    return snapshot(workers, containers, now=1000.0)


def _median_ms(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median wall-clock and median CPU time of ``repeats`` calls, in ms. On a shared
    machine the CPU time shows how much of the wall time is waiting for a core."""
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
    return statistics.median(wall), statistics.median(cpu)


def _cpu(ms: tuple[float, float], per: int = 1) -> str:
    return f"cpu {ms[1] / per:.3f} ms"


def run(quick: bool) -> list[Figure]:
    n_workers = 1_000 if quick else 10_000
    n_containers = 10 * n_workers
    repeats = 3 if quick else 7
    size = f"{n_workers:,} workers / {n_containers:,} containers"
    rng = random.Random(20)
    figures: list[Figure] = []

    # Algorithm 2: round-robin placement, ~10 containers per worker.
    snap = _snapshot(n_workers, [i % n_workers for i in range(n_containers)], rng)
    index = ClusterIndex.of(snap)
    requests = [c.id for c in rng.sample(snap.containers, 50)]
    cfg = PlacementConfig()

    def decide_all(with_index: bool) -> None:
        for cid in requests:
            select_target(snap, cid, cfg=cfg, worker_timeout=TIMEOUT, index=index if with_index else None)

    n = len(requests)
    reused = _median_ms(lambda: decide_all(True), repeats)
    fresh = _median_ms(lambda: decide_all(False), 1 if quick else 2)
    build = _median_ms(lambda: ClusterIndex.of(snap), repeats)
    figures += [
        Figure(f"select_target, prebuilt index ({size})", reused[0] / n, "ms", 5.0, "max", _cpu(reused, n)),
        Figure(
            f"select_target, index built per call ({size})",
            fresh[0] / n,
            "ms",
            detail=f"{_cpu(fresh, n)}; what a manager pays if it does not reuse the index",
        ),
        Figure(f"ClusterIndex.of ({size})", build[0], "ms", detail=_cpu(build)),
    ]

    # Algorithm 3, balanced. Typical: 5% of workers went idle (their jobs finished).
    idle = n_workers // 20
    busy = n_workers - idle
    scenarios = {
        "5% workers idle": [idle + i % busy for i in range(n_containers)],
        "random placement": [rng.randrange(n_workers) for _ in range(n_containers)],
    }
    for name, hosts in scenarios.items():
        figures += _rebalance_figures(f"{name}, {size}", _snapshot(n_workers, hosts, rng), repeats)
    return figures


def _rebalance_figures(name: str, snap: ClusterSnapshot, repeats: int) -> list[Figure]:
    cfg = RebalanceConfig(mode="balanced")
    index = ClusterIndex.of(snap)
    moves = len(plan_rebalance(snap, cfg=cfg, worker_timeout=TIMEOUT, index=index))
    prebuilt = _median_ms(lambda: plan_rebalance(snap, cfg=cfg, worker_timeout=TIMEOUT, index=index), repeats)
    fresh = _median_ms(lambda: plan_rebalance(snap, cfg=cfg, worker_timeout=TIMEOUT), repeats)
    return [
        Figure(
            f"plan_rebalance balanced, prebuilt index ({name})",
            prebuilt[0],
            "ms",
            200.0,
            "max",
            f"{moves:,} moves; {_cpu(prebuilt)}",
        ),
        Figure(
            f"plan_rebalance balanced, incl. index ({name})",
            fresh[0],
            "ms",
            200.0,
            "max",
            f"{moves:,} moves; {_cpu(fresh)}",
        ),
    ]
