"""What a move costs, learned from the moves the manager made (pure, bounded, deterministic).

The work model (``specon.policy.work``) charges a move its downtime (seconds the job does not
run) and its restore CPU (CPU-seconds taken from the target's jobs). The policy file's
``migration.move_downtime`` and ``migration.restore_cpu`` are the *prior*; each finished move
is an observation, kept per cell: the backend the job moved onto (the target worker's
``specon.io/runtime`` label: local, docker, kubernetes, criu, ...; ``default`` without one)
and a job-size bucket (its declared memory request, in powers of two of a GiB).

Each figure is a shrinkage mean, the prior counting as ``weight`` pseudo-observations:

    estimate = (weight * prior + sum of the last ``window`` observations) / (weight + n)

in two levels: the backend's estimate shrinks to the policy's figure, and a cell's estimate
shrinks to its backend's, so a job size never seen on a known backend starts from what that
backend measured. Memory is bounded: ``window`` observations per cell and per backend, at
most ``MAX_CELLS`` cells (observations for further cells still teach their backend's level,
if that one has room).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from copy import deepcopy
from dataclasses import dataclass, field

from specon.model import RUNTIME_LABEL, ContainerSnapshot, WorkerSnapshot

DEFAULT_BACKEND = "default"
GIB = 1 << 30
# Size buckets: 0 for under 1 GiB (or undeclared), b for [2^(b-1), 2^b) GiB, up to MAX_BUCKET.
MAX_BUCKET = 8
MAX_CELLS = 64
# An observation beyond this (seconds or CPU-seconds) is a measurement error, not a move.
MAX_OBSERVED = 3600.0


def size_bucket(memory: int) -> int:
    """The job-size bucket of a declared memory request in bytes."""
    if memory < GIB:
        return 0
    return min(MAX_BUCKET, 1 + int(math.log2(memory / GIB)))


def bucket_name(bucket: int) -> str:
    """A bucket as a metric label: ``<1GiB``, ``1-2GiB``, ... ``>=128GiB``."""
    if bucket == 0:
        return "<1GiB"
    if bucket >= MAX_BUCKET:
        return f">={1 << (MAX_BUCKET - 1)}GiB"
    return f"{1 << (bucket - 1)}-{1 << bucket}GiB"


def backend_of(labels: Mapping[str, str] | tuple[tuple[str, str], ...]) -> str:
    """The backend a worker's labels name (``DEFAULT_BACKEND`` without the label)."""
    found = labels.get(RUNTIME_LABEL) if isinstance(labels, Mapping) else dict(labels).get(RUNTIME_LABEL)
    return found[:63] if found else DEFAULT_BACKEND


Cell = tuple[str, int]  # (backend, size bucket)


@dataclass(frozen=True, slots=True)
class Observation:
    """One finished move: where it went, its size, and what it was measured to cost
    (None: not measured; that figure learns nothing from it)."""

    backend: str
    bucket: int
    downtime: float | None = None
    restore_cpu: float | None = None


@dataclass(frozen=True, slots=True)
class Estimate:
    downtime: float
    restore_cpu: float
    # Observations of each figure behind it (the cell's own, or its backend's).
    moves: int = 0


class _Series:
    """The last ``window`` observations of one figure and their sum."""

    __slots__ = ("added", "sum", "values")

    def __init__(self, window: int) -> None:
        self.values: deque[float] = deque(maxlen=window)
        self.sum = 0.0
        self.added = 0

    def add(self, x: float) -> None:
        if len(self.values) == self.values.maxlen:
            self.sum -= self.values[0]
        self.values.append(x)
        self.added += 1
        # Re-summed every 64 additions so float drift never accumulates.
        self.sum = math.fsum(self.values) if self.added % 64 == 0 else self.sum + x

    def shrunk(self, prior: float, weight: float) -> float:
        n = len(self.values)
        return prior if weight + n <= 0 else (weight * prior + self.sum) / (weight + n)


@dataclass(slots=True)
class _Figures:
    downtime: _Series
    restore_cpu: _Series


@dataclass(slots=True)
class MoveCosts:
    """The running estimates; ``learn=False`` keeps the prior (the policy's static figures)."""

    prior_downtime: float
    prior_restore_cpu: float
    weight: float = 5.0
    window: int = 50
    learn: bool = True
    _backends: dict[str, _Figures] = field(default_factory=dict)
    _cells: dict[Cell, _Figures] = field(default_factory=dict)
    skipped: int = 0  # observations refused (not finite, negative, absurd, or no room)

    def copy(self) -> MoveCosts:
        """An independent copy (a decision pass off the event loop reads it while moves teach this one)."""
        return deepcopy(self)

    def _new(self) -> _Figures:
        return _Figures(_Series(self.window), _Series(self.window))

    def observe(self, obs: Observation) -> Estimate | None:
        """Learn from one move; its cell's new estimate (None: nothing learned)."""
        if not self.learn:
            return None
        figures = [
            (k, v) for k, v in (("downtime", obs.downtime), ("restore_cpu", obs.restore_cpu)) if v is not None
        ]
        if not figures or not all(math.isfinite(v) and 0 <= v <= MAX_OBSERVED for _, v in figures):
            self.skipped += 1
            return None
        cell = (obs.backend, obs.bucket)
        backend = self._backends.get(obs.backend)
        if backend is None and len(self._backends) < MAX_CELLS:
            backend = self._backends[obs.backend] = self._new()
        if backend is None:
            self.skipped += 1
            return None
        own = self._cells.get(cell)
        if own is None and len(self._cells) < MAX_CELLS:
            own = self._cells[cell] = self._new()
        for name, value in figures:
            for f in (backend, own):
                if f is not None:
                    getattr(f, name).add(value)
        return self.estimate(*cell)

    def estimate(self, backend: str, bucket: int) -> Estimate:
        """The current figures for a move onto ``backend`` of a job in ``bucket``."""
        b = self._backends.get(backend)
        if b is None:
            return Estimate(self.prior_downtime, self.prior_restore_cpu)
        down = b.downtime.shrunk(self.prior_downtime, self.weight)
        cpu = b.restore_cpu.shrunk(self.prior_restore_cpu, self.weight)
        moves = len(b.downtime.values)
        c = self._cells.get((backend, bucket))
        if c is not None:
            down = c.downtime.shrunk(down, self.weight)
            cpu = c.restore_cpu.shrunk(cpu, self.weight)
            moves = len(c.downtime.values)
        return Estimate(down, cpu, moves)

    def for_move(self, container: ContainerSnapshot, target: WorkerSnapshot) -> tuple[float, float]:
        """(downtime, restore CPU) of moving ``container`` onto ``target``."""
        if not self._backends:
            return self.prior_downtime, self.prior_restore_cpu
        e = self.estimate(backend_of(target.labels), size_bucket(container.requests.memory))
        return e.downtime, e.restore_cpu

    def cells(self) -> dict[Cell, Estimate]:
        """Every cell learned so far and its estimate (for metrics and the status)."""
        return {cell: self.estimate(*cell) for cell in sorted(self._cells)}
