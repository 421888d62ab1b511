"""A user's own cluster for the simulator: the scenario file of ``specon sim --scenario FILE``.

::

    apiVersion: specon/v1alpha1
    kind: Scenario
    name: my-cluster
    description: optional; the table's title
    workers: [{name: big-1, cpu: 2}, {name: small-1, cpu: 1}]
    jobs:                          # an explicit list ...
      - {submit: 0, model: vae, steps: 12000, worker: big-1, id: first}
      - {submit: 35.5, model: gru, steps: 8000}
    # ... or a generator, drawn anew for every seed:
    # jobs: {count: 30, models: [vae, gru], arrivals: {uniform: [0, 600]}, steps: [4000, 20000]}

Hosts that fail (``specon.sim.scenario_failures``): a ``failures:`` section gives each
worker's MTBF (``mtbf``, seconds), the seconds a lost worker stays down (``repair``, default
600), the jobs' checkpoint schedule (``checkpoint_every`` steps, ``checkpoint_interval``
seconds: jobkit's 200 and 60 by default) and listed losses and reclaim notices
(``events: [{worker, at[, notice]}]``).

GPU workers and jobs (``specon.sim.gpu``): a worker may have ``gpus`` (devices),
``gpu_memory`` (GiB per device, required with gpus), ``gpu_product`` and ``gpu_share`` (GPU
jobs per device, default 1); a job in a list may be a GPU job: ``gpu: 1``, ``gpu_step``
(seconds per step alone on one GPU, required), ``gpu_memory`` (GiB), ``gpu_product`` and
``checkpoint`` (GiB). Its loss curve is still its model's trace.

A job's ``model`` is the name of a recorded trace (``--traces``) or the path of a trace
JSON file, relative to the scenario file's directory. A job costs ``steps`` times its
trace's measured ``step_cost``: the paper's calibrated job sizes (``PaperWorkload``) are
for reproducing its tables, a user's cluster takes the sizes as written. Per seed, each
job gets one of its model's traces (a model recorded with several seeds has several);
a generator also draws its arrival times, models and step counts from the seed.

Reading is parse (YAML 1.2, which reads JSON too) -> check every field, collecting every
problem with its path (``jobs[1].steps: must be an integer >= 1, got -3``) -> a
``Scenario`` whose plan is a ``FileWorkload``, or one ``ScenarioFileError`` listing them
all, as the policy file does (``specon.config``).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from specon.config import API_VERSION
from specon.config.yaml12 import YamlError, load_yaml
from specon.model import WorkerId
from specon.sim.cluster import JobPlan, WorkerSpec, Workload
from specon.sim.scenario_failures import FailureChecks
from specon.sim.scenario_gpu import GPU_JOB_KEYS, WORKER_GPU_KEYS, GpuChecks, GpuNeeds
from specon.sim.scenarios import (
    FixedInterval,
    Poisson,
    Scenario,
    Traces,
    UniformWindow,
    job_id,
    pick_trace,
)
from specon.sim.trace import Trace, TraceError, read_trace_file
from specon.wire import codec

KIND = "Scenario"
TOP_KEYS = ("apiVersion", "kind", "name", "description", "workers", "jobs", "failures")
WORKER_KEYS = ("name", "cpu", *WORKER_GPU_KEYS)
JOB_KEYS = ("submit", "model", "steps", "id", "worker", *GPU_JOB_KEYS)
GENERATOR_KEYS = ("count", "models", "arrivals", "steps")
ARRIVAL_KINDS = ("uniform", "fixed", "poisson")

T = TypeVar("T")
Where = tuple[codec.PathPart, ...]
GeneratedArrivals = UniformWindow | FixedInterval | Poisson


class ScenarioFileError(ValueError):
    """A scenario file that cannot be used; ``errors`` lists every problem as ``path: problem``."""

    def __init__(self, errors: Sequence[str], *, source: str = "<scenario>") -> None:
        self.errors = tuple(errors)
        self.source = source
        count = f"{len(self.errors)} error{'s' if len(self.errors) != 1 else ''}"
        super().__init__(f"{source}: {count}\n" + "\n".join(f"  {e}" for e in self.errors))


# --- the validated file ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job as the file gives it (a generator's, as drawn). ``model`` is a trace name
    or the resolved path of a trace file (a key of ``FileWorkload.files``)."""

    id: str
    submit: float
    model: str
    steps: int
    worker: WorkerId | None = None
    gpu: GpuNeeds | None = None


