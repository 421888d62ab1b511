"""One event sequence, fed to the real manager (over HTTP) and to the simulator's manager,
gets the same decisions: the same commands to the same workers, the same journal.

The script plays three agents; it answers every command the way an agent does (a save
result, then the container running on the target with a start result), so what it
sends next depends on what each side decided. Both sides see identical inputs at
identical (fake) times; any divergence in decisions shows up as a different command
stream or journal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from specon_manager.app import SHELL, create_app
from specon_manager.journal import Journal
from specon_manager.shell import ManagerShell

from specon.config import Policy, default_policy
from specon.coordinator.effects import MemoryJournal
from specon.coordinator.migration import Migration
from specon.model import Category
from specon.sim.runner import simulated_manager
from specon.wire import protocol
from specon.wire.protocol import Action, Command, CommandBatch, CommandResult, ContainerReport, Heartbeat
from tests.unit.manager_fakes import FakeAgent, FakeClock, policy, report

CC, PC = Category.CONVERGED, Category.PROGRESSING
TOKEN = "t" * 40

Send = Callable[[Heartbeat], Awaitable[CommandBatch]]
Tick = Callable[[], Awaitable[None]]
# What a side decided: every command as (worker, action, container, target, rollback), in order.
Decisions = list[tuple[str, str, str, str | None, bool]]


async def _script(clock: FakeClock, send: Send, tick: Tick) -> Decisions:
    """Three workers; converged jobs ask to move, one after the other; Algorithm 3 runs."""
    a, b, c = FakeAgent("a", clock), FakeAgent("b", clock), FakeAgent("c", clock)
    hosted: dict[str, dict[str, ContainerReport]] = {
        "a": {cid: report(cid) for cid in ("j1", "j2", "j3", "j4", "j6", "j7")},
        "b": {},
        "c": {"j5": report("j5")},
    }
    agents = {"a": a, "b": b, "c": c}
    results: dict[str, list[CommandResult]] = {"a": [], "b": [], "c": []}
    seen: Decisions = []
    answered: set[str] = set()

    async def beat(name: str) -> None:
        agent = agents[name]
        batch = await send(agent.heartbeat(*hosted[name].values(), results=tuple(results[name])))
        results[name] = []
        for cmd in batch.commands:
            if cmd.id in answered:
                continue  # a repeat until the result is in: an agent answers it once
            answered.add(cmd.id)
            seen.append((name, cmd.action.value, cmd.container, cmd.target, cmd.rollback))
            _answer(name, cmd)

    def _answer(name: str, cmd: Command) -> None:
        agent = agents[name]
        if cmd.action is Action.MARK_MIGRATED:
            rep = hosted[name][cmd.container]
            hosted[name][cmd.container] = ContainerReport(
                id=rep.id, category=CC, migrated=True, t_cc=rep.t_cc
            )
        elif cmd.action is Action.SAVE:
            del hosted[name][cmd.container]
            ckpt = f"/vol/{cmd.container}/ckpt.json"
            results[name].append(
                CommandResult(cmd.id, ok=True, checkpoint=ckpt, checkpoint_step=10, finished_at=agent.now())
            )
        elif cmd.action is Action.START:
            hosted[name][cmd.container] = report(cmd.container, CC, migrated=cmd.migrated)
            results[name].append(CommandResult(cmd.id, ok=True, finished_at=agent.now()))

    async def round_() -> None:
        for name in ("b", "c", "a"):
            await beat(name)
        clock.advance(1.0)

    for _ in range(2):
        await round_()
    t_cc = clock() - 30.0
    hosted["a"]["j1"] = report("j1", CC, pending=True, t_cc=t_cc)
    for _ in range(4):
        await round_()
    hosted["a"]["j2"] = report("j2", CC, pending=True, t_cc=t_cc + 5.0)
    for _ in range(4):
        await round_()
    # j5 alone on c asks too (staying is best there: a Stay, the agent freezes it), and
    # two jobs on the crowded a converge without asking (candidates for Algorithm 3).
    hosted["c"]["j5"] = report("j5", CC, pending=True, t_cc=t_cc + 9.0)
    hosted["a"]["j3"] = report("j3", CC, t_cc=t_cc + 2.0)
    hosted["a"]["j4"] = report("j4", CC, t_cc=t_cc + 7.0)
    for _ in range(3):
        await round_()
    for _ in range(6):
        await tick()
        await round_()
    return seen


def _journal_view(migrations: list[Migration]) -> list[tuple[object, ...]]:
    return sorted(
        (m.id, m.container, m.source, m.target, m.reason, m.state.value, m.checkpoint, m.downtime)
        for m in migrations
    )


def _paper_one_at_a_time() -> Policy:
    p = default_policy("paper")
    return dataclasses.replace(p, migration=dataclasses.replace(p.migration, max_concurrent=1))


@pytest.mark.parametrize(
    "make",
    [policy, lambda: policy(rebalance={"mode": "balanced", "when": "always"}), _paper_one_at_a_time],
    ids=["defaults", "rebalance-always", "paper-one-at-a-time"],
)
async def test_the_manager_and_the_simulator_decide_the_same(
    tmp_path: Path, make: Callable[[], Policy]
) -> None:
    pol = make()

    # The real manager: its shell and HTTP app, JSON on the wire.
    clock_m = FakeClock()
    journal = Journal(tmp_path / "journal.db")
    shell = ManagerShell(policy=pol, journal=journal, clock=clock_m)
    headers = {protocol.AUTH_HEADER: f"Bearer {TOKEN}", "Content-Type": protocol.CONTENT_TYPE}
    async with TestClient(TestServer(create_app(shell, token=TOKEN, tick=False))) as client:

        async def send_http(hb: Heartbeat) -> CommandBatch:
            resp = await client.post(protocol.HEARTBEAT_PATH, data=protocol.encode(hb), headers=headers)
            assert resp.status == 200, await resp.text()
            return protocol.decode(await resp.read(), CommandBatch)

        async def tick_http() -> None:
            app = client.app
            assert app is not None
            await app[SHELL].tick()

        manager = await _script(clock_m, send_http, tick_http)
    manager_journal = _journal_view(journal.all())

    # The simulator's manager: the same coordinator behind the inline shell.
    clock_s = FakeClock()
    memory = MemoryJournal()
    sim = simulated_manager(pol, clock_s, journal=memory)

    async def send_sim(hb: Heartbeat) -> CommandBatch:
        return sim.on_heartbeat(hb)

    async def tick_sim() -> None:
        sim.step(rebalance=True)

    simulated = await _script(clock_s, send_sim, tick_sim)

    assert simulated == manager
    assert _journal_view(memory.all()) == manager_journal
    # Not a vacuous agreement: moves were decided, carried out and finished.
    assert {"save", "start", "mark_migrated"} <= {action for _, action, *_ in manager}
    assert any(m[5] == "done" for m in manager_journal)
