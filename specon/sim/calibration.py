"""Calibrating the simulator against the local runtime: the arithmetic, no measuring.

``bench/bench_calibration.py`` measures; this module turns its measurements into
simulator parameters and compares real runs with simulated ones:

* sharing: k jobs on one worker with a CPU budget of ``cpus`` should each run at
  ``solo_rate * min(1, cpus / k)`` under ideal processor sharing (a job is
  single-threaded; ``solo_rate`` is its rate alone on a full core). The measured
  shortfall, ``predicted / measured``, is a per-step cost multiplier (1 = ideal). It
  grows with the oversubscription r = k / cpus; ``fit_exponent`` fits
  ``r ** interference_exponent`` (``specon.sim.cluster.SimParams``) to the samples.
* threads: the same for k jobs of T threads (``bench/bench_threads.py``). A thread that
  waits for a sibling the scheduler took off its core spins, so the cost per step grows
  with the threads per core the worker's threads run on, r = k * T / cores (a quota does
  not confine threads: a 1-CPU quota on 2 cores runs them on both). ``thread_rows``
  tabulates median and spread per (T, budget, k); ``fit_threads`` gives
  ``SimParams.thread_overhead`` and ``thread_exponent``.
* mapping: a workload of real jobs (``specon.embedded.demo.make_workload``) becomes a simulator
  ``Workload`` with the same workers, arrivals, models, steps and round-robin placement
  (``specon.embedded.demo.run_once``'s rule: the i-th job in submission order goes to worker
  ``w{i mod W}``). A real job that trains only ``steps`` steps logs the first ``steps``
  steps of its model's curve, so its trace is truncated, not stretched. Traces hold raw
  mini-batch losses; a real job logs the mean of the ``log_every`` mini-batches since
  its previous record, so the trace is smoothed by a centred mean over ``log_every``
  records, which gives its records about the real ones' noise. Its start-up
  (interpreter, torch import, data generation; a few CPU-seconds that compete for the
  worker like training does) is spread over its steps as extra per-step cost.
* gaps: the relative difference of the simulated average JCT and makespan from the
  real ones, per policy.
* parameter files: the measured ``SimParams`` as JSON/YAML, for ``specon sim --params``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from specon.config.yaml12 import load_yaml
from specon.evaluation import RunResult
from specon.model import WorkerId
from specon.sim.cluster import DEFAULT_PARAMS, JobPlan, SimParams, WorkerSpec, Workload
from specon.sim.trace import Trace
from specon.wire import codec


class PlannedJob(Protocol):
    """What the mapping needs of a real job (``specon.embedded.demo.DemoJob`` has it)."""

    @property
    def id(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def submit(self) -> float: ...
    @property
    def steps(self) -> int: ...
    @property
    def seed(self) -> int: ...


# --- sharing -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RateSample:
    """One measurement: ``k`` jobs on one worker with a CPU budget of ``cpus``."""

    k: int
    cpus: float
    rates: tuple[float, ...]  # steps per second of each job over the window
    cpu_seconds: float = math.nan  # CPU the worker used over the window (nan: not measured)
    seconds: float = math.nan  # the window
    threads: int = 1  # torch threads per job

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.k < 1 or len(self.rates) != self.k:
            raise ValueError(f"a sample of k={self.k} jobs needs k rates, got {len(self.rates)}")
        if not (math.isfinite(self.cpus) and self.cpus > 0):
            raise ValueError(f"cpus must be > 0, got {self.cpus}")
        if not all(math.isfinite(r) and r > 0 for r in self.rates):
            raise ValueError(f"rates must be > 0, got {self.rates}")

    @property
    def mean_rate(self) -> float:
        return statistics.fmean(self.rates)

    @property
    def cpu_per_step(self) -> float:
        """CPU-seconds per training step on this worker (nan when CPU was not measured)."""
        return self.cpu_seconds / (sum(self.rates) * self.seconds)

    @property
    def utilisation(self) -> float:
        """The share of the budget the jobs got: below 1 when the machine could not give it."""
        return self.cpu_seconds / (self.cpus * self.seconds)


def predicted_rate(solo_rate: float, *, k: int, cpus: float) -> float:
    """Each job's rate under ideal processor sharing: min(1, cpus / k) of a core."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return solo_rate * min(1.0, cpus / k)


def slowdown(solo_rate: float, sample: RateSample) -> float:
    """``predicted / measured`` per-job rate: 1 = ideal sharing, 1.1 = steps cost 10 % more."""
    return predicted_rate(solo_rate, k=sample.k, cpus=sample.cpus) / sample.mean_rate


