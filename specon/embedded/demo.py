"""``specon demo``: the default scheduler (DS) against specon on the same arrivals, for real.

Both runs use the embedded default (``specon.embedded.cluster``): W workers with a CPU budget each,
real PyTorch training jobs, the paper's fixed initial placement (round-robin by
submission order). The DS run has no specon daemons at all; the specon run adds the
manager and one agent per worker, which classify the jobs and move converged ones by
save/restore. A job's JCT is read from its own progress log (submit -> its
``finished`` record), so both runs are measured the same way.

The specon run says where its status page is and how to get in (the read token's file);
``PageKeeper`` keeps the page at the run's busiest moment (the most jobs drawing a loss
curve) and ``screenshot`` renders it to a PNG with headless Chromium, where installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from specon.embedded.cluster import EmbeddedCluster, RuntimeName
from specon.embedded.host_loss import HostLoss, HostLosses, lost_steps
from specon.evaluation import JobResult, MigrationRecord, RunResult
from specon.model import ContainerId, Resources, WorkerId
from specon.progress.last import last_record, read_records
from specon.runtime.base import ContainerInfo, JobSpec
from specon.sim.detection import SMOOTH_HALF_WIDTH_STEPS, ground_truth_index
from specon.wire import protocol
from specon.wire.status import Status

Say = Callable[[str], None]
MODELS = ("vae", "gru", "birnn", "rnn", "dynrnn")


@dataclass(frozen=True, slots=True)
class DemoJob:
    id: str
    model: str
    submit: float  # seconds after the run starts
    steps: int
    seed: int


def make_workload(
    *,
    jobs: int,
    window: float,
    seed: int,
    steps: Callable[[str], int],
    models: Sequence[str] = MODELS,
    spread: float = 0.0,
) -> list[DemoJob]:
    """``jobs`` random-model jobs arriving uniformly in [0, window] (sorted), seeded.

    Each job trains ``steps(model)`` steps times a factor uniform in [1 - spread, 1 + spread]
    (jobs of one size finish together, which leaves a scheduler nothing to improve).
    """
    rng = random.Random(seed)
    arrivals = sorted(rng.uniform(0.0, window) for _ in range(jobs))
    if arrivals:
        arrivals[0] = 0.0  # the run starts with its first job
    out = []
    for i, t in enumerate(arrivals):
        model = rng.choice(list(models))
        n = max(1, round(steps(model) * rng.uniform(1.0 - spread, 1.0 + spread)))
        out.append(DemoJob(f"job-{i + 1:02d}", model, round(t, 3), n, rng.randrange(1 << 30)))
    return out


# Steps between two progress records of a demo job.
LOG_EVERY = 5


def machine_speed(
    models: Sequence[str], *, python: str = sys.executable, timeout: float = 300.0
) -> dict[str, float] | None:
    """Seconds per training step of each model on this machine (``specon.workloads.speed``, in
    a process of its own: the driver never imports torch); None where it could not be measured."""
    argv = [python, "-m", "specon.workloads.speed", "--models", ",".join(models)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=True)
        got = json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    if not isinstance(got, dict):
        return None
    out = {m: got.get(m) for m in models}
    ok = all(isinstance(v, float) and math.isfinite(v) and v > 0 for v in out.values())
    return {m: float(v) for m, v in out.items() if isinstance(v, float)} if ok else None


def step_factors(measured: Mapping[str, float], nominal: Mapping[str, float]) -> dict[str, float]:
    """Per model, the share of its steps a demo job keeps so that it trains as long here as on
    the machine its step count was set for: that machine's seconds per step (``nominal``, the
    recorded traces' ``step_cost``) over this one's, never above 1 (a faster machine keeps the
    full count). A model measured or recorded at no positive speed keeps its count."""
    return {
        m: min(1.0, nominal[m] / t) if t > 0 and nominal.get(m, 0.0) > 0 else 1.0 for m, t in measured.items()
    }


def job_spec(job: DemoJob, *, python: str = sys.executable, log_every: int = LOG_EVERY) -> JobSpec:
    argv = (
        python, "-m", "specon.workloads",
        "--model", job.model,
        "--steps", str(job.steps),
        "--seed", str(job.seed),
        "--log-every", str(log_every),
    )  # fmt: skip
    return JobSpec(
        id=ContainerId(job.id),
        command=argv,
        requests=Resources(cpu=0.0),
        labels=(("model", job.model),),
        steps=job.steps,
        model=job.model,
    )


def quality_time(progress: Path, *, log_every: int) -> float | None:
    """When the job's logged loss reached 95 % of its final improvement (the detection
    benchmark's ground truth, ``specon.sim.detection``), as its record's wall-clock ``ts``."""
    stamps: list[float] = []
    losses: list[float] = []
    try:
        lines = progress.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            rec = json.loads(line)
            loss, ts = float(rec["loss"]), float(rec["ts"])
        except (ValueError, KeyError, TypeError):
            continue  # event records (started, finished, ...) carry no loss
        if math.isfinite(loss) and math.isfinite(ts):
            stamps.append(ts)
            losses.append(loss)
    if not losses:
        return None
    half_width = max(0, round(SMOOTH_HALF_WIDTH_STEPS / log_every))
    return stamps[ground_truth_index(tuple(losses), half_width=half_width)]


# Seconds between two looks at the status page (one GET of it: the jobs' CPU is not touched).
PAGE_EVERY = 10.0
SHOT_WINDOW = (1400, 1400)
SHOT_TIMEOUT = 120.0


@dataclass
class PageKeeper:
    """The status page at the run's busiest moment: the most running jobs with a loss curve."""

    html: bytes | None = None
    curves: int = -1
    looked_at: float = -math.inf

    def due(self, now: float, status: Status) -> bool:
        """Whether to fetch the page now: every ``PAGE_EVERY`` s, while the status shows at
        least as many curves as the page kept."""
        return now - self.looked_at >= PAGE_EVERY and _curves(status) >= self.curves

    def keep(self, now: float, html: bytes) -> None:
        """``html`` if it draws at least as many curves as the page kept. Counted on the page
        itself: the manager shares a built page for a second, so it may be older than the
        status that made it due."""
        self.looked_at = now
        curves = html.count(CURVE_MARK)
        if curves >= self.curves:
            self.html, self.curves = html, curves


