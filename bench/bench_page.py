"""The status page at 1,000 jobs: the time to build and render it, its size, and a browser's load.

An in-process coordinator (``specon.coordinator.machine``, no journal, no HTTP) learns 50
workers x 20 jobs from heartbeats like a running cluster's: categories that changed a few
times (a history per job), steps against declared totals, a loss window of 32 points (what
agents send) with a step rate per job, and converged jobs asking to move (so migrations are
decided and listed). Then
the manager's work for ``GET /`` is timed: ``build_status`` of a page plus
``render_status_page`` (what the status cache holds for a second), in CPU time of this thread
(the build machines are small and shared; wall time is in the detail), median of several runs:

* the first page of the default size (1,000 entries: a worker counts once plus once per job);
* every page of the walk that lists all 1,000 jobs, workers and migrations once, added up:
  cold (no curve drawn yet: every agent sent a new window since the last build) and warm (the
  windows unchanged since, as between two ticks, which is most builds).

When ``chromium`` is installed, the largest page is also loaded from a file by headless
Chromium (``--screenshot``; wall time, and that of an empty page: the browser's own start).
"""

from __future__ import annotations

import math
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from specon_agent.window import POINTS
from specon_manager import page_jobs
from specon_manager.page import render_status_page
from specon_manager.status import Page, build_status

from bench.figures import Figure
from specon.config import Policy, default_policy
from specon.coordinator.machine import Coordinator
from specon.model import Category, ContainerId, Resources, WorkerId
from specon.wire.protocol import STEPS_LABEL, ContainerReport, Heartbeat
from specon.wire.status import LossWindow

WORKERS, PER_WORKER = 50, 20
RUNS = 9
TARGET_MS = 100.0  # a page built within a tenth of the status cache's one second
T0 = 1_700_000_000.0
CATEGORIES = (Category.PROGRESSING, Category.WATCHING, Category.PROGRESSING, Category.CONVERGED)


def _window(rng: random.Random, step: int) -> LossWindow:
    tau = rng.uniform(0.1, 0.5) * max(step, 1)
    first = max(0, step - POINTS * 50)
    loss = tuple(
        round(
            2.0 * math.exp(-(first + (step - first) * i / (POINTS - 1)) / tau) + 0.1 + rng.gauss(0, 0.02), 5
        )
        for i in range(POINTS)
    )
    return LossWindow(first_step=first, last_step=step, loss=loss, steps_per_second=rng.uniform(2, 20))


def _reports(w: int, beat: int, rng: random.Random) -> tuple[ContainerReport, ...]:
    out = []
    for j in range(PER_WORKER):
        total = 2_000 * (1 + (w + j) % 5)
        step = min(total, 150 * (beat + 1) + 37 * j)
        # Odd workers' jobs converge; even workers' keep training but three, which converge and
        # ask to move to the odd workers' (lower loads): moves are decided.
        late = w % 2 or j < 3
        category = CATEGORIES[min(beat + (j % 3), len(CATEGORIES) - 1) if late else min(beat, 2)]
        out.append(
            ContainerReport(
                id=ContainerId(f"w{w:02d}-job-{j:02d}"),
                category=category,
                step=step,
                last_g=rng.uniform(0, 0.05),
                t_cc=T0 + beat if category is Category.CONVERGED else None,
                pending_request=category is Category.CONVERGED and j % 4 == 0,
                requests=Resources(cpu=0.25),
                job={"model": ("vae", "gru", "rnn")[j % 3], STEPS_LABEL: str(total)},
                window=_window(rng, step),
            )
        )
    return tuple(out)


def cluster(workers: int = WORKERS) -> tuple[Coordinator, float]:
    """A coordinator that learnt ``workers`` x ``PER_WORKER`` jobs over four heartbeats each."""
    rng = random.Random(7)
    now = T0
    coord = Coordinator(policy=_policy(), now=now)
    for beat in range(4):
        now = T0 + 5.0 * beat
        for w in range(workers):
            coord.heartbeat(
                Heartbeat(
                    worker=WorkerId(f"w{w:02d}"),
                    address=f"127.0.0.1:{9000 + w}",
                    seq=beat + 1,
                    sent_at=now,
                    capacity=Resources(cpu=8.0, memory=32 << 30),
                    usage=rng.random(),
                    containers=_reports(w, beat, rng),
                ),
                now,
            )
        coord.tick(now, rebalance=False)
    return coord, now


