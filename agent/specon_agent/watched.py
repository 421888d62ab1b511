"""What the agent keeps per container: the classifier's view (``Watched``), its counters, the
total steps a job declared in its progress log, and its loss curve: what its quality point is
estimated and measured from (``specon.policy.quality_point``) and, for a job with no declared
total, what it is sized by (``specon.policy.remaining``)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from specon.checkpoint import open_regular
from specon.policy.monitor import MonitorState
from specon.policy.remaining import Fit, refit
from specon.progress import SkipReason, Tailer
from specon.runtime.base import ContainerInfo
from specon.wire.limits import COUNT


@dataclass(slots=True)
class Watched:
    """One container this agent classifies."""

    info: ContainerInfo
    tailer: Tailer
    state: MonitorState
    step: int | None = None
    # The baseline of its CPU per step: a step it had logged and its CPU seconds then, so
    # what it spent before (imports, model and optimizer set-up, a CUDA context) is not a cost
    # of its steps. Both are taken at the tick after the first that read a step: a tick samples
    # the CPU before it reads the logs, so a job's first step read with the CPU sampled just
    # before would leave the start-up CPU spent in between to its first few steps (tens of
    # times their cost: srpt then froze a short job on a GPU behind a long one, for good).
    first_step: int | None = None
    first_cpu: float = 0.0
    # (step, mean loss) per tick: its quality point's input and, with no declared total, its
    # size's (``specon.policy.remaining``); thinned to every other point when full.
    curve: list[tuple[float, float]] = field(default_factory=list)
    curve_samples: int = 0  # points ever added to ``curve`` (thinned ones included)
    fit: Fit = field(default_factory=Fit)  # its last fit (``remaining.refit``)
    last_sample_at: float | None = None
    nonfinite_seen: int = 0
    # Skipped lines per reason already added to the agent's counters.
    skipped_seen: dict[SkipReason, int] = field(default_factory=dict)
    # The total steps its log's first record declared (None: none), once that line is whole.
    declared: int | None = None
    declared_read: bool = False


# A first record longer than this declares nothing.
FIRST_RECORD_BYTES = 4096


def first_record_steps(progress: Path) -> tuple[int | None, bool]:
    """The total a job declared in its log's first record, ``{"event": "started", "steps": N}``
    (``specon.integrations`` write it: a framework knows its total only once it runs), and
    whether that first line is complete (else ask again later)."""
    try:
        fd = open_regular(progress)
        try:
            head = os.pread(fd, FIRST_RECORD_BYTES, 0)
        finally:
            os.close(fd)
    except OSError:
        return None, False
    line, newline, _ = head.partition(b"\n")
    if not newline:
        return None, len(head) >= FIRST_RECORD_BYTES
    try:
        record = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None, True
    steps = record.get("steps") if isinstance(record, dict) and record.get("event") == "started" else None
    if isinstance(steps, int) and not isinstance(steps, bool) and 1 <= steps <= COUNT.hi:
        return steps, True
    return None, True


def declare_steps(w: Watched) -> None:
    """Give ``w``'s spec the total its log declared, when the spec (the job's submitter) did not."""
    if w.info.spec.steps is not None:
        return
    if not w.declared_read:
        w.declared, w.declared_read = first_record_steps(w.info.progress_path)
    if w.declared is not None:
        w.info = dataclasses.replace(w.info, spec=dataclasses.replace(w.info.spec, steps=w.declared))


@dataclass(slots=True)
class AgentCounters:
    ticks: int = 0
    samples: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    requests_sent: int = 0
    commands: dict[str, int] = field(default_factory=dict)
    command_failures: int = 0
    state_write_failures: int = 0
    states_forgotten: int = 0


# Loss-curve points kept per job (thinned to every other point when full).
CURVE_POINTS = 256


def append_curve(w: Watched, step: float, values: list[float]) -> None:
    """Add a tick's mean finite loss at ``step`` to ``w``'s curve (thinned when full)."""
    finite = [v for v in values if math.isfinite(v)]
    if finite:
        w.curve.append((step, sum(finite) / len(finite)))
        w.curve_samples += 1
        if len(w.curve) > CURVE_POINTS:
            del w.curve[::2]


def predicted_steps(w: Watched) -> float | None:
    """Steps left to convergence from the loss curve of a job that declared no total
    (refitted once its curve grew by ``remaining.REFIT_GROWTH``)."""
    if w.info.spec.steps is not None or not w.curve or w.step is None:
        return None
    curve = w.curve
    w.fit = refit(w.fit, w.curve_samples, lambda: ([k for k, _ in curve], [v for _, v in curve]))
    return w.fit.steps_left(w.step)
