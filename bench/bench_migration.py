"""Migration downtime by save/restore on the local runtime, per workload (paper: < 5 s; target < 2 s).

For each of the five models a real training job (``python -m specon.workloads``) runs on one
worker of a two-worker ``LocalCluster``; it is then moved back and forth N times by the
runtime's ``save`` (SIGTERM -> verified checkpoint -> exit) and ``start`` on the other worker
(restore from that checkpoint). Per move we measure:

* save    - SIGTERM until the process is gone and its checkpoint verifies;
* restore - start until the job records ``started`` (interpreter, torch, model, checkpoint);
* downtime - SIGTERM until the job logs its first training sample again: what the job loses.

Median and p95 of the downtime are reported per model; the target is judged on the p95.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from bench.figures import Figure
from specon.evaluation import percentile
from specon.model import ContainerId, WorkerId
from specon.progress.last import read_records
from specon.runtime.base import JobSpec
from specon.runtime.local.cluster import LocalCluster

MODELS = ("vae", "gru", "birnn", "rnn", "dynrnn")


async def _wait(cond: object, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        await asyncio.sleep(0.02)
    raise TimeoutError("job did not reach the expected state")


def _after(path: Path, t: float, *, event: str | None) -> float | None:
    """Timestamp of the first record after ``t`` with that event (None: a training sample)."""
    for rec in read_records(path):
        ts = rec.get("ts")
        if not isinstance(ts, float | int) or ts <= t:
            continue
        if (event is None and "loss" in rec) or (event is not None and rec.get("event") == event):
            return float(ts)
    return None


async def _measure(model: str, moves: int, root: Path) -> list[tuple[float, float, float]]:
    async with LocalCluster(root, [1.0, 1.0], name=f"bm{model}") as cluster:
        w = [WorkerId("w0"), WorkerId("w1")]
        spec = JobSpec(
            id=ContainerId(f"mig-{model}"),
            command=(sys.executable, "-m", "specon.workloads", "--model", model, "--steps", "1000000",
                     "--log-every", "1", "--checkpoint-every", "0", "--checkpoint-interval", "0"),
            model=model,
        )  # fmt: skip
        info = await cluster.runtimes[w[0]].start(spec)
        progress = info.progress_path
        await _wait(lambda: _after(progress, 0.0, event=None) is not None)
        out = []
        for i in range(moves):
            src, dst = w[i % 2], w[(i + 1) % 2]
            await asyncio.sleep(0.5)  # let it train a little between moves
            t0 = time.time()
            res = await cluster.runtimes[src].save(spec.id, grace=30.0)
            saved = time.time()
            await cluster.runtimes[dst].start(spec, checkpoint=res.checkpoint)
            await _wait(lambda t=saved: _after(progress, t, event=None) is not None)
            started = _after(progress, saved, event="started") or saved
            first = _after(progress, saved, event=None) or saved
            out.append((saved - t0, started - saved, first - t0))
        return out


def run(quick: bool) -> list[Figure]:
    moves = 3 if quick else 8
    figures: list[Figure] = []
    all_down: list[float] = []
    with tempfile.TemporaryDirectory(prefix="specon-bench-mig-") as tmp:
        for model in MODELS[:2] if quick else MODELS:
            print(f"  ... {model}: {moves} moves", flush=True)
            samples = asyncio.run(_measure(model, moves, Path(tmp) / model))
            saves = [s for s, _, _ in samples]
            restores = [r for _, r, _ in samples]
            downs = [d for _, _, d in samples]
            all_down += downs
            detail = (
                f"save median {percentile(saves, 50):.2f}s, restore median {percentile(restores, 50):.2f}s, "
                f"downtime median {percentile(downs, 50):.2f}s, n={len(downs)}"
            )
            p95 = percentile(downs, 95) or 0.0
            figures.append(Figure(f"migration downtime p95, {model}", p95, "s", 2.0, "max", detail))
    figures.append(
        Figure("migration downtime median, all models", percentile(all_down, 50) or 0.0, "s", None, "max")
    )
    figures.append(
        Figure("migration downtime p95, all models", percentile(all_down, 95) or 0.0, "s", 2.0, "max")
    )
    return figures