@dataclass(frozen=True, slots=True)
class JobGenerator:
    count: int
    models: tuple[str, ...]  # drawn uniformly; a model listed twice is drawn twice as often
    arrivals: GeneratedArrivals
    steps: tuple[int, int]  # drawn uniformly from [lo, hi], integers

    def draw(self, rng: random.Random) -> tuple[JobSpec, ...]:
        times = self.arrivals.times(self.count, rng)
        return tuple(
            JobSpec(job_id(i, self.count), round(t, 3), rng.choice(self.models), rng.randint(*self.steps))
            for i, t in enumerate(times)
        )


@dataclass(frozen=True, slots=True)
class FileWorkload:
    """A scenario file's workers and jobs, a ``WorkloadPlan`` (``specon.sim.scenarios``)."""

    workers: tuple[WorkerSpec, ...]
    jobs: tuple[JobSpec, ...] | JobGenerator
    # Traces read from files the jobs name by path, by resolved path.
    files: Mapping[str, tuple[Trace, ...]] = field(default_factory=dict)

    def workload(self, rng: random.Random, traces: Traces, where: str) -> Workload:
        pool: Traces = {**traces, **self.files} if self.files else traces
        specs = self.jobs.draw(rng) if isinstance(self.jobs, JobGenerator) else self.jobs
        jobs = []
        for i, spec in enumerate(specs):
            trace = pick_trace(rng, pool, spec.model, where=where, index=i)
            g = spec.gpu
            jobs.append(
                JobPlan(
                    id=spec.id,
                    model=trace.model,
                    submit=spec.submit,
                    trace=trace,
                    steps=spec.steps,
                    step_cost=trace.step_cost if g is None else g.step,
                    worker=spec.worker,
                    gpu=0 if g is None else 1,
                    gpu_memory=0 if g is None else g.memory,
                    gpu_product=None if g is None else g.product,
                    checkpoint=0 if g is None else g.checkpoint,
                )
            )
        return Workload(self.workers, tuple(jobs))


# --- loading ---------------------------------------------------------------------------


