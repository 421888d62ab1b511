"""How much sooner a restored workload job takes its first step through a standby than cold, on
this machine's CPUs (no GPU: the standby primes on the CPU). Prints the medians of five:

    .venv/bin/pytest -s -m slow tests/integration/test_standby_timing.py

Each run restores the gru workload from the same step-10 checkpoint (``--steps 11``: one step,
then it finishes); the time is from the ``start`` call to the ``ts`` of its first step record.
The standby's refill primes at the same time as the restored job's first step (on a 2-core
machine it competes for the CPU), and is awaited before the next run.
"""

from __future__ import annotations

import hashlib
import statistics
import sys
import time
from pathlib import Path

import pytest
from test_runtime_local import records, wait_for

from specon import checkpoint
from specon.model import ContainerId, Resources, WorkerId
from specon.runtime import JobPaths, JobSpec, LocalRuntime

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]

RUNS = 5


async def restore(rt: LocalRuntime, job: str, payload: bytes) -> tuple[float, float]:
    """Seconds from the start call to the job's pid, and to its first step."""
    argv = (sys.executable, "-m", "specon.workloads", "--model", "gru", "--steps", "11", "--log-every", "1")
    spec = JobSpec(id=ContainerId(job), command=argv, steps=11, model="gru", requests=Resources(gpu=1))
    paths = JobPaths.of(rt.root, job)
    paths.create()
    ckpt = checkpoint.write(paths.checkpoints, 10, payload)
    t0 = time.time()
    await rt.start(spec, checkpoint=ckpt.payload)
    started = time.time() - t0
    await wait_for(paths.finished, f"{job} to finish", timeout=240)
    first = next(r for r in records(rt, job) if "loss" in r)
    assert first["step"] == 11
    return started, first["ts"] - t0


@pytest.mark.serial
async def test_a_restore_through_the_standby_reaches_its_first_step_sooner_than_cold(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from specon.workloads.registry import build  # noqa: PLC0415 - imports torch

    workload = build("gru", seed=0)
    for _ in range(10):
        workload.train_step()
    payload = workload.state()
    root = tmp_path / "volume"
    cluster = "sbt" + hashlib.sha1(str(root).encode()).hexdigest()[:8]
    cold = LocalRuntime(root, WorkerId("cold"), 1.0, cluster=cluster)
    hot = LocalRuntime(root, WorkerId("hot"), 1.0, cluster=cluster, standby_gpus=(0,))
    pool = hot.standby
    assert pool is not None
    times: dict[str, list[tuple[float, float]]] = {"cold": [], "standby": []}
    try:
        for i in range(RUNS):
            times["cold"].append(await restore(cold, f"cold-{i}", payload))
            await wait_for(lambda: pool.standbys[0].ready, "the standby to prime", timeout=240)
            times["standby"].append(await restore(hot, f"standby-{i}", payload))
        assert pool.launches == RUNS
    finally:
        for rt in (cold, hot):
            await rt.stop_all()
            rt.close()
    for name, runs in times.items():
        to_pid = statistics.median(t for t, _ in runs)
        to_step = statistics.median(s for _, s in runs)
        steps = ", ".join(f"{s:.2f}" for _, s in runs)
        print(
            f"\n{name:>8}: first step {to_step:.2f} s after the request (median of {RUNS}: {steps});"
            f" process running after {to_pid:.3f} s"
        )
    assert statistics.median(s for _, s in times["standby"]) < statistics.median(s for _, s in times["cold"])
