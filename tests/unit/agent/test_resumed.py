"""When a restarted job trains again, told by where its records lie in the log, not by
comparing another host's timestamps with this host's clock (``specon_agent.resumed``)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest
from specon_agent.resumed import first_record_after, first_record_time, log_size

from specon.model import ContainerId, WorkerId
from specon.runtime import ContainerInfo, ContainerState, JobSpec
from specon.testing.fake_runtime import JobScript
from specon.wire.protocol import Action
from tests.unit.agent.test_core import World, command, execute, spec, world  # noqa: F401 (a fixture)

START = 1000.0


def append(path: Path, *records: dict[str, Any], tail: str = "") -> None:
    with open(path, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
        f.write(tail)


def test_an_earlier_runs_record_from_a_clock_ahead_is_not_taken_for_the_new_runs(tmp_path: Path) -> None:
    log = tmp_path / "progress.jsonl"
    # The source host, five minutes ahead, wrote the last records before the save.
    append(log, {"step": 50, "loss": 0.1, "ts": START + 300}, {"event": "checkpointed", "ts": START + 301})
    offset = log_size(log)

    assert first_record_time(log, offset, START, START + 2) is None
    append(log, {"event": "started", "step": 50, "ts": START + 1.5})
    assert first_record_time(log, offset, START, START + 2) == START + 1.5


def test_a_record_at_or_before_the_start_is_passed_over(tmp_path: Path) -> None:
    log = tmp_path / "progress.jsonl"
    append(log, {"event": "launched", "time": START}, {"step": 1, "loss": 1.0, "time": START + 0.5})

    assert first_record_time(log, 0, START, START + 1) == START + 0.5


def test_a_record_without_a_time_counts_when_it_is_seen_and_a_future_one_is_capped(tmp_path: Path) -> None:
    log = tmp_path / "progress.jsonl"
    append(log, {"step": 1, "loss": 1.0})
    assert first_record_time(log, 0, START, START + 3) == START + 3

    ahead = tmp_path / "ahead.jsonl"
    append(ahead, {"step": 1, "loss": 1.0, "ts": START + 3600})
    assert first_record_time(ahead, 0, START, START + 3) == START + 3


def test_half_lines_and_junk_are_not_records(tmp_path: Path) -> None:
    log = tmp_path / "progress.jsonl"
    log.write_text('not json\n[1, 2]\n{"step": 1, "loss": 1.0, "ts": 10')  # the last one half-written
    assert first_record_time(log, 0, START, START + 1) is None


def test_a_log_shorter_than_the_offset_was_replaced_and_is_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "progress.jsonl"
    append(log, {"step": 1, "loss": 1.0, "ts": START + 1})
    assert first_record_time(log, 10_000, START, START + 2) == START + 1


def test_no_log_or_not_a_regular_file_has_no_record(tmp_path: Path) -> None:
    assert log_size(tmp_path / "missing") == 0
    assert first_record_time(tmp_path / "missing", 0, START, START + 1) is None
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert log_size(fifo) == 0
    assert first_record_time(fifo, 0, START, START + 1) is None  # never waits on a writer


async def test_a_start_after_a_source_whose_clock_is_ahead_reports_the_new_runs_first_record(
    world: World,  # noqa: F811 (the fixture imported above)
) -> None:
    """The regression: the log's last record, from a source host five minutes ahead, once
    ended the wait at once and was reported as the restart time."""
    world.volume.script("a", JobScript(steps_per_second=2.0))
    progress = world.volume.paths(ContainerId("a")).progress
    progress.parent.mkdir(parents=True, exist_ok=True)
    began = world.clock.now()
    append(
        progress,
        {"step": 7, "loss": 0.5, "time": began + 300},
        {"event": "checkpointed", "time": began + 300},
    )
    agent = world.agent(world.w1)

    world.volume.submit(spec("a"))
    res = await execute(agent, world.clock, command("start-a", Action.START, "a"))

    # The new run's first step, on this clock.
    assert res.ok and res.finished_at == pytest.approx(began + 0.5)


class _Listing:
    """A runtime whose listing of the copy is scripted, one answer per poll."""

    def __init__(self, info: ContainerInfo, answers: list[ContainerState | None]) -> None:
        self.info, self.answers, self.t = info, answers, 0.0

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds

    async def list_containers(self) -> list[ContainerInfo]:
        state = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return [] if state is None else [dataclasses.replace(self.info, state=state)]


def _copy(tmp_path: Path) -> ContainerInfo:
    return ContainerInfo(
        id=ContainerId("a"),
        worker=WorkerId("w1"),
        spec=JobSpec(id=ContainerId("a"), command=("train",)),
        state=ContainerState.RUNNING,
        progress_path=tmp_path / "progress.jsonl",
        checkpoint_dir=tmp_path / "ckpt",
        started_at=0.0,
    )


async def test_a_copy_not_yet_listed_is_waited_for_and_one_that_ends_never_ran(tmp_path: Path) -> None:
    # A watch cache may not list a pod just created: that is no sign it ended.
    rt = _Listing(_copy(tmp_path), [None, None, ContainerState.RUNNING, ContainerState.FAILED])
    first = await first_record_after(rt, rt.info, 0.0, 0, timeout=10.0)  # type: ignore[arg-type]
    assert first.never_ran and first.ended is not None and not first.vanished
    assert first.at == pytest.approx(0.15)


async def test_a_copy_that_vanishes_after_it_was_listed_never_ran(tmp_path: Path) -> None:
    rt = _Listing(_copy(tmp_path), [ContainerState.RUNNING, None])
    first = await first_record_after(rt, rt.info, 0.0, 0, timeout=10.0)  # type: ignore[arg-type]
    assert first.never_ran and first.vanished


async def test_a_copy_that_runs_silently_until_the_timeout_counts_as_running(tmp_path: Path) -> None:
    rt = _Listing(_copy(tmp_path), [None, ContainerState.RUNNING])
    first = await first_record_after(rt, rt.info, 0.0, 0, timeout=1.0)  # type: ignore[arg-type]
    assert not first.never_ran and first.at >= 1.0


async def test_a_record_written_just_before_the_copy_ended_counts(tmp_path: Path) -> None:
    info = _copy(tmp_path)
    rt = _Listing(info, [ContainerState.RUNNING, ContainerState.EXITED])
    orig = rt.list_containers

    async def listing_after_a_record() -> list[ContainerInfo]:
        out = await orig()
        if out and out[0].state is ContainerState.EXITED:
            info.progress_path.write_text(json.dumps({"step": 1, "loss": 1.0, "ts": 0.05}) + "\n")
        return out

    rt.list_containers = listing_after_a_record  # type: ignore[method-assign]
    first = await first_record_after(rt, info, 0.0, 0, timeout=10.0)  # type: ignore[arg-type]
    assert not first.never_ran and first.at == 0.05
