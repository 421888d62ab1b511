"""Fakes shared by the manager tests: a settable clock, agents that write heartbeats, a coordinator."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from specon_manager.journal import Journal
from specon_manager.shell import ManagerShell, recover

from specon.config import Policy, default_policy
from specon.coordinator.effects import Event
from specon.coordinator.inline import InlineCoordinator
from specon.model import Category, ContainerId, Resources, WorkerId
from specon.wire.protocol import Action, Command, CommandBatch, CommandResult, ContainerReport, Heartbeat
from specon.wire.status import Phase

START = 1_000_000.0


class FakeClock:
    """The manager's clock; tests move it by hand."""

    def __init__(self, t: float = START) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class FakeAgent:
    """Writes one worker's heartbeats: increasing ``seq``, ``sent_at`` on its own (skewed) clock."""

    def __init__(self, worker: str, clock: FakeClock, *, skew: float = 0.0, cpu: float = 4.0) -> None:
        self.worker = WorkerId(worker)
        self.clock = clock
        self.skew = skew  # agent clock = manager clock + skew
        self.cpu = cpu
        self.seq = 0
        self.taints: tuple[str, ...] = ()  # as a Kubernetes node reports them

    def now(self) -> float:
        return self.clock() + self.skew

    def heartbeat(
        self, *containers: ContainerReport, results: tuple[CommandResult, ...] = (), usage: float = 0.1
    ) -> Heartbeat:
        self.seq += 1
        return Heartbeat(
            worker=self.worker,
            address=f"{self.worker}:7701",
            seq=self.seq,
            sent_at=self.now(),
            capacity=Resources(cpu=self.cpu, memory=8 << 30),
            usage=usage,
            containers=containers,
            results=results,
            taints=self.taints,
        )


def report(
    cid: str,
    category: Category = Category.PROGRESSING,
    *,
    phase: Phase = "running",
    pending: bool = False,
    migrated: bool = False,
    t_cc: float | None = None,
) -> ContainerReport:
    return ContainerReport(
        id=ContainerId(cid),
        category=category,
        phase=phase,
        pending_request=pending,
        migrated=migrated,
        t_cc=t_cc,
        requests=Resources(cpu=1.0),
    )


def policy(**sections: dict[str, Any]) -> Policy:
    """The default policy with some fields replaced, e.g. ``policy(migration={"max_concurrent": 1})``."""
    p = default_policy()
    for name, changes in sections.items():
        p = dataclasses.replace(p, **{name: dataclasses.replace(getattr(p, name), **changes)})
    return p


def coordinator(tmp_path: Path, clock: FakeClock, pol: Policy | None = None) -> InlineCoordinator:
    """The coordinator, its effects performed inline, on the journal file
    ``tmp_path/journal.db`` (recovered from it if it exists, as the manager does)."""
    journal = Journal(tmp_path / "journal.db")
    return InlineCoordinator(
        policy=pol or policy(), journal=journal, clock=clock, recovered=recover(journal, clock())
    )


def shell(tmp_path: Path, clock: FakeClock, pol: Policy | None = None) -> ManagerShell:
    """The manager's shell (journal writes in a thread) on ``tmp_path/journal.db``."""
    return ManagerShell(policy=pol or policy(), journal=Journal(tmp_path / "journal.db"), clock=clock)


def record_events(coord: InlineCoordinator) -> list[Event]:
    """The metric events ``coord`` emits from now on."""
    seen: list[Event] = []
    coord.on_event = seen.append
    return seen


def commands(batch: CommandBatch, action: Action | None = None) -> list[Command]:
    return [c for c in batch.commands if action is None or c.action is action]


def only(batch: CommandBatch, action: Action) -> Command:
    """The one command of ``action`` in ``batch`` (fails the test otherwise)."""
    found = commands(batch, action)
    assert len(found) == 1, f"expected one {action.value} command, got {batch.commands}"
    return found[0]
