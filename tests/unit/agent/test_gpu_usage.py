"""The agent's GPU usage end to end, with no GPU: the fake NVML (``specon.testing.fake_nvml``)
behind ``import pynvml``, a real ``Agent`` on the fake runtime, its heartbeat through the wire
codec, and its /metrics and /healthz."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import structlog
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families
from specon_agent.app import create_app
from specon_agent.client import ManagerClient
from specon_agent.core import Agent
from specon_agent.daemon import AgentDaemon

from specon.jobkit import EXIT_CHECKPOINTED
from specon.model import GPU_COUNT_LABEL, GPU_MEMORY_LABEL, GPU_PRODUCT_LABEL, ContainerId, Resources
from specon.runtime import JobSpec
from specon.runtime.gpu.nvml import NvmlReader
from specon.testing.fake_nvml import (
    GIB,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    FakeGpu,
    FakeNvml,
    FakeProcess,
)
from specon.testing.fake_runtime import FakeClock, FakeRuntime, FakeVolume, JobScript
from specon.wire import fastpath, protocol
from specon.wire.gpu import GpuDevice, GpuUse
from specon.wire.protocol import ContainerReport, Heartbeat
from tests.unit.manager_fakes import policy as make_policy

A, B = ContainerId("a"), ContainerId("b")


class PidRuntime(FakeRuntime):
    """The fake runtime with host PIDs per container (``pids``: what ``Runtime.pids`` answers
    for the running ones); ``pid_error`` makes it raise instead."""

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.pid_map: dict[ContainerId, frozenset[int]] = {}
        self.pid_error: Exception | None = None
        self.pid_calls = 0

    async def pids(self) -> dict[ContainerId, frozenset[int]]:
        self.pid_calls += 1
        if self.pid_error is not None:
            raise self.pid_error
        running = {i.id for i in await self.list_containers() if i.alive}
        return {cid: p for cid, p in self.pid_map.items() if cid in running}


@dataclasses.dataclass
class World:
    clock: FakeClock
    volume: FakeVolume
    runtime: PidRuntime
    nvml: FakeNvml
    agents: list[Agent] = dataclasses.field(default_factory=list)

    def agent(self, *, gpus: bool = True) -> Agent:
        agent = Agent(
            runtime=self.runtime,
            policy=make_policy(),
            address="gpu-box-1:7701",
            gpus=NvmlReader() if gpus else None,
        )
        self.agents.append(agent)
        return agent

    async def start(self, job: str, **kw: object) -> None:
        self.volume.script(job, JobScript(loss=lambda step: 100.0 - step))
        await self.runtime.start(JobSpec(id=ContainerId(job), command=("train",), **kw))  # type: ignore[arg-type]

    async def sample(self, agent: Agent) -> Heartbeat:
        await self.clock.advance(10.0)
        await agent.refresh()
        await agent.sample_usage()
        agent.tick(self.clock.now())
        return agent.heartbeat(self.clock.now())


def machine() -> FakeNvml:
    """One H100 with a's two processes and b's one, another tenant's process, and an A100."""
    return FakeNvml(
        [
            FakeGpu(
                utilisation=97,
                processes=[
                    FakeProcess(100, memory=4 * GIB, sm=70),
                    FakeProcess(101, memory=GIB // 2, sm=10),
                    FakeProcess(200, memory=GIB, sm=None),
                    FakeProcess(999, memory=GIB, sm=15),
                ],
            ),
            FakeGpu(name="NVIDIA A100-SXM4-40GB", memory_total=40 * GIB, uuid="GPU-a100"),
        ]
    )


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    volume = FakeVolume(FakeClock(1000.0), root=tmp_path / "volume")
    runtime = PidRuntime("gpu-box-1", volume, capacity=Resources(cpu=16.0))
    w = World(volume.clock, volume, runtime, machine().install(monkeypatch))
    yield w
    for agent in w.agents:
        for watched in agent.watched.values():
            watched.tailer.close()


def by_id(hb: Heartbeat) -> dict[str, ContainerReport]:
    return {r.id: r for r in hb.containers}


async def test_the_heartbeat_carries_gpus_labels_capacity_and_each_jobs_use(world: World) -> None:
    await world.start("a", gpu_memory=3 * GIB, requests=Resources(cpu=1, gpu=1))
    await world.start("b")
    world.runtime.pid_map = {A: frozenset({100, 101}), B: frozenset({200})}
    agent = world.agent()
    hb = await world.sample(agent)

    assert hb.gpus == (
        GpuDevice(0, "GPU-fake-0", "NVIDIA H100 80GB HBM3", 80 * GIB, int(6.5 * GIB), 97.0),
        GpuDevice(1, "GPU-a100", "NVIDIA A100-SXM4-40GB", 40 * GIB, 0, 0.0),
    )
    assert hb.capacity == Resources(cpu=16.0, gpu=2)
    assert hb.labels == {
        GPU_PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3",
        GPU_MEMORY_LABEL: str(40 * 1024),
        GPU_COUNT_LABEL: "2",
    }
    reports = by_id(hb)
    assert reports["a"].gpu == GpuUse(devices=(0,), memory=int(4.5 * GIB), utilisation=80.0)
    assert reports["a"].gpu_memory == 3 * GIB
    assert reports["b"].gpu == GpuUse(devices=(0,), memory=GIB, utilisation=None)  # not sampled
    assert reports["b"].gpu_memory == 0
    assert agent.gpu_sample is not None and agent.gpu_sample.unmapped == 1  # pid 999
    assert agent.gpu_sample.at == world.runtime.now()  # when the read began (the fake clock stood)

    # The heartbeat travels: encoded, then decoded by msgspec's path and by the codec's.
    data = protocol.encode(hb)
    assert fastpath.decode(data, Heartbeat, protocol.VERSION) == hb  # msgspec took it, no fallback
    assert protocol.decode(data, Heartbeat) == hb
    assert protocol.decode(data) == hb


async def test_the_gpu_sharings_states_are_reported_running_or_not(world: World) -> None:
    await world.start("a")
    await world.start("b")
    world.runtime.pid_map = {A: frozenset({100}), B: frozenset({200})}
    agent = world.agent()
    agent.gpu_states[A] = "frozen"
    await world.sample(agent)
    # The sharing suspends b: it checkpoints and exits (still listed here), and is reported
    # stopped and suspended.
    world.runtime.crash(B, exit_code=EXIT_CHECKPOINTED)
    world.nvml.gpus[0].processes = [p for p in world.nvml.gpus[0].processes if p.pid != 200]
    agent.gpu_states[B] = "suspended"
    reports = by_id(await world.sample(agent))
    assert reports["a"].gpu is not None and reports["a"].gpu.state == "frozen"
    assert reports["b"].phase == "stopped"
    assert reports["b"].gpu == GpuUse(state="suspended")


async def test_node_labels_and_the_nodes_gpu_count_win(world: World) -> None:
    """A Kubernetes node: GPU feature discovery's labels and the device plugin's count."""
    world.runtime.labels = {GPU_PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3-SHARED"}
    world.runtime.capacity = Resources(cpu=16.0, gpu=8)
    hb = await world.sample(world.agent())
    assert hb.labels[GPU_PRODUCT_LABEL] == "NVIDIA-H100-80GB-HBM3-SHARED"
    assert hb.labels[GPU_COUNT_LABEL] == "2"
    assert hb.capacity.gpu == 8


async def test_pids_are_asked_only_when_a_gpu_has_processes(world: World) -> None:
    for gpu in world.nvml.gpus:
        gpu.processes = []
    agent = world.agent()
    hb = await world.sample(agent)
    assert len(hb.gpus) == 2
    assert world.runtime.pid_calls == 0


async def test_a_failing_runtime_pid_lookup_is_counted_not_fatal(world: World) -> None:
    await world.start("a")
    world.runtime.pid_error = RuntimeError("boom")
    agent = world.agent()
    with structlog.testing.capture_logs() as logs:
        hb = await world.sample(agent)
        await world.sample(agent)
    assert len(hb.gpus) == 2
    assert by_id(hb)["a"].gpu is None
    assert agent.gpus.pid_failures == 2
    assert [e["event"] for e in logs].count("specon.agent.gpu_pids_failed") == 1


async def test_a_lost_gpu_loses_only_itself_and_a_failed_read_keeps_the_last(world: World) -> None:
    agent = world.agent()
    world.nvml.gpus[1].fail["nvmlDeviceGetMemoryInfo"] = NVML_ERROR_GPU_IS_LOST
    hb = await world.sample(agent)
    assert [d.index for d in hb.gpus] == [0]
    assert hb.capacity.gpu == 1
    world.nvml.count_error = NVML_ERROR_GPU_IS_LOST  # now nothing can be read
    again = await world.sample(agent)
    assert again.gpus == hb.gpus
    assert again.labels == hb.labels


async def test_without_nvml_the_agent_reports_no_gpus_and_runs(world: World) -> None:
    world.nvml.init_error = NVML_ERROR_LIBRARY_NOT_FOUND
    await world.start("a")
    agent = world.agent()
    with structlog.testing.capture_logs() as logs:
        hb = await world.sample(agent)
        hb = await world.sample(agent)
    assert hb.gpus == ()
    assert hb.capacity == Resources(cpu=16.0)
    assert hb.labels == {}
    assert by_id(hb)["a"].gpu is None
    assert agent.gpu_sample is None
    assert agent.counters.ticks == 2
    assert [e["event"] for e in logs].count("specon.agent.gpu_unavailable") == 1


async def test_without_the_package_the_agent_reports_no_gpus(world: World) -> None:
    agent = world.agent()
    with FakeNvml.absent():
        hb = await world.sample(agent)
    assert hb.gpus == ()
    assert agent.gpus.reader is not None and "specon[gpu]" in (agent.gpus.reader.reason or "")


async def test_gpu_off_never_touches_nvml(world: World) -> None:
    hb = await world.sample(world.agent(gpus=False))
    assert hb.gpus == ()
    assert world.nvml.calls == []


# --- /metrics and /healthz ---------------------------------------------------------------

Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def client(world: World) -> AsyncIterator[Client]:
    await world.start("a")
    world.runtime.pid_map = {A: frozenset({100, 101})}
    agent = world.agent()
    await world.sample(agent)
    daemon = AgentDaemon(agent, ManagerClient("http://127.0.0.1:9", "unused"))
    async with TestClient(TestServer(create_app(daemon, gpu_device_metrics=True))) as c:
        yield c


async def metrics(client: Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    resp = await client.get("/metrics")
    assert resp.status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): float(s.value)
        for family in text_string_to_metric_families(await resp.text())
        for s in family.samples
    }


def dcgm(index: int, uuid: str, model: str) -> tuple[tuple[str, str], ...]:
    return (("Hostname", "gpu-box-1"), ("UUID", uuid), ("gpu", str(index)), ("modelName", model))


async def test_metrics_use_dcgm_names_per_device_and_specon_names_per_container(client: Client) -> None:
    got = await metrics(client)
    h100 = dcgm(0, "GPU-fake-0", "NVIDIA H100 80GB HBM3")
    a100 = dcgm(1, "GPU-a100", "NVIDIA A100-SXM4-40GB")
    assert got["DCGM_FI_DEV_GPU_UTIL", h100] == 97.0
    assert got["DCGM_FI_DEV_FB_USED", h100] == 6.5 * 1024
    assert got["DCGM_FI_DEV_FB_FREE", h100] == 80 * 1024 - 6.5 * 1024
    assert got["DCGM_FI_DEV_FB_FREE", a100] == 40 * 1024
    assert got["specon_agent_container_gpu_memory_bytes", (("container", "a"),)] == 4.5 * GIB
    assert got["specon_agent_container_gpu_utilisation", (("container", "a"),)] == 80.0
    assert got["specon_agent_gpu_available", ()] == 1.0
    assert got["specon_agent_gpu_unmapped_processes", ()] == 2.0  # b's 200 (b not here) and 999
    assert got["specon_agent_gpu_read_failures_total", ()] == 0.0
    assert got["specon_agent_gpu_freezes_total", ()] == 0.0  # the GPU sharing's counters
    assert got["specon_agent_gpu_jobs", (("state", "frozen"),)] == 0.0


async def test_per_device_series_are_off_by_default_beside_a_dcgm_exporter(world: World) -> None:
    await world.start("a")
    world.runtime.pid_map = {A: frozenset({100, 101})}
    agent = world.agent()
    await world.sample(agent)
    daemon = AgentDaemon(agent, ManagerClient("http://127.0.0.1:9", "unused"))
    async with TestClient(TestServer(create_app(daemon))) as c:
        got = await metrics(c)
    assert not [name for name, _ in got if name.startswith("DCGM_")]
    assert got["specon_agent_container_gpu_memory_bytes", (("container", "a"),)] == 4.5 * GIB


async def test_healthz_counts_the_gpus(client: Client) -> None:
    body = await (await client.get("/healthz")).json()
    assert body["gpus"] == 2


async def test_a_frozen_job_neither_trains_nor_goes_stale(world: World) -> None:
    # The fake runtime freezes for real (no steps while frozen); the agent does not count a
    # tick of a job the GPU sharing froze as a stale one, so it never turns "stalled".
    agent = world.agent()
    await world.start("a")
    await world.sample(agent)

    def last_step() -> int:
        return max(int(r["step"]) for r in world.volume.records("a") if "step" in r)

    assert await world.runtime.freeze(A)
    agent.gpu_states[A] = "frozen"
    step, stale = last_step(), agent.watched[A].state.stale_run
    for _ in range(agent.policy.monitor.stale_ticks + 2):
        await world.sample(agent)
    assert last_step() == step
    assert agent.watched[A].state.stale_run == stale and not agent.watched[A].state.stalled
    assert await world.runtime.thaw(A)
    agent.gpu_states.pop(A)
    await world.sample(agent)
    assert last_step() == step + 10


def test_gpu_standby_auto_keeps_one_per_gpu_nvml_finds(world: World) -> None:
    from specon_agent.__main__ import standby_gpus  # noqa: PLC0415

    assert standby_gpus(NvmlReader()) == (0, 1)
    assert standby_gpus(None) == ()
    with FakeNvml.absent():
        assert standby_gpus(NvmlReader()) == ()


async def test_between_monitor_ticks_the_gpu_loop_samples_and_shares(world: World) -> None:
    # srpt: a has less work left than b, so a runs and b is frozen, by the GPU loop alone (no
    # monitor tick), half a quantum after its start; the sample it acts on is its own.
    await world.start("a", steps=1000, requests=Resources(gpu=1))
    await world.start("b", steps=5000, requests=Resources(gpu=1))
    world.runtime.pid_map = {A: frozenset({100, 101}), B: frozenset({200})}
    agent = Agent(runtime=world.runtime, policy=make_policy(priority={"rule": "srpt"}), gpus=NvmlReader())
    world.agents.append(agent)
    await world.sample(agent)
    await world.sample(agent)  # a step of each read: a job still starting is not shared
    assert all(r.step is not None for r in agent.running_jobs())
    assert not world.volume.jobs[B].frozen
    daemon = AgentDaemon(agent, ManagerClient("http://127.0.0.1:9", "token"))
    loop = asyncio.create_task(daemon._gpus())
    await asyncio.sleep(0)  # it is asleep on the fake clock
    try:
        before = world.runtime.pid_calls
        await world.clock.advance(daemon.gpu_period)
        for _ in range(200):  # the NVML read runs in a thread
            if world.volume.jobs[B].frozen:
                break
            await asyncio.sleep(0.01)
        assert world.volume.jobs[B].frozen and not world.volume.jobs[A].frozen
        assert agent.gpu_states == {A: "running", B: "frozen"}
        assert world.runtime.pid_calls > before  # sampled afresh, not the tick's sample
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
        await agent.gpu_share.close()
    assert not world.volume.jobs[B].frozen  # closing thaws what it froze
