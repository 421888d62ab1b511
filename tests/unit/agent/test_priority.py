"""The agent's priority action: the pure weights (``specon_agent.priority``), the shell that applies
them through the runtime and keeps ``fair_seconds`` (``specon_agent.weights``), and the agent that
runs it every tick and reports the weight in effect."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from specon_agent.core import Agent
from specon_agent.priority import (
    Running,
    accrue,
    changed,
    decide,
    fair_shares,
    finished_shares,
    progress,
    running_of,
)
from specon_agent.watched import CURVE_POINTS, Watched, append_curve, predicted_steps
from specon_agent.weights import CpuWeights, state_path

from specon.config import PriorityConfig, ProgressConfig
from specon.model import ContainerId, Resources, WorkerId
from specon.policy import remaining
from specon.policy.monitor import MonitorState
from specon.policy.priority import phased
from specon.progress import Tailer
from specon.runtime import ContainerInfo, ContainerState, JobSpec
from specon.testing.fake_runtime import FakeClock, FakeRuntime, FakeVolume, JobScript
from specon.wire.protocol import CommandBatch, QualityPoint
from tests.unit.manager_fakes import policy as make_policy

A, B, C = ContainerId("a"), ContainerId("b"), ContainerId("c")
SRPT = PriorityConfig(rule="srpt")


def run(cid: ContainerId, **kw: Any) -> Running:
    kw.setdefault("started", 0.0)
    return Running(id=cid, **kw)


# -- the pure half --------------------------------------------------------------------------
def test_fair_shares_split_the_worker_equally_capped_by_each_limit() -> None:
    jobs = [run(A), run(B, cpu_limit=0.5), run(C, cpu_limit=4.0)]
    assert fair_shares(jobs, 3.0) == {A: 1.0, B: 0.5, C: 1.0}
    assert fair_shares([run(A)], 2.0) == {A: 2.0}  # alone: the whole worker
    assert fair_shares(jobs, 0.0) == {A: 0.0, B: 0.0, C: 0.0}  # capacity unknown
    assert fair_shares([], 4.0) == {}


def test_fair_seconds_accrue_for_running_containers_only() -> None:
    fair = accrue({C: 5.0}, [run(A), run(B)], 2.0, 10.0)
    assert fair == {A: 10.0, B: 10.0, C: 5.0}  # C left: it keeps what it had
    assert accrue(fair, [run(A)], 2.0, 3.0)[A] == 16.0
    for dt in (0.0, -4.0, math.nan):  # no time, a clock that went back: nothing added
        assert accrue(fair, [run(A)], 2.0, dt) == fair


def test_a_container_accrues_only_since_it_started() -> None:
    # A ran the whole interval (100-110); B arrived at 106: 4 s of its half share.
    jobs = [run(A, started=90.0), run(B, started=106.0)]
    assert accrue({}, jobs, 2.0, 10.0, now=110.0) == {A: 10.0, B: 4.0}
    # The first tick (no previous one): each since its own start.
    assert accrue({}, jobs, 2.0, math.inf, now=110.0) == {A: 20.0, B: 4.0}
    # A start stamped after now (clock skew) adds nothing.
    assert accrue({}, [run(A, started=120.0)], 2.0, 10.0, now=110.0) == {}


def test_running_of_takes_the_declared_total_and_a_finite_gain_only() -> None:
    info = ContainerInfo(
        id=A,
        worker="w0",  # type: ignore[arg-type]
        spec=JobSpec(id=A, command=("x",), steps=500),
        state=ContainerState.RUNNING,
        progress_path=Path("p"),
        checkpoint_dir=Path("c"),
        started_at=12.0,
        cpu_limit=1.5,
    )
    state = MonitorState(last_g=0.25)
    r = running_of(info, 40, state, 8.0)
    assert r == Running(A, started=12.0, step=40, total=500, gain=0.25, cpu_limit=1.5, cpu_seconds=8.0)
    nan = MonitorState(last_g=math.nan)
    assert running_of(info, None, nan, math.inf).gain is None
    assert running_of(info, None, nan, math.inf).cpu_seconds == 0.0


def test_progress_is_what_the_rule_reads() -> None:
    [p] = progress([run(A, step=10, total=100, cpu_seconds=20.0, gain=0.1)], {A: 7.0})
    assert (p.step, p.total, p.cpu_seconds, p.fair_seconds, p.gain) == (10.0, 100, 20.0, 7.0, 0.1)
    assert p.steps_left == 90 and p.cpu_per_step is None  # steps seen, its baseline not yet taken
    [p] = progress([run(A, step=10, first_step=0, total=100, cpu_seconds=20.0)], {})
    assert p.cpu_per_step == 2.0


def test_srpt_gives_the_job_with_least_work_left_the_top_weight() -> None:
    jobs = [
        run(A, step=10, total=1000, cpu_seconds=10.0),  # 990 steps left at 1 s a step
        run(B, step=10, total=100, cpu_seconds=10.0),  # 90 left
        run(C, step=5),  # declared nothing: unknown size, last
    ]
    assert decide(jobs, {}, SRPT) == {B: 10_000, A: 100, C: 1}


def test_the_default_rule_runs_a_fresh_jobs_early_part_before_another_jobs_tail() -> None:
    # Both at 1 CPU-s a step: A is past its early part with 500 CPU-s left; B is fresh, its
    # early part (35 % of 1000 steps) worth 0.75 of a completion: 350 / 0.75 < 500.
    jobs = [
        run(A, step=500, first_step=0, total=1000, cpu_seconds=500.0),
        run(B, step=1, first_step=0, total=1000, cpu_seconds=1.0),
    ]
    fair = {A: 300.0, B: 1.0}  # A got more than its equal share: no aging, not late
    assert PriorityConfig().rule == "phased"
    assert decide(jobs, fair, PriorityConfig()) == {B: 10_000, A: 100}
    assert decide(jobs, fair, SRPT) == {A: 10_000, B: 100}


def test_rule_none_decides_nothing() -> None:
    assert decide([run(A, total=5)], {}, PriorityConfig(rule="none")) == {}
    assert decide([], {}, SRPT) == {}


def test_only_new_and_changed_weights_are_applied() -> None:
    assert changed({A: 100, B: 10_000, C: 1}, {A: 100, B: 1}) == {B: 10_000, C: 1}


# -- the shell --------------------------------------------------------------------------------
class Recording(FakeRuntime):
    """A fake worker that logs every weight it is asked to set; ``refuse``/``explode`` fail it."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.asked: list[tuple[ContainerId, int]] = []
        self.explode = False

    async def set_cpu_weight(self, container_id: ContainerId, weight: int) -> bool:
        self.asked.append((container_id, weight))
        if self.explode:
            raise RuntimeError("backend bug")
        return await super().set_cpu_weight(container_id, weight)