def cpu_slowdown(solo: RateSample, sample: RateSample) -> float:
    """The same multiplier from CPU accounting: CPU per step at ``sample`` over CPU per step
    alone. Unlike wall-clock rates it does not count CPU the machine's other work took from
    the budget, only what time-sharing itself costs."""
    return sample.cpu_per_step / solo.cpu_per_step


def oversubscription(sample: RateSample) -> float:
    """Threads per core of the sample's worker: r = k * threads / cpus."""
    return sample.k * sample.threads / sample.cpus


def fit_exponent(points: Sequence[tuple[float, float]]) -> float:
    """The gamma of ``factor = r ** gamma`` that fits ``(r, factor)`` points best in log space
    (least squares through r = 1, factor = 1); points with r <= 1 say nothing and are skipped.
    Never negative: a measured speed-up from sharing is noise, not a model."""
    return fit_relative_exponent([(r, 1.0, f) for r, f in points])


def fit_relative_exponent(points: Sequence[tuple[float, float, float]]) -> float:
    """``fit_exponent`` for factors measured against a reference that may itself be
    oversubscribed: ``(r, r_ref, factor)`` with factor = (max(1, r) / max(1, r_ref)) ** gamma."""
    usable = [
        (math.log(max(1.0, r)) - math.log(max(1.0, ref)), math.log(f))
        for r, ref, f in points
        if f > 0 and max(1.0, r) > max(1.0, ref)
    ]
    if not usable:
        raise ValueError("no oversubscribed sample to fit")
    return max(0.0, sum(x * y for x, y in usable) / sum(x * x for x, _ in usable))


# --- threads -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ThreadPoint:
    """One window of the thread measurement and the cores the machine's other work used
    meanwhile."""

    sample: RateSample
    foreign: float = 0.0


@dataclass(frozen=True, slots=True)
class Spread:
    median: float
    lo: float
    hi: float

    @classmethod
    def of(cls, values: Sequence[float], per: float = 1.0) -> Spread:
        return cls(statistics.median(values) / per, min(values) / per, max(values) / per)

    def text(self, fmt: str = ".2f") -> str:
        return f"{self.median:{fmt}} [{self.lo:{fmt}}-{self.hi:{fmt}}]"


@dataclass(frozen=True, slots=True)
class ThreadRow:
    """One (threads, budget, k) point over its windows. Ratios are to the median of the
    one-job windows of the same threads and budget (a window the machine's other work
    disturbed moves a median less than a pairing)."""

    threads: int
    cpus: float
    k: int
    r: float  # threads per core the worker's threads run on
    ms_per_step: Spread  # CPU milliseconds per step (cpuacct)
    slowdown: Spread  # CPU per step over one T-thread job alone on this budget
    throughput: Spread  # all k jobs' steps/s over one T-thread job alone's on this budget
    utilisation: float  # median share of the budget the jobs used
    foreign: float  # median cores the machine's other work used

    def cells(self) -> list[str]:
        return [
            str(self.threads), f"{self.cpus:g}", str(self.k), f"{self.r:g}", self.ms_per_step.text(".1f"),
            self.slowdown.text(), self.throughput.text(), f"{100 * self.utilisation:.0f} %",
            f"{self.foreign:.2f}",
        ]  # fmt: skip


THREAD_COLUMNS = (
    "T", "budget (CPU)", "k", "r = kT/cores", "CPU ms/step", "slowdown (CPU/step vs alone)",
    "throughput (all k vs alone)", "budget used", "other load (cores)",
)  # fmt: skip


def _grouped(points: Sequence[ThreadPoint]) -> dict[tuple[int, float, int], list[ThreadPoint]]:
    """Windows by (threads, budget, k), sorted."""
    out: dict[tuple[int, float, int], list[ThreadPoint]] = {}
    for p in points:
        out.setdefault((p.sample.threads, p.sample.cpus, p.sample.k), []).append(p)
    return dict(sorted(out.items()))


def thread_rows(points: Sequence[ThreadPoint], *, cores: int) -> list[ThreadRow]:
    """The table: one row per (threads, budget, k); ``cores``: the CPUs the worker's
    threads could run on."""
    groups = _grouped(points)
    rows = []
    for (threads, cpus, k), windows in groups.items():
        alone = groups.get((threads, cpus, 1))
        if not alone:
            continue
        solo_cpu = statistics.median(p.sample.cpu_per_step for p in alone)
        solo_rate = statistics.median(sum(p.sample.rates) for p in alone)
        samples = [p.sample for p in windows]
        rows.append(
            ThreadRow(
                threads=threads,
                cpus=cpus,
                k=k,
                r=k * threads / cores,
                ms_per_step=Spread.of([1000 * s.cpu_per_step for s in samples]),
                slowdown=Spread.of([s.cpu_per_step for s in samples], solo_cpu),
                throughput=Spread.of([sum(s.rates) for s in samples], solo_rate),
                utilisation=statistics.median(s.utilisation for s in samples),
                foreign=statistics.median(p.foreign for p in windows),
            )
        )
    return rows


