"""The agent's work without the network: watch, classify, report, execute commands, persist.

Everything runs on the in-memory runtime (``specon.testing.fake_runtime``): a ``FakeClock`` that moves
only when a test advances it, and a ``FakeVolume`` rooted in ``tmp_path`` so the real tailer
reads the progress records the fake jobs write. A job logs one record per fake second.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import itertools
import json
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from specon_agent.core import Agent

from specon.config import Policy
from specon.daemon.settings import AgentSettings
from specon.model import Category, ContainerId, Resources
from specon.policy import classifier as classifier_module
from specon.runtime import ContainerInfo, JobSpec
from specon.testing.fake_runtime import FakeClock, FakeRuntime, FakeVolume, JobScript
from specon.wire.protocol import Action, Command, CommandBatch, CommandResult, ContainerReport
from tests.unit.manager_fakes import policy as make_policy

PC, WC, CC = Category.PROGRESSING, Category.WATCHING, Category.CONVERGED
TICK = 10.0  # fake seconds between ticks: ten samples per tick

# These tests step Algorithm 1 as printed (PC -> WC -> CC per slowing tick): the specon classifier.
SPECON: dict[str, object] = {"classifier": "specon"}


def converging(step: int) -> float:
    """Each tick's change is a tenth of the previous one: PC, PC, PC, WC, CC, then requests."""
    return float(1.0 + 0.1 ** (step / 10))


def steady(step: int) -> float:
    """A job that keeps progressing: G stays about 0.05, well above alpha (0.01)."""
    return 200.0 - step


def spec(job: str, **kw: Any) -> JobSpec:
    return JobSpec(id=ContainerId(job), command=("train",), requests=Resources(cpu=1.0), **kw)


@dataclasses.dataclass
class World:
    clock: FakeClock
    volume: FakeVolume
    w0: FakeRuntime
    w1: FakeRuntime
    tmp: Path
    agents: list[Agent] = dataclasses.field(default_factory=list)

    async def run(self, job: str, loss: Callable[[int], float] = steady, **kw: Any) -> None:
        """Start ``job`` on w0 with a scripted loss curve."""
        self.volume.script(job, JobScript(loss=loss))
        await self.w0.start(spec(job, **kw))

    def agent(self, runtime: FakeRuntime | None = None, *, pol: Policy | None = None, **kw: Any) -> Agent:
        agent = Agent(
            runtime=runtime or self.w0, policy=pol or make_policy(monitor=SPECON), address="w0:7701", **kw
        )
        self.agents.append(agent)
        return agent

    def close(self) -> None:
        for agent in self.agents:
            close_tailers(agent)


def close_tailers(agent: Agent) -> None:
    """The agent holds its progress logs open for as long as it runs; a test ends sooner."""
    for w in agent.watched.values():
        w.tailer.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    volume = FakeVolume(FakeClock(1000.0), root=tmp_path / "volume")
    w = World(volume.clock, volume, FakeRuntime("w0", volume), FakeRuntime("w1", volume), tmp_path)
    yield w
    w.close()


async def tick(agent: Agent, clock: FakeClock, n: int = 1) -> list[list[ContainerId]]:
    """``n`` monitor intervals as the daemon runs them: time passes, refresh, tick."""
    raised = []
    for _ in range(n):
        await clock.advance(TICK)
        await agent.refresh()
        raised.append(agent.tick(clock.now()))
    return raised


def command(cid: str, action: Action, container: str, **kw: Any) -> Command:
    return Command(id=cid, action=action, container=ContainerId(container), deadline=1e12, **kw)


def batch(*commands: Command, ack: int | None = None) -> CommandBatch:
    return CommandBatch(manager_time=0.0, policy_generation=1, commands=commands, ack=ack)


async def settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


async def finish(clock: FakeClock, task: asyncio.Task[CommandResult]) -> CommandResult:
    """Let a command run, moving fake time only while it waits on the clock."""
    for _ in range(500):
        await settle()
        if task.done():
            break
        await clock.advance(1.0)
    return await task