@pytest.fixture
def worker() -> Iterator[Recording]:
    volume = FakeVolume(FakeClock(100.0))
    yield Recording("w0", volume, capacity=Resources(cpu=2.0))


async def started(rt: Recording, *jobs: ContainerId) -> None:
    for job in jobs:
        rt.volume.script(job, JobScript())
        await rt.start(JobSpec(id=job, command=("train",)))


async def test_the_shell_applies_changed_weights_and_reports_those_in_effect(worker: Recording) -> None:
    await started(worker, A, B)
    shell = CpuWeights(worker, SRPT)
    # Both started at the first tick: 10 s later each has had 10 s of its equal share.
    jobs = [
        run(A, step=1, total=50, cpu_seconds=1.0, started=100.0),
        run(B, step=1, total=5, cpu_seconds=1.0, started=100.0),
    ]
    assert await shell.tick(jobs, 2.0, 100.0) == {B: 10_000, A: 100}
    assert worker.weights == {A: 100, B: 10_000}
    assert await shell.tick(jobs, 2.0, 110.0) == {B: 10_000, A: 100}
    assert sorted(worker.asked) == [(A, 100), (B, 10_000)]  # nothing changed: nothing re-applied
    assert shell.fair == {A: 10.0, B: 10.0}  # 10 s at one core each
    assert (shell.weight_of(A), shell.weight_of(C)) == (100, None)
    await shell.tick([jobs[0]], 2.0, 120.0)  # B left the worker
    assert shell.applied == {A: 10_000}


