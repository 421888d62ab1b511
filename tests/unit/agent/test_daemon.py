"""The agent daemon against a real manager app served on 127.0.0.1 (aiohttp's TestServer).

The agent runs on the fake runtime. Its ``FakeClock`` is moved along with the event loop's
clock by a small driver task, so the fake jobs progress while the daemon's loops run; the
manager's ticker is off, so it acts only on the messages it gets. Tests wait for
outcomes (``eventually``), never for fixed times.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest
import structlog
from aiohttp.test_utils import TestServer
from specon_agent.client import ManagerClient
from specon_agent.core import Agent
from specon_agent.daemon import AgentDaemon, backoff
from specon_manager.app import create_app
from specon_manager.journal import Journal
from specon_manager.shell import ManagerShell
from tenacity import RetryCallState

from specon.config import Policy
from specon.daemon.settings import AgentSettings
from specon.model import Category, ContainerId, Resources, WorkerId
from specon.policy.monitor import MonitorState
from specon.runtime import ContainerInfo, JobSpec, WorkerUsage
from specon.testing.fake_runtime import FakeClock, FakeRuntime, FakeVolume
from specon.wire import protocol
from specon.wire.protocol import Action, Command
from specon.wire.status import Status
from tests.unit.manager_fakes import policy as make_policy

TOKEN = "agent-daemon-test-token"
W0 = WorkerId("w0")
# Fast loops: the tests wait for outcomes, and fast loops make them arrive quickly.
FAST = {"monitor": {"interval": 0.05}, "messaging": {"heartbeat_interval": 0.05}}
FAST_SETTINGS = AgentSettings(poll_wait=0.2)


async def eventually(cond: Callable[[], bool], what: str, *, within: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not cond():
        assert loop.time() < deadline, f"timed out waiting for: {what}"
        await asyncio.sleep(0.01)


def spec(job: str) -> JobSpec:
    return JobSpec(id=ContainerId(job), command=("train",), requests=Resources(cpu=1.0), steps=100_000)


@pytest.fixture
async def clock() -> AsyncIterator[FakeClock]:
    """A fake clock that follows the event loop's: fake jobs progress while loops run."""
    fake = FakeClock(1000.0)

    async def follow() -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            await asyncio.sleep(0.01)
            now = loop.time()
            await fake.advance(now - last)
            last = now

    task = asyncio.create_task(follow())
    yield fake
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@dataclasses.dataclass
class Rig:
    tmp: Path
    volume: FakeVolume
    runtime: FakeRuntime
    pol: Policy
    servers: list[TestServer] = dataclasses.field(default_factory=list)
    daemons: list[AgentDaemon] = dataclasses.field(default_factory=list)
    journals: list[Journal] = dataclasses.field(default_factory=list)

    def coordinator(self) -> ManagerShell:
        """A manager (its shell); a second one reopens the first one's journal (a restart)."""
        self.journals.append(Journal(self.tmp / "journal.db"))
        return ManagerShell(policy=self.pol, journal=self.journals[-1])

    async def serve(self, coord: ManagerShell, port: int | None = None) -> TestServer:
        server = TestServer(create_app(coord, token=TOKEN, tick=False), host="127.0.0.1", port=port)
        await server.start_server()
        self.servers.append(server)
        return server

    def daemon(
        self,
        url: str,
        *,
        token: str = TOKEN,
        agent: Agent | None = None,
        settings: AgentSettings = FAST_SETTINGS,
    ) -> AgentDaemon:
        agent = agent or Agent(
            runtime=self.runtime, policy=self.pol, address="127.0.0.1:7701", settings=settings
        )
        d = AgentDaemon(agent, ManagerClient(url, token))
        self.daemons.append(d)
        return d


