"""The ``failures:`` section of a scenario file (``specon.sim.scenario_file``): hosts that fail.

::

    failures:
      mtbf: 7200               # each worker's mean time between failures, seconds (exponential,
                               # drawn from the seed); optional
      repair: 600              # seconds a lost worker stays down before it comes back empty
                               # (default 600)
      checkpoint_every: 200    # a job checkpoints every this many steps ... (default 200)
      checkpoint_interval: 60  # ... or seconds, whichever comes first (default 60: jobkit's)
      events:                  # listed failures; optional
        - {worker: big-1, at: 1800}                 # the host is lost at 1800 s
        - {worker: small-1, at: 3600, notice: 120}  # a reclaim notice: drained at 3600 s, lost 120 s later

It needs ``mtbf`` or ``events`` (or both). What a failure does is ``specon.sim.hosts``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specon.model import WorkerId
from specon.sim.failures import DEFAULT_REPAIR, Checkpoints, Failures, HostEvent
from specon.wire import codec

FAILURE_KEYS = ("mtbf", "repair", "checkpoint_every", "checkpoint_interval", "events")
EVENT_KEYS = ("worker", "at", "notice")

Where = tuple[codec.PathPart, ...]


class FailureChecks:
    """The failure checks of the scenario file's reader, which provides the generic ones."""

    worker_names: list[str] | None = None

    def add(self, path: Where, message: str) -> None:
        raise NotImplementedError

    def mapping(
        self, value: object, path: Where, keys: Sequence[str], required: Sequence[str]
    ) -> dict[str, Any] | None:
        raise NotImplementedError

    def number(self, value: object, path: Where, *, low: float, strict: bool = False) -> float | None:
        raise NotImplementedError

    def integer(self, value: object, path: Where) -> int | None:
        raise NotImplementedError

    def name(self, value: object, path: Where) -> str | None:
        raise NotImplementedError

    def failures_of(self, value: object) -> Failures | None:
        path: Where = ("failures",)
        entry = self.mapping(value, path, FAILURE_KEYS, ())
        if entry is None:
            return None
        if "mtbf" not in entry and "events" not in entry:
            self.add(path, "needs mtbf (seconds), events (a list), or both")
            return None
        ok = True
        mtbf = None
        if "mtbf" in entry:
            mtbf = self.number(entry["mtbf"], (*path, "mtbf"), low=0.0, strict=True)
            ok = mtbf is not None
        repair = self.number(entry.get("repair", DEFAULT_REPAIR), (*path, "repair"), low=0.0, strict=True)
        every = (
            self.integer(entry["checkpoint_every"], (*path, "checkpoint_every"))
            if "checkpoint_every" in entry
            else Checkpoints().every
        )
        interval = self.number(
            entry.get("checkpoint_interval", Checkpoints().interval),
            (*path, "checkpoint_interval"),
            low=0.0,
            strict=True,
        )
        events = self.events(entry["events"], (*path, "events")) if "events" in entry else ()
        if not ok or repair is None or every is None or interval is None or events is None:
            return None
        return Failures(mtbf, repair, events, Checkpoints(every, interval))

    def events(self, value: object, path: Where) -> tuple[HostEvent, ...] | None:
        if not isinstance(value, list):
            self.add(path, f"expected a list of {{worker, at[, notice]}}, got {codec.describe(value)}")
            return None
        found = [self.event(item, (*path, i)) for i, item in enumerate(value)]
        events = [e for e in found if e is not None]
        return tuple(events) if len(events) == len(found) else None

    def event(self, item: object, path: Where) -> HostEvent | None:
        entry = self.mapping(item, path, EVENT_KEYS, ("worker", "at"))
        if entry is None:
            return None
        worker = self.name(entry["worker"], (*path, "worker")) if "worker" in entry else None
        known = self.worker_names
        if worker is not None and known is not None and worker not in known:
            hint = codec.suggest(worker, known) or f" (known: {', '.join(known)})"
            self.add((*path, "worker"), f"unknown worker {worker!r}{hint}")
            worker = None
        at = self.number(entry["at"], (*path, "at"), low=0.0) if "at" in entry else None
        notice = None
        if "notice" in entry:
            notice = self.number(entry["notice"], (*path, "notice"), low=0.0, strict=True)
            if notice is None:
                return None
        if worker is None or at is None:
            return None
        return HostEvent(WorkerId(worker), at, notice)