async def test_a_weight_the_runtime_refuses_is_counted_logged_once_and_retried(worker: Recording) -> None:
    await started(worker, A)
    worker.weights_supported = False
    shell = CpuWeights(worker, SRPT)
    with structlog.testing.capture_logs() as logs:
        for t in (0.0, 10.0, 20.0):
            await shell.tick([run(A, total=5)], 2.0, t)
    assert shell.failures == 3 and shell.weight_of(A) is None
    assert [e["event"] for e in logs] == ["specon.agent.cpu_weight_failed"]
    worker.weights_supported = True
    await shell.tick([run(A, total=5)], 2.0, 30.0)
    assert shell.weight_of(A) == 10_000 and worker.weights == {A: 10_000}


async def test_a_runtime_that_raises_never_stops_the_agent(worker: Recording) -> None:
    await started(worker, A)
    worker.explode = True
    shell = CpuWeights(worker, SRPT)
    with structlog.testing.capture_logs() as logs:
        await shell.tick([run(A, total=5)], 2.0, 0.0)
    assert shell.failures == 1 and "RuntimeError: backend bug" in logs[0]["error"]


async def test_fair_seconds_survive_a_restart_and_count_the_time_between(
    worker: Recording, tmp_path: Path
) -> None:
    await started(worker, A, B)
    path = state_path(tmp_path / "monitor.json")
    assert path == tmp_path / "monitor.priority.json"
    first = CpuWeights(worker, SRPT, state_file=path)
    jobs = [run(A, started=1000.0), run(B, started=1000.0)]
    await first.tick(jobs, 2.0, 1000.0)
    await first.tick(jobs, 2.0, 1010.0)
    assert json.loads(path.read_text()) == {
        "at": 1010.0,
        "fair_seconds": {"a": 10.0, "b": 10.0},
        "finished": {},
        "quality_points": {},
        "quality_version": 0,
    }
    again = CpuWeights(worker, SRPT, state_file=path)  # the agent restarted; the jobs ran on
    await again.tick(jobs, 2.0, 1040.0)
    assert again.fair == {A: 40.0, B: 40.0}
    again.forget([A])
    assert again.fair == {B: 40.0}


async def test_finished_jobs_are_measured_and_the_clusters_points_kept_across_a_restart(
    worker: Recording, tmp_path: Path
) -> None:
    await started(worker, A, B)
    path = state_path(tmp_path / "monitor.json")
    cfg = PriorityConfig(rule="phased", phased=phased.Args(quality_point="memory"))
    curve = tuple((float(k), max(0.0, 100.0 - k)) for k in range(1, 201))  # flat from step 100 of 200
    first = CpuWeights(worker, cfg, state_file=path)
    done = run(A, step=190, total=200, curve=curve, model="gru")
    half = run(B, step=100, total=200, curve=curve[:100], model="gru")
    await first.tick([done, half], 2.0, 1000.0)
    await first.tick([], 2.0, 1010.0)  # both gone: A had trained its steps, B only half
    assert first.finished == {A: pytest.approx(0.48)}  # 95 % of the fall, smoothed: for the manager
    assert first.shares == {} and first.quality_version == 0  # nothing from the manager yet
    first.learn(3, [QualityPoint("gru", 0.48), QualityPoint("vae", 0.2)])
    first.learn(None, [])  # a batch without points changes nothing
    again = CpuWeights(worker, cfg, state_file=path)  # the agent restarted
    assert (again.finished, again.shares, again.quality_version) == (first.finished, first.shares, 3)
    # A new gru job's quality point is its model's on the cluster: 48 % of its steps.
    assert progress([run(C, step=1, total=400, model="gru")], {}, again.shares)[
        0
    ].quality_memory == pytest.approx(0.48)
    again.forget([A])
    assert again.finished == {}


def test_a_job_moved_here_mid_training_is_not_measured() -> None:
    curve = tuple((float(k), 100.0 - k / 2) for k in range(100, 201))
    gone = run(A, step=200, total=200, curve=curve, model="gru")
    assert finished_shares([gone], []) == {}
    assert finished_shares([gone], [gone]) == {}  # still running


async def test_an_unreadable_priority_state_starts_afresh(worker: Recording, tmp_path: Path) -> None:
    path = tmp_path / "monitor.priority.json"
    path.write_text('{"fair_seconds": [1, 2]}')
    with structlog.testing.capture_logs() as logs:
        shell = CpuWeights(worker, SRPT, state_file=path)
    assert shell.fair == {} and logs[0]["event"] == "specon.agent.priority_state_unreadable"


