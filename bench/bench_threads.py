"""Multi-threaded jobs sharing a worker (issue 10, item 5): how k jobs of T torch threads
slow each other under a cgroup CPU budget, and the simulator's thread parameters fitted to it.

On ONE local worker (``LocalCluster``, a cgroup quota) four real training jobs of one model
(``python -m specon.workloads --threads T``) start once per (model, T). Each point (budget,
k) runs k of them and holds the others stopped (SIGSTOP: no CPU, no wake-ups), with the
quota set live (a quota change applies at once), so all points are measured on the same
processes, in rounds that interleave them (the machine's other load falls on every point
alike). A window opens once every running job has logged a record since the change plus
``SETTLE`` seconds, and reads:

* the worker's CPU-seconds (cpuacct), hence CPU per training step. Unlike a wall-clock rate
  it is not lowered by CPU the machine's other work takes from the budget; it does count a
  thread's spin-waiting for a sibling that is descheduled (libgomp spins before it sleeps);
* every running job's steps, from its progress log (interpolated at the window's ends),
  hence the aggregate wall-clock throughput (steps/s of all k jobs together), which also
  loses what quota throttling leaves idle;
* the CPU the rest of the machine used (``/proc/stat`` less the worker's), reported per
  point: a foreign process on a core stalls a multi-threaded job's barrier. The bench's
  cgroup weighs like as many processes as it runs threads (``_weigh``), and multi-threaded
  windows the rest of the machine disturbed are measured again (``MAX_OTHER``).

Per (T, budget, k): the median and spread over ``REPEATS`` rounds of the CPU per step over
the median of one T-thread job alone on that budget (the slowdown multiplier), and of the
aggregate throughput over one job alone's. ``specon.sim.calibration.fit_threads`` turns
the windows into ``SimParams.thread_overhead`` and ``thread_exponent`` per model; pooled
over the models they are written to ``bench/results/threads_params.json`` (``specon sim
--params``: 2-thread jobs on workers of real cores) and the tables to
``bench/results/threads_table.md``. Two full runs took 518 s and 496 s on 2 cores (at most
``RETRY_SECONDS`` more per multi-threaded set, and the one-job windows' retries, on a busy
machine); ``quick``: one model, one round of shorter windows.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from bench.figures import Figure
from specon.model import ContainerId, WorkerId
from specon.runtime.base import ContainerInfo, JobSpec
from specon.runtime.local.backend import LocalRuntime
from specon.runtime.local.cluster import LocalCluster
from specon.sim.calibration import (
    THREAD_COLUMNS,
    RateSample,
    ThreadFit,
    ThreadPoint,
    ThreadRow,
    fit_exponent,
    fit_relative_exponent,
    fit_threads,
    params_to_dict,
    thread_rows,
)
from specon.sim.cluster import DEFAULT_PARAMS, SimParams

# Models measured (each a separate set of jobs); quick mode measures the first only.
MODELS = {False: ("vae", "gru"), True: ("vae",)}
THREADS = (1, 2)  # 2 = every core of these machines, as the paper's TensorFlow jobs used
KS = (1, 2, 3, 4)
BUDGETS = (1.0, 2.0)
REPEATS = {False: 3, True: 1}
WINDOW = {False: 3.0, True: 2.0}  # seconds per window
SETTLE = 1.0  # seconds after every running job has logged since the change
# A multi-threaded window during which the rest of the machine used more cores than this is
# measured again (the quietest attempt is kept) while RETRY_SECONDS of the whole run are
# left: a process on a core stalls every barrier of a 2-thread job. One-thread jobs' CPU per
# step does not care (``bench_calibration``), so their windows are never measured again.
MAX_OTHER = 0.25
RETRY_SECONDS = {False: 60.0, True: 20.0}  # per (model, T) set, beyond the one-job windows
LOG_EVERY = 1  # a record per step: the window's ends are interpolated between close records
CGROUP_PARENT = "specon-bench-threads"  # weighed by ``_weigh``, so not the shared "specon"
RESULTS = Path(__file__).resolve().parent / "results"
PARAMS_FILE = RESULTS / "threads_params.json"
TABLE_FILE = RESULTS / "threads_table.md"


class _Log:
    """A job's (time, step) training records, read incrementally from its progress log."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.points: list[tuple[float, float]] = []

    def poll(self) -> float:
        """Read what was appended; the time of the newest record (0: none yet)."""
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return 0.0
        end = chunk.rfind(b"\n") + 1  # only complete lines
        self.offset += end
        for line in chunk[:end].splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            ts, step = rec.get("ts"), rec.get("step")
            if "loss" in rec and isinstance(ts, float | int) and isinstance(step, int):
                self.points.append((float(ts), float(step)))
        return self.points[-1][0] if self.points else 0.0

    def step_at(self, t: float) -> float:
        """The step at ``t``, interpolated between the records either side of it."""
        after = next(i for i, (ts, _) in enumerate(self.points) if ts > t)
        (t0, s0), (t1, s1) = self.points[after - 1], self.points[after]
        return s0 + (s1 - s0) * (t - t0) / (t1 - t0)


