"""Each job's loss window: built from ticks, resampled, thinned, and sent only when it changed
(or due again) -- first on its own, then through a real ``Agent`` on the fake runtime."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from specon_agent.core import Agent
from specon_agent.window import EVERY_BEATS, KEPT, POINTS, RESEND_BEATS, LossWindows, build_window, step_rate

from specon.model import Category, ContainerId, Resources, WorkerId
from specon.runtime import JobSpec
from specon.testing.fake_runtime import FakeClock, FakeRuntime, FakeVolume, JobScript
from specon.wire import protocol
from specon.wire.limits import MAX_WINDOW_POINTS
from specon.wire.protocol import STEPS_LABEL, ContainerReport, Heartbeat
from specon.wire.status import LossWindow
from tests.unit.manager_fakes import policy

TICK = 10.0


def test_a_linear_curve_is_resampled_exactly_at_evenly_spaced_steps() -> None:
    # Uneven steps per tick; the loss falls by 0.001 a step, so interpolation is exact.
    steps = [0, 7, 30, 31, 90, 200]
    ticks = [(float(i), s, 1.0 - 0.001 * s) for i, s in enumerate(steps)]
    w = build_window(ticks, "train_loss")
    assert (w.first_step, w.last_step, w.metric) == (0, 200, "train_loss")
    assert len(w.loss) == len(steps)
    expected = [1.0 - 0.001 * 200 * i / (len(steps) - 1) for i in range(len(steps))]
    assert w.loss == pytest.approx(expected, abs=1e-9)


def test_a_window_holds_at_most_its_points_and_rounds_its_losses() -> None:
    ticks = [(float(i), 10 * i, 1 / (i + 3)) for i in range(500)]
    w = build_window(ticks, "loss")
    assert len(w.loss) == POINTS <= MAX_WINDOW_POINTS
    assert all(v == float(f"{v:.5g}") for v in w.loss)  # 5 significant digits: a plot needs no more
    assert w.loss[0] == pytest.approx(1 / 3, rel=1e-4) and w.loss[-1] == pytest.approx(1 / 502, rel=1e-4)


def test_ticks_at_one_step_make_one_point_their_mean() -> None:
    w = build_window([(0.0, 5, 1.0), (1.0, 5, 3.0)], "loss")
    assert (w.first_step, w.last_step, w.loss) == (5, 5, (2.0,))


def test_the_step_rate_is_steps_over_seconds_and_unknown_without_two_ticks_apart() -> None:
    assert step_rate([(0.0, 0, 1.0), (10.0, 50, 1.0)]) == 5.0
    assert step_rate([(0.0, 0, 1.0)]) is None
    assert step_rate([(3.0, 0, 1.0), (3.0, 9, 1.0)]) is None


class _Config:
    def __init__(self, metric: str) -> None:
        self.metric = metric


class _Tailer:
    def __init__(self, metric: str) -> None:
        self.config = _Config(metric)


class _Job:
    """What the windows read of a watched job: its step and its tailer's metric."""

    def __init__(self, step: int | None, metric: str = "loss") -> None:
        self.step = step
        self.tailer = _Tailer(metric)


def test_whatever_a_log_says_the_window_is_one_the_manager_accepts() -> None:
    windows = LossWindows()
    a, b = ContainerId("a"), ContainerId("b")
    huge = 1.7976931348623157e308
    for i, (step, values) in enumerate(
        [(-5, [1.0]), (0, [huge, huge]), (1, [-huge]), (10**12, [huge]), (2**64, [1.0])]
    ):
        windows.tick(1e-6 * i, {a: values}, {a: _Job(step, metric="m" * 2000)})  # type: ignore[dict-item]
    w = windows.report(a)
    assert w is not None and (w.first_step, w.last_step) == (
        0,
        10**12,
    )  # the negative and the 2**64 step left out
    assert w.steps_per_second is None  # 10**12 steps in 2 µs: no rate the wire carries
    assert len(w.metric) == 512 and all(abs(v) <= huge for v in w.loss)
    hb = Heartbeat(
        worker=WorkerId("w0"),
        address="w0:7701",
        seq=1,
        sent_at=1.0,
        capacity=Resources(cpu=1.0),
        usage=0.0,
        containers=(ContainerReport(id=a, category=Category.PROGRESSING, window=w),),
    )
    assert protocol.decode(protocol.encode(hb), Heartbeat) == hb
    windows.tick(5.0, {b: [float("nan"), float("inf")]}, {a: _Job(3), b: _Job(3)})  # type: ignore[dict-item]
    assert windows.report(b) is None  # nothing finite: no point


def _beats_until_sent(windows: LossWindows, cid: ContainerId, most: int) -> tuple[int, LossWindow | None]:
    for beat in range(1, most + 1):
        w = windows.report(cid)
        if w is not None:
            return beat, w
    return most, None