async def execute(agent: Agent, clock: FakeClock, cmd: Command) -> CommandResult:
    [task] = agent.accept(batch(cmd))
    return await finish(clock, task)


def reports(agent: Agent, clock: FakeClock) -> dict[str, ContainerReport]:
    return {r.id: r for r in agent.heartbeat(clock.now()).containers}


def categories(agent: Agent) -> dict[str, Category]:
    return {cid: w.state.display for cid, w in agent.watched.items()}


# --- refresh -------------------------------------------------------------------------------


async def test_refresh_adopts_the_running_containers(world: World) -> None:
    await world.run("a")
    await world.run("b")
    agent = world.agent()

    await agent.refresh()

    assert categories(agent) == {"a": PC, "b": PC}
    assert {cid: r.phase for cid, r in reports(agent, world.clock).items()} == {
        "a": "running",
        "b": "running",
    }


async def test_refresh_reports_ended_containers_with_their_phase(world: World) -> None:
    for job in ("done", "crashed", "stopped", "alive"):
        await world.run(job, steps=5 if job == "done" else None)
    agent = world.agent()
    await agent.refresh()

    await world.clock.advance(6.0)  # "done" finishes its 5 steps
    world.w0.crash("crashed")
    await world.w0.stop(ContainerId("stopped"), grace=1.0)
    await agent.refresh()

    assert set(agent.watched) == {"alive"}
    phases = {cid: r.phase for cid, r in reports(agent, world.clock).items()}
    assert phases == {"done": "finished", "crashed": "failed", "stopped": "stopped", "alive": "running"}
    # Still reported on the next refresh: the manager must learn how each ended.
    await agent.refresh()
    assert {r.id for r in agent.heartbeat(world.clock.now()).containers} == set(phases)


@pytest.mark.slow
async def test_refresh_closes_the_progress_log_of_an_ended_container(world: World) -> None:
    await world.run("a")
    agent = world.agent()
    await agent.refresh()
    world.w0.crash("a")
    gc.collect()  # what earlier tests in this process left unclosed is theirs, not the agent's

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        await agent.refresh()
        gc.collect()

    assert agent.ended and [w.message for w in caught if w.category is ResourceWarning] == []


async def test_refresh_drops_forgotten_and_departed_containers(world: World) -> None:
    for job in ("ended", "moved", "kept"):
        await world.run(job)
    agent = world.agent()
    await agent.refresh()
    world.w0.crash("ended")
    await agent.refresh()

    await world.w0.forget(ContainerId("ended"))
    await world.w0.save(ContainerId("moved"), grace=1.0)  # saved away behind the agent's back
    await agent.refresh()

    assert set(agent.watched) == {"kept"} and not agent.ended
    assert set(reports(agent, world.clock)) == {"kept"}


# --- tick: Algorithm 1 ---------------------------------------------------------------------


async def test_a_converging_job_steps_pc_wc_cc_and_requests_beside_an_active_job(world: World) -> None:
    await world.run("conv", loss=converging)
    await world.run("busy")
    agent = world.agent()
    await agent.refresh()

    seen, raised = [], []
    for _ in range(6):
        raised += await tick(agent, world.clock)
        seen.append(categories(agent)["conv"])

    assert seen == [PC, PC, PC, WC, CC, CC]
    assert raised == [[], [], [], [], [], ["conv"]]
    conv = agent.watched[ContainerId("conv")].state
    assert conv.pending_request and conv.t_cc == 1000.0 + 5 * TICK  # stamped by the WC -> CC tick
    assert categories(agent)["busy"] is PC
    # Raised once; afterwards it stays pending (the heartbeat repeats it) without re-raising.
    assert await tick(agent, world.clock, 2) == [[], []]
    assert agent.watched[ContainerId("conv")].state.pending_request


