"""The manager's shell: journal writes off the event loop, write-ahead kept, long polls woken."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import specon_manager.shell as shell_module
from specon_manager.journal import Journal
from specon_manager.shell import PRUNE_EVERY, ManagerShell

from specon.coordinator.deciding import Answer, Ask, answer
from specon.coordinator.machine import RECENT_MIGRATIONS
from specon.coordinator.migration import Mark, Migration, State
from specon.model import Category, ContainerId, WorkerId
from specon.wire.protocol import Action, CommandResult, Heartbeat, ReallocationRequest
from tests.unit.manager_fakes import FakeAgent, FakeClock, only, policy, report, shell

CC = Category.CONVERGED


async def _begin_move(sh: ManagerShell, a: FakeAgent, b: FakeAgent) -> None:
    """b idle, a loaded with c1 (CC, requesting) and two PC jobs: Algorithm 2 moves c1 a -> b."""
    await sh.heartbeat(b.heartbeat())
    await sh.heartbeat(_a_asks(a))


async def test_a_waiting_poll_returns_as_soon_as_a_command_is_queued(
    tmp_path: Path, clock: FakeClock
) -> None:
    sh = shell(tmp_path, clock)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    await sh.heartbeat(b.heartbeat())
    poll_b = asyncio.create_task(sh.poll(b.worker, 30.0))
    batch = await sh.heartbeat(a.heartbeat(report("c1", CC, pending=True), report("c2"), report("c3")))
    save = only(batch, Action.SAVE)
    await asyncio.sleep(0)
    assert not poll_b.done(), "nothing for b yet: the poll waits"
    done = CommandResult(
        command=save.id, ok=True, checkpoint="/v/c1.json", checkpoint_step=1, finished_at=a.now()
    )
    await sh.heartbeat(a.heartbeat(report("c2"), report("c3"), results=(done,)))
    got = await asyncio.wait_for(poll_b, 5.0)
    assert only(got, Action.START).container == "c1"


async def test_a_poll_does_not_return_again_with_commands_already_delivered(
    tmp_path: Path, clock: FakeClock
) -> None:
    sh = shell(tmp_path, clock)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    await _begin_move(sh, a, b)  # the heartbeat reply delivered the save to a
    poll_a = asyncio.create_task(sh.poll(a.worker, 30.0))
    try:
        for _ in range(5):
            await asyncio.sleep(0)
        assert not poll_a.done(), "the save is already on its way; nothing new for a"
    finally:
        poll_a.cancel()


class _GatedJournal(Journal):
    """A journal whose writes wait for a gate, or fail while ``failing`` is set."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.gate = threading.Event()
        self.gate.set()
        self.failing = False
        self.entered = threading.Event()

    def put(self, m: Migration) -> None:
        self.entered.set()
        self.gate.wait(10.0)
        if self.failing:
            raise OSError("disk full")
        super().put(m)

    def put_mark(self, mark: Mark) -> None:
        if self.failing:
            raise OSError("disk full")
        super().put_mark(mark)


async def _gated(
    tmp_path: Path, clock: FakeClock
) -> tuple[_GatedJournal, ManagerShell, FakeAgent, FakeAgent]:
    """A shell on a gated journal; b (idle) has reported."""
    journal = _GatedJournal(tmp_path / "journal.db")
    sh = ManagerShell(policy=policy(), journal=journal, clock=clock)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    await sh.heartbeat(b.heartbeat())
    return journal, sh, a, b


def _a_asks(a: FakeAgent) -> Heartbeat:
    """a loaded with c1 (CC, requesting) and two PC jobs: Algorithm 2 moves c1 to b."""
    return a.heartbeat(report("c1", CC, pending=True), report("c2"), report("c3"))


async def test_journal_writes_run_off_the_loop_and_commands_wait_for_them(
    tmp_path: Path, clock: FakeClock
) -> None:
    journal, sh, a, _ = await _gated(tmp_path, clock)
    journal.gate.clear()
    journal.entered.clear()
    beat = asyncio.create_task(sh.heartbeat(_a_asks(a)))
    await asyncio.to_thread(journal.entered.wait, 5.0)
    # The write blocks in its thread; the loop still runs other tasks, but the save is
    # not handed out.
    for _ in range(20):
        await asyncio.sleep(0)
    assert not beat.done()
    assert not sh.core.batch_for(a.worker, clock()).commands, "a command never precedes its journal record"
    journal.gate.set()
    batch = await asyncio.wait_for(beat, 5.0)
    assert only(batch, Action.SAVE).container == "c1"
    assert [m.container for m in journal.in_flight()] == ["c1"]


