"""Recovery on the embedded cluster: real manager, agent and job processes (SPEC §6.5).

A job whose host dies (its agent and its processes killed together) and a job that crashes
outside any migration (SIGKILLed, as the OOM killer does) are restored by the manager's
reconciler from their newest complete checkpoint and finish with exactly their steps, never
two copies at once. On today's code before the reconciler, neither job ever ran again.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest
from jobwatch import (
    CHECKPOINT_EVERY,
    Watchdog,
    assert_finished_once,
    embedded_cluster,
    finished,
    in_state,
    job_processes,
    migration_of,
    records,
    spec,
    wait_for,
)

from specon.embedded.cluster import EmbeddedCluster
from specon.model import WorkerId
from specon.testing.held_jobs import finished_steps, release

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(120)]

W0, W1 = WorkerId("w0"), WorkerId("w1")
WORKER_TIMEOUT = 2.0
AFTER = 4.0  # recovery.after: a silent worker is lost after this
STEPS = 300


def embedded(tmp_path: Path) -> contextlib.AbstractAsyncContextManager[EmbeddedCluster]:
    return embedded_cluster(
        tmp_path,
        f"messaging: {{heartbeat_interval: 0.5, worker_timeout: {WORKER_TIMEOUT}}}\n"
        f"recovery: {{after: {AFTER}, backoff: 1}}\n"
        'rebalance: {mode: "off"}\nplacement: {require_gain: true}\n',
    )


def checkpointed(c: EmbeddedCluster, jid: str) -> bool:
    return any(r.get("event") == "checkpoint" for r in records(c, jid))


def kill_job(c: EmbeddedCluster, jid: str) -> list[str]:
    """SIGKILL every process of ``jid``; the workers they ran on."""
    procs = job_processes(c, jid)
    for pid in procs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return sorted(set(procs.values()))


async def test_a_dead_hosts_job_resumes_on_the_other_worker_with_exactly_its_steps(tmp_path: Path) -> None:
    gate = tmp_path / "release-lost"
    async with embedded(tmp_path) as c, Watchdog(c, "lost", lost_after=AFTER + 40) as dog:
        await c.submit(spec("lost", STEPS, "linear", until_released=gate), W0)
        await wait_for(lambda: checkpointed(c, "lost"), "a first checkpoint", timeout=40, watchdog=dog)
        # The host dies: its agent and its job at once, with no goodbye and no save.
        c.kill(c.agents[W0])
        assert kill_job(c, "lost") == [W0]
        await wait_for(in_state(c, "lost", "done"), "the recovery to finish", timeout=60, watchdog=dog)
        m = await migration_of(c, "lost")
        assert m is not None and (m.reason, m.source, m.target) == ("recovered", W0, W1)
        release(gate)
        await wait_for(lambda: finished(c, "lost"), "the job to finish", timeout=60, watchdog=dog)
        rs = await assert_finished_once(c, dog, trained(c, "lost"))
        # It resumed on w1 from the newest checkpoint the dead run completed: it redid at most
        # the steps after that checkpoint.
        assert dog.workers == [W0, W1] and len(rs) == 2
        assert rs[1].resumed_from == rs[0].checkpoints[-1]
        assert rs[0].trained[-1] - rs[1].resumed_from < CHECKPOINT_EVERY


async def test_a_job_killed_outside_a_migration_is_restarted_and_finishes_with_exactly_its_steps(
    tmp_path: Path,
) -> None:
    gate = tmp_path / "release-oom"
    async with embedded(tmp_path) as c, Watchdog(c, "oom", lost_after=30) as dog:
        await c.submit(spec("oom", STEPS, "linear", until_released=gate), W0)
        await wait_for(lambda: checkpointed(c, "oom"), "a first checkpoint", timeout=40, watchdog=dog)
        assert kill_job(c, "oom") == [W0]  # as the OOM killer does: the agent lives on
        await wait_for(in_state(c, "oom", "done"), "the restart to finish", timeout=40, watchdog=dog)
        m = await migration_of(c, "oom")
        assert m is not None and m.reason == "crashed" and m.source == W0
        release(gate)
        await wait_for(lambda: finished(c, "oom"), "the job to finish", timeout=60, watchdog=dog)
        rs = await assert_finished_once(c, dog, trained(c, "oom"))
        assert len(rs) == 2 and rs[1].resumed_from == rs[0].checkpoints[-1]


def trained(c: EmbeddedCluster, jid: str) -> int:
    total = finished_steps(c.volume, jid)
    assert total >= STEPS, f"{jid}: finished after {total} steps, fewer than its {STEPS}"
    return total