async def test_rule_none_touches_nothing(worker: Recording, tmp_path: Path) -> None:
    await started(worker, A)
    path = tmp_path / "monitor.priority.json"
    shell = CpuWeights(worker, PriorityConfig(rule="none"), state_file=path)
    assert await shell.tick([run(A, total=5)], 2.0, 0.0) == {}
    assert worker.asked == [] and not path.exists()


# -- the agent ----------------------------------------------------------------------------------
def steady(step: int) -> float:
    return 200.0 - step


async def test_the_agent_weighs_its_running_containers_every_tick_and_reports_the_weights(
    tmp_path: Path,
) -> None:
    volume = FakeVolume(FakeClock(1000.0), root=tmp_path / "volume")
    rt = FakeRuntime("w0", volume, capacity=Resources(cpu=2.0))
    for job, steps in (("long", 1000), ("short", 100)):
        volume.script(job, JobScript(loss=steady))
        await rt.start(JobSpec(id=ContainerId(job), command=("train",), steps=steps))
    agent = Agent(
        runtime=rt,
        policy=make_policy(priority={"rule": "srpt"}),
        state_file=tmp_path / "state" / "monitor.json",
    )
    (tmp_path / "state").mkdir()
    try:
        await agent.refresh()
        await volume.clock.advance(10.0)
        await agent.sample_usage()
        agent.tick(volume.clock.now())
        await agent.apply_priority(volume.clock.now())
        short, long_ = ContainerId("short"), ContainerId("long")
        assert rt.weights == {short: 10_000, long_: 100}  # both at step 10: "short" has less left
        reports = {r.id: r.cpu_weight for r in agent.heartbeat(volume.clock.now()).containers}
        assert reports == {short: 10_000, long_: 100}
        assert agent.cpu_seconds == {short: 10.0, long_: 10.0}  # from the runtime's accounting
        assert (tmp_path / "state" / "monitor.priority.json").exists()
        # One leaves (saved away): it is no longer weighed, nor reported.
        await rt.save(long_, grace=1.0)
        await agent.refresh()
        await volume.clock.advance(10.0)
        await agent.apply_priority(volume.clock.now())
        assert agent.cpu_weights.applied == {short: 10_000}
        left = {r.id: r.cpu_weight for r in agent.heartbeat(volume.clock.now()).containers}
        assert left == {short: 10_000}
    finally:
        for w in agent.watched.values():
            w.tailer.close()


async def test_under_rule_none_the_agent_sets_and_reports_no_weight(tmp_path: Path) -> None:
    volume = FakeVolume(FakeClock(1000.0), root=tmp_path / "volume")
    rt = FakeRuntime("w0", volume)
    await rt.start(JobSpec(id=A, command=("train",), steps=10))
    agent = Agent(runtime=rt, policy=make_policy(priority={"rule": "none"}))
    try:
        await agent.refresh()
        await agent.apply_priority(volume.clock.now())
        assert rt.weights == {}
        assert [r.cpu_weight for r in agent.heartbeat(volume.clock.now()).containers] == [None]
    finally:
        for w in agent.watched.values():
            w.tailer.close()


# -- remaining work, for the manager's work model ----------------------------------------------
def test_remaining_work_is_steps_left_times_the_cpu_per_step_trained_here() -> None:
    # Restored at step 100, trained to 150 on 10 CPU-s here: 0.2 CPU-s a step, 350 steps left.
    r = run(A, step=150, first_step=100, total=500, cpu_seconds=10.0)
    assert r.cpu_per_step == pytest.approx(0.2)
    assert r.remaining_work == pytest.approx(70.0)
    assert (
        run(A, step=100, first_step=100, total=500, cpu_seconds=3.0).remaining_work is None
    )  # no step here yet
    assert (
        run(A, step=150, first_step=100, cpu_seconds=10.0).remaining_work is None
    )  # no total, no prediction
    predicted = run(A, step=150, first_step=100, cpu_seconds=10.0, predicted_steps=40.0)
    assert predicted.remaining_work == pytest.approx(8.0)
    assert run(A, step=600, first_step=100, total=500, cpu_seconds=10.0).remaining_work == 0.0