def test_a_window_is_sent_at_once_then_when_changed_every_few_beats_and_unchanged_seldom() -> None:
    windows = LossWindows()
    a = ContainerId("a")
    assert windows.report(a) is None  # never ticked
    windows.tick(0.0, {a: [2.0, 1.0]}, {a: _Job(10)})  # type: ignore[dict-item]
    first = windows.report(a)
    assert first is not None and first.loss == (1.5,)  # the first heartbeat after its first tick
    windows.tick(10.0, {a: [0.5]}, {a: _Job(20)})  # type: ignore[dict-item]
    beats, changed = _beats_until_sent(windows, a, EVERY_BEATS)
    assert changed is not None and changed.last_step == 20 and changed.steps_per_second == 1.0
    # Unchanged, it is sent again only after RESEND_BEATS (a manager that restarted gets it back).
    beats, again = _beats_until_sent(windows, a, RESEND_BEATS)
    assert (beats, again) == (RESEND_BEATS, changed)
    windows.tick(20.0, {a: [0.25]}, {a: _Job(30)})  # type: ignore[dict-item]
    beats, latest = _beats_until_sent(windows, a, RESEND_BEATS)
    assert beats == EVERY_BEATS and latest is not None and latest.last_step == 30


def test_jobs_adopted_together_send_their_windows_on_different_heartbeats() -> None:
    windows = LossWindows()
    ids = [ContainerId(f"job-{i}") for i in range(24)]
    windows.tick(0.0, {cid: [1.0] for cid in ids}, {cid: _Job(1) for cid in ids})  # type: ignore[misc]
    assert all(windows.report(cid) is not None for cid in ids)  # the first: at once, all of them
    windows.tick(1.0, {cid: [0.5] for cid in ids}, {cid: _Job(2) for cid in ids})  # type: ignore[misc]
    per_beat = [sum(windows.report(cid) is not None for cid in ids) for _ in range(EVERY_BEATS)]
    assert sum(per_beat) == len(ids) and max(per_beat) < len(ids) // 2


def test_values_without_a_step_make_no_point_and_unwatched_jobs_are_forgotten() -> None:
    windows = LossWindows()
    a, b = ContainerId("a"), ContainerId("b")
    windows.tick(0.0, {a: [1.0], b: [1.0]}, {a: _Job(None), b: _Job(3)})  # type: ignore[dict-item]
    assert windows.report(a) is None and windows.report(b) is not None
    windows.tick(1.0, {}, {})
    assert windows.report(b) is None


def test_a_job_that_starts_over_starts_a_new_window_and_a_long_one_is_thinned() -> None:
    windows = LossWindows()
    a = ContainerId("a")
    for i in range(KEPT + 1):
        windows.tick(float(i), {a: [1.0 / (i + 1)]}, {a: _Job(100 + i)})  # type: ignore[dict-item]
    w = windows.report(a)
    assert w is not None and (w.first_step, w.last_step) == (100, 100 + KEPT)  # the first and newest stay
    windows.tick(999.0, {a: [5.0]}, {a: _Job(3)})  # type: ignore[dict-item]
    _, restarted = _beats_until_sent(windows, a, EVERY_BEATS)
    assert restarted is not None and (restarted.first_step, restarted.last_step, restarted.loss) == (
        3,
        3,
        (5.0,),
    )


# --- through the agent ---------------------------------------------------------------------------


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[FakeRuntime]:
    volume = FakeVolume(FakeClock(1000.0), root=tmp_path / "volume")
    yield FakeRuntime("w0", volume)


async def _ticked(agent: Agent, rt: FakeRuntime, n: int) -> None:
    for _ in range(n):
        await rt.volume.clock.advance(TICK)
        await agent.refresh()
        agent.tick(rt.volume.clock.now())


def _report(agent: Agent, rt: FakeRuntime) -> ContainerReport:
    hb = agent.heartbeat(rt.volume.clock.now())
    # Every heartbeat the agent builds is one the manager accepts.
    assert protocol.decode(protocol.encode(hb), Heartbeat) == hb
    (rep,) = hb.containers
    return rep


async def test_the_agent_s_heartbeat_carries_the_window_when_a_tick_changed_it(runtime: FakeRuntime) -> None:
    runtime.volume.script("job", JobScript(steps_per_second=2.0, loss=lambda s: 10.0 / (s + 1)))
    await runtime.start(
        JobSpec(id=ContainerId("job"), command=("train",), requests=Resources(cpu=1.0), steps=900)
    )
    agent = Agent(runtime=runtime, policy=policy(), address="w0:7701")
    try:
        await agent.refresh()
        await _ticked(agent, runtime, 3)
        rep = _report(agent, runtime)
        assert rep.job[STEPS_LABEL] == "900"
        w = rep.window
        assert w is not None and w.metric == "loss" and len(w.loss) == 3
        assert w.last_step == rep.step and w.loss[0] > w.loss[-1]  # the loss falls
        assert w.steps_per_second == pytest.approx(2.0)
        assert _report(agent, runtime).window is None  # just sent: not again
        await _ticked(agent, runtime, 1)
        sent = [_report(agent, runtime).window for _ in range(EVERY_BEATS)]
        assert sum(w is not None for w in sent) == 1  # the changed window, once due
        again = next(w for w in sent if w is not None)
        assert len(again.loss) == 4
    finally:
        for w in agent.watched.values():
            w.tailer.close()