@pytest.fixture
async def rig(tmp_path: Path, clock: FakeClock) -> AsyncIterator[Rig]:
    volume = FakeVolume(clock, root=tmp_path / "volume")
    r = Rig(tmp_path, volume, FakeRuntime("w0", volume, capacity=Resources(cpu=4.0)), make_policy(**FAST))
    yield r
    for d in r.daemons:
        if not d._stopping.is_set():
            await d.stop(goodbye=False)
        for w in d.agent.watched.values():  # the agent holds its logs open while it runs
            w.tailer.close()
    for s in r.servers:
        await s.close()
    for j in r.journals:
        j.close()


def url_of(server: TestServer) -> str:
    return str(server.make_url("/"))


async def status(url: str) -> Status:
    async with aiohttp.ClientSession() as s, s.get(url.rstrip("/") + protocol.STATUS_PATH) as resp:
        return protocol.decode(await resp.read(), Status)


def alive(d: AgentDaemon) -> bool:
    return len(d._tasks) == 3 and not any(t.done() for t in d._tasks)


@pytest.fixture
def nobody() -> Iterator[str]:
    """The URL of a manager that is not there: its port stays bound (not listening) by this
    test, so a connection is refused and no other process can take the port meanwhile (a
    port found free and closed again may be bound by anyone the next moment)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


# --- heartbeats ----------------------------------------------------------------------------


async def test_heartbeats_reach_the_manager_which_lists_the_worker_and_its_containers(rig: Rig) -> None:
    for job in ("a", "b"):
        await rig.runtime.start(spec(job))
    coord = rig.coordinator()
    server = await rig.serve(coord)
    d = rig.daemon(url_of(server))

    d.start()
    await eventually(lambda: coord.core.state.heartbeats >= 2, "two heartbeats")

    st = await status(url_of(server))
    [worker] = st.workers
    assert (worker.id, worker.ready, worker.reachable) == (W0, True, True)
    assert worker.address == "127.0.0.1:7701" and worker.capacity == Resources(cpu=4.0)
    assert sorted(worker.containers) == ["a", "b"]
    assert {(c.id, c.worker, c.phase) for c in st.containers} == {("a", W0, "running"), ("b", W0, "running")}
    assert d.link.connected and d.link.heartbeats_sent >= 1 and d.link.last_ok is not None
    assert d.agent.counters.ticks >= 1 and alive(d)


async def test_a_runtime_slow_to_list_does_not_silence_the_heartbeats(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Docker engine answers a listing only once the container it is starting has started:
    # the heartbeats go on with the containers as last listed, and the worker stays reachable.
    await rig.runtime.start(spec("a"))
    coord = rig.coordinator()
    server = await rig.serve(coord)
    d = rig.daemon(url_of(server))
    d.start()
    await eventually(lambda: coord.core.state.heartbeats >= 2, "two heartbeats")
    released = asyncio.Event()
    listing = rig.runtime.list_containers

    async def slow() -> list[ContainerInfo]:
        await released.wait()
        return await listing()

    monkeypatch.setattr(rig.runtime, "list_containers", slow)
    await rig.runtime.start(spec("b"))
    before = coord.core.state.heartbeats
    await eventually(lambda: coord.core.state.heartbeats >= before + 5, "heartbeats while it lists")
    assert d.link.heartbeats_unlisted >= 1
    [worker] = (await status(url_of(server))).workers
    assert worker.reachable and sorted(worker.containers) == ["a"]  # as last listed
    released.set()

    async def both_listed() -> bool:
        return sorted((await status(url_of(server))).workers[0].containers) == ["a", "b"]

    for _ in range(500):
        if await both_listed():
            break
        await asyncio.sleep(0.02)
    assert await both_listed()
    assert alive(d)


async def test_a_runtime_stuck_listing_past_a_worker_timeout_lets_the_worker_fall_silent(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Heartbeats with a stale view are for a slow start, not for a runtime that hangs: past
    # worker_timeout the manager must see the worker silent (and restore its jobs once lost).
    coord = rig.coordinator()
    server = await rig.serve(coord)
    d = rig.daemon(url_of(server))  # its loops not started: each beat by hand
    assert await d._beat() and coord.core.state.heartbeats == 1
    hung = asyncio.Event()

    async def stuck() -> list[ContainerInfo]:
        await hung.wait()
        return []

    monkeypatch.setattr(rig.runtime, "list_containers", stuck)
    assert await d._beat(), "a listing under way holds no heartbeat back"
    assert coord.core.state.heartbeats == 2 and d.link.heartbeats_unlisted == 1
    d._listing_since -= rig.pol.messaging.worker_timeout  # the same listing, a worker timeout on
    assert not await d._beat()
    assert coord.core.state.heartbeats == 2 and d.link.heartbeats_unlisted == 1
    hung.set()
    assert await d._beat() and coord.core.state.heartbeats == 3


async def test_a_request_answered_by_the_manager_freezes_the_container(rig: Rig) -> None:
    """Pending request -> Algorithm 2 (one worker: stay) -> mark_migrated -> result acknowledged."""
    await rig.runtime.start(spec("a"))
    coord = rig.coordinator()
    server = await rig.serve(coord)
    agent = Agent(runtime=rig.runtime, policy=rig.pol, settings=FAST_SETTINGS)
    agent.saved_states[ContainerId("a")] = MonitorState(
        category=Category.CONVERGED, t_cc=1000.0, pending_request=True
    )
    d = rig.daemon(url_of(server), agent=agent)

    d.start()
    await eventually(
        lambda: "a" in agent.watched and agent.watched[ContainerId("a")].state.migrated,
        "the mark command",
    )
    await eventually(lambda: not agent.unacked and not coord.core.outbox.get(W0), "the result acknowledged")

    state = agent.watched[ContainerId("a")].state
    assert state.category is Category.CONVERGED and not state.pending_request
    assert coord.core.marks[ContainerId("a")].migrations == 1
    assert agent.counters.commands == {"mark_migrated": 1}
    await eventually(
        lambda: (
            {c.id: c.migrated for c in coord.core.state.container_status(coord.core.marks)} == {"a": True}
        ),
        "the manager sees it migrated",
    )


# --- the manager going away ----------------------------------------------------------------


def attempts(d: AgentDaemon) -> list[int]:
    """The attempt each manager loop's retrying is on (1: its last exchange went through)."""
    return [r.statistics.get("attempt_number", 1) for r in d.retrying.values()]