def _policy() -> Policy:
    """The defaults, but moves are decided at once (the page lists migrations)."""
    p = default_policy()
    return replace(
        p,
        migration=replace(p.migration, min_residence=0.0),
        placement=replace(p.placement, require_gain=False),
    )


def _render(coord: Coordinator, now: float, page: Page) -> tuple[bytes, str | None]:
    s = build_status(coord, now, page)
    return render_status_page(s).encode(), s.next


def _timed(fn: Callable[[], object], *, cold: bool = False) -> tuple[float, float]:
    """Median CPU and wall milliseconds of ``RUNS`` calls of ``fn``; ``cold``: no curve cached."""
    cpu, wall = [], []
    for _ in range(RUNS):
        if cold:
            page_jobs.loss_curve.cache_clear()
        t, w = time.thread_time(), time.perf_counter()
        fn()
        cpu.append(1e3 * (time.thread_time() - t))
        wall.append(1e3 * (time.perf_counter() - w))
    return statistics.median(cpu), statistics.median(wall)


def _walk(coord: Coordinator, now: float) -> list[bytes]:
    pages, after = [], None
    while True:
        body, after = _render(coord, now, Page.parse(None, after))
        pages.append(body)
        if after is None:
            return pages


def _shot_seconds(binary: str, html: bytes) -> float | None:
    """Wall seconds of headless Chromium loading ``html`` from a file and taking a screenshot."""
    with tempfile.TemporaryDirectory(prefix="bench-page-") as d:
        page, shot = Path(d) / "page.html", Path(d) / "page.png"
        page.write_bytes(html)
        argv = [binary, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={d}/profile",
                f"--screenshot={shot}", "--window-size=1400,1000", page.as_uri()]  # fmt: skip
        t = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, timeout=120, check=False)
        seconds = time.perf_counter() - t
        return seconds if done.returncode == 0 and shot.exists() else None


def _browser(html: bytes) -> Figure | None:
    binary = shutil.which("chromium")
    if binary is None:
        return None
    empty = _shot_seconds(binary, b"<!doctype html><title>empty</title>")
    full = _shot_seconds(binary, html)
    if empty is None or full is None:
        return None
    return Figure(
        "headless Chromium: load + screenshot of the largest page",
        1e3 * full,
        "ms",
        detail=f"{len(html) / 1e6:.2f} MB of HTML; wall time; an empty page takes {1e3 * empty:,.0f} ms "
        "(the browser's start)",
    )


def run(quick: bool) -> list[Figure]:
    workers = 10 if quick else WORKERS
    jobs = workers * PER_WORKER
    coord, now = cluster(workers)
    first = Page.parse(None, None)
    body, _ = _render(coord, now, first)
    cpu, wall = _timed(lambda: _render(coord, now, first))
    pages = _walk(coord, now)
    cpu_all, wall_all = _timed(lambda: _walk(coord, now), cold=True)
    cpu_warm, wall_warm = _timed(lambda: _walk(coord, now))
    st = build_status(coord, now, first)
    moved = len(coord.recent) + len(coord.migrations)
    figures = [
        Figure(
            f"status page: build + render the first page ({jobs:,} jobs)",
            cpu,
            "ms",
            target=TARGET_MS,
            detail=f"CPU, median of {RUNS}; wall {wall:.1f} ms; {len(body) / 1e3:,.0f} kB; "
            f"{len(st.workers)} workers and {len(st.containers)} job cards on it",
        ),
        Figure(
            f"status page: every page listing all {jobs:,} jobs once, cold",
            cpu_all,
            "ms",
            target=TARGET_MS * len(pages),
            detail=f"CPU, median of {RUNS}; wall {wall_all:.1f} ms; {len(pages)} pages, "
            f"{sum(map(len, pages)) / 1e6:.2f} MB in all; {moved} migrations listed",
        ),
        Figure(
            f"status page: every page listing all {jobs:,} jobs once, warm",
            cpu_warm,
            "ms",
            target=TARGET_MS * len(pages),
            detail=f"CPU, median of {RUNS}; wall {wall_warm:.1f} ms; the curves drawn by an earlier build",
        ),
    ]
    browser = _browser(max(pages, key=len))
    if browser is not None:
        figures.append(browser)
    return figures
