"""Fault injection on the embedded cluster: real manager, agent and job processes (SPEC §6).

"Nothing lost": whatever crashes (the manager, an agent, a job that will not stop, a
checkpoint on the volume), a container is never left without a running copy, never runs
twice at once, and finishes with exactly its steps, redoing at most the steps after its
last complete checkpoint.

Every test watches the job's processes in ``/proc`` all along (``Watchdog``), judges the
job's progress log run by run (``runs``), and waits on conditions, never on fixed sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path

import aiohttp
import pytest
from jobwatch import (
    SAVES,
    STARTS,
    Watchdog,
    agent_health,
    agent_metric,
    assert_finished_once,
    embedded_cluster,
    finished,
    frozen,
    has_event,
    in_state,
    job_processes,
    manager_port,
    marked_migrated,
    migration_of,
    pending_request,
    restart_agent,
    runs,
    spec,
    status,
    wait_for,
    worker_reachable,
)

from specon import checkpoint
from specon.embedded.cluster import EmbeddedCluster
from specon.model import ContainerId, WorkerId
from specon.runtime.volume import JobPaths
from specon.testing.held_jobs import finished_steps, release
from specon.wire import protocol

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(120)]

W0, W1 = WorkerId("w0"), WorkerId("w1")
HEARTBEAT = 0.5
STEPS = 500  # of the converging job; held (``until_released``) until its test has moved it


def embedded(
    tmp_path: Path, *, worker_timeout: float = 4.0, grace: float = 10.0
) -> contextlib.AbstractAsyncContextManager[EmbeddedCluster]:
    return embedded_cluster(
        tmp_path,
        "monitor: {interval: 1, alpha: 0.02}\n"
        f"messaging: {{heartbeat_interval: {HEARTBEAT}, worker_timeout: {worker_timeout}}}\n"
        f"migration: {{grace_period: {grace}, min_residence: 0}}\n"
        "placement: {require_gain: false}\n"  # the mechanics are tested: Algorithm 2's move is made
        'rebalance: {mode: "off"}\n',
    )


def gate_of(tmp_path: Path, jid: str) -> Path:
    """The file that releases the held job ``jid`` (:func:`release`)."""
    return tmp_path / f"release-{jid}"


async def submit_converging_pair(
    c: EmbeddedCluster,
    gate: Path,
    *,
    steps: int = STEPS,
    save_seconds: float = 0.0,
    ignore_sigterm: bool = False,
    crash_on_restore: Path | None = None,
) -> None:
    """On w0: ``conv`` (converges in seconds, so it asks to move to the empty w1) and
    ``steady`` (keeps progressing, so w0 stays the busier worker and ``conv`` may ask).
    ``conv`` trains on past ``steps`` until ``gate`` exists: the test releases it once it
    has done to it what it meant to."""
    await c.submit(spec("steady", 4000, "linear"), W0)
    await c.submit(
        spec(
            "conv",
            steps,
            "converge",
            save_seconds=save_seconds,
            ignore_sigterm=ignore_sigterm,
            until_released=gate,
            crash_on_restore=crash_on_restore,
        ),
        W0,
    )


def trained_at_least(c: EmbeddedCluster, jid: str, steps: int) -> int:
    """The steps the finished (held) job trained in all: at least its declared ``steps``."""
    total = finished_steps(c.volume, jid)
    assert total >= steps, f"{jid}: finished after {total} steps, fewer than its {steps}"
    return total


# -- 1. the manager crashes during a migration ------------------------------------------------
@pytest.mark.parametrize("journaled", ["saving", "restoring"])
async def test_manager_killed_during_a_migration_resumes_or_rolls_it_back_and_loses_nothing(
    tmp_path: Path, journaled: str
) -> None:
    # worker_timeout 6: the target's agent is frozen for a moment in the "restoring" case.
    gate = gate_of(tmp_path, "conv")
    async with embedded(tmp_path, worker_timeout=6.0) as c, Watchdog(c, "conv") as dog:
        await submit_converging_pair(c, gate, save_seconds=3.0 if journaled == "saving" else 1.0)
        await wait_for(lambda: has_event(c, "conv", "saving"), "conv to start saving", timeout=45)
        async with contextlib.AsyncExitStack() as stack:
            if journaled == "restoring":
                # Hold the target back so the manager dies with the restore ordered, not done.
                stack.enter_context(frozen(c.agents[W1]))
            await wait_for(in_state(c, "conv", journaled), f"the migration {journaled}", timeout=20)
            before = await migration_of(c, "conv")
            port = manager_port(c)
            assert c.manager is not None
            c.kill(c.manager)
            await c.start_manager(port)
        await wait_for(
            in_state(c, "conv", "done", "rolled_back"), "the migration to end", timeout=30, watchdog=dog
        )
        release(gate)  # it ends only now that it has been moved (or kept)
        await wait_for(lambda: finished(c, "conv"), "conv to finish", timeout=40, watchdog=dog)
        assert before is not None and before.state.value == journaled
        m = await migration_of(c, "conv")
        assert m is not None and m.id == before.id  # resumed, not decided anew
        rs = await assert_finished_once(c, dog, trained_at_least(c, "conv", STEPS))
        assert sum(run.ending == "checkpointed" for run in rs) == 1
        # It ended where the migration says: on the target if done, back on the source if not.
        assert dog.workers[-1] == (m.target if m.state.value == "done" else m.source)
        assert "steady" in {ci.id for ci in await c.containers() if ci.alive}


# -- 2. an agent crashes ------------------------------------------------------------------------
async def test_idle_agent_killed_its_job_keeps_running_and_is_readopted_on_restart(
    tmp_path: Path,
) -> None:
    steps = 400
    gate = gate_of(tmp_path, "solo")  # it runs until its agent is back and has re-adopted it
    async with embedded(tmp_path) as c, Watchdog(c, "solo") as dog:
        await c.submit(spec("solo", steps, "linear", until_released=gate), W1)

        async def seen_on_w1() -> bool:
            st = await status(c)
            return st is not None and any(
                ci.id == "solo" and ci.worker == W1 and ci.phase == "running" for ci in st.containers
            )

        await wait_for(seen_on_w1, "the manager to see solo on w1", timeout=20)
        # Its process may be listed before its interpreter wrote anything (a loaded machine).
        await wait_for(
            lambda: bool(runs(c, "solo")) and bool(runs(c, "solo")[-1].trained), "solo to train", timeout=30
        )
        c.kill(c.agents[W1])
        # The job is detached from its agent: it keeps training while the agent is down.
        trained = len(runs(c, "solo")[-1].trained)
        await wait_for(
            lambda: len(runs(c, "solo")[-1].trained) >= trained + 20, "solo to keep training", timeout=20
        )

        async def w1_unreachable() -> bool:
            return await worker_reachable(c, W1) is False

        await wait_for(w1_unreachable, "the manager to mark w1 unreachable", timeout=20, watchdog=dog)
        assert job_processes(c, "solo"), "the job died with its agent"
        agent = await restart_agent(c, W1)

        async def readopted() -> bool:
            h = await agent_health(agent)
            return h is not None and h["containers"] == 1 and await worker_reachable(c, W1) is True

        await wait_for(readopted, "the restarted agent to re-adopt solo", timeout=20, watchdog=dog)
        await wait_for(seen_on_w1, "the manager to see solo on w1 again", timeout=20, watchdog=dog)
        release(gate)
        await wait_for(lambda: finished(c, "solo"), "solo to finish", timeout=40, watchdog=dog)
        rs = await assert_finished_once(c, dog, trained_at_least(c, "solo", steps))
        assert len(rs) == 1, "the job was restarted although it never stopped"
        assert dog.workers == ["w1"]


async def kill_source_agent_mid_save(c: EmbeddedCluster, gate: Path, *, stubborn: bool) -> None:
    """Submit the converging pair (``conv`` held until ``gate``), kill -9 w0's agent while it
    saves ``conv``, and wait until the manager has given w0 up. A cooperative ``conv``
    finishes its checkpoint and exits meanwhile; a stubborn one (deaf to SIGTERM) keeps
    running on w0."""
    await submit_converging_pair(c, gate, save_seconds=2.0, ignore_sigterm=stubborn)
    if stubborn:  # it never announces the save: ask the agent

        async def saving() -> bool:
            return await agent_metric(c.agents[W0], SAVES, default=0) >= 1

        await wait_for(saving, "w0 to start saving conv", timeout=45)
    else:
        await wait_for(lambda: has_event(c, "conv", "saving"), "conv to start saving", timeout=45)
    c.kill(c.agents[W0])

    async def w0_unreachable() -> bool:
        return await worker_reachable(c, W0) is False

    await wait_for(w0_unreachable, "the manager to mark w0 unreachable", timeout=20)


async def refused_on_w1(c: EmbeddedCluster) -> bool:
    return await agent_metric(c.agents[W1], "specon_agent_command_failures_total") >= 1


@pytest.mark.parametrize("job", ["cooperative", "stubborn"])
async def test_source_agent_killed_during_a_save_the_migration_ends_and_nothing_is_lost(
    tmp_path: Path, job: str
) -> None:
    """``stubborn``: the job still runs on the source when its agent dies mid-save (the
    grace period is long), so a restart elsewhere must be refused until the source is back
    and the job is found still running there."""
    stubborn = job == "stubborn"
    gate = gate_of(tmp_path, "conv")
    grace = 30.0 if stubborn else 10.0
    async with (
        embedded(tmp_path, grace=grace) as c,
        Watchdog(c, "conv") as dog,
        Watchdog(c, "steady") as steady,
    ):
        await kill_source_agent_mid_save(c, gate, stubborn=stubborn)
        # The other job on w0 never noticed.
        assert "w0" in job_processes(c, "steady").values()
        if stubborn:
            # The manager tries to restart conv on w1, which refuses: it still runs on w0.
            await wait_for(lambda: refused_on_w1(c), "w1 to refuse a second copy", timeout=20, watchdog=dog)
            assert dog.workers == ["w0"]
        await restart_agent(c, W0)
        # The save died with its agent, but the manager cannot tell a restarted agent from one
        # still saving: a stubborn job listed running ends its migration once no save can be
        # under way (the grace, then a worker timeout for its result).
        await wait_for(
            in_state(c, "conv", "done", "rolled_back"),
            "the migration to end",
            timeout=30 + grace,
            watchdog=dog,
        )
        release(gate)  # it ends only now that the migration has
        await wait_for(lambda: finished(c, "conv"), "conv to finish", timeout=40, watchdog=dog)
        rs = await assert_finished_once(c, dog, trained_at_least(c, "conv", STEPS))
        if stubborn:  # never stopped, never moved
            m = await migration_of(c, "conv")
            assert len(rs) == 1 and dog.workers == ["w0"]
            assert m is not None and m.state.value == "rolled_back"
        assert len(runs(c, "steady")) == 1 and steady.workers == ["w0"]


async def test_a_refused_rollback_start_is_retried_at_a_bounded_pace(tmp_path: Path) -> None:
    # conv runs on w0 (refusing every start on w1) until the rate was measured.
    gate = gate_of(tmp_path, "conv")
    async with embedded(tmp_path, grace=30.0) as c:
        await kill_source_agent_mid_save(c, gate, stubborn=True)
        await wait_for(lambda: refused_on_w1(c), "w1 to refuse a second copy", timeout=20)
        t0 = time.monotonic()
        before = await agent_metric(c.agents[W1], STARTS)
        await asyncio.sleep(4 * HEARTBEAT)  # a rate needs a window of time
        tries = await agent_metric(c.agents[W1], STARTS) - before
        release(gate)
        # The window as it was, not as asked: on a busy machine the sleep and the reads last longer.
        window = time.monotonic() - t0
        # One retry per heartbeat would be plenty; a busy loop makes hundreds.
        assert tries <= 2 * window / HEARTBEAT, f"{tries:g} start attempts in {window:.1f}s"


# -- 3. a job that ignores SIGTERM -------------------------------------------------------------
async def test_job_ignoring_sigterm_is_killed_after_the_grace_period_and_resumes_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    gate = gate_of(tmp_path, "conv")
    async with embedded(tmp_path, grace=2.0) as c, Watchdog(c, "conv") as dog:
        await submit_converging_pair(c, gate, ignore_sigterm=True)
        await wait_for(
            in_state(c, "conv", "done", "rolled_back"), "the migration to end", timeout=50, watchdog=dog
        )
        release(gate)  # killed and moved: now it may end
        await wait_for(lambda: finished(c, "conv"), "conv to finish", timeout=40, watchdog=dog)
        m = await migration_of(c, "conv")
        assert m is not None and m.state.value == "done" and dog.workers == ["w0", "w1"]
        rs = await assert_finished_once(c, dog, trained_at_least(c, "conv", STEPS))
        assert len(rs) == 2 and rs[0].ending is None, "the first run should have been killed"
        # It resumed from the checkpoint the forced save reported: its newest complete one
        # (newer than the last one it recorded only if killed between writing and recording).
        assert rs[1].resumed_from == m.checkpoint_step
        assert m.checkpoint_step >= max(rs[0].checkpoints)
        redone = set(rs[0].trained) & set(rs[1].trained)
        assert redone == set(range(rs[1].resumed_from + 1, rs[0].trained[-1] + 1))
        exits, _ = JobPaths(c.volume, ContainerId("conv")).read_exits()
        assert exits[0].reason == "killed" and exits[0].signal == signal.SIGKILL


# -- 4. a corrupt checkpoint ---------------------------------------------------------------------
async def test_corrupt_saved_checkpoint_restores_from_the_previous_complete_one(tmp_path: Path) -> None:
    # A long worker_timeout: the target's agent is frozen for a moment without being given up.
    gate = gate_of(tmp_path, "conv")
    async with embedded(tmp_path, worker_timeout=10.0) as c, Watchdog(c, "conv") as dog:
        await submit_converging_pair(c, gate, save_seconds=2.0)
        await wait_for(lambda: has_event(c, "conv", "saving"), "conv to start saving", timeout=45)
        # Freeze the target's agent so the checkpoint can be corrupted between the save and
        # the restore (as bit rot or a torn copy on the volume would).
        with frozen(c.agents[W1]):
            await wait_for(in_state(c, "conv", "restoring"), "the restore to be ordered", timeout=20)
            m = await migration_of(c, "conv")
            assert m is not None and m.checkpoint is not None and m.checkpoint_step is not None
            saved = checkpoint.verify(Path(m.checkpoint))
            data = bytearray(saved.payload.read_bytes())
            data[0] ^= 0xFF  # same size, wrong checksum
            saved.payload.write_bytes(bytes(data))
        await wait_for(
            in_state(c, "conv", "done", "rolled_back"), "the migration to end", timeout=30, watchdog=dog
        )
        release(gate)  # restored (from which checkpoint is the point): now it may end
        await wait_for(lambda: finished(c, "conv"), "conv to finish", timeout=40, watchdog=dog)
        steps = trained_at_least(c, "conv", STEPS)
        rs = await assert_finished_once(c, dog, steps, corrupt=frozenset({m.checkpoint_step}))
        assert len(rs) == 2 and rs[0].ending == "checkpointed"
        # Not from the corrupt one: from the previous complete checkpoint, redoing the rest once.
        assert rs[1].resumed_from == sorted(rs[0].checkpoints)[-2] < m.checkpoint_step
        redone = set(rs[0].trained) & set(rs[1].trained)
        assert redone == set(range(rs[1].resumed_from + 1, m.checkpoint_step + 1))


async def test_a_restored_copy_that_dies_at_start_restarts_on_its_source_and_loses_nothing(
    tmp_path: Path,
) -> None:
    # The copy on the target exits before its first record (its checkpoint load crashes, as
    # on a host that cannot run it). Its start fails instead of the move counting done with
    # the job running nowhere, and the job resumes on its source from the saved checkpoint.
    gate, crash = gate_of(tmp_path, "conv"), tmp_path / "crash-once"
    crash.touch()
    async with embedded(tmp_path) as c, Watchdog(c, "conv") as dog:
        await submit_converging_pair(c, gate, crash_on_restore=crash)
        await wait_for(in_state(c, "conv", "rolled_back"), "the move to roll back", timeout=60, watchdog=dog)
        assert not crash.exists(), "the target's copy loaded the checkpoint and crashed"
        m = await migration_of(c, "conv")
        assert m is not None and m.checkpoint_step is not None
        assert m.error is not None and "ended before its first progress record (exit code 1)" in m.error
        release(gate)
        await wait_for(lambda: finished(c, "conv"), "conv to finish", timeout=40, watchdog=dog)
        rs = await assert_finished_once(c, dog, trained_at_least(c, "conv", STEPS))
        # The crashed copy logged nothing: the source's run resumes from the saved checkpoint.
        assert len(rs) == 2 and rs[0].ending == "checkpointed"
        assert rs[1].resumed_from == m.checkpoint_step == rs[0].checkpoints[-1]


# -- 5. the manager is away for a while ---------------------------------------------------------
async def test_agents_ride_out_a_manager_outage_and_their_pending_request_is_answered(
    tmp_path: Path,
) -> None:
    steps = 700
    gate = gate_of(tmp_path, "conv")  # it runs until the restarted manager has answered it
    async with embedded(tmp_path) as c, Watchdog(c, "conv") as dog:
        port = manager_port(c)
        agents = dict(c.agents)
        await submit_converging_pair(c, gate, steps=steps)
        assert c.manager is not None
        # In a thread: the manager may take a while to stop, and the watchdog keeps sampling.
        stopped = asyncio.create_task(asyncio.to_thread(c.kill, c.manager, signal.SIGTERM))

        async def disconnected() -> bool:
            hs = [await agent_health(d) for d in agents.values()]
            return all(h is not None and h["manager_connected"] is False for h in hs)

        await wait_for(disconnected, "the agents to lose the manager", timeout=20, watchdog=dog)
        # Several heartbeat intervals without a manager, during which conv converges: the
        # agents back off, keep classifying, stay up, and hold conv's request.
        w0 = agents[W0]
        ticks = await agent_metric(w0, "specon_agent_ticks_total")
        failures = await agent_metric(w0, "specon_agent_manager_failures_total")

        async def rode_it_out() -> bool:
            return (
                pending_request(c, W0, "conv")
                and await agent_metric(w0, "specon_agent_ticks_total") >= ticks + 4
                and await agent_metric(w0, "specon_agent_manager_failures_total") >= failures + 4
            )

        await wait_for(rode_it_out, "a pending request, more ticks, more failures", timeout=40, watchdog=dog)
        await stopped
        # (A long poll the stopping manager still answered may have flipped the link up.)
        await wait_for(disconnected, "the agents to see the manager gone", timeout=10, watchdog=dog)
        for d in agents.values():
            assert d.proc.poll() is None, f"{d.name} died without its manager"
            h = await agent_health(d)
            assert h is not None and h["ok"]
        assert pending_request(c, W0, "conv") and dog.workers == ["w0"]

        await c.start_manager(port)

        async def reconnected() -> bool:
            hs = [await agent_health(d) for d in agents.values()]
            return all(h is not None and h["manager_connected"] is True for h in hs)

        await wait_for(reconnected, "the agents to reconnect", timeout=20, watchdog=dog)
        # The request made while the manager was away is answered: conv is marked migrated
        # (moved, or told to stay) and its agent stops asking.
        await wait_for(lambda: marked_migrated(c, "conv"), "an answer to conv's request", timeout=20)
        if await migration_of(c, "conv") is not None:  # told to move (not to stay): moved first
            moved = in_state(c, "conv", "done", "rolled_back")
            await wait_for(moved, "conv's migration to end", timeout=30, watchdog=dog)
        release(gate)
        await wait_for(lambda: finished(c, "conv"), "conv to finish", timeout=40, watchdog=dog)
        await assert_finished_once(c, dog, trained_at_least(c, "conv", steps))
        m = await migration_of(c, "conv")
        assert dog.workers == (["w0"] if m is None else ["w0", "w1"])
        assert m is None or m.state.value == "done"
        assert not pending_request(c, WorkerId(dog.workers[-1]), "conv")


async def test_a_restarted_manager_decides_a_pending_request_with_every_worker_in_view(
    tmp_path: Path,
) -> None:
    # conv runs (its request pending) until the restarted manager has answered it.
    gate = gate_of(tmp_path, "conv")
    async with embedded(tmp_path) as c, Watchdog(c, "conv"):
        port = manager_port(c)
        await submit_converging_pair(c, gate, steps=700)
        assert c.manager is not None
        c.kill(c.manager)
        await wait_for(lambda: pending_request(c, W0, "conv"), "conv's reallocation request", timeout=40)
        # w1's first heartbeat to the new manager comes a moment after w0's, well within
        # worker_timeout: w1 is alive and idle, so conv belongs there.
        with frozen(c.agents[W1]):
            await c.start_manager(port)

            async def heard_from_w0() -> bool:
                return await worker_reachable(c, W0) is True

            await wait_for(heard_from_w0, "the manager to hear from w0", timeout=10)
        await wait_for(lambda: marked_migrated(c, "conv"), "an answer to conv's request", timeout=20)
        m = await migration_of(c, "conv")
        release(gate)  # answered: it may end (nothing here waits for that)
        assert m is not None and m.target == W1, "conv was told to stay on the busier worker"


async def test_an_open_long_poll_does_not_hold_up_the_managers_shutdown(tmp_path: Path) -> None:
    async with embedded(tmp_path) as c:
        manager = c.manager
        assert manager is not None
        poll = protocol.Poll(worker=WorkerId("w0"), sent_at=time.time(), wait=60.0)

        async def park() -> int:
            async with (
                aiohttp.ClientSession() as s,
                s.post(
                    manager.url + protocol.POLL_PATH,
                    data=protocol.encode(poll),
                    headers={protocol.AUTH_HEADER: f"Bearer {c.agent_tokens[WorkerId('w0')]}"},
                ) as r,
            ):
                return r.status

        held = asyncio.create_task(park())
        await asyncio.sleep(1.0)  # nothing to observe: the poll is parked inside the manager
        assert not held.done()
        manager.proc.send_signal(signal.SIGTERM)
        try:
            await wait_for(lambda: manager.proc.poll() is not None, "the manager to exit", timeout=10)
        finally:
            if manager.proc.poll() is None:
                manager.proc.kill()  # keep the teardown short when this fails
            held.cancel()
            with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError, OSError):
                await held
