"""The coordinator's quality memory: a finished job's measured quality point counted once, from
the worker it ran on; each model's median sent to every agent that holds another version, once
the memory is durable; journaled across a restart."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from specon.coordinator.effects import MemoryJournal, PutQuality, write
from specon.coordinator.inline import InlineCoordinator
from specon.policy.quality_memory import QualityMemory
from specon.wire.protocol import ContainerReport, Heartbeat, QualityPoint
from tests.unit.manager_fakes import FakeAgent, FakeClock, coordinator, report


def _job(
    cid: str, model: str = "gru", *, share: float | None = None, phase: str = "running"
) -> ContainerReport:
    rep = report(cid, phase="finished" if share is not None else phase)  # type: ignore[arg-type]
    return dataclasses.replace(rep, job={"model": model}, quality_share=share)


def _holding(hb: Heartbeat, version: int | None = 0) -> Heartbeat:
    return dataclasses.replace(hb, quality_version=version)


def _ran_and_finished(
    coord: InlineCoordinator, agent: FakeAgent, cid: str, share: float, model: str = "gru"
) -> None:
    coord.on_heartbeat(agent.heartbeat(_job(cid, model)))
    coord.on_heartbeat(agent.heartbeat(_job(cid, model, share=share)))


def test_finished_jobs_are_counted_once_and_sent_to_agents_that_do_not_hold_them(
    tmp_path: Path, clock: FakeClock
) -> None:
    coord = coordinator(tmp_path, clock)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    first = coord.on_heartbeat(_holding(a.heartbeat(_job("j0"))))
    assert first.quality_version is None and first.quality == ()  # nothing known yet
    _ran_and_finished(coord, a, "j1", 0.4)
    _ran_and_finished(coord, a, "j2", 0.2, "vae")
    for _ in range(3):  # the agent reports its ended jobs for a while: counted once
        again = coord.on_heartbeat(_holding(a.heartbeat(_job("j1", share=0.4), _job("j2", "vae", share=0.2))))
    assert again.quality_version == 2
    assert again.quality == (QualityPoint("gru", 0.4), QualityPoint("vae", 0.2))
    assert coord.on_heartbeat(_holding(a.heartbeat(), 2)).quality_version is None  # it holds them
    # Another worker's job of the same model: the median moves, every agent is sent it.
    _ran_and_finished(coord, b, "k1", 0.6)
    assert (
        dict((p.model, p.share) for p in coord.on_heartbeat(_holding(b.heartbeat(), 2)).quality)["gru"] == 0.5
    )
    assert coord.on_heartbeat(_holding(a.heartbeat(), 2)).quality_version == 3
    # An agent before protocol 1.7 says nothing of what it holds: it is sent nothing.
    assert coord.on_heartbeat(_holding(a.heartbeat(), None)).quality_version is None


def test_a_job_that_left_the_window_is_not_counted_again(tmp_path: Path, clock: FakeClock) -> None:
    coord = coordinator(tmp_path, clock)
    a = FakeAgent("a", clock)
    for i in range(20):  # more than a model keeps
        coord.on_heartbeat(a.heartbeat(_job(f"j{i}")))
    ended = tuple(_job(f"j{i}", share=0.3) for i in range(20))
    coord.on_heartbeat(a.heartbeat(*ended))
    version = coord.core.quality.version
    for _ in range(5):
        coord.on_heartbeat(a.heartbeat(*ended))
    coord.step(rebalance=True)  # the finished marks journaled
    assert coord.core.quality.version == version == 20


def test_only_a_job_seen_running_on_that_worker_with_a_measure_and_a_model_counts(
    tmp_path: Path, clock: FakeClock
) -> None:
    coord = coordinator(tmp_path, clock)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    coord.on_heartbeat(
        a.heartbeat(_job("on-a"), _job("long-name", "x" * 64), _job("unmeasured"), _job("failed"))
    )
    # b claims a's job, and a job nobody ever saw run: neither counts.
    coord.on_heartbeat(b.heartbeat(_job("on-a", share=0.1), _job("never-ran", share=0.1)))
    failed = dataclasses.replace(_job("failed", share=0.3), phase="failed")
    running = _job("r", share=None)
    coord.on_heartbeat(
        a.heartbeat(_job("long-name", "x" * 64, share=0.3), _job("unmeasured", share=None), failed, running)
    )
    assert coord.core.quality.version == 0
    coord.on_heartbeat(a.heartbeat(_job("on-a", share=0.3)))
    assert coord.core.quality.shares() == {"gru": 0.3}


def test_the_memory_survives_a_manager_restart(tmp_path: Path, clock: FakeClock) -> None:
    coord = coordinator(tmp_path, clock)
    a = FakeAgent("a", clock)
    _ran_and_finished(coord, a, "j1", 0.4)
    restarted = coordinator(tmp_path, clock)  # the same journal, read back
    assert restarted.core.quality == coord.core.quality
    got = restarted.on_heartbeat(_holding(a.heartbeat(_job("j1", share=0.4))))  # not counted twice
    assert (got.quality_version, got.quality) == (1, (QualityPoint("gru", 0.4),))


def test_points_wait_for_the_journal_and_a_request_gets_none(tmp_path: Path, clock: FakeClock) -> None:
    coord = coordinator(tmp_path, clock)
    a = FakeAgent("a", clock)
    coord.on_heartbeat(a.heartbeat(_job("j1")))
    coord.core.heartbeat(a.heartbeat(_job("j1", share=0.4)), clock())  # not yet journaled
    assert coord.core.batch_for(a.worker, clock(), ack=1, quality_held=0).quality_version is None
    coord.perform()  # the write made durable
    assert coord.core.batch_for(a.worker, clock(), ack=1, quality_held=0).quality_version == 1
    assert coord.core.batch_for(a.worker, clock()).quality_version is None  # no heartbeat said what it holds


def test_a_measure_that_comes_a_heartbeat_after_the_job_ended_counts(
    tmp_path: Path, clock: FakeClock
) -> None:
    """The agent measures a job a tick after it ended: its first finished report has no point."""
    coord = coordinator(tmp_path, clock)
    a = FakeAgent("a", clock)
    coord.on_heartbeat(a.heartbeat(_job("j1")))
    coord.on_heartbeat(a.heartbeat(_job("j1", phase="finished")))
    coord.step(rebalance=True)  # its finished mark journaled
    coord.on_heartbeat(a.heartbeat(_job("j1", share=0.4)))
    assert coord.core.quality.shares() == {"gru": 0.4}
    restarted = coordinator(tmp_path, clock)  # counted once, also by the next manager
    restarted.on_heartbeat(a.heartbeat(_job("j1", share=0.4)))
    assert restarted.core.quality.version == 1


def test_a_batch_writes_the_memory_once_whatever_number_of_jobs_it_counted() -> None:
    """Many jobs ending in one heartbeat: each count holds the whole memory, only the last is written."""

    class Counting(MemoryJournal):
        def __init__(self) -> None:
            super().__init__()
            self.meta_writes = 0

        def set_meta(self, key: str, value: str) -> None:
            self.meta_writes += 1
            super().set_meta(key, value)

    mems = [QualityMemory()]
    for i in range(3):
        got = mems[-1].finished("gru", f"j{i}", 0.1 * (i + 1), "w")
        assert got is not None
        mems.append(got)
    journal = Counting()
    assert write(journal, [PutQuality(i + 1, m) for i, m in enumerate(mems[1:])]) == 3
    assert journal.meta_writes == 1
    assert QualityMemory.from_text(journal.meta["quality_memory"]) == mems[-1]