@pytest.mark.slow
async def test_the_daemon_backs_off_while_the_manager_is_away_and_reconnects(rig: Rig) -> None:
    await rig.runtime.start(spec("a"))
    server = await rig.serve(rig.coordinator())
    port, url = server.port, url_of(server)
    # The retry schedule shrunk to keep the test short.
    d = rig.daemon(url, settings=dataclasses.replace(FAST_SETTINGS, backoff_initial=0.02, backoff_max=0.2))
    d.start()
    await eventually(lambda: d.link.connected, "connected")

    with structlog.testing.capture_logs() as logs:
        await server.close()
        await eventually(lambda: not d.link.connected, "the link is down")
        ticks, failures = d.agent.counters.ticks, d.link.failures
        await eventually(lambda: max(attempts(d)) >= 5, "retries backing off")
        await eventually(lambda: d.agent.counters.ticks > ticks + 2, "classifying on")
        assert d.link.failures > failures and alive(d)

        coord = rig.coordinator()  # a restarted manager on the same address
        await rig.serve(coord, port=port)
        await eventually(lambda: d.link.connected and coord.core.state.heartbeats > 0, "reconnected")
        await eventually(lambda: attempts(d) == [1, 1], "every loop's backoff reset")

    events = [e["event"] for e in logs]
    # Logged once per outage (the link may flap while the server drains), not once per retry.
    assert (
        1
        <= events.count("specon.agent.manager_unreachable")
        <= events.count("specon.agent.manager_connected")
    )
    assert d.link.failures > events.count("specon.agent.manager_unreachable")
    assert "specon.agent.manager_connected" in events
    assert "specon.agent.task_crashed" not in events
    assert [w.id for w in (await status(url)).workers] == [W0] and alive(d)