def _busy_seconds() -> float:
    """CPU-seconds the whole machine has spent busy since boot (``/proc/stat``)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _cpu(rt: LocalRuntime) -> float:
    return rt.budget.cpu_seconds({}, per_job=False)[0]


async def _until(cond: object, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("a job did not log in time")
        await asyncio.sleep(0.05)


def _spec(jid: str, model: str, threads: int, seed: int) -> JobSpec:
    return JobSpec(
        id=ContainerId(jid),
        command=(sys.executable, "-m", "specon.workloads", "--model", model, "--steps", "10000000",
                 "--seed", str(seed), "--threads", str(threads), "--log-every", str(LOG_EVERY),
                 "--checkpoint-every", "0", "--checkpoint-interval", "0"),
        model=model,
    )  # fmt: skip


def _weigh(rt: LocalRuntime, threads: int) -> None:
    """Weigh the bench's top cgroup like ``threads`` processes. A group competes with the
    root group's processes as ONE of them by default, so the machine's other work (tests,
    benches of other people) would take most of a core from a worker whose threads wait on
    each other; weighed per thread, each of its threads counts as much as any other
    process's thread, no more."""
    group = rt.budget.group
    if group is not None:
        top = group.cpu_dir.parents[group.levels - 2]  # the CGROUP_PARENT level
        (top / "cpu.shares").write_text(str(min(262_144, 1024 * threads)))


@dataclass(slots=True)
class Retries:
    seconds: float  # per set of jobs, for measuring windows again
    count: int = 0  # windows measured again
    over: int = 0  # windows kept with over MAX_OTHER cores of other load


def _signal(infos: Sequence[ContainerInfo], sig: signal.Signals) -> None:
    for info in infos:
        if info.pid is not None:
            os.killpg(info.pid, sig)  # the launcher and its job


async def _window(
    rt: LocalRuntime,
    infos: Sequence[ContainerInfo],
    logs: Sequence[_Log],
    *,
    k: int,
    cpus: float,
    threads: int,
    window: float,
) -> ThreadPoint:
    """Run the first ``k`` jobs (the rest stopped) on a ``cpus`` budget and measure a window."""  # fmt: skip
    _signal(infos[k:], signal.SIGSTOP)
    rt.set_cpus(cpus)
    _weigh(rt, k * threads)
    changed = time.time()
    _signal(infos[:k], signal.SIGCONT)
    running = logs[:k]

    def logged_since(t: float) -> bool:
        return all([log.poll() > t for log in running])  # a list: poll every log

    await _until(lambda: logged_since(changed))
    await asyncio.sleep(SETTLE)
    t_a, cpu_a, busy_a = time.time(), _cpu(rt), _busy_seconds()
    await asyncio.sleep(window)
    t_b, cpu_b, busy_b = time.time(), _cpu(rt), _busy_seconds()
    await _until(lambda: logged_since(t_b))
    rates = tuple((log.step_at(t_b) - log.step_at(t_a)) / (t_b - t_a) for log in running)
    used = cpu_b - cpu_a
    sample = RateSample(k=k, cpus=cpus, rates=rates, cpu_seconds=used, seconds=t_b - t_a, threads=threads)
    return ThreadPoint(sample, max(0.0, (busy_b - busy_a) - used) / (t_b - t_a))


