"""Host loss on the local runtime: the host dies -> the job's first step on another host
(target <= recovery.after + 5 s), and the steps each recovery redoes (target <= the job's
checkpoint interval).

Each run is an embedded cluster (real manager, two real agents) with the shipped default
policy (heartbeats every 5 s, a worker unreachable after 20 s, lost after
``recovery.after`` = 60 s; rebalancing off so that nothing else moves the job). A curve job
checkpointing every 50 steps trains on w0; after its first checkpoint the host dies:
its agent and the job's processes are SIGKILLed together, with no goodbye and no save (once
the manager has heard of the job: one it never heard of cannot be restored). Times
from the kill, on this machine's clock, from the job's own progress log:

* first step - the first training record the resumed run writes (on w1);
* redone     - the steps the dead run had trained past the checkpoint the new run resumed
  from: what the loss cost.

Median of 5 runs (1 with ``--quick``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.figures import Figure
from specon.config import default_policy
from specon.embedded.cluster import EmbeddedCluster
from specon.model import ContainerId, WorkerId
from specon.runtime.base import JobSpec
from specon.runtime.volume import JobPaths
from specon.testing.progress_log import job_records

JOB = Path(__file__).resolve().parents[1] / "tests" / "integration" / "jobs" / "curve_job.py"
CHECKPOINT_EVERY = 50
W0, W1 = WorkerId("w0"), WorkerId("w1")
SLACK = 5.0  # the target: recovery.after + this


def _policy(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "policy.yaml"
    path.write_text('apiVersion: specon/v1alpha1\nkind: Policy\nrebalance: {mode: "off"}\n')
    return path


def _processes(progress: Path) -> list[int]:
    """Every live process of the job, found by the progress file its environment names."""
    marker = f"SPECON_PROGRESS_FILE={progress}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    out.append(int(entry.name))
    return out


async def _until(cond: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("the job did not reach the expected state")
        await asyncio.sleep(0.05)


async def _one(root: Path, i: int) -> tuple[float, int]:
    """One host loss: seconds from the kill to the first step elsewhere, steps redone."""
    jid = ContainerId(f"lost-{i}")
    spec = JobSpec(
        id=jid,
        command=(sys.executable, str(JOB), "--steps", "1000000", "--curve", "linear",
                 "--step-seconds", "0.05", "--checkpoint-every", str(CHECKPOINT_EVERY)),
        steps=1_000_000,
        model="linear",
    )  # fmt: skip
    async with EmbeddedCluster(root, workers=2, cpus_per_worker=1.0, policy=_policy(root)) as c:
        try:
            progress = JobPaths.of(c.volume, jid).progress
            await c.submit(spec, W0)

            def records() -> list[dict[str, Any]]:
                return job_records(c.volume, jid)

            await _until(lambda: any(r.get("event") == "checkpoint" for r in records()), 120)
            # The manager must know the job (its first heartbeat listing it, up to 5 s later).
            deadline = time.monotonic() + 60
            while not any(x.id == jid and x.phase == "running" for x in (await c.status()).containers):
                if time.monotonic() > deadline:
                    raise TimeoutError("the manager never listed the job")
                await asyncio.sleep(0.2)
            c.kill(c.agents[W0])
            for pid in _processes(progress):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            killed = time.time()

            def resumed() -> bool:
                rs = records()
                starts = [k for k, r in enumerate(rs) if r.get("event") == "started"]
                return len(starts) > 1 and any("loss" in r for r in rs[starts[1] :])

            await _until(resumed, 300)
            rs = records()
            first_run, second_run = [k for k, r in enumerate(rs) if r.get("event") == "started"][:2]
            resumed_from = int(rs[second_run]["step"])
            first = next(float(r["ts"]) for r in rs[second_run:] if "loss" in r)
            dead = [int(r["step"]) for r in rs[first_run:second_run] if "loss" in r]
            return first - killed, (dead[-1] - resumed_from if dead else 0)
        finally:
            if c.manager is not None:
                c.kill(c.manager)


def run(quick: bool = False) -> list[Figure]:
    n = 1 if quick else 5
    after = default_policy().recovery.after
    results: list[tuple[float, int]] = []
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        for i in range(n):
            took, redone = asyncio.run(_one(Path(tmp) / f"run-{i}", i))
            print(
                f"  run {i + 1}/{n}: first step on w1 {took:.1f} s after the kill; {redone} steps redone",
                flush=True,
            )
            results.append((took, redone))
    times, steps = [t for t, _ in results], [r for _, r in results]
    spread = (
        f"median of {n}; {min(times):.1f}-{max(times):.1f} s; recovery.after {after:g} s, default heartbeats"
    )
    return [
        Figure("host loss -> first step on another host (local)", statistics.median(times), "s",
               target=after + SLACK, detail=spread),
        Figure("steps redone per host loss (checkpoint every 50)", statistics.median(steps), "steps",
               target=CHECKPOINT_EVERY, detail=f"median of {n}; {min(steps)}-{max(steps)}"),
    ]  # fmt: skip
