"""The agent's own HTTP endpoints, /healthz and /metrics, through aiohttp's test client.

The daemon is built but never started: the tests set its agent and link state directly
(fake runtime, fake clock) and read what the endpoints make of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families
from specon_agent.app import create_app
from specon_agent.client import ManagerClient
from specon_agent.core import Agent
from specon_agent.daemon import AgentDaemon

from specon.model import ContainerId, Resources
from specon.runtime import JobSpec
from specon.testing.fake_runtime import FakeClock, FakeRuntime, FakeVolume, JobScript
from specon.wire.protocol import Action, Command, CommandBatch, CommandResult
from tests.unit.manager_fakes import policy as make_policy

Client = TestClient[web.Request, web.Application]
FAMILIES = {
    "specon_agent_ticks",
    "specon_agent_samples",
    "specon_agent_skipped_lines",
    "specon_agent_containers",
    "specon_agent_requests",
    "specon_agent_commands",
    "specon_agent_command_failures",
    "specon_agent_heartbeats",
    "specon_agent_manager_failures",
    "specon_agent_manager_up",
    "specon_agent_worker_usage",
    "specon_agent_container_cpu_weight",
    "specon_agent_cpu_weight_failures",
}


@dataclasses.dataclass
class Rig:
    clock: FakeClock
    volume: FakeVolume
    runtime: FakeRuntime
    daemon: AgentDaemon
    client: Client

    @property
    def agent(self) -> Agent:
        return self.daemon.agent

    async def tick(self, n: int = 1) -> None:
        for _ in range(n):
            await self.clock.advance(10.0)
            await self.agent.refresh()
            self.agent.tick(self.clock.now())

    async def run(self, cmd: Command) -> CommandResult:
        [task] = self.agent.accept(CommandBatch(manager_time=0.0, policy_generation=1, commands=(cmd,)))
        return await task

    async def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of /metrics as (name, sorted labels) -> value."""
        resp = await self.client.get("/metrics")
        assert resp.status == 200 and resp.content_type == "text/plain"
        out = {}
        for family in text_string_to_metric_families(await resp.text()):
            for s in family.samples:
                out[s.name, tuple(sorted(s.labels.items()))] = float(s.value)
        return out


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    volume = FakeVolume(FakeClock(1000.0), root=tmp_path / "volume")
    runtime = FakeRuntime("w0", volume, capacity=Resources(cpu=2.0))
    agent = Agent(runtime=runtime, policy=make_policy(), address="127.0.0.1:7701")
    daemon = AgentDaemon(agent, ManagerClient("http://127.0.0.1:9", "unused"))
    async with TestClient(TestServer(create_app(daemon))) as client:
        yield Rig(volume.clock, volume, runtime, daemon, client)
    for w in agent.watched.values():  # the agent holds its logs open while it runs
        w.tailer.close()


async def start(rig: Rig, job: str) -> None:
    rig.volume.script(job, JobScript(loss=lambda step: 100.0 - step))
    await rig.runtime.start(JobSpec(id=ContainerId(job), command=("train",)))


async def healthz(rig: Rig) -> dict[str, object]:
    resp = await rig.client.get("/healthz")
    assert resp.status == 200 and resp.content_type == "application/json"
    body: dict[str, object] = await resp.json()
    return body


# --- /healthz -------------------------------------------------------------------------------


async def test_healthz_before_any_contact_with_the_manager(rig: Rig) -> None:
    body = await healthz(rig)

    assert body["ok"] is True and body["worker"] == "w0"
    assert body["manager_connected"] is False and body["last_manager_contact_age"] is None
    assert body["containers"] == 0
    assert isinstance(body["time"], float)


async def test_healthz_reports_the_watched_containers_and_the_manager_link(rig: Rig) -> None:
    for job in ("a", "b"):
        await start(rig, job)
    await rig.agent.refresh()
    rig.daemon.link.connected, rig.daemon.link.last_ok = True, rig.clock.now()
    await rig.clock.advance(2.5)

    body = await healthz(rig)

    assert body["containers"] == 2
    assert body["manager_connected"] is True and body["last_manager_contact_age"] == 2.5


# --- /metrics -------------------------------------------------------------------------------


