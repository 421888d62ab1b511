"""Replay a recorded progress log through a classifier, tick by tick (``specon classify``).

Pure: the records come in as ``(timestamp or None, value)`` pairs, a ``ReplayResult``
comes out. Time runs from the first record (t = 0):

* a record with a timestamp sits at ``ts - ts_first`` (anchored so that the first
  timestamped record keeps its place after any untimed ones);
* a record without one sits ``seconds_per_record`` after the previous record;
* a record that would go back in time stays at the previous record's time.

Ticks fall at t_0 = 0 and every Δ after it; tick m consumes the records with t in
(t_{m-1}, t_m] (tick 0 those at t = 0) and the last tick is the first at or after the
last record.

One job is replayed on its own, so the worker-level request rule (SPEC §3.3) cannot be
evaluated: the replay assumes the worker has enough other active jobs, i.e. a wanted
request is always raised. Nobody answers it either, so the job goes on being classified
after its request (in the cluster it would be frozen once the manager marks it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from specon.config import MonitorConfig
from specon.model import Category, Direction
from specon.policy.classifier import classifier_for
from specon.policy.monitor import MonitorState, raise_request

DEFAULT_SECONDS_PER_RECORD = 1.0
# A guard against a bogus timestamp turning one file into billions of ticks.
MAX_TICKS = 1_000_000

Record = tuple[float | None, float]


@dataclass(frozen=True, slots=True)
class Transition:
    t: float  # seconds since the first record
    source: Category
    target: Category


@dataclass(frozen=True, slots=True)
class ReplayResult:
    transitions: tuple[Transition, ...]
    # Time of the first tick that would send a reallocation request, if any.
    request_at: float | None
    # The category shown after the last tick (STALLED/DIVERGING where they apply).
    final: Category
    records: int  # finite values used
    nonfinite: int  # non-finite values seen (never part of E)
    ticks: int
    stale_ticks: int  # ticks without a finite value
    requests: int  # requests raised (a reset to PC lets a job ask again later)
    # (t, value) of every finite record, for plotting.
    points: tuple[tuple[float, float], ...]
    end: float  # time of the last tick
    state: MonitorState


def record_times(records: Iterable[Record], *, seconds_per_record: float) -> list[tuple[float, float]]:
    """``(t, value)`` with t in seconds since the first record (rules in the module doc)."""
    out: list[tuple[float, float]] = []
    anchor: float | None = None
    prev: float | None = None
    for ts, value in records:
        if ts is not None and math.isfinite(ts):
            if anchor is None:
                anchor = ts - (0.0 if prev is None else prev + seconds_per_record)
            t = ts - anchor
        else:
            t = 0.0 if prev is None else prev + seconds_per_record
        if prev is not None and t < prev:
            t = prev
        out.append((t, value))
        prev = t
    return out


def replay(
    records: Iterable[Record],
    cfg: MonitorConfig,
    *,
    direction: Direction = Direction.MINIMIZE,
    seconds_per_record: float = DEFAULT_SECONDS_PER_RECORD,
    max_ticks: int = MAX_TICKS,
    length: float | None = None,
) -> ReplayResult:
    """Run ``records`` through ``cfg.classifier`` in ticks of ``cfg.interval``.

    ``length``: when the job declared how long it runs, that length on the replay's clock
    (seconds since the first record); each tick then tells the classifier its horizon,
    ``length / now`` (the agent's total steps / steps done). None: undeclared.

    ``ValueError`` for a non-positive interval, a negative ``seconds_per_record``, an
    unknown classifier or a log spanning more than ``max_ticks`` ticks.
    """
    interval = cfg.interval
    if not (math.isfinite(interval) and interval > 0):
        raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
    if not (math.isfinite(seconds_per_record) and seconds_per_record >= 0):
        raise ValueError(f"seconds per record must be >= 0, got {seconds_per_record!r}")
    if length is not None and not (math.isfinite(length) and length > 0):
        raise ValueError(f"length must be a positive number of seconds, got {length!r}")
    clf = classifier_for(cfg)
    timed = record_times(records, seconds_per_record=seconds_per_record)
    state = clf.initial(direction=direction)
    last = timed[-1][0] if timed else 0.0
    n_ticks = math.ceil(last / interval) + 1 if timed else 0
    if n_ticks > max_ticks:
        raise ValueError(
            f"the records span {last:.0f} s, {n_ticks} ticks of {interval:g} s (limit {max_ticks});"
            " check the timestamps or --seconds-per-record"
        )

    transitions: list[Transition] = []
    shown = state.display
    request_at: float | None = None
    requests = stale = nonfinite_total = 0
    points: list[tuple[float, float]] = []
    i = 0
    for m in range(n_ticks):
        now = m * interval
        samples: list[float] = []
        nonfinite = 0
        while i < len(timed) and timed[i][0] <= now:
            t, value = timed[i]
            if math.isfinite(value):
                samples.append(value)
                points.append((t, value))
            else:
                nonfinite += 1
            i += 1
        nonfinite_total += nonfinite
        stale += not samples
        horizon = length / now if length is not None and now > 0 else None
        state = clf.tick(state, samples, now, nonfinite=nonfinite, horizon=horizon)
        if state.wants_request and not state.pending_request:
            state = raise_request(state)
            requests += 1
            if request_at is None:
                request_at = now
        if state.display is not shown:
            transitions.append(Transition(now, shown, state.display))
            shown = state.display

    return ReplayResult(
        transitions=tuple(transitions),
        request_at=request_at,
        final=shown,
        records=len(points),
        nonfinite=nonfinite_total,
        ticks=n_ticks,
        stale_ticks=stale,
        requests=requests,
        points=tuple(points),
        end=(n_ticks - 1) * interval if n_ticks else 0.0,
        state=state,
    )
