"""``specon drain`` on the embedded cluster: the real CLI against a real manager, agents and
training processes (SPEC §6.6).

Three jobs train on w0; ``specon drain w0 --wait`` moves each to w1 with a fresh checkpoint,
and each finishes with exactly its steps, never two copies at once, losing no step. With a
deadline shorter than a job's save, the save is cut short: the job resumes from its newest
periodic checkpoint and the steps it lost are reported. ``specon uncordon`` puts w0 back.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from jobwatch import (
    Watchdog,
    assert_finished_once,
    drained_with_fresh_checkpoints,
    embedded_cluster,
    finished,
    migration_of,
    records,
    spec,
    specon_cli,
    status,
    training,
    wait_for,
)

from specon.embedded.cluster import EmbeddedCluster
from specon.model import WorkerId
from specon.testing.held_jobs import finished_steps, release

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(150)]

W0, W1 = WorkerId("w0"), WorkerId("w1")
STEPS = 200
JOBS = ("d1", "d2", "d3")


def embedded(tmp_path: Path) -> contextlib.AbstractAsyncContextManager[EmbeddedCluster]:
    return embedded_cluster(
        tmp_path,
        "messaging: {heartbeat_interval: 0.5, worker_timeout: 2}\n"
        'rebalance: {mode: "off"}\nplacement: {require_gain: true}\n',
        cpus=1.5,
    )


def trained(c: EmbeddedCluster, jid: str) -> int:
    total = finished_steps(c.volume, jid)
    assert total >= STEPS, f"{jid}: finished after {total} steps, fewer than its {STEPS}"
    return total


async def test_drain_moves_every_job_off_with_a_fresh_checkpoint_and_uncordon_puts_the_worker_back(
    tmp_path: Path,
) -> None:
    gates = {j: tmp_path / f"release-{j}" for j in JOBS}
    async with embedded(tmp_path) as c, contextlib.AsyncExitStack() as stack:
        dogs = {j: await stack.enter_async_context(Watchdog(c, j)) for j in JOBS}
        for j in JOBS:
            await c.submit(spec(j, STEPS, "linear", until_released=gates[j]), W0)
        await wait_for(lambda: training(c, *JOBS), "the jobs training", timeout=60)
        await drained_with_fresh_checkpoints(c, JOBS, W0, W1)
        st = await status(c)
        assert st is not None and next(w for w in st.workers if w.id == W0).cordoned
        code, out, _ = await specon_cli(c, "uncordon", "w0")
        assert code == 0 and out.strip() == "w0 uncordoned: it takes jobs again"
        for j in JOBS:
            release(gates[j])
        for j in JOBS:
            await wait_for(lambda j=j: finished(c, j), f"{j} to finish", timeout=60, watchdog=dogs[j])
            rs = await assert_finished_once(c, dogs[j], trained(c, j))
            assert dogs[j].workers == [W0, W1] and rs[0].ending == "checkpointed"  # saved, not killed
        st = await status(c)
        assert st is not None and not next(w for w in st.workers if w.id == W0).cordoned


async def test_a_drain_deadline_cuts_a_slow_save_short_and_reports_the_steps_it_lost(tmp_path: Path) -> None:
    gate = tmp_path / "release-slow"
    async with embedded(tmp_path) as c, Watchdog(c, "slow") as dog:
        # Its save on SIGTERM takes 20 s: longer than the drain allows.
        await c.submit(spec("slow", STEPS, "linear", save_seconds=20.0, until_released=gate), W0)
        checkpointed = lambda: any(r.get("event") == "checkpoint" for r in records(c, "slow"))  # noqa: E731
        await wait_for(checkpointed, "a checkpoint", timeout=40, watchdog=dog)
        await wait_for(lambda: training(c, "slow"), "it training", timeout=60)
        code, out, err = await specon_cli(c, "drain", "w0", "--deadline", "3", "--wait")
        assert code == 0, err
        m = await migration_of(c, "slow")
        assert m is not None and m.state.value == "done" and m.lost_steps is not None and m.lost_steps > 0
        assert f"{m.lost_steps} step(s) lost" in out
        release(gate)
        await wait_for(lambda: finished(c, "slow"), "slow to finish", timeout=60, watchdog=dog)
        rs = await assert_finished_once(c, dog, trained(c, "slow"))
        # Killed mid-save: it resumed from its newest periodic checkpoint.
        assert rs[0].ending is None and rs[1].resumed_from == rs[0].checkpoints[-1] == m.checkpoint_step
