"""The in-memory runtime the daemons' unit tests stand on: it must keep the real contract."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from specon.model import ContainerId, Resources
from specon.runtime import (
    AlreadyRunning,
    ContainerState,
    JobSpec,
    NoSuchContainer,
    Runtime,
    SaveFailed,
    StartFailed,
    StillRunning,
)
from specon.testing.fake_runtime import FakeClock, FakeRuntime, FakeVolume, JobScript

JOB = JobSpec(id=ContainerId("vae-1"), command=("train",), steps=20, requests=Resources(cpu=1.0))


def cluster(
    *, autojump: bool = False, root: Path | None = None
) -> tuple[FakeVolume, FakeRuntime, FakeRuntime]:
    volume = FakeVolume(FakeClock(autojump=autojump), root=root)
    return volume, FakeRuntime("w0", volume, capacity=Resources(cpu=2.0)), FakeRuntime("w1", volume)


def steps(volume: FakeVolume, job: str) -> list[int]:
    return [int(r["step"]) for r in volume.records(job) if "loss" in r]


def test_fake_runtime_is_a_runtime() -> None:
    _, w0, _ = cluster()
    assert isinstance(w0, Runtime)


async def test_a_started_job_makes_scripted_progress_with_the_clock() -> None:
    volume, w0, _ = cluster()
    volume.script("vae-1", JobScript(steps_per_second=2.0, loss=lambda s: 10.0 - s))
    info = await w0.start(JOB)
    assert (info.state, info.worker, info.finished) == (ContainerState.RUNNING, "w0", False)

    await volume.clock.advance(3.0)

    assert steps(volume, "vae-1") == [1, 2, 3, 4, 5, 6]
    assert volume.records("vae-1")[-1]["loss"] == 4.0
    [listed] = await w0.list_containers()
    assert listed.state is ContainerState.RUNNING and listed.progress_path.name == "progress.jsonl"


async def test_usage_reports_cpu_share_of_the_worker_budget() -> None:
    volume, w0, _ = cluster()
    await w0.start(JOB)
    await volume.clock.advance(10.0)
    usage = await w0.usage()
    assert usage.cpu_utilisation == pytest.approx(0.5)  # one busy core of two
    assert usage.cpu_seconds == pytest.approx(10.0)
    assert [(c, round(s, 9)) for c, s in usage.per_container] == [("vae-1", 10.0)]
    assert usage.capacity == Resources(cpu=2.0)


async def test_save_then_start_elsewhere_resumes_and_finishes_with_exactly_n_steps() -> None:
    volume, w0, w1 = cluster()
    await w0.start(JOB)
    await volume.clock.advance(7.0)

    saved = await w0.save(JOB.id, grace=30)

    assert (saved.step, saved.forced, saved.rolled_back, saved.finished) == (7, False, False, False)
    assert saved.checkpoint is not None and saved.checkpoint.name == "ckpt-000000000007.json"
    assert await w0.list_containers() == []

    await w1.start(JOB, checkpoint=saved.checkpoint)
    await volume.clock.advance(100.0)

    [done] = await w1.list_containers()
    assert (done.state, done.exit_code, done.finished) == (ContainerState.EXITED, 0, True)
    assert steps(volume, "vae-1") == list(range(1, 21))
    assert volume.records("vae-1")[-1]["event"] == "finished"
    await w1.forget(JOB.id)
    assert await w1.list_containers() == []


async def test_a_job_never_runs_twice_on_the_shared_volume() -> None:
    _, w0, w1 = cluster()
    await w0.start(JOB)
    for rt in (w0, w1):
        with pytest.raises(AlreadyRunning, match="already running on worker w0"):
            await rt.start(JOB)


async def test_save_timeout_kills_and_rolls_back_to_the_last_periodic_checkpoint() -> None:
    volume, w0, _ = cluster(autojump=True)
    volume.script("vae-1", JobScript(checkpoint_every=5))
    await w0.start(JOB)
    await volume.clock.advance(12.0)
    w0.fail_next_save("timeout")

    saved = await w0.save(JOB.id, grace=2)

    assert (saved.step, saved.forced, saved.rolled_back, saved.seconds) == (10, True, True, 2)
    assert volume.clock.now() == pytest.approx(14.0)  # the grace period passed
    assert await w0.list_containers() == []


async def test_save_timeout_without_any_checkpoint_restarts_from_zero() -> None:
    volume, w0, w1 = cluster(autojump=True)
    await w0.start(JOB)
    await volume.clock.advance(4.0)
    w0.fail_next_save("timeout")
    saved = await w0.save(JOB.id, grace=1)
    assert (saved.step, saved.checkpoint, saved.forced) == (None, None, True)
    await w1.start(JOB)
    assert volume.records("vae-1")[-1] == {"event": "resumed", "step": 0, "worker": "w1", "time": 5.0}


async def test_save_error_leaves_the_job_running() -> None:
    _, w0, _ = cluster()
    await w0.start(JOB)
    w0.fail_next_save("error")
    with pytest.raises(SaveFailed, match="left running"):
        await w0.save(JOB.id, grace=1)
    [info] = await w0.list_containers()
    assert info.state is ContainerState.RUNNING


async def test_injected_start_failure_happens_once() -> None:
    _, w0, _ = cluster()
    w0.fail_next_start("no room")
    with pytest.raises(StartFailed, match="no room"):
        await w0.start(JOB)
    assert (await w0.start(JOB)).state is ContainerState.RUNNING
    assert [c for c, _ in w0.calls] == ["start", "start"]


async def test_start_refuses_an_unknown_checkpoint_and_a_finished_job(tmp_path: Path) -> None:
    volume, w0, w1 = cluster()
    with pytest.raises(StartFailed, match="does not verify"):
        await w0.start(JOB, checkpoint=tmp_path / "ckpt-000000000003.json")
    await w0.start(JOB)
    await volume.clock.advance(50.0)
    with pytest.raises(StartFailed, match="finished"):
        await w1.start(JOB)


async def test_corrupt_latest_checkpoint_resumes_from_the_previous_one() -> None:
    volume, w0, w1 = cluster()
    volume.script("vae-1", JobScript(checkpoint_every=4))
    await w0.start(JOB)
    await volume.clock.advance(9.0)
    await w0.stop(JOB.id, grace=1)  # checkpoints step 9 on SIGTERM
    volume.corrupt_latest_checkpoint("vae-1")
    await w0.forget(JOB.id)
    await w1.start(JOB)
    assert volume.records("vae-1")[-1]["step"] == 8


async def test_wrong_worker_running_forget_and_crash() -> None:
    _, w0, w1 = cluster()
    await w0.start(JOB)
    with pytest.raises(NoSuchContainer):
        await w1.save(JOB.id, grace=1)
    with pytest.raises(StillRunning):
        await w0.forget(JOB.id)
    w0.crash(JOB.id, exit_code=3)
    [info] = await w0.list_containers()
    assert (info.state, info.exit_code) == (ContainerState.FAILED, 3)
    await w0.forget(JOB.id)
    assert await w0.list_containers() == []


async def test_progress_files_follow_the_clock_when_the_volume_has_a_root(tmp_path: Path) -> None:
    volume, w0, _ = cluster(root=tmp_path)
    info = await w0.start(JOB)
    await volume.clock.advance(3.0)
    lines = [json.loads(x) for x in info.progress_path.read_text().splitlines()]
    assert info.progress_path == tmp_path / "jobs" / "vae-1" / "progress.jsonl"
    assert [r.get("step") for r in lines] == [0, 1, 2, 3]


async def test_sleepers_wake_in_deadline_order_only_when_time_reaches_them() -> None:
    clock = FakeClock(100.0)
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.now()))

    tasks = [asyncio.create_task(sleeper("late", 5)), asyncio.create_task(sleeper("early", 2))]
    await asyncio.sleep(0)
    await clock.advance(1)
    assert woke == []
    await clock.advance(10)
    assert woke == [("early", 102.0), ("late", 105.0)]
    assert clock.now() == 111.0
    await asyncio.gather(*tasks)


async def test_clock_refuses_to_go_backwards() -> None:
    with pytest.raises(ValueError, match="cannot advance"):
        await FakeClock().advance(-1)