async def test_a_manager_that_never_answers_does_not_stop_the_agent(rig: Rig, nobody: str) -> None:
    await rig.runtime.start(spec("a"))
    d = rig.daemon(nobody)

    d.start()
    await eventually(lambda: d.link.failures >= 3, "failed exchanges")
    await eventually(lambda: d.agent.counters.ticks >= 3, "classifying without a manager")

    assert not d.link.connected and d.link.last_ok is None and alive(d)


async def test_a_wrong_token_is_logged_counted_and_survived(rig: Rig) -> None:
    coord = rig.coordinator()
    server = await rig.serve(coord)
    d = rig.daemon(url_of(server), token="not-the-token")

    with structlog.testing.capture_logs() as logs:
        d.start()
        await eventually(lambda: d.link.rejected >= 3, "rejected messages")

    rejected = [e for e in logs if e["event"] == "specon.agent.message_rejected"]
    assert rejected and all(e["status"] == 401 for e in rejected)
    assert "bearer token" in rejected[0]["error"] and rejected[0]["log_level"] == "error"
    assert not d.link.connected and coord.core.state.heartbeats == 0
    assert "specon.agent.task_crashed" not in [e["event"] for e in logs] and alive(d)


# --- supervision and shutdown --------------------------------------------------------------


class FlakyRuntime(FakeRuntime):
    """``usage`` fails once: a bug in a backend must not kill the monitor loop."""

    failures = 1

    async def usage(self) -> WorkerUsage:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("injected usage failure")
        return await super().usage()


@pytest.mark.slow
async def test_a_crashing_loop_is_logged_and_restarted(rig: Rig, nobody: str) -> None:
    rig.runtime = FlakyRuntime("w0", rig.volume)
    d = rig.daemon(nobody)

    with structlog.testing.capture_logs() as logs:
        d.start()
        await eventually(lambda: d.agent.counters.ticks >= 2, "ticks after the crash")

    [crash] = [e for e in logs if e["event"] == "specon.agent.task_crashed"]
    assert crash["task"] == "monitor" and alive(d)


async def test_stop_says_goodbye_and_the_manager_marks_the_worker_not_ready(rig: Rig) -> None:
    await rig.runtime.start(spec("a"))
    coord = rig.coordinator()
    server = await rig.serve(coord)
    d = rig.daemon(url_of(server))
    d.start()
    await eventually(lambda: coord.core.state.heartbeats > 0, "a heartbeat")
    assert [w.ready for w in (await status(url_of(server))).workers] == [True]

    await d.stop()

    assert [(w.id, w.ready) for w in (await status(url_of(server))).workers] == [(W0, False)]
    assert all(t.done() for t in d._tasks)
    # The jobs keep running: an agent restart must not cost them anything.
    assert [c.alive for c in await rig.runtime.list_containers()] == [True]


@pytest.mark.slow
async def test_stop_reports_the_results_of_the_commands_it_waited_for(rig: Rig) -> None:
    rig.runtime.save_seconds = 0.6  # the job takes a while to checkpoint
    await rig.runtime.start(spec("a"))
    coord = rig.coordinator()
    server = await rig.serve(coord)
    d = rig.daemon(url_of(server))
    d.start()
    await eventually(lambda: "a" in d.agent.watched and d.link.connected, "the job watched")
    coord.core._send(W0, Command(id="save-a", action=Action.SAVE, container=ContainerId("a"), deadline=1e12))
    await eventually(lambda: "save-a" in d.agent.running, "the save under way")

    await d.stop()

    assert d.agent.done["save-a"].ok
    assert "save-a" not in coord.core.outbox.get(W0, {})  # the manager has its result


async def test_stop_without_a_manager_returns(rig: Rig, nobody: str) -> None:
    d = rig.daemon(nobody)
    d.start()
    await eventually(lambda: d.link.failures >= 1, "a failed exchange")

    await asyncio.wait_for(d.stop(), 10.0)

    assert all(t.done() for t in d._tasks)