def load_scenario(path: Path | str, traces: Traces) -> Scenario:
    """Read and check the scenario file at ``path``; ``traces`` (``load_traces()``) are the
    models a job may name. Raises ``ScenarioFileError`` listing every problem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ScenarioFileError([f"cannot read: {e.strerror or e}"], source=str(p)) from None
    except UnicodeDecodeError as e:
        raise ScenarioFileError([f"not UTF-8 text: {e.reason} at byte {e.start}"], source=str(p)) from None
    return parse_scenario(text, traces, base_dir=p.parent, source=str(p))


def parse_scenario(text: str, traces: Traces, *, base_dir: Path, source: str = "<string>") -> Scenario:
    """A scenario from YAML or JSON text; trace file paths resolve against ``base_dir``."""
    try:
        data = load_yaml(text)
    except YamlError as e:
        raise ScenarioFileError([str(e)], source=source) from None
    if data is None:
        needed = ", ".join(k for k in TOP_KEYS if k not in ("description", "failures"))
        raise ScenarioFileError([f"empty scenario; it needs {needed}"], source=source)
    return scenario_from_data(data, traces, base_dir=base_dir, source=source)


def scenario_from_data(data: object, traces: Traces, *, base_dir: Path, source: str = "<dict>") -> Scenario:
    """Check ``data`` (a parsed scenario file) and build its ``Scenario``."""
    reader = _Reader(traces, base_dir)
    scenario = reader.scenario(data)
    if reader.problems or scenario is None:
        problems = sorted(reader.problems, key=lambda p: _file_order(data, p.path))
        raise ScenarioFileError([str(p) for p in problems], source=source)
    return scenario


def _file_order(data: object, path: Sequence[codec.PathPart]) -> tuple[int, ...]:
    """Sort key placing a problem where its value is in the file (a missing key after its
    mapping's keys), so the problems read in file order, as the policy file's do."""
    out: list[int] = []
    for part in path:
        if isinstance(data, dict):
            keys = list(data)
            out.append(keys.index(part) if part in keys else len(keys))
            data = data.get(part)
        elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            out.append(part)
            data = data[part]
        else:
            break
    return tuple(out)


def title(workers: Sequence[WorkerSpec], jobs: tuple[JobSpec, ...] | JobGenerator) -> str:
    """The table's title when the file has no description."""
    if isinstance(jobs, JobGenerator):
        models = ", ".join(dict.fromkeys(_label(m) for m in jobs.models))
        what = f"{jobs.count} generated jobs ({models})"
    else:
        what = f"{len(jobs)} job{'s' if len(jobs) != 1 else ''}"
    cores = sum(w.cpu for w in workers)
    return f"{what} on {len(workers)} worker{'s' if len(workers) != 1 else ''} ({cores:g} cores)"


def _label(model: str) -> str:
    return Path(model).name if _is_path(model) else model


def _is_path(text: str) -> bool:
    return "/" in text or "\\" in text or text.lower().endswith(".json")


def _read_traces(path: Path) -> tuple[Trace, ...] | str:
    """The traces of a trace file, or why it cannot be used."""
    if not path.is_file():
        return f"no such file: {path}"
    try:
        found = tuple(read_trace_file(path))
    except TraceError as e:
        return str(e).removeprefix(f"{path}: ")
    return found or "no traces in the file"


def _shown(value: object) -> str:
    """A number as written (``-3``), anything else described (``string 'many'``)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return repr(value)
    return codec.describe(value)


class _Reader(GpuChecks, FailureChecks):
    """One pass over the file: every check appends its problems and returns the value, or
    None when it is unusable, so later checks still run and everything is reported once."""

    def __init__(self, traces: Traces, base_dir: Path) -> None:
        self.problems: list[codec.Problem] = []
        self.known = sorted(m for m, ts in traces.items() if ts)
        self.base_dir = base_dir
        self.files: dict[str, tuple[Trace, ...]] = {}
        self.file_errors: dict[str, str] = {}
        # The names a job's ``worker:`` may give; None when a worker's name is unreadable
        # (a job naming it would be reported as unknown for a problem already reported).
        self.worker_names: list[str] | None = None
        # The workers, where all are readable: where a GPU job could run.
        self.worker_specs: tuple[WorkerSpec, ...] | None = None

    def add(self, path: Where, message: str) -> None:
        self.problems.append(codec.Problem(path, message))

    # -- generic checks

    def mapping(
        self, value: object, path: Where, keys: Sequence[str], required: Sequence[str]
    ) -> dict[str, Any] | None:
        if not isinstance(value, dict):
            self.add(path, f"expected a mapping, got {codec.describe(value)}")
            return None
        for key in value:
            if not isinstance(key, str):
                self.add(path, f"keys must be strings, got {codec.describe(key)}")
            elif key not in keys:
                # As the codec words it for the policy file.
                hint = codec.suggest(key, keys) or f" (known: {', '.join(keys)})"
                self.add((*path, key), f"unknown key{hint}")
        for key in required:
            if key not in value:
                self.add((*path, key), "missing")
        return value

    def typed(self, tp: type[T], value: object, path: Where) -> T | None:
        try:
            return codec.from_data(tp, value)
        except codec.SchemaError as e:
            self.problems += [codec.Problem((*path, *p.path), p.message) for p in e.problems]
            return None

    def number(self, value: object, path: Where, *, low: float, strict: bool = False) -> float | None:
        x = self.typed(float, value, path)
        if x is None:
            return None
        if x < low or (strict and x == low):
            self.add(path, f"must be {'>' if strict else '>='} {low:g}, got {_shown(value)}")
            return None
        return x

    def integer(self, value: object, path: Where) -> int | None:
        if type(value) is not int or value < 1:
            self.add(path, f"must be an integer >= 1, got {_shown(value)}")
            return None
        return value

    def name(self, value: object, path: Where) -> str | None:
        text = self.typed(str, value, path)
        if text is not None and not text.strip():
            self.add(path, "must not be empty")
            return None
        return text

    def nonempty_list(self, value: object, path: Where, what: str) -> list[Any] | None:
        if not isinstance(value, list):
            self.add(path, f"expected a list of {what}, got {codec.describe(value)}")
            return None
        if not value:
            self.add(path, "must not be empty")
            return None
        return value

    # -- the file

    def scenario(self, data: object) -> Scenario | None:
        top = self.mapping(data, (), TOP_KEYS, ("name", "workers", "jobs"))
        if top is None:
            return None
        for key, expected in (("apiVersion", API_VERSION), ("kind", KIND)):
            if key not in top:
                self.add((key,), f"missing; expected {expected!r}")
        if "apiVersion" in top and top["apiVersion"] != API_VERSION:
            self.add(("apiVersion",), f"unsupported {top['apiVersion']!r}; expected {API_VERSION!r}")
        if "kind" in top and top["kind"] != KIND:
            self.add(("kind",), f"must be {KIND!r}, got {top['kind']!r}")
        name = self.name(top["name"], ("name",)) if "name" in top else None
        description = self.typed(str, top["description"], ("description",)) if "description" in top else None
        workers = self.workers(top["workers"]) if "workers" in top else None
        jobs = self.jobs(top["jobs"]) if "jobs" in top else None
        failures = self.failures_of(top["failures"]) if "failures" in top else None
        if name is None or workers is None or jobs is None or self.problems:
            return None
        return Scenario(
            name,
            description or title(workers, jobs),
            FileWorkload(workers, jobs, dict(self.files)),
            failures=failures,
        )

    def workers(self, value: object) -> tuple[WorkerSpec, ...] | None:
        items = self.nonempty_list(value, ("workers",), "workers")
        if items is None:
            return None
        out: list[WorkerSpec] = []
        names: list[str] = []
        ok, readable = True, 0
        for i, item in enumerate(items):
            path: Where = ("workers", i)
            entry = self.mapping(item, path, WORKER_KEYS, ("name",))
            if entry is None:
                ok = False
                continue
            name = self.name(entry["name"], (*path, "name")) if "name" in entry else None
            cpu = self.number(entry.get("cpu", 1.0), (*path, "cpu"), low=0.0, strict=True)
            gpus = self.gpus_of(entry, path)
            readable += name is not None
            if name is not None and name in names:
                self.add((*path, "name"), f"duplicate worker name {name!r}")
                name = None
            elif name is not None:
                names.append(name)
            if name is None or cpu is None or gpus is None:
                ok = False
                continue
            out.append(WorkerSpec(WorkerId(name), cpu, *gpus))
        if readable == len(items):
            self.worker_names = names
        if ok:
            self.worker_specs = tuple(out)
        return tuple(out) if ok else None

    def jobs(self, value: object) -> tuple[JobSpec, ...] | JobGenerator | None:
        if isinstance(value, dict):
            return self.generator(value)
        items = self.nonempty_list(value, ("jobs",), "jobs or a generator mapping")
        if items is None:
            return None
        ids: set[str] = set()
        found = [self.job(item, ("jobs", i), job_id(i, len(items)), ids) for i, item in enumerate(items)]
        jobs = [job for job in found if job is not None]
        return tuple(jobs) if len(jobs) == len(found) else None

    def job(self, item: object, path: Where, default_id: str, ids: set[str]) -> JobSpec | None:
        """One job of an explicit list; ``ids``: those of the jobs before it."""
        entry = self.mapping(item, path, JOB_KEYS, ("submit", "model", "steps"))
        if entry is None:
            return None
        submit = self.number(entry["submit"], (*path, "submit"), low=0.0) if "submit" in entry else None
        model = self.model(entry["model"], (*path, "model")) if "model" in entry else None
        steps = self.integer(entry["steps"], (*path, "steps")) if "steps" in entry else None
        jid = self.name(entry["id"], (*path, "id")) if "id" in entry else default_id
        if jid is not None and jid in ids:
            self.add((*path, "id"), f"duplicate job id {jid!r}")
            jid = None
        elif jid is not None:
            ids.add(jid)
        worker: str | None = None
        if "worker" in entry:
            worker = self.name(entry["worker"], (*path, "worker"))
            workers = self.worker_names
            if worker is not None and workers is not None and worker not in workers:
                hint = codec.suggest(worker, workers) or f" (known: {', '.join(workers)})"
                self.add((*path, "worker"), f"unknown worker {worker!r}{hint}")
                worker = None
            if worker is None:
                return None
        gpu_ok, gpu = self.gpu_job(entry, path)
        if submit is None or model is None or steps is None or jid is None or not gpu_ok:
            return None
        if gpu is not None and not self.gpu_host(worker, gpu, path):
            return None
        return JobSpec(jid, submit, model, steps, None if worker is None else WorkerId(worker), gpu)

    def generator(self, value: dict[Any, Any]) -> JobGenerator | None:
        path: Where = ("jobs",)
        entry = self.mapping(value, path, GENERATOR_KEYS, GENERATOR_KEYS)
        if entry is None:
            return None
        count = self.integer(entry["count"], (*path, "count")) if "count" in entry else None
        models: tuple[str, ...] | None = None
        if "models" in entry:
            items = self.nonempty_list(entry["models"], (*path, "models"), "models")
            if items is not None:
                found = [self.model(m, (*path, "models", i)) for i, m in enumerate(items)]
                models = tuple(m for m in found if m is not None) if None not in found else None
        arrivals = self.arrivals(entry["arrivals"], (*path, "arrivals")) if "arrivals" in entry else None
        steps = self.step_range(entry["steps"], (*path, "steps")) if "steps" in entry else None
        if count is None or models is None or arrivals is None or steps is None:
            return None
        return JobGenerator(count, models, arrivals, steps)

    def step_range(self, value: object, path: Where) -> tuple[int, int] | None:
        if not isinstance(value, list):
            n = self.integer(value, path)
            return None if n is None else (n, n)
        if len(value) != 2:
            self.add(path, f"expected an integer or a range [lo, hi], got a list of {len(value)}")
            return None
        lo, hi = self.integer(value[0], (*path, 0)), self.integer(value[1], (*path, 1))
        if lo is None or hi is None:
            return None
        if lo > hi:
            self.add(path, f"lo must be <= hi, got [{lo}, {hi}]")
            return None
        return lo, hi

    def arrivals(self, value: object, path: Where) -> GeneratedArrivals | None:
        entry = self.mapping(value, path, ARRIVAL_KINDS, ())
        if entry is None:
            return None
        kinds = [k for k in ARRIVAL_KINDS if k in entry]
        if len(kinds) != 1:
            given = f" (got {', '.join(kinds)})" if kinds else ""
            self.add(path, f"expected exactly one of {', '.join(ARRIVAL_KINDS)}{given}")
            return None
        kind = kinds[0]
        where: Where = (*path, kind)
        if kind == "uniform":
            if not (isinstance(entry[kind], list) and len(entry[kind]) == 2):
                self.add(where, f"expected [lo, hi] in seconds, got {codec.describe(entry[kind])}")
                return None
            lo = self.number(entry[kind][0], (*where, 0), low=0.0)
            hi = self.number(entry[kind][1], (*where, 1), low=0.0)
            if lo is None or hi is None:
                return None
            if lo > hi:
                self.add(where, f"lo must be <= hi, got [{lo:g}, {hi:g}]")
                return None
            return UniformWindow(lo, hi)
        # fixed: {every: S, start: T}; poisson: {rate: R, start: T}
        rate_key = "every" if kind == "fixed" else "rate"
        spec = self.mapping(entry[kind], where, (rate_key, "start"), (rate_key,))
        if spec is None:
            return None
        # A fixed interval of 0 is a burst: every job at ``start``.
        rate = (
            self.number(spec[rate_key], (*where, rate_key), low=0.0, strict=kind == "poisson")
            if rate_key in spec
            else None
        )
        start = self.number(spec.get("start", 0.0), (*where, "start"), low=0.0)
        if rate is None or start is None:
            return None
        return FixedInterval(rate, start) if kind == "fixed" else Poisson(rate, start)

    def model(self, value: object, path: Where) -> str | None:
        """A trace name, or a trace file's resolved path (its traces read into ``files``)."""
        text = self.name(value, path)
        if text is None:
            return None
        if text in self.known:
            return text
        if not _is_path(text):
            known = ", ".join(self.known) or "none"
            self.add(
                path,
                f"unknown model {text!r}{codec.suggest(text, self.known)} "
                f"(known: {known}; or the path of a trace JSON file)",
            )
            return None
        resolved = str((self.base_dir / text).resolve())
        if resolved not in self.files and resolved not in self.file_errors:  # read each file once
            found = _read_traces(Path(resolved))
            if isinstance(found, str):
                self.file_errors[resolved] = found
            else:
                self.files[resolved] = found
        if resolved in self.file_errors:
            self.add(path, f"trace file {text!r}: {self.file_errors[resolved]}")
            return None
        return resolved
