"""The coordinator's quality memory: finished jobs' measured quality points in (once each),
each model's median out to every agent that does not hold it yet, journaled across a restart."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from specon.wire.protocol import ContainerReport, Heartbeat, QualityPoint
from tests.unit.manager_fakes import FakeAgent, FakeClock, coordinator, report


def _finished(cid: str, model: str, share: float | None) -> ContainerReport:
    return dataclasses.replace(report(cid, phase="finished"), job={"model": model}, quality_share=share)


def _holding(hb: Heartbeat, version: int | None) -> Heartbeat:
    return dataclasses.replace(hb, quality_version=version)


def test_finished_jobs_are_counted_once_and_sent_to_agents_that_do_not_hold_them(
    tmp_path: Path, clock: FakeClock
) -> None:
    coord = coordinator(tmp_path, clock)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    first = coord.on_heartbeat(a.heartbeat(report("j0")))
    assert first.quality_version is None and first.quality == ()  # nothing known yet
    coord.on_heartbeat(a.heartbeat(_finished("j1", "gru", 0.4), _finished("j2", "vae", 0.2)))
    again = coord.on_heartbeat(a.heartbeat(_finished("j1", "gru", 0.4), _finished("j2", "vae", 0.2)))
    assert again.quality_version == 2  # the repeated reports counted nothing
    assert again.quality == (QualityPoint("gru", 0.4), QualityPoint("vae", 0.2))
    assert coord.on_heartbeat(_holding(a.heartbeat(), 2)).quality_version is None  # it holds them
    # Another worker's job of the same model: the median moves, every agent is sent it.
    got = coord.on_heartbeat(_holding(b.heartbeat(_finished("k1", "gru", 0.6)), 2))
    assert got.quality_version == 3 and dict((p.model, p.share) for p in got.quality)["gru"] == 0.5
    assert coord.on_heartbeat(_holding(a.heartbeat(), 2)).quality_version == 3


def test_only_a_finished_job_with_a_measure_and_a_model_counts(tmp_path: Path, clock: FakeClock) -> None:
    coord = coordinator(tmp_path, clock)
    a = FakeAgent("a", clock)
    running = dataclasses.replace(report("r"), job={"model": "gru"}, quality_share=0.3)
    failed = dataclasses.replace(_finished("f", "gru", 0.3), phase="failed")
    no_model = dataclasses.replace(_finished("n", "gru", 0.3), job={})
    coord.on_heartbeat(a.heartbeat(running, failed, no_model, _finished("u", "gru", None)))
    assert coord.core.quality.version == 0


def test_the_memory_survives_a_manager_restart(tmp_path: Path, clock: FakeClock) -> None:
    coord = coordinator(tmp_path, clock)
    a = FakeAgent("a", clock)
    coord.on_heartbeat(a.heartbeat(_finished("j1", "gru", 0.4)))
    restarted = coordinator(tmp_path, clock)  # the same journal, read back
    assert restarted.core.quality == coord.core.quality
    got = restarted.on_heartbeat(a.heartbeat(_finished("j1", "gru", 0.4)))  # not counted twice
    assert (got.quality_version, got.quality) == (1, (QualityPoint("gru", 0.4),))


def test_a_request_is_answered_without_the_points(tmp_path: Path, clock: FakeClock) -> None:
    coord = coordinator(tmp_path, clock)
    a = FakeAgent("a", clock)
    coord.on_heartbeat(a.heartbeat(_finished("j1", "gru", 0.4), report("j2")))
    assert coord.core.batch_for(a.worker, clock()).quality_version is None  # no heartbeat said what it holds