async def test_the_monitor_ticks_once_per_interval_of_the_runtime_clock(tmp_path: Path, nobody: str) -> None:
    clock = FakeClock(1000.0)  # moved only by this test
    volume = FakeVolume(clock, root=tmp_path / "volume")
    pol = make_policy(monitor={"interval": 30.0})
    agent = Agent(runtime=FakeRuntime("w0", volume), policy=pol, settings=FAST_SETTINGS)
    d = AgentDaemon(agent, ManagerClient(nobody, TOKEN))
    d.start()
    try:
        await eventually(lambda: agent.counters.ticks == 1, "the first tick")
        for n in (2, 3, 4):
            await clock.advance(30.0)
            await eventually(lambda n=n: agent.counters.ticks >= n, f"tick {n}", within=0.5)  # type: ignore[misc]
    finally:
        await d.stop(goodbye=False)


# --- backoff -------------------------------------------------------------------------------


def retry_state(attempt: int) -> RetryCallState:
    state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
    state.attempt_number = attempt
    return state


def test_backoff_doubles_with_jitter_up_to_its_maximum() -> None:
    wait = backoff(AgentSettings(backoff_initial=0.5, backoff_max=4.0))
    for _ in range(50):  # the jitter is random: every draw stays in its band
        delays = [wait(retry_state(n)) for n in range(1, 9)]
        ceilings = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0, 4.0]
        assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert wait(retry_state(10_000)) <= 4.0  # no overflow after a long outage
    assert len({wait(retry_state(3)) for _ in range(20)}) > 1  # agents do not retry in step


def test_a_heartbeats_backoff_is_capped_by_the_heartbeat_interval() -> None:
    wait = backoff(AgentSettings(backoff_initial=0.5, backoff_max=30.0), cap=1.5)
    assert all(0.75 <= wait(retry_state(n)) <= 1.5 for n in range(3, 12))


async def test_a_loops_retrying_backs_off_until_a_success_then_starts_over(rig: Rig, nobody: str) -> None:
    settings = AgentSettings(backoff_initial=1.0, backoff_max=8.0)
    d = rig.daemon(nobody, settings=settings)
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    outcomes = iter([False] * 5 + [True] + [False, True])

    async def exchange() -> bool:
        return next(outcomes)

    call = d._retried("test", exchange, sleep=sleep)
    assert await call() is True
    assert d.retrying["test"].statistics["attempt_number"] == 6
    ceilings = [1.0, 2.0, 4.0, 8.0, 8.0]
    assert all(c / 2 <= s <= c for s, c in zip(slept, ceilings, strict=True))

    slept.clear()
    assert await call() is True  # the next outage starts from the first delay
    assert len(slept) == 1 and 0.5 <= slept[0] <= 1.0

    async def bug() -> bool:
        raise RuntimeError("a bug, not the manager being away")

    slept.clear()
    with pytest.raises(RuntimeError):  # not retried: _supervised logs it and restarts the loop
        await d._retried("bug", bug, sleep=sleep)()
    assert slept == []

    d._stopping.set()  # stopping: a failing exchange gives up after its attempt
    tries: list[bool] = []

    async def failing() -> bool:
        tries.append(False)
        return False

    assert await d._retried("stop", failing, sleep=sleep)() is False
    assert tries == [False] and slept == []


async def test_a_link_that_starts_being_refused_no_longer_reports_connected(rig: Rig) -> None:
    # Before: an agent whose heartbeats were refused kept saying "connected" on /healthz.
    coord = rig.coordinator()
    server = await rig.serve(coord)
    d = rig.daemon(url_of(server))
    d.start()
    await eventually(lambda: d.link.connected, "connected")
    d.client._token = lambda: "revoked-token-0123456789abcdef0123"  # e.g. a revoked agent token
    await eventually(lambda: not d.link.connected and d.link.rejected >= 1, "the refusal noticed")
    assert alive(d)