async def test_a_failed_journal_write_withholds_commands_until_a_retry_succeeds(
    tmp_path: Path, clock: FakeClock
) -> None:
    journal, sh, a, _ = await _gated(tmp_path, clock)
    journal.failing = True
    batch = await sh.heartbeat(_a_asks(a))
    assert not batch.commands and sh.journal_failures == 1
    assert journal.in_flight() == []
    journal.failing = False
    await sh.tick()  # the ticker retries the queued writes, in order
    assert [m.container for m in journal.in_flight()] == ["c1"]
    assert journal.marks()["c1"].migrations == 1  # type: ignore[index]
    assert only(sh.core.batch_for(a.worker, clock()), Action.SAVE).container == "c1"


async def test_a_heartbeat_with_nothing_to_journal_does_not_wait_for_anothers_write(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Journal writes are serialised; heartbeats that bring none are not: a slow journal
    (the Kubernetes one is an HTTP read-modify-write) must not stall every agent."""
    journal, sh, a, b = await _gated(tmp_path, clock)
    journal.gate.clear()
    journal.entered.clear()
    beat = asyncio.create_task(sh.heartbeat(_a_asks(a)))
    await asyncio.to_thread(journal.entered.wait, 5.0)  # a's decision is being journaled
    other = await asyncio.wait_for(sh.heartbeat(b.heartbeat()), 2.0)
    assert other.ack is not None and not beat.done()
    journal.gate.set()
    assert only(await asyncio.wait_for(beat, 5.0), Action.SAVE).container == "c1"


async def test_the_leader_prunes_ended_migrations_past_retention_every_hour(
    tmp_path: Path, clock: FakeClock
) -> None:
    week = 7 * 86_400.0
    journal = Journal(tmp_path / "journal.db")

    def ended(n: int, at: float) -> Migration:
        return Migration(f"m{n}", ContainerId(f"c{n}"), WorkerId("a"), WorkerId("b"), "converged",
                         State.DONE, at, at)  # fmt: skip

    with journal.transaction():  # the status's newest RECENT_MIGRATIONS always stay
        for n in range(RECENT_MIGRATIONS + 2):
            journal.put(ended(n, clock() - week - 10_000 + n))
    sh = ManagerShell(policy=policy(), journal=journal, clock=clock, journal_retention=week)
    await sh.tick()  # the first pass prunes
    assert len(journal.all()) == RECENT_MIGRATIONS and sh.journal_pruned == 2
    assert {m.id for m in journal.all()} == {f"m{n}" for n in range(2, RECENT_MIGRATIONS + 2)}
    journal.put(ended(-1, clock() - 2 * week))
    await sh.tick()  # not an hour since
    assert len(journal.all()) == RECENT_MIGRATIONS + 1
    clock.advance(PRUNE_EVERY)
    await sh.tick()
    assert len(journal.all()) == RECENT_MIGRATIONS and sh.journal_pruned == 3
    # A standby never deletes anything.
    standby = ManagerShell(policy=policy(), journal=journal, clock=clock, standby=True, journal_retention=0.0)
    await standby.tick()
    assert len(journal.all()) == RECENT_MIGRATIONS


async def _tick_held_in_its_thread(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> tuple[ManagerShell, FakeAgent, threading.Event, asyncio.Task[None]]:
    """A tick whose decision pass (c1: a -> b) is held in its thread until the event is set."""
    sh = ManagerShell(policy=policy(), journal=Journal(tmp_path / "journal.db"), clock=clock)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    await sh.heartbeat(b.heartbeat())
    await sh.heartbeat(a.heartbeat(report("c1", CC), report("c2"), report("c3")))
    ask = ReallocationRequest(a.worker, ContainerId("c1"), t_cc=0.0, g=0.0, sent_at=a.now())
    sh.core.request(ask, clock(), step=False)  # it waits for the ticker's pass
    entered, release = threading.Event(), threading.Event()

    def held(ask: Ask, timer: Callable[[], float]) -> Answer:
        entered.set()
        release.wait(10.0)
        return answer(ask, timer)

    monkeypatch.setattr(shell_module, "answer", held)
    tick = asyncio.create_task(sh.tick())
    assert await asyncio.to_thread(entered.wait, 5.0)
    return sh, b, release, tick


async def test_heartbeats_are_answered_while_the_tickers_decision_pass_runs(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    sh, b, release, tick = await _tick_held_in_its_thread(tmp_path, clock, monkeypatch)
    reply = await asyncio.wait_for(sh.heartbeat(b.heartbeat()), 2.0)
    assert reply.ack is not None and not tick.done() and not sh.core.migrations
    release.set()
    await asyncio.wait_for(tick, 5.0)
    assert [(m.container, m.target) for m in sh.core.migrations.values()] == [("c1", "b")]


async def test_a_pass_that_returns_after_the_shell_stood_down_is_not_acted_on(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    sh, _, release, tick = await _tick_held_in_its_thread(tmp_path, clock, monkeypatch)
    sh.stand_down()  # leadership lost while the pass ran
    release.set()
    await asyncio.wait_for(tick, 5.0)
    assert not sh.core.migrations and not sh.journal.in_flight()
