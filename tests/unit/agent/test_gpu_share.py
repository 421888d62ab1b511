"""The agent's GPU sharing (``specon_agent.gpu_share``): plans carried out through a runtime,
suspended jobs never forgotten (across restarts too), failures survived; no GPU needed (the
NVML sample is built by hand)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
import structlog
from specon_agent.client import ManagerClient
from specon_agent.core import Agent
from specon_agent.daemon import AgentDaemon
from specon_agent.gpu_share import MPS_ENV, GpuShare, exempt, gpu_state_path, with_mps
from specon_agent.priority import Running

from specon.config import PriorityConfig
from specon.config.sections import GpuShareConfig
from specon.model import ContainerId, Resources
from specon.runtime import JobSpec
from specon.runtime.gpu.sample import GpuSample
from specon.testing.fake_runtime import FakeClock, FakeRuntime, FakeVolume
from specon.wire.gpu import GpuDevice, GpuUse
from tests.unit.manager_fakes import policy as make_policy

GB = 1 << 30
A, B, C = ContainerId("a"), ContainerId("b"), ContainerId("c")
SRPT = PriorityConfig(rule="srpt")
FREEZE = GpuShareConfig()


class GpuRuntime(FakeRuntime):
    """A fake worker whose freezer works (or fails, or raises, where a test says)."""

    def __init__(self, volume: FakeVolume) -> None:
        super().__init__("w0", volume, capacity=Resources(cpu=4.0, gpu=1))
        self.frozen: set[ContainerId] = set()
        self.refuse: set[ContainerId] = set()
        self.broken = False

    async def freeze(self, container_id: ContainerId) -> bool:
        self.calls.append(("freeze", container_id))
        if self.broken:
            raise OSError("the freezer broke")
        if container_id in self.refuse:
            return False
        self.frozen.add(container_id)
        return True

    async def thaw(self, container_id: ContainerId) -> bool:
        self.calls.append(("thaw", container_id))
        self.frozen.discard(container_id)
        return True


@pytest.fixture
def volume(tmp_path: Path) -> FakeVolume:
    return FakeVolume(FakeClock(1000.0), root=tmp_path / "volume")


@pytest.fixture
async def rt(volume: FakeVolume) -> GpuRuntime:
    runtime = GpuRuntime(volume)
    for cid in (A, B, C):
        spec = JobSpec(id=cid, command=("train",), steps=1000)
        volume.submit(spec)
        await runtime.start(spec)
    runtime.calls.clear()
    return runtime


def running(*left: tuple[ContainerId, int]) -> list[Running]:
    """Jobs with these steps left of 1000 (srpt: fewest first)."""
    return [Running(id=cid, started=1000.0, step=1000 - n, total=1000) for cid, n in left]


def sample(memory: Mapping[ContainerId, int], *, total: int = 80 * GB) -> GpuSample:
    device = GpuDevice(index=0, uuid="GPU-0", name="NVIDIA H100 80GB HBM3", memory_total=total)
    return GpuSample(
        devices=(device,), containers={c: GpuUse(devices=(0,), memory=m) for c, m in memory.items()}
    )


async def step(
    share: GpuShare,
    rt: FakeRuntime,
    jobs: Sequence[Running],
    memory: Mapping[ContainerId, int] | None,
    specs: Mapping[ContainerId, JobSpec] | None = None,
) -> None:
    got = None if memory is None else sample(memory)
    await share.step(rt.now(), sample=got, running=jobs, fair={}, priority=SRPT, specs=specs or {})


def actions(rt: FakeRuntime) -> list[tuple[str, ContainerId]]:
    out = list(rt.calls)
    rt.calls.clear()
    return out


async def test_the_job_with_the_least_work_left_runs_and_the_other_is_frozen(rt: GpuRuntime) -> None:
    share = GpuShare(rt, FREEZE)
    await step(share, rt, running((A, 10), (B, 900)), {A: GB, B: GB})
    assert actions(rt) == [("freeze", B)]
    assert share.states == {A: "running", B: "frozen"} and rt.frozen == {B}
    await step(share, rt, running((A, 10), (B, 900)), {A: GB, B: GB})
    assert actions(rt) == []  # nothing changed: nothing done
    # A finished: B is thawed.
    await step(share, rt, running((B, 900)), {B: GB})
    assert actions(rt) == [("thaw", B)]
    assert share.states == {B: "running"}
    assert (share.counters.freezes, share.counters.thaws, share.counters.switches) == (1, 1, 2)


async def test_a_job_still_starting_is_not_frozen_before_its_first_record(rt: GpuRuntime) -> None:
    # B is on the GPU (NVML sees its launcher's group) but has logged no step yet: a freeze
    # now could stop its launcher before it joined its budget (a full run: the start waited
    # 30 s for a launcher the agent had SIGSTOPped, and failed).
    share = GpuShare(rt, FREEZE)
    starting = [*running((A, 10)), Running(id=B, started=1000.0, step=None, total=1000)]
    await step(share, rt, starting, {A: GB, B: GB})
    assert actions(rt) == [] and B not in share.states
    await step(share, rt, running((A, 10), (B, 999)), {A: GB, B: GB})  # it trains: shared now
    assert actions(rt) == [("freeze", B)]


async def test_a_state_is_published_when_its_action_is_done_and_counted(
    rt: GpuRuntime, volume: FakeVolume
) -> None:
    """The agent's gauges and heartbeats read ``states``: a job is not published frozen while
    its freeze is under way (recorded before the call), and is once it is done and counted."""
    share = GpuShare(rt, FREEZE)
    seen: list[tuple[str | None, int]] = []
    freeze = rt.freeze

    async def watched_freeze(cid: ContainerId) -> bool:
        seen.append((share.states.get(cid), share.counters.freezes))
        return await freeze(cid)

    rt.freeze = watched_freeze  # type: ignore[method-assign]
    await step(share, rt, running((A, 10), (B, 900)), {A: GB, B: GB})
    assert seen == [(None, 0)]
    assert share.states[B] == "frozen" and share.counters.freezes == 1


async def test_a_job_that_leaves_no_room_is_suspended_and_resumed_with_its_steps(
    rt: GpuRuntime, volume: FakeVolume, tmp_path: Path
) -> None:
    state = gpu_state_path(tmp_path / "monitor.json")
    share = GpuShare(rt, FREEZE, state_file=state)
    await volume.clock.advance(30.0)  # the jobs train a while
    # 50 + 30 GB of 80 leaves less than the 5 % kept free: B goes to its checkpoint.
    await step(share, rt, running((A, 10), (B, 900)), {A: 50 * GB, B: 30 * GB})
    assert actions(rt) == [("save", B)]
    assert share.states[B] == "suspended" and share.counters.suspends == 1
    kept = json.loads(state.read_text())["jobs"]
    assert kept["b"]["state"] == "suspended" and kept["b"]["memory"] == 30 * GB
    saved_at = volume.jobs[B].checkpoints[-1]
    assert saved_at > 0

    # While A runs B stays suspended (weighed from what was last seen of it).
    await step(share, rt, running((A, 5)), {A: 50 * GB})
    assert actions(rt) == []
    # A is done: B is due and fits, so it is restored on this worker from its checkpoint.
    await step(share, rt, [], {})
    assert actions(rt) == [("start", B)]
    assert share.states == {B: "running"} and share.counters.resumes == 1
    assert volume.jobs[B].records[-1] == {
        "event": "resumed",
        "step": saved_at,
        "worker": "w0",
        "time": rt.now(),
    }
    assert json.loads(state.read_text())["jobs"] == {}


async def test_a_restarted_agent_resumes_what_the_last_one_suspended(
    rt: GpuRuntime, volume: FakeVolume, tmp_path: Path
) -> None:
    state = gpu_state_path(tmp_path / "monitor.json")
    first = GpuShare(rt, FREEZE, state_file=state)
    await step(first, rt, running((A, 10), (B, 900)), {A: 50 * GB, B: 30 * GB})
    assert first.states[B] == "suspended"

    again = GpuShare(rt, FREEZE, state_file=state)
    assert again.states == {B: "suspended"}
    # No NVML on the new agent: nothing to share by, so what was suspended runs again.
    await step(again, rt, running((A, 10)), None)
    assert ("start", B) in actions(rt)
    assert again.states[B] == "running" and volume.jobs[B].running


async def test_a_suspended_job_a_command_restarted_is_let_be(rt: GpuRuntime, volume: FakeVolume) -> None:
    share = GpuShare(rt, FREEZE)
    await step(share, rt, running((A, 10), (B, 900)), {A: 50 * GB, B: 30 * GB})
    spec = rt.job_spec(B)
    assert spec is not None
    await rt.start(spec)  # the manager's start, say
    actions(rt)
    # Seen running again: it is planned like any other (frozen beside A, memory allowing).
    await step(share, rt, running((A, 10), (B, 900)), {A: 50 * GB, B: 10 * GB})
    assert actions(rt) == [("freeze", B)]
    assert share.states[B] == "frozen"


async def test_a_job_just_suspended_that_the_monitor_still_lists_stays_suspended(
    rt: GpuRuntime, volume: FakeVolume
) -> None:
    # The GPU loop passes between monitor ticks: right after the save the monitor's view
    # still lists the job as running (started before its suspension), NVML no longer sees it.
    share = GpuShare(rt, FREEZE)
    await volume.clock.advance(30.0)
    await step(share, rt, running((A, 10), (B, 900)), {A: 50 * GB, B: 30 * GB})
    assert actions(rt) == [("save", B)]
    await step(share, rt, running((A, 10), (B, 900)), {A: 50 * GB})  # a tick old
    assert actions(rt) == [] and share.states[B] == "suspended"
    await step(share, rt, running((A, 10)), {A: 50 * GB})  # the monitor caught up
    assert actions(rt) == [] and share.states[B] == "suspended"  # not forgotten
    await step(share, rt, [], {})
    assert actions(rt) == [("start", B)] and share.counters.resumes == 1


async def test_a_read_begun_before_its_save_ended_does_not_bring_a_suspended_job_back(
    rt: GpuRuntime, volume: FakeVolume
) -> None:
    # The GPU loop reads NVML while the monitor tick's pass is saving B, then waits for the
    # pass and plans from that read: B still holds its memory there, and the monitor still
    # lists it. Taken for B running again, it was forgotten once the monitor caught up.
    share = GpuShare(rt, FREEZE)
    await volume.clock.advance(30.0)
    during = replace(sample({A: 50 * GB, B: 30 * GB}), at=rt.now())
    await volume.clock.advance(1.0)
    await step(share, rt, running((A, 10), (B, 900)), {A: 50 * GB, B: 30 * GB})
    assert actions(rt) == [("save", B)] and share.states[B] == "suspended"
    jobs = running((A, 10), (B, 900))
    await share.step(rt.now(), sample=during, running=jobs, fair={}, priority=SRPT, specs={})
    assert actions(rt) == [] and share.states[B] == "suspended"
    await step(share, rt, running((A, 10)), {A: 50 * GB})  # the monitor caught up
    assert share.states[B] == "suspended"  # not forgotten
    await step(share, rt, [], {})
    assert actions(rt) == [("start", B)] and share.counters.resumes == 1


async def test_close_thaws_every_frozen_job(rt: GpuRuntime) -> None:
    share = GpuShare(rt, FREEZE)
    await step(share, rt, running((A, 10), (B, 900), (C, 500)), {A: GB, B: GB, C: GB})
    assert rt.frozen == {B, C}
    await share.close()
    assert rt.frozen == set() and set(share.states.values()) == {"running"}


async def test_a_frozen_job_is_thawed_before_a_save_and_left_alone_during_it(rt: GpuRuntime) -> None:
    share = GpuShare(rt, FREEZE)
    jobs = running((A, 10), (B, 900))
    await step(share, rt, jobs, {A: GB, B: GB})
    actions(rt)
    await share.before_save(B)
    assert actions(rt) == [("thaw", B)] and share.states[B] == "running"
    await step(share, rt, jobs, {A: GB, B: GB})
    assert actions(rt) == []  # not frozen again while the save runs
    await step(share, rt, running((A, 10)), {A: GB})  # saved away: forgotten here
    assert B not in share.states


async def test_a_failing_freezer_is_logged_once_counted_and_retried(rt: GpuRuntime) -> None:
    share = GpuShare(rt, FREEZE)
    rt.refuse.add(B)
    jobs, memory = running((A, 10), (B, 900)), {A: GB, B: GB}
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            await step(share, rt, jobs, memory)
    assert [c for c in actions(rt) if c[0] == "freeze"] == [("freeze", B)] * 3
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["specon.agent.gpu_freeze_failed"]
    assert share.counters.failures == 3 and share.states[B] == "running"
    rt.refuse.clear()
    rt.broken = True  # a backend bug: the same, never an exception out of the tick
    await step(share, rt, jobs, memory)
    rt.broken = False
    await step(share, rt, jobs, memory)
    assert share.states[B] == "frozen" and share.counters.failures == 4


async def test_jobs_that_span_workers_or_opt_out_always_run(rt: GpuRuntime) -> None:
    share = GpuShare(rt, FREEZE)
    specs = {B: JobSpec(id=B, command=("x",), env=(("WORLD_SIZE", "4"),))}
    await step(share, rt, running((A, 10), (B, 900), (C, 500)), {A: GB, B: GB, C: GB}, specs)
    assert actions(rt) == [("freeze", C)]  # B, last by weight, runs: its peers would time out
    assert exempt(specs[B]) and not exempt(replace(specs[B], env=())) and not exempt(None)
    assert exempt(replace(specs[B], env=(("WORLD_SIZE", "many"),)))  # unreadable: assume it spans
    assert exempt(JobSpec(id=C, command=("x",), labels=(("specon.io/gpu-share", "off"),)))


async def test_a_job_on_several_gpus_is_never_frozen(rt: GpuRuntime) -> None:
    share = GpuShare(rt, FREEZE)
    devices = tuple(GpuDevice(index=i, uuid=f"GPU-{i}", name="H100", memory_total=80 * GB) for i in (0, 1))
    on = {A: (0,), B: (0, 1), C: (1,)}
    got = GpuSample(devices=devices, containers={c: GpuUse(devices=d, memory=GB) for c, d in on.items()})
    jobs = running((A, 10), (B, 900), (C, 500))
    await share.step(rt.now(), sample=got, running=jobs, fair={}, priority=SRPT, specs={})
    assert actions(rt) == []  # A leads on GPU 0, C on GPU 1; B runs on both
    assert share.states == {A: "running", B: "running", C: "running"}


async def test_under_mps_a_resumed_job_starts_with_its_share_of_the_sms(
    rt: GpuRuntime, volume: FakeVolume
) -> None:
    share = GpuShare(rt, replace(FREEZE, mechanism="both", concurrency=2))
    await step(share, rt, running((A, 10), (B, 900), (C, 500)), {A: 50 * GB, B: 20 * GB, C: 10 * GB})
    assert actions(rt) == [("save", B)]  # C runs beside A (the two slots); B does not fit
    await step(share, rt, running((A, 5), (C, 400)), {A: 50 * GB, C: 10 * GB})
    await step(share, rt, running((C, 400)), {C: 10 * GB})
    assert actions(rt) == [("start", B)]
    # srpt's weights: C (400 left) 10,000, B (900 left) 100: B gets 1 %, at least 10.
    assert dict(volume.jobs[B].spec.env)[MPS_ENV] == "10"
    assert with_mps(with_mps(volume.jobs[B].spec, 50), 60).env.count((MPS_ENV, "60")) == 1


async def test_an_unreadable_state_file_is_said_and_started_afresh(rt: GpuRuntime, tmp_path: Path) -> None:
    state = tmp_path / "monitor.gpu.json"
    for text in (
        "{",
        '{"jobs": {"b": {"state": "asleep"}}}',
        '{"jobs": {"b": {"state": "frozen", "since": 1, "device": -1, "memory": 0}}}',
    ):
        state.write_text(text)
        with structlog.testing.capture_logs() as logs:
            share = GpuShare(rt, FREEZE, state_file=state)
        assert share.jobs == {} and logs[0]["event"] == "specon.agent.gpu_state_unreadable"


async def trained_a_step(agent: Agent, rt: FakeRuntime) -> None:
    """The agent has adopted the jobs and read a step of each (a job still starting is not shared)."""
    await agent.refresh()
    await rt.clock.advance(5.0)
    agent.tick(rt.now())
    assert all(r.step is not None for r in agent.running_jobs())


async def test_the_daemon_shares_the_gpus_each_tick_and_thaws_when_it_stops(
    rt: GpuRuntime, tmp_path: Path
) -> None:
    pol = make_policy(priority={"rule": "srpt"})
    agent = Agent(runtime=rt, policy=pol, state_file=tmp_path / "monitor.json")
    daemon = AgentDaemon(agent, ManagerClient("http://127.0.0.1:9", "token"))
    assert daemon.gpu_share.states is agent.gpu_states  # the heartbeat reports them
    await trained_a_step(agent, rt)
    agent.gpu_sample = sample({A: GB, B: GB, C: GB})
    await daemon.share_gpus()
    assert len(rt.frozen) == 2 and sorted(agent.gpu_states.values()) == ["frozen", "frozen", "running"]
    assert (tmp_path / "monitor.gpu.json").exists()
    await daemon.stop(goodbye=False)
    assert rt.frozen == set()
    for w in agent.watched.values():
        w.tailer.close()


async def test_a_save_command_thaws_first_and_a_gpu_loop_runs_only_where_it_can_freeze(
    rt: GpuRuntime, tmp_path: Path
) -> None:
    agent = Agent(runtime=rt, policy=make_policy(priority={"rule": "srpt"}), state_file=tmp_path / "m.json")
    await trained_a_step(agent, rt)
    agent.gpu_sample = sample({A: GB, B: GB, C: GB})
    await agent.gpu_share.step(
        rt.now(),
        sample=agent.gpu_sample,
        running=agent.running_jobs(),
        fair={},
        priority=agent.policy.priority,
        specs={},
    )
    frozen = sorted(rt.frozen)
    assert frozen and agent.gpu_states[frozen[0]] == "frozen"
    # The agent's save path thaws a frozen job before the runtime's save (it must see SIGTERM).
    await agent.gpu_share.before_save(frozen[0])
    assert frozen[0] not in rt.frozen and agent.gpu_states[frozen[0]] == "running"
    # Without NVML no GPU loop is started; with it and a freezing mechanism, half a quantum apart.
    daemon = AgentDaemon(agent, ManagerClient("http://127.0.0.1:9", "token"))
    assert daemon.gpu_period == max(0.5, agent.policy.gpu.quantum / 2)
    for w in agent.watched.values():
        w.tailer.close()