def thread_ratios(
    points: Sequence[ThreadPoint], *, threads: int, cores: int
) -> list[tuple[float, float, float]]:
    """``(r, r_alone, factor)`` for every window of k > 1 ``threads``-thread jobs: its CPU
    per step over the median one job alone has on the same budget, r = k * threads / cores
    (``fit_relative_exponent``'s input)."""
    groups = _grouped(points)
    out = []
    for (t, cpus, k), windows in groups.items():
        alone = groups.get((t, cpus, 1))
        if t != threads or k == 1 or not alone:
            continue
        solo = statistics.median(p.sample.cpu_per_step for p in alone)
        out += [(k * t / cores, t / cores, p.sample.cpu_per_step / solo) for p in windows]
    return out


@dataclass(frozen=True, slots=True)
class ThreadFit:
    threads: int
    overhead: float  # SimParams.thread_overhead: wall clock, see fit_threads
    cpu_overhead: float  # the same from CPU accounting (lower: it leaves out idle cores)
    exponent: float  # SimParams.thread_exponent
    ratios: tuple[tuple[float, float, float], ...]  # what the exponent was fitted to


def fit_threads(points: Sequence[ThreadPoint], *, threads: int, cores: int) -> ThreadFit:
    """``thread_overhead`` and ``thread_exponent`` for jobs of ``threads`` threads.

    exponent: ``fit_relative_exponent`` of ``thread_ratios`` (CPU accounting).
    overhead: ``threads / (rate * c1)``, medians over windows: a T-thread job alone on a
    budget of T CPUs (``rate``: its steps/s) against ``c1``, a one-thread job's CPU per step
    alone on that budget: what its step costs in the simulator's terms (job_cores = T
    cores, step_cost = one thread's). Wall clock, so the simulated job runs at the measured
    speed, cores its threads leave idle included; ``cpu_overhead`` is the CPU-accounting
    figure (CPU per step over ``c1``)."""
    groups = _grouped(points)
    multi = groups.get((threads, float(threads), 1))
    single = groups.get((1, float(threads), 1))
    if not (multi and single):
        raise ValueError(f"need a {threads}-thread and a 1-thread job alone on {threads} CPUs")
    c1 = statistics.median(p.sample.cpu_per_step for p in single)
    ratios = thread_ratios(points, threads=threads, cores=cores)
    return ThreadFit(
        threads=threads,
        overhead=max(1.0, threads / (statistics.median(p.sample.mean_rate for p in multi) * c1)),
        cpu_overhead=statistics.median(p.sample.cpu_per_step for p in multi) / c1,
        exponent=fit_relative_exponent(ratios),
        ratios=tuple(ratios),
    )


# --- mapping a real workload ---------------------------------------------------------


def truncated(trace: Trace, steps: int) -> Trace:
    """The first ``steps`` steps of ``trace``: what a job that trains ``steps`` steps logs
    (records past the trace's end repeat its last loss, as ``Trace.loss_at`` reads them)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    records = max(1, steps // trace.stride)
    losses = trace.losses[:records]
    losses += (trace.losses[-1],) * (records - len(losses))
    source = f"{trace.source} (first {steps} steps)"
    return Trace(trace.model, steps, trace.step_cost, losses, source, trace.stride)


def smoothed(trace: Trace, window: int) -> Trace:
    """``trace`` with each loss replaced by the mean of the ``window`` records centred on it
    (fewer at the ends): the noise of a record that averages ``window`` mini-batches."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if window == 1:
        return trace
    xs = trace.losses
    lo_off, hi_off = (window - 1) // 2, window // 2
    out = []
    for i in range(len(xs)):
        part = xs[max(0, i - lo_off) : i + hi_off + 1]
        out.append(sum(part) / len(part))
    source = f"{trace.source} (mean of {window} records)"
    return Trace(trace.model, trace.steps, trace.step_cost, tuple(out), source, trace.stride)


def pick_trace(traces: Mapping[str, Sequence[Trace]], model: str, seed: int) -> Trace:
    """One recorded trace of ``model``, chosen by the job's seed (deterministic)."""
    have = traces.get(model)
    if not have:
        known = ", ".join(sorted(m for m, ts in traces.items() if ts)) or "none"
        raise ValueError(f"no trace of model {model!r} (have: {known})")
    return have[seed % len(have)]