# How the status page draws one job's loss curve (specon_manager.page_jobs).
CURVE_MARK = b"<polyline"


def _curves(status: Status) -> int:
    return sum(1 for c in status.containers if c.phase == "running" and c.window is not None)


async def _page(cluster: EmbeddedCluster) -> bytes:
    """The status page as the read token's holder gets it."""
    assert cluster.manager is not None
    async with (
        aiohttp.ClientSession() as s,
        s.get(
            cluster.manager.url + "/",
            headers={protocol.AUTH_HEADER: f"Bearer {cluster.read_token}"},
            timeout=aiohttp.ClientTimeout(total=10),
            ssl=cluster.ssl,
        ) as r,
    ):
        r.raise_for_status()
        return await r.read()


def screenshot(html: bytes, out: Path) -> str | None:
    """Render ``html`` (the page inlines its styles and curves: nothing is fetched) to the PNG
    ``out`` with headless Chromium; None when written, else why not."""
    binary = shutil.which("chromium")
    if binary is None:
        return "chromium is not installed (Debian: apt-get install chromium)"
    with tempfile.TemporaryDirectory(prefix="specon-page-") as d:
        page = Path(d) / "status.html"
        page.write_bytes(html)
        argv = [
            binary,
            "--headless",
            *(["--no-sandbox"] if os.geteuid() == 0 else []),  # the sandbox cannot start as root
            "--disable-gpu",
            "--disable-background-networking",
            f"--user-data-dir={d}/profile",
            f"--window-size={SHOT_WINDOW[0]},{SHOT_WINDOW[1]}",
            f"--screenshot={out.resolve()}",
            page.as_uri(),
        ]
        try:
            done = subprocess.run(argv, capture_output=True, timeout=SHOT_TIMEOUT, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"chromium failed: {exc}"
    if done.returncode != 0 or not out.is_file():
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return f"chromium exited with {done.returncode}: {tail[0][:200]}"
    return None


def _finished_record(progress: Path) -> dict[str, object] | None:
    """The job's ``finished`` progress record, if that is its last record."""
    record = last_record(progress)
    return record if record is not None and record.get("event") == "finished" else None


async def run_once(
    jobs: Sequence[DemoJob],
    *,
    root: Path,
    workers: int,
    cpus_per_worker: float,
    with_specon: bool,
    policy: Path | None,
    say: Say,
    deadline: float,
    label: str,
    runtime: RuntimeName = "local",
    warm: bool = True,
    page: PageKeeper | None = None,
    spec_of: Callable[[DemoJob], JobSpec] = job_spec,
    agent_args: Sequence[str] = (),
    lose: Sequence[HostLoss] = (),
    restart_after: float = 60.0,
) -> RunResult:
    """One run: submit at the arrival times, watch until every job finished (or the deadline).
    ``warm``: jobs start and restore from a warm interpreter per worker (local runtime);
    ``page``: where the specon run keeps its status page; ``spec_of``: each job's spec (the
    built-in workloads on the CPU by default); ``agent_args``: more for every agent;
    ``lose``: hosts to lose (``specon.embedded.host_loss``), whose jobs the manager restores
    or, without specon, the driver restarts from scratch ``restart_after`` seconds later."""
    wids = [WorkerId(f"w{i}") for i in range(workers)]
    async with EmbeddedCluster(
        root,
        workers=workers,
        cpus_per_worker=cpus_per_worker,
        policy=policy,
        with_specon=with_specon,
        runtime=runtime,
        warm=warm,
        agent_args=agent_args,
    ) as cluster:
        if with_specon and cluster.manager is not None:
            url, token = cluster.manager.url, cluster.tokens_dir / "read"
            say(
                f"[{label}] status page: open {url}/ and paste the token from {token} "
                f"(or: specon status --manager {url} --token-file {token})"
            )
        t0 = time.time()
        by_id = {j.id: j for j in jobs}
        losses = HostLosses(
            lose,
            restart_after=None if with_specon else restart_after,
            spec_of=lambda jid: spec_of(by_id[jid]),
            say=lambda line: say(f"[{label} {time.time() - t0:6.1f}s] {line}"),
        )
        pending = list(jobs)
        where: dict[str, list[tuple[float, str]]] = {}
        finish: dict[str, tuple[float, int]] = {}
        quality: dict[str, float | None] = {}
        infos: dict[str, ContainerInfo] = {}
        seen_migrations: set[str] = set()
        next_report = 0.0
        while len(finish) < len(jobs):
            now = time.time() - t0
            if now > deadline:
                say(
                    f"[{label} {now:6.1f}s] deadline reached with {len(jobs) - len(finish)} job(s) unfinished"
                )
                break
            while pending and pending[0].submit <= now:
                job = pending.pop(0)
                i = jobs.index(job)
                worker = wids[i % workers]  # the paper's fixed round-robin placement
                info = await cluster.submit(spec_of(job), worker)
                infos[job.id] = info
                where[job.id] = [(round(job.submit, 3), worker)]
                say(f"[{label} {now:6.1f}s] submit {job.id} ({job.model}, {job.steps} steps) -> {worker}")
            await losses.step(cluster, now, lambda jid: jid in finish)
            running: dict[str, int] = dict.fromkeys(wids, 0)
            for c in await cluster.containers():
                if c.alive:
                    running[c.worker] += 1
                    hist = where.setdefault(c.id, [])
                    if hist and hist[-1][1] != c.worker:
                        hist.append((round(now, 3), c.worker))
                if c.id in finish or c.id not in infos:
                    continue
                rec = _finished_record(c.progress_path)
                if rec is not None and not c.alive:
                    ts = float(rec.get("ts", time.time()))  # type: ignore[arg-type]
                    done = int(rec.get("steps", rec.get("step", 0)))  # type: ignore[call-overload]
                    finish[c.id] = (ts - t0, done)
                    q = quality_time(c.progress_path, log_every=LOG_EVERY)
                    quality[c.id] = None if q is None else q - t0
                    jct = ts - t0 - next(j.submit for j in jobs if j.id == c.id)
                    say(f"[{label} {now:6.1f}s] {c.id} finished on {c.worker}: JCT {jct:.1f}s")
            if with_specon:
                with contextlib.suppress(Exception):
                    st = await cluster.status()
                    if page is not None and page.due(now, st):
                        page.keep(now, await _page(cluster))
                    for m in st.migrations:
                        if m.id not in seen_migrations and m.state.value in ("done", "rolled_back"):
                            seen_migrations.add(m.id)
                            down = "" if m.downtime is None else f", downtime {m.downtime:.1f}s"
                            say(
                                f"[{label} {now:6.1f}s] {m.reason} migration of {m.container}: "
                                f"{m.source} -> {m.target} {m.state.value}{down}"
                            )
            if now >= next_report:
                load = " ".join(f"{w}:{n}" for w, n in running.items())
                say(f"[{label} {now:6.1f}s] finished {len(finish)}/{len(jobs)}; running per worker {load}")
                next_report = now + 30.0
            await asyncio.sleep(0.5)
        migrations: list[MigrationRecord] = []
        if with_specon:
            st = await cluster.status()
            for m in st.migrations:
                if m.state.value == "done":
                    migrations.append(
                        MigrationRecord(
                            m.container, m.source, m.target, m.reason, round(m.decided_at - t0, 3), m.downtime
                        )
                    )
        meta: dict[str, object] = {}
        if lose:  # a recovery is a ``recovered`` move (specon) or a restart from scratch (DS)
            meta["failures"] = {
                "hosts_lost": len(losses.dead),
                "lost_steps": sum(lost_steps(read_records(i.progress_path)) for i in infos.values()),
                "recoveries": losses.restarts + sum(m.reason == "recovered" for m in migrations),
            }
    results = tuple(
        JobResult(
            id=j.id,
            model=j.model,
            submit=j.submit,
            finish=finish[j.id][0] if j.id in finish else None,
            steps=j.steps,
            steps_done=finish[j.id][1] if j.id in finish else 0,
            worker_history=tuple(where.get(j.id, ())),
            quality_time=quality.get(j.id),
        )
        for j in jobs
    )
    return RunResult(jobs=results, migrations=tuple(migrations), meta=meta)
