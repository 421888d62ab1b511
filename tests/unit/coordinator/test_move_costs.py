"""The coordinator learns what its moves cost (``specon.policy.move_costs``) and the manager
exposes it: each finished move's measured downtime, per target backend and job size."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from specon_manager.metrics import ManagerMetrics

from specon.coordinator.effects import Log
from specon.coordinator.inline import InlineCoordinator
from specon.model import RUNTIME_LABEL, Category
from specon.wire.protocol import Action, CommandResult, Heartbeat
from tests.unit.manager_fakes import FakeAgent, FakeClock, coordinator, only, policy, report

CC = Category.CONVERGED


def _on(agent: FakeAgent, hb: Heartbeat) -> Heartbeat:
    return dataclasses.replace(hb, labels={RUNTIME_LABEL: "docker"}) if agent.worker == "b" else hb


def _move(coord: InlineCoordinator, clock: FakeClock, downtime: float) -> None:
    """c1 moves from a to b (a docker worker); the job stops at the save's
    ``began_at`` and trains again ``downtime`` seconds later (the start result's time)."""
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    coord.on_heartbeat(_on(b, b.heartbeat()))
    batch = coord.on_heartbeat(a.heartbeat(report("c1", CC, pending=True), report("c2"), report("c3")))
    save = only(batch, Action.SAVE)
    began = a.now()
    clock.advance(1.0)
    saved = CommandResult(command=save.id, ok=True, checkpoint="/v/c1/ckpt-1.json", checkpoint_step=1,
                          finished_at=a.now(), detail={"began_at": began})  # fmt: skip
    coord.on_heartbeat(a.heartbeat(report("c2"), report("c3"), results=(saved,)))
    start = only(coord.batch_for(b.worker), Action.START)
    clock.advance(downtime - 1.0)
    started = CommandResult(command=start.id, ok=True, finished_at=b.now())
    clock.advance(0.5)
    coord.on_heartbeat(_on(b, b.heartbeat(report("c1", CC, migrated=True), results=(started,))))
    assert not coord.core.migrations


def test_a_finished_move_teaches_the_work_model_its_downtime(tmp_path: Path, clock: FakeClock) -> None:
    coord = coordinator(tmp_path, clock)
    logs: list[Log] = []
    coord.on_log = logs.append
    prior = policy().migration
    _move(coord, clock, downtime=7.0)
    costs = coord.core.move_costs
    k = prior.cost_prior_weight
    backend = (k * prior.move_downtime + 7.0) / (k + 1)
    learned = costs.estimate("docker", 0)
    assert learned.downtime == pytest.approx((k * backend + 7.0) / (k + 1))
    assert learned.moves == 1
    assert costs.estimate("default", 0).downtime == prior.move_downtime  # another backend
    [line] = [x for x in logs if x.event == "specon.manager.move_cost"]
    assert line.fields["backend"] == "docker" and line.fields["size"] == "<1GiB"
    assert line.fields["downtime"] == pytest.approx(7.0)
    assert line.fields["learned_downtime"] == pytest.approx(learned.downtime, abs=1e-3)


def test_with_learning_off_the_prior_stays(tmp_path: Path, clock: FakeClock) -> None:
    pol = policy(migration={"learn_costs": False})
    coord = coordinator(tmp_path, clock, pol)
    _move(coord, clock, downtime=7.0)
    assert coord.core.move_costs.cells() == {}
    assert coord.core.move_costs.estimate("docker", 0).downtime == pol.migration.move_downtime


def test_the_learned_costs_are_prometheus_gauges(tmp_path: Path, clock: FakeClock) -> None:
    coord = coordinator(tmp_path, clock)
    metrics = ManagerMetrics()
    metrics.watch(coord.core)
    assert b"specon_manager_move_downtime_seconds{" not in generate_latest(metrics.registry)
    _move(coord, clock, downtime=7.0)
    text = generate_latest(metrics.registry).decode()
    est = coord.core.move_costs.estimate("docker", 0)
    assert f'specon_manager_move_downtime_seconds{{backend="docker",size="<1GiB"}} {est.downtime}' in text
    assert (
        f'specon_manager_move_restore_cpu_seconds{{backend="docker",size="<1GiB"}} {est.restore_cpu}' in text
    )
    assert 'specon_manager_move_cost_observations{backend="docker",size="<1GiB"} 1.0' in text
