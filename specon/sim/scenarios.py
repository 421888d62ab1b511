"""Arrival processes, workloads and the paper's scenarios A1-A5 (SPEC §8).

A scenario turns a seed and a set of loss-curve traces into a ``Workload``: arrival
times, a model per job (one of its traces, picked by the seed), and a job size. Every
policy of one seed runs on the identical workload. How it does so is its plan: the
paper's workload model (``PaperWorkload``, below) for A1-A5, or a user's own cluster and
jobs read from a scenario file (``specon.sim.scenario_file``).

Job sizes and their calibration. In the paper's model a job's work (CPU-seconds on one core) is
``work * relative model cost * exp(size_sigma * z - size_sigma**2 / 2)``, z ~ N(0, 1) (a
log-normal factor with mean 1); the relative model cost is the model's recorded
``steps * step_cost`` over the mean of the scenario's models, and a job runs its trace's
step count (the loss curve keeps its shape, the per-step cost is scaled). Workers have
one core each and a job alone uses it fully (see ``specon.sim.cluster``), as a
multi-threaded training job fills a node. The paper gives no job sizes; ``work`` and
``size_sigma`` were fitted by a grid search over DS runs (seeds 0-19) so that DS's mean
makespan, and where the paper gives it DS's mean average JCT, fall on the paper's:

====  ===========  ======  ==================================  ===========================
      work (s)     sigma   DS avg JCT / makespan here (s)      paper DS (s)
====  ===========  ======  ==================================  ===========================
A1    210          0.20    295 / 1261                          275.2 / 1260
A2    210          0.20    (A1's VAE jobs)                     not given
A3    233          0.35    869 / 1420                          - / 1421
A4    192          0.35    885 / 1743                          865.7 / 1760
A5    250          0.35    598 / 2074                          596.3 / 2070
====  ===========  ======  ==================================  ===========================

In A1 no (work, sigma) pair on this model meets both of the paper's figures; the makespan
was kept. ``bench_sim`` prints DS's figures beside the paper's for every scenario, so a
drift in the calibration shows.
"""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass, field, replace
from pathlib import Path
from typing import Protocol

from specon.model import WorkerId
from specon.sim.cluster import JobPlan, WorkerSpec, Workload
from specon.sim.failures import Failures
from specon.sim.trace import Trace

PAPER_MODELS = ("vae", "gru", "birnn", "rnn", "dynrnn")  # SpeCon Table II, as our workloads name them


# --- arrivals ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FixedInterval:
    interval: float
    start: float = 0.0

    def times(self, n: int, rng: random.Random) -> list[float]:
        del rng
        return [self.start + i * self.interval for i in range(n)]


@dataclass(frozen=True, slots=True)
class UniformWindow:
    """``n`` times uniform in [start, end], sorted; the first job arrives at ``start``
    (a run starts with its first job, as the paper's experiments do)."""

    start: float
    end: float

    def times(self, n: int, rng: random.Random) -> list[float]:
        out = sorted(rng.uniform(self.start, self.end) for _ in range(n))
        if out:
            out[0] = self.start
        return out


@dataclass(frozen=True, slots=True)
class Poisson:
    rate: float  # jobs per second
    start: float = 0.0

    def times(self, n: int, rng: random.Random) -> list[float]:
        t, out = self.start, []
        for _ in range(n):
            out.append(t)
            t += rng.expovariate(self.rate)
        return out


@dataclass(frozen=True, slots=True)
class ArrivalList:
    """Arrivals read from a file: submit times, optionally with the model of each job."""

    entries: tuple[tuple[float, str | None], ...]

    def times(self, n: int, rng: random.Random) -> list[float]:
        del rng
        return [t for t, _ in self.entries[:n]]


Arrivals = FixedInterval | UniformWindow | Poisson | ArrivalList


class ArrivalError(ValueError):
    pass