async def test_metrics_expose_every_agent_family(rig: Rig) -> None:
    resp = await rig.client.get("/metrics")
    names = {f.name for f in text_string_to_metric_families(await resp.text())}

    assert names >= FAMILIES
    assert resp.headers["Content-Type"].startswith("text/plain; version=")


async def test_metrics_count_the_agents_work(rig: Rig) -> None:
    for job in ("a", "b"):
        await start(rig, job)
    await rig.agent.refresh()
    await rig.tick(3)
    with open(rig.runtime.volume.paths(ContainerId("a")).progress, "a") as fh:
        fh.write("this is not a progress record\n")
    await rig.tick()
    mark = Command(id="m", action=Action.MARK_MIGRATED, container=ContainerId("a"), deadline=1e12)
    assert (await rig.run(mark)).ok
    ghost = Command(id="g", action=Action.MARK_MIGRATED, container=ContainerId("ghost"), deadline=1e12)
    assert not (await rig.run(ghost)).ok
    await rig.agent.sample_usage()
    rig.daemon.link.failures, rig.daemon.link.heartbeats_sent = 3, 7
    rig.agent.counters.requests_sent = 2

    m = await rig.metrics()

    assert m["specon_agent_ticks_total", ()] == 4
    assert m["specon_agent_samples_total", ()] == 2 * 40  # one record per fake second per job
    assert m["specon_agent_skipped_lines_total", (("reason", "unparsable"),)] == 1
    assert m["specon_agent_containers", (("category", "converged"),)] == 1  # "a", marked migrated
    assert m["specon_agent_containers", (("category", "progressing"),)] == 1
    assert m["specon_agent_commands_total", (("action", "mark_migrated"),)] == 2
    assert m["specon_agent_command_failures_total", ()] == 1
    assert m["specon_agent_requests_total", ()] == 2
    assert m["specon_agent_heartbeats_total", ()] == 7
    assert m["specon_agent_manager_failures_total", ()] == 3
    assert m["specon_agent_manager_up", ()] == 0
    assert m["specon_agent_worker_usage", ()] == 1.0  # two one-core jobs on a two-core worker


async def test_manager_up_follows_the_link(rig: Rig) -> None:
    rig.daemon.link.connected = True

    assert (await rig.metrics())["specon_agent_manager_up", ()] == 1


async def test_the_skipped_lines_counter_never_decreases(rig: Rig) -> None:
    await start(rig, "a")
    await rig.agent.refresh()
    with open(rig.runtime.volume.paths(ContainerId("a")).progress, "a") as fh:
        fh.write("garbage\n")
    await rig.tick()
    before = (await rig.metrics())["specon_agent_skipped_lines_total", (("reason", "unparsable"),)]

    save = Command(id="s", action=Action.SAVE, container=ContainerId("a"), deadline=1e12)
    assert (await rig.run(save)).ok  # the container leaves this worker
    after = (await rig.metrics()).get(("specon_agent_skipped_lines_total", (("reason", "unparsable"),)), 0.0)

    assert before == 1 and after == before  # a Prometheus counter must not go down


async def test_metrics_show_each_running_containers_cpu_weight_and_the_failures(rig: Rig) -> None:
    rig.agent.cpu_weights.cfg = dataclasses.replace(rig.agent.cpu_weights.cfg, rule="srpt")
    for job in ("a", "b"):
        await start(rig, job)
    await rig.agent.refresh()
    await rig.agent.apply_priority(rig.clock.now())
    rig.runtime.weights_supported = False
    rig.agent.cpu_weights.applied.pop(ContainerId("b"))  # as if "b" were new: tried again, refused
    await rig.agent.apply_priority(rig.clock.now())

    m = await rig.metrics()

    assert m["specon_agent_container_cpu_weight", (("container", "a"),)] == 10_000  # started first
    assert ("specon_agent_container_cpu_weight", (("container", "b"),)) not in m  # not in effect
    assert m["specon_agent_cpu_weight_failures_total", ()] == 1
    save = Command(id="s", action=Action.SAVE, container=ContainerId("a"), deadline=1e12)
    assert (await rig.run(save)).ok  # "a" leaves: its series goes with it
    assert ("specon_agent_container_cpu_weight", (("container", "a"),)) not in await rig.metrics()
