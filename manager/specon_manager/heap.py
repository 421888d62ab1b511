"""Keep the manager's long-lived cluster state out of the cyclic GC's full collections.

With 100k containers the manager holds about a million tracked objects, and each full
(generation 2) collection walks them all: 120 ms here, during which no request is
answered. The state is plain data without reference cycles, freed by reference counting
when pruned, so scanning it finds nothing. After the state has grown by ``growth`` since
the last time, one full collection clears any real cyclic garbage and ``gc.freeze`` moves
every survivor to the permanent generation, which later collections skip. The pause of
that one collection is paid once per growth step (a handful of times while a cluster
fills up), not on every full collection for as long as the manager runs.
"""

from __future__ import annotations

import gc
import time

import structlog

log = structlog.get_logger()


class HeapFreezer:
    def __init__(self, *, growth: float = 1.25, minimum: int = 5_000) -> None:
        self.growth = growth
        self.minimum = minimum
        self.frozen_at_size = 0

    def maybe_freeze(self, size: int) -> bool:
        """Freeze if the state (``size`` records) outgrew the last frozen size; True if so."""
        if size < self.minimum or size < self.frozen_at_size * self.growth:
            return False
        t0 = time.perf_counter()
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self.frozen_at_size = size
        log.info(
            "specon.manager.heap_frozen",
            records=size,
            frozen_objects=gc.get_freeze_count(),
            seconds=round(time.perf_counter() - t0, 3),
        )
        return True
