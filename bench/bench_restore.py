"""Restore cost, cold vs warm interpreter (issue 10, item 7): the CPU a job spends before its
first step, and the downtime of a move, on the demo's workers.

A cold local job imports torch (and what its optimizer imports lazily) on every start, so
every restore of a moved job spends that CPU on the target worker, from the budget its
other jobs share. The warm interpreter (``specon.runtime.local.zygote``) imports once per worker
and forks each job. Measured the same way for both, alternating cold and warm so drift
favours neither:

* start-up CPU: the worker's CPU accounting until the job's first training step (less that
  step), per model, on a one-core worker (``bench_calibration.measure_startup``); median of
  the runs per model, then the mean over models. Target (the issue): less than the cold
  2-3 CPU-seconds; here judged against 1 CPU-second.
* downtime: SIGTERM on the source until the job trains again on the target, VAE moved back
  and forth between the demo's two 0.5-CPU workers, each running one other job
  (``bench_calibration.measure_moves``); median of the moves.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
from pathlib import Path

from bench.bench_calibration import measure_moves, measure_startup
from bench.figures import Figure
from specon.sim.trace import load_traces

ROUNDS = {False: 3, True: 1}  # start-ups per model and mode
MOVES = {False: 6, True: 2}
CPUS = 0.5  # the demo's workers


def _startups(root: Path, rounds: int) -> dict[bool, dict[str, list[float]]]:
    out: dict[bool, dict[str, list[float]]] = {False: {}, True: {}}
    for model, traces in sorted(load_traces().items()):
        cost = statistics.fmean(t.step_cost for t in traces)
        for r in range(rounds):
            for warm in (False, True) if r % 2 == 0 else (True, False):
                where = root / f"start-{model}-{r}-{int(warm)}"
                out[warm].setdefault(model, []).append(
                    asyncio.run(measure_startup(where, model, cost, warm=warm))
                )
    return out


def run(quick: bool) -> list[Figure]:
    figures = []
    with tempfile.TemporaryDirectory(prefix="specon-bench-restore-") as tmp:
        root = Path(tmp)
        print("  ... start-up CPU per model, cold and warm", flush=True)
        startups = _startups(root, ROUNDS[quick])
        means = {}
        for warm in (False, True):
            per_model = {m: statistics.median(v) for m, v in startups[warm].items()}
            means[warm] = statistics.fmean(per_model.values())
            figures.append(
                Figure(
                    f"start-up CPU until the first step, {'warm' if warm else 'cold'} (mean over models)",
                    means[warm],
                    "s CPU",
                    target=1.0 if warm else None,
                    detail=", ".join(
                        f"{m} {statistics.median(v):.2f} ({', '.join(f'{x:.2f}' for x in v)})"
                        for m, v in startups[warm].items()
                    ),
                )
            )
        figures.append(
            Figure("start-up CPU saved by the warm interpreter", means[False] - means[True], "s CPU")
        )
        downs: dict[bool, list[float]] = {}
        for warm in (False, True):
            print(
                f"  ... {MOVES[quick]} moves between busy {CPUS:g}-CPU workers, {'warm' if warm else 'cold'}"
            )
            where = root / f"moves-{int(warm)}"
            downs[warm] = asyncio.run(
                measure_moves(where, cpus=CPUS, busy=True, moves=MOVES[quick], warm=warm)
            )
        for warm in (False, True):
            d = downs[warm]
            figures.append(
                Figure(
                    f"move downtime median, {'warm' if warm else 'cold'}, busy {CPUS:g}-CPU workers",
                    statistics.median(d),
                    "s",
                    detail=f"SIGTERM -> training again; n={len(d)}: {', '.join(f'{x:.2f}' for x in d)}",
                )
            )
    return figures
