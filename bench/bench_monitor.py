"""Classifier tick latency: one Algorithm 1 tick (plus the request rule) over 10,000 containers.

The containers are warmed up first on noisy decaying losses (so every state carries its
full history and categories are mixed), then one more tick, three samples each, is timed
with ``tick_worker`` for the ``specon`` and the ``robust`` classifier. Each figure is
the median of several runs of that same tick from the same states (the tick is pure),
in CPU time of the running thread: the build machines are small and shared, and wall
time there measures the neighbours (it is reported in the detail).
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace

from bench.figures import Figure
from specon.config import MonitorConfig
from specon.model import ContainerId
from specon.policy import monitor
from specon.policy.classifier import tick_worker
from specon.policy.monitor import MonitorState

CONTAINERS = 10_000
WARMUP_TICKS = 24
SAMPLES_PER_TICK = 3
TARGET_MS = 50.0


def _samples(
    ids: Sequence[ContainerId], taus: Sequence[float], m: int, rng: random.Random
) -> dict[ContainerId, list[float]]:
    """The losses each container logged during tick m: 2 exp(-t/tau) + 0.1 + noise."""
    out = {}
    for cid, tau in zip(ids, taus, strict=True):
        base = 2.0 * math.exp(-m / tau) + 0.1
        out[cid] = [base + rng.gauss(0.0, 0.002) for _ in range(SAMPLES_PER_TICK)]
    return out


def _warm(
    cfg: MonitorConfig, ids: Sequence[ContainerId], taus: Sequence[float]
) -> dict[ContainerId, MonitorState]:
    rng = random.Random(7)
    states: Mapping[ContainerId, MonitorState] = {cid: monitor.initial() for cid in ids}
    for m in range(WARMUP_TICKS):
        states = tick_worker(states, _samples(ids, taus, m, rng), m * cfg.interval, cfg).states
    return dict(states)


def run(quick: bool) -> list[Figure]:
    repeats = 3 if quick else 15
    ids = [ContainerId(f"job-{i:05d}") for i in range(CONTAINERS)]
    rng = random.Random(1)
    taus = [rng.uniform(2.0, 12.0) for _ in ids]
    figures = []
    for name in ("specon", "robust"):
        cfg = replace(MonitorConfig(), classifier=name)
        states = _warm(cfg, ids, taus)
        samples = _samples(ids, taus, WARMUP_TICKS, random.Random(2))
        now = WARMUP_TICKS * cfg.interval
        cpu, wall = [], []
        for _ in range(repeats):
            w0, c0 = time.perf_counter(), time.thread_time()
            tick_worker(states, samples, now, cfg)
            cpu.append((time.thread_time() - c0) * 1000)
            wall.append((time.perf_counter() - w0) * 1000)
        ms = statistics.median(cpu)
        mix = Counter(s.category.short for s in states.values())
        figures.append(
            Figure(
                name=f"{name}: one tick over {CONTAINERS:,} containers",
                value=ms,
                unit="ms",
                target=TARGET_MS,
                better="max",
                detail=f"CPU time, {ms * 1000 / CONTAINERS:.2f} us/container, median of {repeats}; "
                f"wall {statistics.median(wall):.1f} ms; "
                + ", ".join(f"{k} {v}" for k, v in sorted(mix.items())),
            )
        )
    return figures