async def test_the_classifier_is_told_the_horizon_of_each_job_that_declared_its_steps(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[dict[ContainerId, float] | None] = []
    real = classifier_module.tick_worker

    def spy(*args: Any, horizons: Any = None, **kw: Any) -> Any:
        seen.append(None if horizons is None else dict(horizons))
        return real(*args, horizons=horizons, **kw)

    monkeypatch.setattr(classifier_module, "tick_worker", spy)
    await world.run("declared", steps=1000)
    await world.run("open")
    agent = world.agent(pol=make_policy())
    await agent.refresh()
    await tick(agent, world.clock, 3)
    step = agent.watched[ContainerId("declared")].step
    assert step is not None and 0 < step < 1000
    # Only the job that declared its steps has one: total / the last step it logged.
    assert seen[-1] == {ContainerId("declared"): pytest.approx(1000 / step)}


@pytest.mark.parametrize(
    ("min_active", "others", "requests"),
    [(1, 0, False), (1, 1, True), (2, 1, False), (2, 2, True)],
    ids=["alone", "one-other", "paper-one-other", "paper-two-others"],
)
async def test_a_request_needs_request_min_active_other_jobs_on_the_worker(
    world: World, min_active: int, others: int, requests: bool
) -> None:
    await world.run("conv", loss=converging)
    for i in range(others):
        await world.run(f"busy{i}")
    agent = world.agent(pol=make_policy(monitor={**SPECON, "request_min_active": min_active}))
    await agent.refresh()

    raised = await tick(agent, world.clock, 8)

    assert categories(agent)["conv"] is CC
    assert (["conv"] in raised) is requests
    assert agent.watched[ContainerId("conv")].state.pending_request is requests


# --- heartbeat -----------------------------------------------------------------------------


async def test_the_heartbeat_reports_each_containers_classification(world: World) -> None:
    await world.run("conv", loss=converging, steps=1000, model="vae")
    await world.run("busy")
    agent = world.agent()
    await agent.refresh()
    await tick(agent, world.clock, 6)
    await agent.sample_usage()

    hb = agent.heartbeat(world.clock.now())

    assert (hb.worker, hb.address, hb.sent_at) == ("w0", "w0:7701", world.clock.now())
    assert hb.capacity == world.w0.capacity and 0.0 <= hb.usage <= 1.0
    conv = {str(r.id): r for r in hb.containers}["conv"]
    assert conv.category is CC and conv.phase == "running"
    assert conv.t_cc == 1000.0 + 5 * TICK and conv.pending_request and not conv.migrated
    assert conv.step == 60  # six ticks of ten steps
    assert conv.requests == Resources(cpu=1.0)
    assert conv.job == {"model": "vae", "steps": "1000"}
    assert conv.last_g is not None and 0.0 < conv.last_g < 0.01


async def test_heartbeat_seq_increases_strictly_also_across_a_restart(world: World) -> None:
    agent = world.agent()
    seqs = [agent.heartbeat(world.clock.now()).seq for _ in range(200)]
    restarted = world.agent()

    assert all(a < b for a, b in itertools.pairwise(seqs))
    assert restarted.heartbeat(world.clock.now()).seq > seqs[-1]


async def test_results_ride_on_heartbeats_until_a_batch_acknowledges_them(world: World) -> None:
    await world.run("a")
    agent = world.agent()
    await agent.refresh()
    done = await execute(agent, world.clock, command("mark-a", Action.MARK_MIGRATED, "a"))
    assert done.ok

    first = agent.heartbeat(world.clock.now())
    agent.acknowledge(batch())  # a reply to a request acknowledges nothing
    agent.acknowledge(batch(ack=first.seq - 1))  # an older heartbeat's reply neither
    second = agent.heartbeat(world.clock.now())
    agent.acknowledge(batch(ack=second.seq))
    third = agent.heartbeat(world.clock.now())

    assert first.results == second.results == (done,)
    assert third.results == ()


async def test_a_result_newer_than_the_acknowledged_heartbeat_is_kept(world: World) -> None:
    await world.run("a")
    agent = world.agent()
    await agent.refresh()
    before = agent.heartbeat(world.clock.now())
    done = await execute(agent, world.clock, command("mark-a", Action.MARK_MIGRATED, "a"))

    agent.accept(batch(ack=before.seq))  # answers a heartbeat that could not carry it

    assert agent.heartbeat(world.clock.now()).results == (done,)


# --- commands ------------------------------------------------------------------------------


async def test_save_checkpoints_the_job_and_stops_watching_it(world: World) -> None:
    await world.run("a", model="vae")
    agent = world.agent()
    await agent.refresh()
    await tick(agent, world.clock)
    saved_at = world.clock.now()

    res = await execute(agent, world.clock, command("save-a", Action.SAVE, "a"))

    assert world.w0.calls.count(("save", ContainerId("a"))) == 1
    assert res.ok and res.error is None
    assert res.checkpoint_step == 10 and res.checkpoint is not None and "a" in res.checkpoint
    assert res.spec == {}, "a save result carries no recipe: a start reads its own record"
    assert res.detail["began_at"] == saved_at and res.finished_at == saved_at
    assert "a" not in agent.watched
    assert "a" not in reports(agent, world.clock)
    await tick(agent, world.clock)
    assert "a" not in agent.watched and not agent.leaving


async def test_a_save_of_a_job_not_watched_yet_reports_the_step_it_trained_to(world: World) -> None:
    await world.run("a")
    agent = world.agent()
    await world.clock.advance(TICK)  # the job logs records; the agent has not looked yet
    assert "a" not in agent.watched

    res = await execute(agent, world.clock, command("save-a", Action.SAVE, "a"))

    assert res.ok and isinstance(res.detail["last_step"], int), "the move's lost steps need it"
    assert res.detail["last_step"] >= (res.checkpoint_step or 0)


async def test_a_refresh_that_raced_the_save_does_not_readopt_the_container(world: World) -> None:
    await world.run("a")
    agent = world.agent()
    await agent.refresh()
    listed_before_the_save = await world.w0.list_containers()

    assert (await execute(agent, world.clock, command("save-a", Action.SAVE, "a"))).ok

    async def stale_listing() -> list[ContainerInfo]:
        return listed_before_the_save

    real_listing = world.w0.list_containers
    world.w0.list_containers = stale_listing  # type: ignore[method-assign]
    await agent.refresh()
    world.w0.list_containers = real_listing  # type: ignore[method-assign]

    assert "a" not in agent.watched and "a" not in agent.ended
    assert "a" not in reports(agent, world.clock)
    await agent.refresh()
    assert not agent.leaving


async def test_a_refresh_during_a_slow_save_leaves_the_container_alone(world: World) -> None:
    world.w0.save_seconds = 5.0
    await world.run("a")
    agent = world.agent()
    await agent.refresh()
    [task] = agent.accept(batch(command("save-a", Action.SAVE, "a")))
    await settle()

    await agent.refresh()  # the job still runs while it writes its checkpoint
    res = await finish(world.clock, task)
    await agent.refresh()

    assert res.ok and "a" not in agent.watched and "a" not in agent.ended


async def test_a_repeated_command_id_is_answered_from_memory_not_rerun(world: World) -> None:
    world.w0.save_seconds = 5.0
    await world.run("a")
    agent = world.agent()
    await agent.refresh()
    save = command("save-a", Action.SAVE, "a")

    [task] = agent.accept(batch(save))
    assert agent.accept(batch(save)) == []  # still running: not started twice
    res = await finish(world.clock, task)
    agent.acknowledge(batch(ack=agent.heartbeat(world.clock.now()).seq))
    assert agent.heartbeat(world.clock.now()).results == ()

    assert agent.accept(batch(save)) == []  # done: the manager lost the result; resend it

    assert agent.heartbeat(world.clock.now()).results == (res,)
    assert world.w0.calls.count(("save", ContainerId("a"))) == 1
    assert agent.counters.commands == {"save": 1}


async def test_a_failed_save_reports_the_error_and_keeps_watching_the_job(world: World) -> None:
    await world.run("a")
    agent = world.agent()
    await agent.refresh()
    world.w0.fail_next_save("error")

    res = await execute(agent, world.clock, command("save-a", Action.SAVE, "a"))

    assert not res.ok and res.error is not None and "no checkpoint" in res.error
    assert agent.counters.command_failures == 1
    await tick(agent, world.clock, 2)
    assert "a" in agent.watched and not agent.leaving
    assert reports(agent, world.clock)["a"].phase == "running"
    assert agent.watched[ContainerId("a")].step == 20  # still classified from its log


async def test_start_restores_from_the_checkpoint_and_watches_the_job(world: World) -> None:
    await world.run("a")
    source = world.agent()
    await source.refresh()
    await world.clock.advance(7.0)
    saved = await execute(source, world.clock, command("save-a", Action.SAVE, "a"))
    target = world.agent(world.w1)
    starts: list[tuple[str, Path | None]] = []
    real_start = world.w1.start

    async def spy(job: JobSpec, *, checkpoint: Path | None = None, supersede: bool = False) -> ContainerInfo:
        starts.append((job.id, checkpoint))
        return await real_start(job, checkpoint=checkpoint, supersede=supersede)

    world.w1.start = spy  # type: ignore[method-assign,assignment]

    res = await execute(
        target,
        world.clock,
        command("start-a", Action.START, "a", checkpoint=saved.checkpoint),
    )

    assert res.ok and res.finished_at is not None
    assert starts == [("a", Path(str(saved.checkpoint)))]
    resumed = [r for r in world.volume.records("a") if r.get("event") == "resumed"]
    assert resumed[-1]["worker"] == "w1" and resumed[-1]["step"] == saved.checkpoint_step == 7
    assert "a" in target.watched
    assert reports(target, world.clock)["a"].phase == "running"
    await tick(target, world.clock, 3)
    assert target.watched[ContainerId("a")].step is not None


async def test_a_start_reports_when_the_job_wrote_its_first_record(world: World) -> None:
    world.volume.script("a", JobScript(steps_per_second=2.0))
    agent = world.agent()
    began = world.clock.now()

    world.volume.submit(spec("a"))
    res = await execute(agent, world.clock, command("start-a", Action.START, "a"))

    assert res.ok and res.finished_at == began + 0.5  # the first step's record, not a timeout


async def test_a_copy_that_dies_before_its_first_record_fails_its_start(world: World) -> None:
    # Its start returned (the copy was launched), but it never trained: reported done, the
    # migration would end with the job running nowhere.
    world.volume.script("a", JobScript(steps_per_second=2.0))
    world.volume.submit(spec("a"))
    agent = world.agent(world.w1)
    world.w1.die_at_next_start(exit_code=137)

    res = await execute(agent, world.clock, command("start-a", Action.START, "a"))

    assert not res.ok and res.detail == {"died": True}
    assert res.error is not None and "ended before its first progress record (exit code 137)" in res.error
    assert "a" not in agent.watched and "a" not in reports(agent, world.clock)
    assert ("forget", "a") in world.w1.calls  # its record blocks no start elsewhere
    restarted = await execute(world.agent(world.w0), world.clock, command("rollback-a", Action.START, "a"))
    assert restarted.ok


async def test_a_copy_that_completes_before_its_first_record_started_fine(world: World) -> None:
    # Resumed from a checkpoint at its last step, a job ends at once without a record of
    # the new run: it completed, which is no failure to restart.
    world.volume.script("a", JobScript(steps_per_second=2.0))
    world.volume.submit(spec("a", steps=4))
    world.volume.jobs[ContainerId("a")].checkpoints.append(4)
    agent = world.agent(world.w1)

    res = await execute(agent, world.clock, command("start-a", Action.START, "a"))

    assert res.ok
    assert ("forget", "a") not in world.w1.calls
    await agent.refresh()
    assert reports(agent, world.clock)["a"].phase == "finished"


async def test_a_migrated_start_arrives_frozen_in_cc(world: World) -> None:
    world.volume.script("a", JobScript(loss=steady))  # progressing: would be PC if classified
    agent = world.agent(world.w1)
    world.volume.submit(spec("a"))

    res = await execute(agent, world.clock, command("start-a", Action.START, "a", migrated=True))
    raised = await tick(agent, world.clock, 5)

    assert res.ok
    state = agent.watched[ContainerId("a")].state
    assert state.category is CC and state.migrated and not state.pending_request
    assert raised == [[]] * 5
    report = reports(agent, world.clock)["a"]
    assert report.migrated and report.category is CC


async def test_start_of_a_container_already_running_here_succeeds(world: World) -> None:
    await world.run("a")
    agent = world.agent()
    await agent.refresh()

    res = await execute(agent, world.clock, command("start-a", Action.START, "a"))

    assert res.ok
    assert [r["worker"] for r in world.volume.records("a") if r.get("event") == "resumed"] == ["w0"]


async def test_a_migrated_start_of_a_container_already_running_here_freezes_it(world: World) -> None:
    # A start repeated under a new id (say, after an agent restart lost the first one's
    # result) must leave the container as the first one did: frozen in CC.
    await world.run("conv", loss=converging)
    await world.run("busy")
    agent = world.agent()
    await agent.refresh()
    await tick(agent, world.clock, 6)

    start = command("rollback", Action.START, "conv", migrated=True)
    res = await execute(agent, world.clock, start)
    raised = await tick(agent, world.clock, 3)

    assert res.ok
    state = agent.watched[ContainerId("conv")].state
    assert state.migrated and not state.pending_request and raised == [[]] * 3


async def test_start_of_a_container_running_elsewhere_fails(world: World) -> None:
    await world.run("a")
    agent = world.agent(world.w1)

    res = await execute(agent, world.clock, command("start-a", Action.START, "a"))

    assert not res.ok and res.error is not None and "already running on worker w0" in res.error
    assert res.detail == {"running_elsewhere": True}  # no restart: the manager counts none
    assert "a" not in agent.watched


def test_a_heartbeat_without_a_fresh_listing_sends_only_results_sent_before(world: World) -> None:
    agent = world.agent()
    old = CommandResult(command="old", ok=True)
    new = CommandResult(command="new", ok=True)
    agent.unacked = {"old": (None, old)}
    assert agent.heartbeat(agent.runtime.now()).results == (old,)  # now sent: it goes again until acked
    agent.unacked["new"] = (None, new)
    # The runtime still lists: the new result waits for a listing at least as new as it.
    assert agent.heartbeat(agent.runtime.now(), new_results=False).results == (old,)
    assert agent.unacked["new"] == (None, new)
    assert agent.heartbeat(agent.runtime.now()).results == (old, new)


async def test_mark_migrated_freezes_the_container_and_answers_its_request(world: World) -> None:
    await world.run("conv", loss=converging)
    await world.run("busy")
    agent = world.agent()
    await agent.refresh()
    await tick(agent, world.clock, 6)
    assert agent.watched[ContainerId("conv")].state.pending_request

    res = await execute(agent, world.clock, command("mark-conv", Action.MARK_MIGRATED, "conv"))
    raised = await tick(agent, world.clock, 4)

    assert res.ok
    state = agent.watched[ContainerId("conv")].state
    assert state.migrated and state.category is CC and not state.pending_request
    assert raised == [[]] * 4
    report = reports(agent, world.clock)["conv"]
    assert report.migrated and not report.pending_request


@pytest.mark.parametrize(
    ("cmd", "says"),
    [
        (command("m", Action.MARK_MIGRATED, "ghost"), "ghost: not on w0"),
        (command("s", Action.SAVE, "ghost"), "ghost: not on worker w0"),
        (command("x", Action.STOP, "ghost"), "ghost: not on worker w0"),
        (command("t", Action.START, "ghost"), "ghost: no job spec on record"),
    ],
    ids=["mark", "save", "stop", "start-without-spec"],
)
async def test_a_command_for_an_unknown_container_fails_clearly(
    world: World, cmd: Command, says: str
) -> None:
    await world.run("a")
    agent = world.agent()
    await agent.refresh()

    res = await execute(agent, world.clock, cmd)

    assert not res.ok and res.error is not None and says in res.error
    assert set(agent.watched) == {"a"} and not agent.leaving
    assert agent.heartbeat(world.clock.now()).results == (res,)


# --- persistence ---------------------------------------------------------------------------


async def test_monitor_states_survive_an_agent_restart(world: World) -> None:
    state_file = world.tmp / "monitor.json"
    await world.run("conv", loss=converging)
    await world.run("busy")
    await world.run("frozen")
    agent = world.agent(state_file=state_file)
    await agent.refresh()
    await tick(agent, world.clock, 6)
    assert (await execute(agent, world.clock, command("mark", Action.MARK_MIGRATED, "frozen"))).ok

    restarted = world.agent(state_file=state_file)
    await restarted.refresh()

    got = {
        cid: (w.state.category, w.state.migrated, w.state.pending_request)
        for cid, w in restarted.watched.items()
    }
    assert got == {"conv": (CC, False, True), "busy": (PC, False, False), "frozen": (CC, True, False)}
    assert reports(restarted, world.clock)["conv"].pending_request
    # The restored states go on being classified from where they were.
    await tick(restarted, world.clock, 2)
    assert restarted.watched[ContainerId("conv")].state.category is CC


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"[1, 2]", b'{"a": "PC"}', b'{"a": {"category": "bogus"}}', b"\xff\xfe\x00"],
    ids=["bad-json", "list", "not-a-state", "bad-category", "not-utf8"],
)
async def test_a_corrupt_state_file_is_logged_and_the_agent_starts_fresh(
    world: World, content: bytes
) -> None:
    state_file = world.tmp / "monitor.json"
    state_file.write_bytes(content)
    await world.run("a")

    with structlog.testing.capture_logs() as logs:
        agent = world.agent(state_file=state_file)
    await agent.refresh()
    await tick(agent, world.clock)

    assert [e["event"] for e in logs] == ["specon.agent.state_unreadable"]
    assert logs[0]["path"] == str(state_file)
    assert categories(agent) == {"a": PC}
    assert set(json.loads(state_file.read_text())) == {"a"}  # rewritten, readable again