async def measure(
    root: Path,
    *,
    model: str,
    threads: int,
    points: Sequence[tuple[float, int]],
    repeats: int,
    window: float,
    retries: Retries,
) -> list[ThreadPoint]:
    """Every (budget, k) point ``repeats`` times, interleaved, on one set of ``max(k)`` jobs;
    a multi-threaded window during which the machine's other work used over ``MAX_OTHER``
    cores is measured again while ``retries.seconds`` are left (a one-job window up to
    three times more regardless), and the quietest attempt kept."""
    n = max(k for _, k in points)
    name = f"thr{os.getpid()}{model}{threads}"
    async with LocalCluster(root, [max(c for c, _ in points)], name=name, cgroup_parent=CGROUP_PARENT) as cl:
        rt = cl.runtimes[WorkerId("w0")]
        group = rt.budget.group
        clusters = [] if group is None else [group.cpu_dir.parent, group.cpuacct_dir.parent]
        infos = [await rt.start(_spec(f"{model}-t{threads}-{i}", model, threads, i)) for i in range(n)]
        logs = [_Log(i.progress_path) for i in infos]
        out = []
        left = retries.seconds
        try:
            await _until(lambda: all(log.poll() > 0 for log in logs), timeout=180.0)
            for i in range(repeats):
                for cpus, k in points:
                    one = functools.partial(
                        _window, rt, infos, logs, k=k, cpus=cpus, threads=threads, window=window
                    )
                    best = await one()
                    tries = 1
                    # The one-job windows are every ratio's reference: they may always try again.
                    while threads > 1 and best.foreign > MAX_OTHER and ((k == 1 and tries < 4) or left > 0):
                        t0 = time.monotonic()
                        best = min(best, await one(), key=lambda p: p.foreign)
                        left -= time.monotonic() - t0
                        tries += 1
                    retries.count += tries - 1
                    retries.over += threads > 1 and best.foreign > MAX_OTHER
                    out.append(best)
                got = ", ".join(f"{1000 * p.sample.cpu_per_step:.0f}" for p in out[-len(points) :])
                print(f"      round {i + 1}: {got} ms/step ({_load()})", flush=True)
        finally:
            _signal(infos, signal.SIGCONT)  # stopped jobs would not act on teardown's SIGTERM
    await _prune(clusters)
    return out


async def _prune(clusters: Sequence[Path]) -> None:
    """Remove what teardown left of this run's groups (a job's group can still be busy with
    a process being killed when teardown removes it: EBUSY), then CGROUP_PARENT if empty."""
    for _ in range(20):
        for top in clusters:
            below = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
            for d in [*below, top]:
                with contextlib.suppress(OSError):
                    d.rmdir()
        if not any(top.exists() for top in clusters):
            break
        await asyncio.sleep(0.1)
    for top in clusters:
        with contextlib.suppress(OSError):
            top.parent.rmdir()  # another run's groups keep it (EBUSY/ENOTEMPTY)


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f} (1 min) / {five:.2f} (5 min) on {os.cpu_count()} CPUs"


def _model(row: ThreadRow, params: SimParams, cores: int) -> float:
    """The simulator's multiplier for ``row`` over one job alone: single-threaded jobs by
    jobs per budget CPU (as ``bench_calibration`` measured them), threaded ones by threads
    per core their threads run on."""
    if row.threads == 1:
        one = replace(params, job_threads=1)
        return one.slowdown(row.k / row.cpus) / one.slowdown(1 / row.cpus)
    return params.slowdown(row.r) / params.slowdown(row.threads / cores)


def markdown(rows: Sequence[ThreadRow], model: Sequence[float]) -> str:
    columns = (*THREAD_COLUMNS, "model")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += [
        "| " + " | ".join([*row.cells(), f"{m:.2f}"]) + " |" for row, m in zip(rows, model, strict=True)
    ]
    return "\n".join(lines)


def _fit_text(fit: ThreadFit) -> str:
    return (
        f"T={fit.threads}: thread_exponent {fit.exponent:.3f} ({len(fit.ratios)} ratios), thread_overhead "
        f"{fit.overhead:.3f} (wall clock; CPU accounting {fit.cpu_overhead:.3f})"
    )