def sim_workload(
    jobs: Sequence[PlannedJob],
    *,
    workers: int,
    cpus_per_worker: float,
    traces: Mapping[str, Sequence[Trace]],
    startup_cpu: Mapping[str, float] | float = 0.0,
    log_every: int = 1,
    step_costs: Mapping[str, float] | None = None,
) -> Workload:
    """The simulator's twin of a real run of ``jobs`` (see the module docstring).

    ``startup_cpu``: CPU-seconds a job spends before its first step, per model or one
    figure for all. ``log_every``: mini-batches each real progress record averages.
    ``step_costs``: CPU-seconds per step measured on this machine now, per model, in place
    of the traces' (recorded on another day, perhaps on a slower or faster CPU).
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    wids = [WorkerId(f"w{i}") for i in range(workers)]
    plans = []
    for i, job in enumerate(jobs):
        trace = smoothed(truncated(pick_trace(traces, job.model, job.seed), job.steps), log_every)
        start = startup_cpu if isinstance(startup_cpu, int | float) else startup_cpu.get(job.model, 0.0)
        if not (math.isfinite(start) and start >= 0):
            raise ValueError(f"startup_cpu of {job.model} must be >= 0, got {start}")
        plans.append(
            JobPlan(
                id=job.id,
                model=job.model,
                submit=job.submit,
                trace=trace,
                steps=job.steps,
                step_cost=(step_costs or {}).get(job.model, trace.step_cost) + start / job.steps,
                worker=wids[i % workers],
            )
        )
    return Workload(tuple(WorkerSpec(w, cpus_per_worker) for w in wids), tuple(plans))


# --- gaps ----------------------------------------------------------------------------


def relative_gap(real: float | None, sim: float | None) -> float | None:
    """``(sim - real) / real``: + = the simulator is slower; None when either is missing."""
    if real is None or sim is None or not real > 0:
        return None
    return (sim - real) / real


@dataclass(frozen=True, slots=True)
class Gap:
    """One policy's real and simulated figures (seconds) and their relative gaps."""

    policy: str
    real_avg_jct: float | None
    sim_avg_jct: float | None
    real_makespan: float | None
    sim_makespan: float | None
    # Mean over jobs of |sim JCT - real JCT| / real JCT (None if a job did not finish).
    job_gap: float | None
    real_moves: int
    sim_moves: int

    @property
    def avg_jct_gap(self) -> float | None:
        return relative_gap(self.real_avg_jct, self.sim_avg_jct)

    @property
    def makespan_gap(self) -> float | None:
        return relative_gap(self.real_makespan, self.sim_makespan)


def gap(policy: str, real: RunResult, sim: RunResult) -> Gap:
    """Compare a real run with its simulated twin (jobs matched by id)."""
    sim_jct = {j.id: j.jct for j in sim.jobs}
    per_job = [relative_gap(j.jct, sim_jct.get(j.id)) for j in real.jobs]
    known = [abs(g) for g in per_job if g is not None]
    return Gap(
        policy=policy,
        real_avg_jct=real.avg_jct,
        sim_avg_jct=sim.avg_jct,
        real_makespan=real.makespan,
        sim_makespan=sim.makespan,
        job_gap=statistics.fmean(known) if known and len(known) == len(per_job) else None,
        real_moves=len(real.migrations),
        sim_moves=len(sim.migrations),
    )


# --- parameter files -----------------------------------------------------------------


def params_to_dict(params: SimParams) -> dict[str, Any]:
    return dict(codec.to_data(params))


def params_from_dict(
    data: object, *, base: SimParams = DEFAULT_PARAMS, source: str = "<params>"
) -> SimParams:
    """``base`` with the fields ``data`` names replaced; every problem is reported at once.

    Read through the one codec (``specon.wire.codec``): a problem names its key, an unknown key
    gets a did-you-mean, and ``SimParams``'s own range checks run on the result.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"{source}: expected a mapping of simulator parameters, got {codec.describe(data)}")
    try:
        return codec.from_data(SimParams, {**params_to_dict(base), **data})
    except codec.SchemaError as e:
        raise ValueError(f"{source}: {codec.explain(e)}") from None


def load_params(path: Path | str, *, base: SimParams = DEFAULT_PARAMS) -> SimParams:
    """Simulator parameters from a JSON or YAML file (a mapping of ``SimParams`` fields).

    Read with the policy file's YAML loader (``specon.config.yaml12.load_yaml``, YAML 1.2), which
    reads JSON as well.
    """
    p = Path(path)
    try:
        data = load_yaml(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{p}: {exc}") from exc
    return params_from_dict(data, base=base, source=str(p))