async def test_an_unwritable_state_file_does_not_stop_classification(world: World) -> None:
    await world.run("conv", loss=converging)
    await world.run("busy")
    agent = world.agent(state_file=world.tmp / "no-such-dir" / "monitor.json")
    await agent.refresh()

    raised = await tick(agent, world.clock, 6)

    assert raised[-1] == ["conv"]


async def test_a_successful_save_is_reported_ok_even_if_the_state_cannot_be_persisted(world: World) -> None:
    await world.run("a")
    agent = world.agent(state_file=world.tmp / "no-such-dir" / "monitor.json")
    await agent.refresh()

    res = await execute(agent, world.clock, command("save-a", Action.SAVE, "a"))

    # The job has stopped here and its checkpoint exists: reporting failure would make the
    # manager roll back a migration whose save worked.
    assert world.w0.calls == [("start", "a"), ("save", "a")]
    assert res.ok and res.checkpoint is not None


# --- unknown actions and placement facts ---------------------------------------------------


async def test_an_unknown_action_is_an_error_and_never_stops_the_container(world: World) -> None:
    # The decoder refuses unknown actions (test_protocol); a Command built in-process with one
    # (a newer manager's action, a bug) must still never fall through to a stop.
    await world.run("a")
    agent = world.agent()
    await agent.refresh()
    unknown = command("m1:reboot:w0:0", "reboot", "a")  # type: ignore[arg-type]
    calls = list(world.w0.calls)

    res = await execute(agent, world.clock, unknown)

    assert not res.ok and res.error == "a: unknown action 'reboot'; nothing done"
    assert world.w0.calls == calls, "the runtime was never asked to act"
    assert {i.id for i in await world.w0.list_containers() if i.alive} == {"a"}
    assert set(agent.watched) == {"a"} and not agent.leaving
    assert agent.heartbeat(world.clock.now()).results == (res,)


