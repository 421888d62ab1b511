"""Concise builders for the snapshots and simulated workloads that tests and benchmarks make.

Pure and I/O-free: each call returns a new frozen value. Worker, container and job ids are
plain strings here (wrapped in ``WorkerId``/``ContainerId``); categories are ``Category``
members or their short names (``"PC"``, ``"WC"``, ``"CC"``, ``"DV"``, ``"ST"``).

* ``worker`` / ``container`` / ``snapshot``: one ``WorkerSnapshot``, ``ContainerSnapshot``
  or ``ClusterSnapshot``. A worker defaults to ``BIG`` capacity (every request fits), a
  container to CC with no requests.
* ``cluster``: a snapshot from ``{"w0": ["PC", "CC"], "w1": []}``, containers numbered per
  worker.
* ``trace`` / ``job_plan`` / ``workload``: the simulator's ``Trace``, ``JobPlan`` and ``Workload``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from specon.model import (
    Category,
    ClusterSnapshot,
    ContainerId,
    ContainerSnapshot,
    Resources,
    WorkerId,
    WorkerSnapshot,
)
from specon.sim.cluster import JobPlan, WorkerSpec, Workload
from specon.sim.trace import Trace

__all__ = [
    "BIG",
    "NOW",
    "category",
    "cluster",
    "container",
    "job_plan",
    "snapshot",
    "trace",
    "worker",
    "workload",
]

# The default decision time (manager clock, seconds) of a built snapshot.
NOW = 1000.0
# A worker's default capacity: room for anything a test asks for.
BIG = Resources(cpu=64.0, memory=1 << 40, gpu=8)

_BY_NAME = {c.short: c for c in Category} | {c.value: c for c in Category}

Pairs = Mapping[str, str] | Iterable[tuple[str, str]]


def category(c: Category | str) -> Category:
    """``c`` itself, or the category whose short name (``"PC"``) or value it is."""
    if isinstance(c, Category):
        return c
    try:
        return _BY_NAME[c]
    except KeyError:
        raise ValueError(f"unknown category {c!r}; one of {sorted(_BY_NAME)}") from None


def _pairs(p: Pairs) -> tuple[tuple[str, str], ...]:
    return tuple(p.items()) if isinstance(p, Mapping) else tuple(p)


def worker(
    wid: str,
    *,
    cpu: float = BIG.cpu,
    memory: int = BIG.memory,
    gpu: int = BIG.gpu,
    usage: float = 0.0,
    ready: bool = True,
    heartbeat_age: float = 0.0,
    labels: Pairs = (),
    taints: Iterable[str] = (),
) -> WorkerSnapshot:
    """A worker; ``cpu``, ``memory`` and ``gpu`` are its capacity (default ``BIG``)."""
    return WorkerSnapshot(
        id=WorkerId(wid),
        capacity=Resources(cpu, memory, gpu),
        usage=usage,
        ready=ready,
        heartbeat_age=heartbeat_age,
        labels=_pairs(labels),
        taints=tuple(taints),
    )


def container(
    cid: str,
    wid: str,
    cat: Category | str = Category.CONVERGED,
    *,
    t_cc: float | None = None,
    migrated: bool = False,
    t_migrated: float | None = None,
    migrations: int = 0,
    rebalances: int = 0,
    cpu: float = 0.0,
    memory: int = 0,
    gpu: int = 0,
    selector: Pairs = (),
    tolerations: Iterable[str] = (),
    movable: bool = True,
) -> ContainerSnapshot:
    """Container ``cid`` on worker ``wid``; ``cpu``, ``memory`` and ``gpu`` are its requests."""
    return ContainerSnapshot(
        id=ContainerId(cid),
        worker=WorkerId(wid),
        category=category(cat),
        t_cc=t_cc,
        migrated=migrated,
        t_migrated=t_migrated,
        migrations=migrations,
        rebalances=rebalances,
        requests=Resources(cpu, memory, gpu),
        selector=_pairs(selector),
        tolerations=tuple(tolerations),
        movable=movable,
    )


def snapshot(
    workers: Iterable[WorkerSnapshot], containers: Iterable[ContainerSnapshot] = (), *, now: float = NOW
) -> ClusterSnapshot:
    return ClusterSnapshot(now=now, workers=tuple(workers), containers=tuple(containers))


# A container's stamp from its worker's position i in the spec and its own position k there.
Stamp = Callable[[int, int], float | None]


def cluster(
    spec: Mapping[str, Iterable[Category | str]],
    *,
    now: float = NOW,
    ids: str = "{worker}-c{k}",
    t_cc: Stamp | None = None,
    migrated: bool = False,
    t_migrated: Stamp | None = None,
    migrations: int = 0,
    make_worker: Callable[[str], WorkerSnapshot] = worker,
) -> ClusterSnapshot:
    """One worker per key of ``spec`` (in its order, built by ``make_worker``) holding
    containers k = 0, 1, ... in the listed categories.

    Container ids follow the format ``ids`` (fields ``worker``, ``i``: the worker's position,
    ``k``); ``t_cc(i, k)`` and ``t_migrated(i, k)`` stamp them; ``migrated`` and
    ``migrations`` apply to all of them.
    """
    workers = []
    containers = []
    for i, (wid, cats) in enumerate(spec.items()):
        workers.append(make_worker(wid))
        for k, cat in enumerate(cats):
            containers.append(
                container(
                    ids.format(worker=wid, i=i, k=k),
                    wid,
                    cat,
                    t_cc=None if t_cc is None else t_cc(i, k),
                    migrated=migrated,
                    t_migrated=None if t_migrated is None else t_migrated(i, k),
                    migrations=migrations,
                )
            )
    return snapshot(workers, containers, now=now)


# -- the simulator ---------------------------------------------------------------------


def trace(
    losses: Iterable[float],
    *,
    model: str = "m",
    stride: int = 1,
    cost: float = 1.0,
    steps: int | None = None,
    source: str = "test",
) -> Trace:
    """A loss trace with one record every ``stride`` steps; ``steps`` defaults to
    ``len(losses) * stride`` and ``cost`` is the CPU-seconds of one step."""
    values = tuple(losses)
    return Trace(model, len(values) * stride if steps is None else steps, cost, values, source, stride)


def job_plan(
    jid: str,
    tr: Trace,
    *,
    submit: float = 0.0,
    steps: int | None = None,
    cost: float = 1.0,
    worker: str | None = "w1",
) -> JobPlan:
    """A job training ``tr`` (its model; ``steps`` defaults to the trace's), starting on
    ``worker`` (``None``: the workload's round-robin), ``cost`` CPU-seconds a step."""
    return JobPlan(
        jid,
        tr.model,
        submit,
        tr,
        tr.steps if steps is None else steps,
        cost,
        None if worker is None else WorkerId(worker),
    )


def workload(workers: int | Mapping[str, float], jobs: Iterable[JobPlan]) -> Workload:
    """``workers``: a count n (one-core workers w1..wn) or worker id -> CPU cores."""
    if isinstance(workers, int):
        workers = {f"w{i + 1}": 1.0 for i in range(workers)}
    return Workload(tuple(WorkerSpec(WorkerId(w), cpu) for w, cpu in workers.items()), tuple(jobs))
