"""A discrete-event engine: a virtual clock and a queue of timed callbacks.

Events run in (time, priority, insertion order), so a run is a pure function of its
inputs: no wall clock, no hash order, no threads. Equal-time events run in priority
order (lower first); the simulator uses that to apply state changes (completions,
migrations, arrivals) before the observers (Algorithm 1 ticks, manager passes) look.
Cancelling is lazy: a cancelled entry stays in the heap and is skipped when it surfaces.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable

Action = Callable[[], None]

# Equal-time order: what changes the cluster first, then what observes it.
COMPLETE = 0  # a job or a migration finishes
ARRIVE = 1
TICK = 2  # Algorithm 1 on every worker
PASS = 3  # a manager decision pass


class Handle:
    """A scheduled event; ``cancel()`` it to drop it."""

    __slots__ = ("cancelled", "time")

    def __init__(self, time: float) -> None:
        self.time = time
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Engine:
    def __init__(self, *, start: float = 0.0) -> None:
        self.now = start
        self._queue: list[tuple[float, int, int, Handle, Action]] = []
        self._seq = itertools.count()
        self.events = 0  # events run so far (cancelled ones not counted)

    def at(self, time: float, action: Action, *, priority: int = COMPLETE) -> Handle:
        """Run ``action`` at virtual ``time`` (not before now)."""
        if not math.isfinite(time):
            raise ValueError(f"event time must be finite, got {time}")
        if time < self.now:
            raise ValueError(f"cannot schedule in the past: {time} < now {self.now}")
        handle = Handle(time)
        heapq.heappush(self._queue, (time, priority, next(self._seq), handle, action))
        return handle

    def after(self, delay: float, action: Action, *, priority: int = COMPLETE) -> Handle:
        return self.at(self.now + delay, action, priority=priority)

    def pending(self) -> int:
        return sum(1 for entry in self._queue if not entry[3].cancelled)

    def run(self, *, until: float = math.inf, stop: Callable[[], bool] | None = None) -> None:
        """Run events in order until the queue is empty, the next event is after
        ``until``, or ``stop()`` is true after an event."""
        queue = self._queue
        while queue:
            time, _, _, handle, action = queue[0]
            if time > until:
                break
            heapq.heappop(queue)
            if handle.cancelled:
                continue
            self.now = time
            self.events += 1
            action()
            if stop is not None and stop():
                break
