"""Draining a worker on the local runtime: ``POST /v1/workers/w0/drain`` -> every one of its 4
jobs has trained its first step on w1 (target <= 30 s).

Each run is an embedded cluster (real manager, two real agents) with the shipped default
policy (rebalancing off, so that only the drain moves jobs). Four curve jobs (light Python
processes: the figure is specon's save, hand-over and restore, not an interpreter loading a
framework; a real job adds its own start-up, docs/costs.md) train on w0; the drain is asked
through the manager's API with the operator token, as ``specon drain`` does. Times on this
machine's clock, from the jobs' own progress logs: the drain request -> the last of the four
jobs' first training record on w1. Median of 5 runs (1 with ``--quick``).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.figures import Figure
from specon.embedded.cluster import EmbeddedCluster
from specon.model import ContainerId, WorkerId
from specon.runtime.base import JobSpec
from specon.testing.progress_log import job_records
from specon.wire import protocol
from specon.wire.operator import DRAIN_PATH

JOB = Path(__file__).resolve().parents[1] / "tests" / "integration" / "jobs" / "curve_job.py"
JOBS = 4
TARGET = 30.0
W0 = WorkerId("w0")


def _spec(jid: str) -> JobSpec:
    argv = (sys.executable, str(JOB), "--steps", "1000000", "--curve", "linear", "--step-seconds", "0.05",
            "--checkpoint-every", "50")  # fmt: skip
    return JobSpec(id=ContainerId(jid), command=argv, steps=1_000_000, model="linear")


def _resumed_at(volume: Path, jid: str, after: float) -> float | None:
    """When ``jid``'s second run wrote its first training record (None: not yet)."""
    rs = job_records(volume, jid)
    starts = [k for k, r in enumerate(rs) if r.get("event") == "started"]
    if len(starts) < 2:
        return None
    return next((float(r["ts"]) for r in rs[starts[1] :] if "loss" in r and float(r["ts"]) > after), None)


async def _one(root: Path, i: int) -> float:
    root.mkdir(parents=True, exist_ok=True)
    policy = root / "policy.yaml"
    policy.write_text('apiVersion: specon/v1alpha1\nkind: Policy\nrebalance: {mode: "off"}\n')
    jobs = [f"drain{i}-{k}" for k in range(JOBS)]
    async with EmbeddedCluster(root, workers=2, cpus_per_worker=2.0, policy=policy) as c:
        try:
            assert c.manager is not None
            for j in jobs:
                await c.submit(_spec(j), W0)
            deadline = time.monotonic() + 60
            while {x.id for x in (await c.status()).containers if x.phase == "running"} < set(jobs):
                if time.monotonic() > deadline:
                    raise TimeoutError("the manager never listed the jobs")
                await asyncio.sleep(0.2)
            headers = {protocol.AUTH_HEADER: f"Bearer {c.operator_token}"}
            asked = time.time()
            async with aiohttp.ClientSession() as s:
                url = c.manager.url + DRAIN_PATH.format(worker=W0)
                async with s.post(url, data=json.dumps({}), headers=headers) as resp:
                    if resp.status != 202:
                        raise RuntimeError(f"drain refused: {resp.status} {await resp.text()}")
            firsts: dict[str, float] = {}
            deadline = time.monotonic() + 120
            while len(firsts) < len(jobs):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"only {sorted(firsts)} resumed on w1")
                for j in jobs:
                    if j not in firsts and (t := _resumed_at(c.volume, j, asked)) is not None:
                        firsts[j] = t
                await asyncio.sleep(0.1)
            return max(firsts.values()) - asked
        finally:
            if c.manager is not None:
                c.kill(c.manager)


def run(quick: bool = False) -> list[Figure]:
    n = 1 if quick else 5
    took: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-drain-") as tmp:
        for i in range(n):
            took.append(asyncio.run(_one(Path(tmp) / f"run-{i}", i)))
            print(
                f"  run {i + 1}/{n}: all {JOBS} jobs training on w1 {took[-1]:.1f} s after the drain",
                flush=True,
            )
    detail = f"median of {n}; {min(took):.1f}-{max(took):.1f} s; default heartbeats, curve jobs"
    return [Figure(f"drain of a worker with {JOBS} jobs -> all training elsewhere (local)",
                   statistics.median(took), "s", target=TARGET, detail=detail)]  # fmt: skip
