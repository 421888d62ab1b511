"""Each job's loss window for the status page (``specon.wire.status.LossWindow``): the mean loss of each
tick since the agent adopted it, thinned to every other tick when full, sent resampled to
``POINTS`` evenly spaced steps with the step rate of its latest ticks.

The heartbeat stays cheap (a window of 32 points costs the manager about as much to decode
as a whole 8-container heartbeat without): a report carries a job's window the first time,
then when ticks changed it but no sooner than ``EVERY_BEATS`` heartbeats after the last, and
unchanged every ``RESEND_BEATS`` (the manager keeps the last one it got, in memory: a
restarted manager has it back within that many); otherwise ``None``. Each job's schedule is
shifted by its id, so jobs adopted together do not all send on one heartbeat. A window is
always one the manager accepts (``specon.wire.checks``): whatever a log says, a bad window
would cost the worker its whole heartbeat.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from specon.model import ContainerId
from specon.wire.limits import MAX_SEQ, MAX_SHORT_TEXT, MAX_STEP_RATE, MAX_WINDOW_POINTS
from specon.wire.status import LossWindow
from specon_agent.watched import Watched

# Points sent (the protocol allows MAX_WINDOW_POINTS): enough for a sparkline, half the decoding.
POINTS = MAX_WINDOW_POINTS // 2
# Ticks kept per job before thinning (twice the points sent: resampling has some to choose from).
KEPT = 2 * POINTS
# The step rate is measured over this many of the latest ticks.
RATE_TICKS = 8
# Heartbeats between two windows of a job: at least EVERY when it changed (2 minutes at the
# default 5 s: a curve for people, a rate for the time left), at most RESEND.
EVERY_BEATS = 24
RESEND_BEATS = 120
# Significant digits of a loss on the wire (a plot needs no more).
DIGITS = 5


@dataclass(slots=True)
class _Job:
    ticks: list[tuple[float, int, float]] = field(default_factory=list)  # (agent time, step, mean loss)
    built: LossWindow | None = None  # the window of ``ticks``, None when a tick changed them
    beats: int | None = None  # heartbeats since it was last sent (None: never sent)
    metric: str = "loss"


class LossWindows:
    """The windows of one agent's watched jobs."""

    def __init__(self) -> None:
        self._jobs: dict[ContainerId, _Job] = {}

    def tick(
        self,
        now: float,
        samples: Mapping[ContainerId, Sequence[float]],
        watched: Mapping[ContainerId, Watched],
    ) -> None:
        """One tick: each job's new values (if it logged a step) become one point, their mean;
        jobs no longer watched are forgotten."""
        for cid in self._jobs.keys() - watched.keys():
            del self._jobs[cid]
        for cid, values in samples.items():
            w = watched.get(cid)
            finite = [v for v in values if math.isfinite(v)]
            if w is None or w.step is None or not 0 <= w.step <= MAX_SEQ or not finite:
                continue  # no step logged (or none the wire carries): no axis to draw the curve on
            job = self._jobs.setdefault(cid, _Job(metric=w.tailer.config.metric[:MAX_SHORT_TEXT]))
            if job.ticks and w.step < job.ticks[-1][1]:
                job.ticks.clear()  # started over (from scratch or an older checkpoint)
            job.ticks.append((now, w.step, sum(v / len(finite) for v in finite)))  # never overflows
            if len(job.ticks) > KEPT:
                del job.ticks[-2::-2]  # every other tick; the first and the newest stay
            job.built = None

    def report(self, cid: ContainerId) -> LossWindow | None:
        """What this heartbeat carries for ``cid``: its window if changed or due, else None."""
        job = self._jobs.get(cid)
        if job is None:
            return None
        if job.beats is not None:
            job.beats += 1
            if job.beats < (EVERY_BEATS if job.built is None else RESEND_BEATS):
                return None
            job.beats = 0
        else:  # the first: at once, then on a schedule shifted by the id
            job.beats = zlib.crc32(cid.encode()) % EVERY_BEATS
        if job.built is None:
            job.built = build_window(job.ticks, job.metric)
        return job.built


def build_window(ticks: Sequence[tuple[float, int, float]], metric: str) -> LossWindow:
    """``ticks`` (time, step, loss; steps not decreasing) as a window of at most ``POINTS``
    losses at evenly spaced steps, linearly interpolated."""
    first, last = ticks[0][1], ticks[-1][1]
    n = min(len(ticks), POINTS) if last > first else 1
    if n == 1:
        loss = [sum(t[2] for t in ticks) / len(ticks)]
    else:
        loss = []
        j = 0
        for i in range(n):
            x = first + (last - first) * i / (n - 1)
            while j + 1 < len(ticks) - 1 and ticks[j + 1][1] < x:
                j += 1
            (_, s0, v0), (_, s1, v1) = ticks[j], ticks[j + 1]
            f = 0.0 if s1 == s0 else (x - s0) / (s1 - s0)
            loss.append(v0 * (1 - f) + v1 * f)  # between v0 and v1: finite as they are
    rate = step_rate(ticks[-RATE_TICKS:])
    return LossWindow(
        first_step=first,
        last_step=last,
        loss=tuple(map(_rounded, loss)),
        steps_per_second=rate if rate is None or rate <= MAX_STEP_RATE else None,
        metric=metric,
    )


def _rounded(v: float) -> float:
    """``v`` to ``DIGITS`` significant digits (itself where rounding would leave the floats)."""
    r = float(f"{v:.{DIGITS}g}")
    return r if math.isfinite(r) else v


def step_rate(ticks: Sequence[tuple[float, int, float]]) -> float | None:
    """Steps per second between the first and last of ``ticks``; None without two apart in time."""
    if len(ticks) < 2:
        return None
    (t0, s0, _), (t1, s1, _) = ticks[0], ticks[-1]
    if t1 <= t0 or s1 < s0:
        return None
    return (s1 - s0) / (t1 - t0)