def run(quick: bool) -> list[Figure]:
    cores = len(os.sched_getaffinity(0))
    threads = max(THREADS)
    grid = list(itertools.product(BUDGETS, KS))
    measured: dict[str, list[ThreadPoint]] = {}
    retries = Retries(RETRY_SECONDS[quick])
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="specon-bench-thr-") as tmp:
        for model, t in itertools.product(MODELS[quick], THREADS):
            print(f"  ... {model}, {t} thread(s): {len(grid)} points x {REPEATS[quick]} rounds of "
                  f"{WINDOW[quick]:g} s ({_load()})", flush=True)  # fmt: skip
            got = asyncio.run(
                measure(Path(tmp) / f"{model}{t}", model=model, threads=t, points=grid,
                        repeats=REPEATS[quick], window=WINDOW[quick], retries=retries)
            )  # fmt: skip
            measured.setdefault(model, []).extend(got)
    fits = {m: fit_threads(points, threads=threads, cores=cores) for m, points in measured.items()}
    # Pooled: the exponent fitted to every model's ratios, the mean of the models' overheads.
    ratios = [r for f in fits.values() for r in f.ratios]
    exponent, n_ratios = fit_relative_exponent(ratios), len(ratios)
    overhead = statistics.fmean(f.overhead for f in fits.values())
    params = replace(
        DEFAULT_PARAMS, job_threads=threads, job_cores=float(threads), thread_overhead=overhead,
        thread_exponent=exponent,
    )  # fmt: skip
    figures: list[Figure] = []
    tables = []
    singles: list[tuple[float, float]] = []
    for model, points in measured.items():
        rows = thread_rows(points, cores=cores)
        model_x = [_model(row, params, cores) for row in rows]
        singles += [
            (row.k / row.cpus, row.slowdown.median) for row in rows if row.threads == 1 and row.cpus == 1
        ]
        tables.append(f"### {model}\n\n{markdown(rows, model_x)}\n\nfit: {_fit_text(fits[model])}")
        figures += [
            Figure(
                f"{model} T={row.threads} k={row.k} on {row.cpus:g} CPU: CPU/step vs alone",
                row.slowdown.median,
                "x",
                detail=f"r={row.r:g}; spread {row.slowdown.text()}; model {m:.2f}; "
                f"{row.ms_per_step.text('.1f')} ms/step; throughput vs alone {row.throughput.text()}; "
                f"budget used {100 * row.utilisation:.0f} %; other load {row.foreign:.2f} cores",
            )
            for row, m in zip(rows, model_x, strict=True)
        ]
    detail = "; ".join(_fit_text(f) for f in fits.values())
    quiet = (f"{retries.count} windows measured again for other load over {MAX_OTHER:g} cores; "
             f"{retries.over} kept over it")  # fmt: skip
    figures += [
        Figure(f"thread_exponent, T={threads} (CPU/step ~ r ** e, r = kT/{cores} cores)", exponent, "",
               detail=f"pooled over {', '.join(fits)} ({n_ratios} ratios); {detail}; {quiet}"),
        Figure(f"thread_overhead, T={threads} (alone: step time x T / one thread's CPU/step)", overhead, "x",
               detail=f"mean over models; {detail}"),
        Figure("one thread, 1-CPU budget: exponent of r = k/CPU (cf. interference_exponent)",
               fit_exponent(singles), "", detail=f"DEFAULT_PARAMS: {DEFAULT_PARAMS.interference_exponent:g}"),
    ]  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    PARAMS_FILE.write_text(json.dumps(params_to_dict(params), indent=2) + "\n", encoding="utf-8")
    TABLE_FILE.write_text(
        f"Measured by `python -m bench bench_threads` ({'quick' if quick else 'full'}; {cores} cores; "
        f"{REPEATS[quick]} rounds of {WINDOW[quick]:g} s windows; median [min-max]; {quiet}).\n\n"
        + "\n\n".join(tables)
        + f"\n\npooled: thread_exponent {exponent:.3f}; thread_overhead {overhead:.3f}\n",
        encoding="utf-8",
    )
    print(f"  ... done in {time.monotonic() - t0:.0f} s ({_load()}); {PARAMS_FILE}, {TABLE_FILE}", flush=True)
    return figures