def watched(tmp_path: Path, steps: int | None = None) -> Watched:
    spec = JobSpec(id=ContainerId("j"), command=("train",), steps=steps)
    info = ContainerInfo(
        ContainerId("j"), WorkerId("w0"), spec, ContainerState.RUNNING, tmp_path / "p.jsonl", tmp_path, 0.0
    )
    return Watched(info, Tailer(tmp_path / "p.jsonl", ProgressConfig()), MonitorState())


def test_a_job_without_a_total_is_sized_by_its_loss_curve(tmp_path: Path) -> None:
    # Optimus' curve 1/(0.01 k + 1) + 0.5 is within 5 % of its floor at k = 19 / 0.01 = 1900.
    w = watched(tmp_path)
    assert predicted_steps(w) is None  # no curve yet
    for k in range(10, 1010, 10):
        append_curve(w, float(k), [1.0 / (0.01 * k + 1.0) + 0.5, math.nan])
        w.step = k
    left = predicted_steps(w)
    assert left == pytest.approx(900.0, rel=0.05)  # from step 1000
    assert w.fit.samples == w.curve_samples == 100
    assert predicted_steps(watched(tmp_path, steps=5000)) is None  # a declared total needs none
    w.tailer.close()


@pytest.mark.slow
def test_the_curve_is_refitted_only_once_it_grew_by_a_tenth_and_counts_down_between(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fits: list[int] = []
    real = remaining.steps_to_converge

    def counted(steps: Any, losses: Any) -> float | None:
        fits.append(len(steps))
        return real(steps, losses)

    monkeypatch.setattr(remaining, "steps_to_converge", counted)
    w = watched(tmp_path)
    lefts = []
    for k in range(10, 2010, 10):
        append_curve(w, float(k), [1.0 / (0.01 * k + 1.0) + 0.5])
        w.step = k
        lefts.append(predicted_steps(w))
    # 200 ticks, refitted at 1, 2, ..., then every 10 % more samples: a few dozen fits.
    assert len(fits) < 60
    assert all(b >= a * remaining.REFIT_GROWTH or b == a + 1 for a, b in itertools.pairwise(fits))
    # Between fits the steps left fall with the steps done.
    last = [x for x in lefts[-5:] if x is not None]
    assert last == sorted(last, reverse=True)
    for k in range(1000):
        append_curve(w, float(3000 + k), [1.0])
    assert len(w.curve) <= CURVE_POINTS  # thinned, never unbounded
    assert w.curve_samples == 1200
    w.tailer.close()


async def test_the_agent_reports_each_jobs_remaining_work(tmp_path: Path) -> None:
    volume = FakeVolume(FakeClock(1000.0), root=tmp_path / "volume")
    rt = FakeRuntime("w0", volume, capacity=Resources(cpu=2.0))
    volume.script("j", JobScript(loss=steady))
    await rt.start(JobSpec(id=ContainerId("j"), command=("train",), steps=1000))
    agent = Agent(runtime=rt, policy=make_policy(priority={"rule": "srpt"}), state_file=None)
    try:
        await agent.refresh()
        for _ in range(3):  # the baseline is taken at the second tick that reads steps
            await volume.clock.advance(10.0)
            await agent.sample_usage()
            agent.tick(volume.clock.now())
            await agent.apply_priority(volume.clock.now())
        (report,) = agent.heartbeat(volume.clock.now()).containers
        w = agent.watched[ContainerId("j")]
        assert w.step is not None and w.first_step is not None and w.step > w.first_step
        # Measured from its first step here, without what it used before: 1 core at 1 step/s.
        cost = (agent.cpu_seconds[ContainerId("j")] - w.first_cpu) / (w.step - w.first_step)
        assert cost == pytest.approx(1.0)
        assert report.remaining_work == pytest.approx((1000 - w.step) * cost)
    finally:
        for w in agent.watched.values():
            w.tailer.close()


async def test_start_up_cpu_between_a_ticks_sample_and_the_first_step_is_not_a_steps_cost(
    tmp_path: Path,
) -> None:
    """A tick samples the CPU, then reads the logs: a job that spent 5 CPU-s starting up after
    the sample and then logged its first steps is measured from the next tick's pair, at its
    steps' own 0.01 CPU-s (the pair of the first tick made it 0.26: 26 times longer)."""
    volume = FakeVolume(FakeClock(1000.0), root=tmp_path / "volume")
    rt = FakeRuntime("w0", volume, capacity=Resources(cpu=2.0))
    volume.script("j", JobScript(loss=steady))
    j = ContainerId("j")
    await rt.start(JobSpec(id=j, command=("train",), steps=1000))
    agent = Agent(runtime=rt, policy=make_policy(priority={"rule": "srpt"}), state_file=None)
    try:
        await agent.refresh()
        for sampled in (0.0, 5.0 + 20 * 0.01, 5.0 + 30 * 0.01):  # 1 step/s, 10 s a tick
            await volume.clock.advance(10.0)
            agent.cpu_seconds = {j: sampled}
            agent.tick(volume.clock.now())
            if sampled == 0.0:  # steps seen, no baseline yet: "not yet", never CPU over steps
                assert progress(agent.running_jobs(), {})[0].cpu_per_step is None
        w = agent.watched[j]
        assert (w.first_step, w.first_cpu) == (20, pytest.approx(5.2))
        assert agent.running_jobs()[0].cpu_per_step == pytest.approx(0.01)
    finally:
        for w in agent.watched.values():
            w.tailer.close()


def test_a_job_seen_at_its_first_step_is_not_weighed_by_its_start_up() -> None:
    """Its CPU so far is mostly imports and set-up: until it trains a step past the first one
    seen, its cost is unknown (its neighbours' median stands in), never CPU over steps. Else
    it looks 100x longer, goes last and, frozen on a GPU, never trains the step that would
    measure it."""
    long = Running(
        id=ContainerId("long"), started=0.0, step=60, total=320, cpu_seconds=1.6, first_step=10, first_cpu=1.5
    )
    new = Running(
        id=ContainerId("new"), started=5.0, step=5, total=160, cpu_seconds=1.2, first_step=5, first_cpu=1.2
    )
    assert new.cpu_per_step is None
    jobs = progress([long, new], {})
    assert [j.cpu_per_step for j in jobs] == [pytest.approx(0.002), None]
    got = decide([long, new], {}, PriorityConfig(rule="srpt"))
    assert got[ContainerId("new")] > got[ContainerId("long")]  # 160 steps left against 260


async def test_the_agent_reports_a_finished_jobs_quality_point_and_takes_the_clusters(tmp_path: Path) -> None:
    """Through the agent: a job of a known model trains its steps and exits; its ended report
    carries its measured quality point; a batch's quality points become the estimate's input and
    the heartbeats then say which version they hold."""
    volume = FakeVolume(FakeClock(1000.0), root=tmp_path / "volume")
    rt = FakeRuntime("w0", volume, capacity=Resources(cpu=1.0))
    volume.script("j", JobScript(loss=lambda step: max(1.0, 100.0 - step)))  # flat from step 99 of 200
    await rt.start(JobSpec(id=ContainerId("j"), command=("train",), steps=200, model="gru"))
    cfg = {"rule": "phased", "phased": phased.Args(quality_point="memory")}
    agent = Agent(runtime=rt, policy=make_policy(priority=cfg), state_file=None)
    try:
        for _ in range(25):  # past its 200 steps at 1 step/s
            await agent.refresh()
            await volume.clock.advance(10.0)
            await agent.sample_usage()
            agent.tick(volume.clock.now())
            await agent.apply_priority(volume.clock.now())
        (report,) = agent.heartbeat(volume.clock.now()).containers
        assert report.phase == "finished" and report.job["model"] == "gru"
        assert report.quality_share == pytest.approx(0.48, abs=0.06)  # 95 % of its fall, by tick
        assert agent.heartbeat(volume.clock.now()).quality_version == 0  # none yet
        agent.acknowledge(CommandBatch(manager_time=1.0, policy_generation=1, quality_version=4,
                                       quality=(QualityPoint("gru", 0.45),)))  # fmt: skip
        assert agent.cpu_weights.shares == {"gru": 0.45}
        assert agent.heartbeat(volume.clock.now()).quality_version == 4
    finally:
        for w in agent.watched.values():
            w.tailer.close()
