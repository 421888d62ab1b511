"""End to end on the embedded default: real manager and agent processes over loopback HTTP,
real jobs in cgroup-budgeted workers, a real save/restore migration."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest

from specon.embedded.cluster import EmbeddedCluster
from specon.model import ContainerId, WorkerId
from specon.runtime.base import JobSpec
from specon.testing.held_jobs import finished_steps, release, release_file
from specon.testing.progress_log import job_records
from specon.wire.status import Status

pytestmark = [pytest.mark.slow, pytest.mark.integration]

JOB = Path(__file__).parent / "jobs" / "curve_job.py"
POLICY = """\
apiVersion: specon/v1alpha1
kind: Policy
monitor: {interval: 1, alpha: 0.02}
messaging: {heartbeat_interval: 0.5, worker_timeout: 4}
migration: {grace_period: 10, min_residence: 0}
placement: {require_gain: false}  # the mechanics are tested: Algorithm 2's move is made
rebalance: {mode: "off"}
"""


def job(
    jid: str,
    steps: int,
    curve: str,
    step_seconds: float = 0.05,
    extra: tuple[str, ...] = (),
    *,
    until_released: Path | None = None,
) -> JobSpec:
    """A ``curve_job.py`` run (``extra``: more of its options); ``until_released``: it trains
    past ``steps`` until that file exists (``held_jobs.release``), so the test decides when it ends."""
    argv = (
        sys.executable,
        str(JOB),
        "--steps",
        str(steps),
        "--curve",
        curve,
        "--step-seconds",
        str(step_seconds),
        *(("--until-released", str(until_released)) if until_released is not None else ()),
        *extra,
    )
    return JobSpec(id=ContainerId(jid), command=argv, steps=steps, model=curve)


def records(c: EmbeddedCluster, jid: str) -> list[dict[str, object]]:
    return job_records(c.volume, jid)


def trained_steps(c: EmbeddedCluster, jid: str) -> list[int]:
    return [int(r["step"]) for r in records(c, jid) if "loss" in r]  # type: ignore[call-overload]


async def wait_for(cond: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await cond() if asyncio.iscoroutinefunction(cond) else cond():
            return
        await asyncio.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[EmbeddedCluster]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    async with EmbeddedCluster(tmp_path / "c", workers=2, cpus_per_worker=0.5, policy=policy) as c:
        yield c


async def test_converged_job_is_migrated_by_save_restore_and_finishes_with_exactly_its_steps(
    cluster: EmbeddedCluster,
) -> None:
    await converged_job_moves_once_and_finishes_exactly(cluster)


async def converged_job_moves_once_and_finishes_exactly(cluster: EmbeddedCluster) -> None:
    """The scenario every runtime of the embedded cluster passes (tests/docker runs it too).

    Both jobs are held (``until_released``): a loaded machine cannot end ``fast`` before it
    was moved, nor ``steady`` before ``fast`` was judged against it. ``fast`` is released
    once its migration is done, ``steady`` when the scenario ends."""
    w0 = WorkerId("w0")
    gates = {jid: release_file(cluster.volume, jid) for jid in ("fast", "steady")}
    try:
        await cluster.submit(job("fast", 400, "converge", until_released=gates["fast"]), w0)
        await cluster.submit(job("steady", 500, "linear", until_released=gates["steady"]), w0)
        await moves_once_and_finishes_exactly(cluster, gates["fast"])
    finally:
        for gate in gates.values():
            release(gate)


async def moves_once_and_finishes_exactly(cluster: EmbeddedCluster, gate: Path) -> None:
    async def migrated() -> bool:
        st: Status = await cluster.status()
        return any(m.container == "fast" and m.state.value == "done" for m in st.migrations)

    await wait_for(migrated, "the converged job's migration to finish", timeout=90)
    st = await cluster.status()
    m = next(m for m in st.migrations if m.container == "fast")
    assert (m.source, m.target, m.reason) == ("w0", "w1", "converged")
    # Recorded; how long it is, the benchmark's (a bound here would bet on the machine's load).
    assert m.downtime is not None and m.downtime > 0
    # The steady (still progressing) job was never moved.
    assert all(m.container != "steady" for m in st.migrations)
    release(gate)  # moved: now it may end

    def finished(jid: str) -> bool:
        return any(r.get("event") == "finished" for r in records(cluster, jid))

    await wait_for(lambda: finished("fast"), "the migrated job to finish", timeout=90)
    # All it trained: its 400 steps and those it was held for.
    total = finished_steps(cluster.volume, "fast")
    assert total >= 400
    steps = trained_steps(cluster, "fast")
    # Exactly its steps: every step trained once (SIGTERM checkpoints, nothing is redone).
    assert sorted(steps) == list(range(1, total + 1))
    events = [r.get("event") for r in records(cluster, "fast") if "event" in r]
    assert events.count("checkpointed") == 1 and events[-1] == "finished"
    # It ran on w1 after the move; the manager saw it there, frozen in CC.
    fast = next(c for c in st.containers if c.id == "fast")
    assert fast.worker == "w1" and fast.migrated


async def test_a_finished_jobs_quality_point_reaches_every_agent(cluster: EmbeddedCluster) -> None:
    """Real agent and manager processes over HTTP: a job of a model trains alone on w0 to its
    end; w0's agent measures where it reached quality, the manager counts it, and w1's agent,
    which never ran a job of that model, holds the model's point."""
    await cluster.submit(job("first", 600, "converge"), WorkerId("w0"))
    assert cluster.manager is not None
    manager, other = cluster.manager.url, cluster.agents[WorkerId("w1")].url

    async def metric(url: str, name: str) -> float | None:
        async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as resp:
            text = await resp.text()
        line = next((x for x in text.splitlines() if x.startswith(f'{name}{{model="converge"}}')), None)
        return None if line is None else float(line.split()[-1])

    async def held() -> bool:
        return await metric(other, "specon_agent_quality_point") is not None

    await wait_for(held, "w1's agent to hold the model's quality point", timeout=120)
    share = await metric(other, "specon_agent_quality_point")
    assert share is not None and 0 < share < 1
    assert await metric(manager, "specon_manager_quality_point") == share
    assert await metric(manager, "specon_manager_quality_jobs") == 1