async def test_the_heartbeat_carries_node_taints_and_each_jobs_selector_and_tolerations(
    world: World,
) -> None:
    rt = FakeRuntime(
        "w2", world.volume, labels={"zone": "a"}, taints=("gpu=a100:NoSchedule", "dedicated:NoExecute")
    )
    world.volume.script("tol", JobScript(loss=steady))
    await rt.start(spec("tol", selector=(("zone", "a"),), tolerations=("gpu:NoSchedule", "*:NoExecute")))
    world.volume.script("plain", JobScript(loss=steady))
    await rt.start(spec("plain"))
    agent = world.agent(rt)
    await agent.refresh()

    hb = agent.heartbeat(world.clock.now())

    assert hb.taints == ("gpu=a100:NoSchedule", "dedicated:NoExecute")
    assert hb.labels["zone"] == "a"
    by_id = {str(r.id): r for r in hb.containers}
    assert by_id["tol"].selector == {"zone": "a"}
    assert by_id["tol"].tolerations == ("gpu:NoSchedule", "*:NoExecute")
    assert (by_id["plain"].selector, by_id["plain"].tolerations) == ({}, ())


async def test_the_state_of_a_container_gone_longer_than_the_retention_is_forgotten(world: World) -> None:
    """The state file stays bounded: a container saved away keeps its state here for
    ``state_retention`` seconds (a rollback brings it back), then it is forgotten."""
    state_file = world.tmp / "monitor.json"
    await world.run("a")
    await world.run("b")
    agent = world.agent(state_file=state_file, settings=AgentSettings(state_retention=300.0))
    await tick(agent, world.clock, 3)
    assert set(agent.saved_states) | set(agent.watched) >= {"a", "b"}
    await agent.execute(command("s1", Action.SAVE, "a"), remaining=60.0)  # a leaves w0
    await tick(agent, world.clock)
    assert "a" in agent.saved_states and "a" not in agent.watched
    await tick(agent, world.clock, int(250 / TICK))
    assert "a" in agent.saved_states, "kept within the retention"
    await tick(agent, world.clock, int(100 / TICK))
    assert "a" not in agent.saved_states and agent.counters.states_forgotten == 1
    assert "b" in agent.watched, "a container still here is never forgotten"
    assert "a" not in json.loads(state_file.read_text())


async def test_a_step_the_protocol_cannot_carry_never_gets_the_heartbeat_refused(world: World) -> None:
    """A log's step below 0 or past 2^63 is not reported (the manager would refuse every
    heartbeat of the worker); its loss still counts and later good steps are reported."""
    from specon.wire.checks import problems  # noqa: PLC0415

    await world.run("odd")
    agent = world.agent()
    await agent.refresh()
    await tick(agent, world.clock)
    log = world.volume.paths(ContainerId("odd")).progress
    good = agent.watched[ContainerId("odd")].step
    for bad in (-5, 2**70):
        with log.open("a") as f:
            f.write(json.dumps({"step": bad, "loss": 1.0}) + "\n")
        samples = agent.counters.samples
        await agent.refresh()
        agent.tick(world.clock.now())
        assert agent.counters.samples > samples  # the loss was read
        beat = agent.heartbeat(world.clock.now())
        assert problems(beat) == [], problems(beat)
        assert agent.watched[ContainerId("odd")].step == good