def read_arrivals(path: Path | str) -> ArrivalList:
    """Arrivals from CSV (a header with ``submit`` and optionally ``model``) or JSON (a list
    of ``{"submit": s, "model": m}`` objects or of numbers). Sorted by submit time."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ArrivalError(f"{p}: {exc}") from exc
    rows: list[tuple[object, object]] = []
    if p.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ArrivalError(f"{p}: {exc}") from exc
        if not isinstance(data, list):
            raise ArrivalError(f"{p}: expected a JSON list of arrivals")
        for item in data:
            rows.append((item.get("submit"), item.get("model")) if isinstance(item, dict) else (item, None))
    else:
        reader = csv.DictReader(text.splitlines())
        if reader.fieldnames is None or "submit" not in reader.fieldnames:
            raise ArrivalError(f"{p}: a CSV header with a 'submit' column is needed")
        rows = [(r.get("submit"), r.get("model") or None) for r in reader]
    entries: list[tuple[float, str | None]] = []
    for i, (submit, model) in enumerate(rows, start=1):
        try:
            t = float(submit)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ArrivalError(f"{p}: arrival {i}: submit time {submit!r} is not a number") from None
        if not (math.isfinite(t) and t >= 0):
            raise ArrivalError(f"{p}: arrival {i}: submit time must be finite and >= 0, got {t}")
        entries.append((t, None if model is None else str(model)))
    if not entries:
        raise ArrivalError(f"{p}: no arrivals")
    entries.sort(key=lambda e: e[0])
    return ArrivalList(tuple(entries))


# --- the paper's numbers ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PaperNumbers:
    """What the paper reports for one scenario (fractions; seconds)."""

    avg_jct_reduction: float | None = None
    makespan_reduction: float | None = None
    jobs_improved: float | None = None
    best_reduction: float | None = None
    ds_avg_jct: float | None = None
    specon_avg_jct: float | None = None
    ds_makespan: float | None = None
    specon_makespan: float | None = None

    @property
    def given(self) -> bool:
        """Whether the paper reports anything for the scenario (a user's own reports nothing)."""
        return any(x is not None for x in astuple(self))


# Table III: (alpha, interval) -> Reduced, Overall, Best, Makespan. (0.05, 30 s) is printed twice,
# identically.
TABLE_III: dict[tuple[float, float], PaperNumbers] = {
    (alpha, delta): PaperNumbers(
        jobs_improved=reduced, avg_jct_reduction=overall, best_reduction=best, makespan_reduction=makespan
    )
    for alpha, delta, reduced, overall, best, makespan in (
        (0.05, 20.0, 0.600, 0.057, 0.291, 0.061),
        (0.05, 25.0, 0.600, 0.068, 0.278, 0.075),
        (0.05, 30.0, 0.550, 0.032, 0.213, 0.040),
        (0.01, 30.0, 0.650, 0.096, 0.310, 0.082),
        (0.10, 30.0, 0.600, 0.064, 0.239, 0.031),
    )
}


# --- scenarios --------------------------------------------------------------------------

Traces = Mapping[str, Sequence[Trace]]


class WorkloadPlan(Protocol):
    """How a scenario builds one seed's workload: ``rng`` is that seed's (every draw comes
    from it, so a seed's workload is the same on every run); ``where`` names the scenario
    in errors."""

    def workload(self, rng: random.Random, traces: Traces, where: str) -> Workload: ...


def job_id(index: int, count: int) -> str:
    """The id of the ``index``-th of ``count`` jobs: ``job-07`` (zero-padded, so ids sort
    in submission order)."""
    return f"job-{index + 1:0{len(str(count))}d}"


def pick_trace(rng: random.Random, traces: Traces, model: str, *, where: str, index: int) -> Trace:
    """One of ``model``'s traces for job ``index``, drawn from ``rng`` (a model recorded with
    several seeds gives each job one of them)."""
    if not traces.get(model):
        raise ValueError(f"{where}: job {index + 1} wants model {model!r}, which has no trace")
    return rng.choice(list(traces[model]))


@dataclass(frozen=True, slots=True)
class PaperWorkload:
    """The paper's workload model (module docstring): ``jobs`` jobs on ``workers`` identical
    workers, models drawn from ``models``, log-normal job sizes around ``work``."""

    workers: int
    jobs: int
    arrivals: Arrivals
    models: tuple[str, ...]
    work: float  # mean CPU-seconds per job on one core (calibrated, see module docstring)
    size_sigma: float = 0.35
    cpu: float = 1.0  # cores per worker

    def workload(self, rng: random.Random, traces: Traces, where: str) -> Workload:
        models = [m for m in self.models if traces.get(m)]
        if not models:
            have = ", ".join(sorted(m for m, ts in traces.items() if ts)) or "none"
            raise ValueError(
                f"{where}: no traces for {', '.join(self.models)} (have: {have}); "
                "record some with `specon trace record` or pass a trace directory"
            )
        cost = {m: sum(t.steps * t.step_cost for t in traces[m]) / len(traces[m]) for m in models}
        mean_cost = sum(cost.values()) / len(cost)
        times = self.arrivals.times(self.jobs, rng)
        listed = self.arrivals.entries if isinstance(self.arrivals, ArrivalList) else ()
        workers = tuple(WorkerSpec(WorkerId(f"worker-{i + 1}"), self.cpu) for i in range(self.workers))
        jobs = []
        for i, t in enumerate(times):
            wanted = listed[i][1] if i < len(listed) else None
            model = wanted if wanted is not None else rng.choice(models)
            trace = pick_trace(rng, traces, model, where=where, index=i)
            rel = cost.get(model, mean_cost) / mean_cost
            work = self.work * rel * math.exp(self.size_sigma * rng.gauss(0.0, 1.0) - self.size_sigma**2 / 2)
            jobs.append(
                JobPlan(
                    id=job_id(i, len(times)),
                    model=model,
                    submit=round(t, 3),
                    trace=trace,
                    steps=trace.steps,
                    step_cost=work / trace.steps,
                )
            )
        return Workload(workers, tuple(jobs))


@dataclass(frozen=True, slots=True)
class Scenario:
    """A named workload plan with the policy settings it runs at and what the paper reports
    for it (nothing, for a user's own scenario: ``specon.sim.scenario_file``)."""

    name: str
    title: str
    plan: WorkloadPlan
    alpha: float = 0.01
    interval: float = 30.0
    paper: PaperNumbers = field(default_factory=PaperNumbers)
    # A2: the (alpha, interval) points of Table III.
    sweep: tuple[tuple[float, float], ...] = ()
    # Its hosts' failures (``specon.sim.failures``); None: hosts never fail.
    failures: Failures | None = None

    def workload(self, seed: int, traces: Traces) -> Workload:
        """The seeded workload; ``traces`` by model (``load_traces()``)."""
        key = f"{self.name}/{seed}"
        w = self.plan.workload(random.Random(key), traces, f"scenario {self.name}")
        return w if self.failures is None else replace(w, failures=self.failures, key=key)

    def with_failures(self, *, mtbf: float | None = None, repair: float | None = None) -> Scenario:
        """The scenario with its workers failing every ``mtbf`` seconds on average and back
        after ``repair`` (``--mtbf``, ``--repair``: each replaces the scenario's own)."""
        f = self.failures or Failures()
        f = replace(f, mtbf=f.mtbf if mtbf is None else mtbf, repair=f.repair if repair is None else repair)
        return replace(self, failures=f)

    def with_arrivals(self, arrivals: Arrivals, jobs: int | None = None) -> Scenario:
        """The scenario with other arrivals (``--arrivals``): only the paper's workload model
        has arrivals to replace."""
        if not isinstance(self.plan, PaperWorkload):
            raise ValueError(f"scenario {self.name}: arrivals can replace only a built-in scenario's")
        n = len(arrivals.entries) if isinstance(arrivals, ArrivalList) and jobs is None else jobs
        plan = replace(self.plan, arrivals=arrivals, jobs=self.plan.jobs if n is None else n)
        return replace(self, plan=plan)


VAE_WORK = 210.0
VAE_SIGMA = 0.2

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "A1",
            "fixed schedule: 20 VAE jobs, one every 50 s, 4 workers",
            PaperWorkload(
                workers=4,
                jobs=20,
                arrivals=FixedInterval(50.0),
                models=("vae",),
                work=VAE_WORK,
                size_sigma=VAE_SIGMA,
            ),
            paper=PaperNumbers(
                avg_jct_reduction=0.147,
                makespan_reduction=(1260 - 1190) / 1260,
                jobs_improved=11 / 20,
                best_reduction=0.376,
                ds_avg_jct=275.2,
                specon_avg_jct=234.7,
                ds_makespan=1260.0,
                specon_makespan=1190.0,
            ),
        ),
        Scenario(
            "A2",
            "Table III sweep: 20 VAE jobs uniform in [0, 300] s, 4 workers",
            PaperWorkload(
                workers=4,
                jobs=20,
                arrivals=UniformWindow(0.0, 300.0),
                models=("vae",),
                work=VAE_WORK,
                size_sigma=VAE_SIGMA,
            ),
            paper=TABLE_III[(0.01, 30.0)],
            sweep=tuple(TABLE_III),
        ),
        Scenario(
            "A3",
            "20 random-model jobs uniform in [0, 300] s, 4 workers",
            PaperWorkload(
                workers=4, jobs=20, arrivals=UniformWindow(0.0, 300.0), models=PAPER_MODELS, work=233.0
            ),
            paper=PaperNumbers(
                avg_jct_reduction=0.136,
                makespan_reduction=(1421 - 1070) / 1421,
                jobs_improved=15 / 20,
                best_reduction=0.316,
                ds_makespan=1421.0,
                specon_makespan=1070.0,
            ),
        ),
        Scenario(
            "A4",
            "30 random-model jobs uniform in [0, 600] s, 4 workers",
            PaperWorkload(
                workers=4, jobs=30, arrivals=UniformWindow(0.0, 600.0), models=PAPER_MODELS, work=192.0
            ),
            paper=PaperNumbers(
                avg_jct_reduction=(865.7 - 800.2) / 865.7,
                makespan_reduction=(1760 - 1498) / 1760,
                jobs_improved=18 / 30,
                best_reduction=0.288,
                ds_avg_jct=865.7,
                specon_avg_jct=800.2,
                ds_makespan=1760.0,
                specon_makespan=1498.0,
            ),
        ),
        Scenario(
            "A5",
            "50 random-model jobs uniform in [0, 1200] s, 8 workers",
            PaperWorkload(
                workers=8, jobs=50, arrivals=UniformWindow(0.0, 1200.0), models=PAPER_MODELS, work=250.0
            ),
            paper=PaperNumbers(
                avg_jct_reduction=(596.3 - 553.0) / 596.3,
                makespan_reduction=(2070 - 1840) / 2070,
                jobs_improved=30 / 50,
                best_reduction=0.415,
                ds_avg_jct=596.3,
                specon_avg_jct=553.0,
                ds_makespan=2070.0,
                specon_makespan=1840.0,
            ),
        ),
    )
}


def scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name.upper()]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r} (known: {', '.join(SCENARIOS)})") from None
