"""A decision pass split as the manager runs it: ``prepare`` on the loop, ``answer`` in a
thread, ``settle`` back on the loop (``specon.coordinator.deciding``).

Run back to back it must act exactly as ``tick``; with inputs applied between the ``Ask``
and its ``settle`` it must not act on what those inputs changed.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest

from specon.config import Policy
from specon.coordinator.deciding import Answer, answer
from specon.coordinator.effects import Effect, Event, Log, PutMigration
from specon.coordinator.machine import Coordinator
from specon.coordinator.migration import State
from specon.model import Category, ContainerId, WorkerId
from specon.policy.decisions import Move, Stay
from specon.policy.move_costs import Observation
from specon.wire.protocol import Action, CommandResult, ContainerReport, Heartbeat, ReallocationRequest
from specon.wire.status import Phase
from tests.unit.manager_fakes import START, FakeAgent, FakeClock, policy, report

CC = Category.CONVERGED
CATEGORIES = (Category.PROGRESSING, Category.WATCHING, CC)


@dataclass
class _Cluster:
    """Random agents: jobs appear, converge, ask to move, finish, vanish and reappear
    elsewhere; agents answer commands (mostly successfully) on their next heartbeat."""

    rng: random.Random
    clock: FakeClock
    agents: list[FakeAgent]
    jobs: dict[ContainerId, tuple[WorkerId, Category, Phase]] = field(default_factory=dict)
    pending: dict[WorkerId, list[CommandResult]] = field(default_factory=dict)
    next_job: int = 0

    def mutate(self) -> None:
        rng = self.rng
        if len(self.jobs) < 24 and rng.random() < 0.3:
            self.next_job += 1
            cid = ContainerId(f"j{self.next_job}")
            self.jobs[cid] = (rng.choice(self.agents).worker, rng.choice(CATEGORIES), "running")
        if not self.jobs:
            return
        cid = rng.choice(sorted(self.jobs))
        worker, cat, phase = self.jobs[cid]
        roll = rng.random()
        if roll < 0.25:
            self.jobs[cid] = (worker, CC, phase)
        elif roll < 0.3:
            self.jobs[cid] = (worker, cat, "finished")
        elif roll < 0.35:
            del self.jobs[cid]
        elif roll < 0.45:  # seen elsewhere (a move the agents made, or a restore)
            self.jobs[cid] = (rng.choice(self.agents).worker, cat, phase)

    def heartbeat(self, agent: FakeAgent) -> Heartbeat:
        reports = tuple(
            report(
                cid,
                cat,
                phase=phase,
                pending=cat is CC and phase == "running" and self.rng.random() < 0.5,
                t_cc=self.clock() - 100.0 if cat is CC else None,
            )
            for cid, (w, cat, phase) in sorted(self.jobs.items())
            if w == agent.worker
        )
        results = tuple(self.pending.pop(agent.worker, ()))
        return agent.heartbeat(*reports, results=results, usage=self.rng.random())

    def answer_commands(self, agent: FakeAgent, core: Coordinator) -> None:
        """The agent runs what its reply carried; the result rides on its next heartbeat."""
        out = []
        for cmd in core.batch_for(agent.worker, self.clock()).commands:
            ok = self.rng.random() < 0.8
            if cmd.action is Action.SAVE and cmd.container in self.jobs and ok:
                w, cat, _ = self.jobs[cmd.container]
                self.jobs[cmd.container] = (w, cat, "stopped")
            elif cmd.action is Action.START and cmd.container in self.jobs and ok:
                _, cat, _ = self.jobs[cmd.container]
                self.jobs[cmd.container] = (agent.worker, cat, "running")
            out.append(
                CommandResult(
                    command=cmd.id,
                    ok=ok,
                    checkpoint="/v/ckpt",
                    checkpoint_step=1,
                    finished_at=agent.now(),
                    error=None if ok else "refused",
                )
            )
        self.pending[agent.worker] = out


def _split_tick(core: Coordinator, now: float, pool: ThreadPoolExecutor) -> bool:
    """``tick`` the way the manager's shell runs it: the pass answered in another thread."""
    ask = core.prepare(now, rebalance=True)
    return ask is not None and core.settle(pool.submit(answer, ask).result())


POLICIES = {
    "balanced": policy(rebalance={"mode": "balanced", "when": "always"}, migration={"min_residence": 0.0}),
    "paper": policy(rebalance={"mode": "paper", "when": "all_migrated"}),
    "work": policy(rebalance={"mode": "work", "when": "always"}, migration={"max_concurrent": 3}),
    "dry-run": policy(rebalance={"mode": "balanced", "when": "always"}, migration={"dry_run": True}),
}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_pass_answered_in_a_thread_acts_exactly_as_a_pass_on_the_loop(name: str, seed: int) -> None:
    pol: Policy = POLICIES[name]
    clock = FakeClock()
    rng = random.Random(seed)
    agents = [FakeAgent(f"w{i}", clock, cpu=rng.choice((2.0, 4.0, 8.0))) for i in range(5)]
    cluster = _Cluster(rng, clock, agents)
    on_loop = Coordinator(policy=pol, now=clock())
    split = Coordinator(policy=pol, now=clock())
    seen: list[Effect] = []
    with ThreadPoolExecutor(1) as pool:
        for step in range(400):
            clock.advance(rng.uniform(0.1, 2.0))
            if rng.random() < 0.25:
                now = clock()
                assert on_loop.tick(now, rebalance=True) == _split_tick(split, now, pool), step
            else:
                cluster.mutate()
                agent = rng.choice(agents)
                hb = cluster.heartbeat(agent)
                assert on_loop.heartbeat(hb, clock()) == split.heartbeat(hb, clock())
                assert on_loop.batch_for(agent.worker, clock()) == split.batch_for(agent.worker, clock())
                cluster.answer_commands(agent, on_loop)
            effects = on_loop.take_effects()
            assert split.take_effects() == effects, step  # same decisions, ids, targets, order
            seen += effects
    decided = [e for e in seen if isinstance(e, Event) and e.kind == "decision"]
    moves = [e for e in seen if isinstance(e, PutMigration)]
    assert decided and moves, "the sequence must make decisions for the comparison to mean anything"
    assert not [e for e in seen if isinstance(e, Log) and e.event == "specon.manager.decision_stale"]


# --- inputs between the Ask and its settle ------------------------------------------------

C1, C2 = ContainerId("c1"), ContainerId("c2")


def _asked(pol: Policy | None = None) -> tuple[Coordinator, FakeClock, FakeAgent, FakeAgent, Answer]:
    """b idle; a runs c1 (converged, asking to move) and two progressing jobs. The ticker's
    pass has been asked and answered (c1: a -> b) but not settled yet."""
    clock = FakeClock()
    core = Coordinator(policy=pol or policy(), now=clock())
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    core.heartbeat(b.heartbeat(), clock())
    core.heartbeat(a.heartbeat(*_on_a(pending=False)), clock())
    # Queued without a pass of its own, as a request that waits for the ticker.
    core.request(ReallocationRequest(a.worker, C1, t_cc=0.0, g=0.0, sent_at=a.now()), clock(), step=False)
    core.take_effects()
    ask = core.prepare(clock(), rebalance=True)
    assert ask is not None
    ans = answer(ask)
    d = ans.decided.decision
    assert isinstance(d, Move) and (d.container, d.source, d.target) == (C1, "a", "b")
    return core, clock, a, b, ans


def _on_a(*, pending: bool) -> tuple[ContainerReport, ...]:
    return (report("c1", CC, pending=pending), report("c2"), report("c3"))


def _stale(effects: list[Effect]) -> list[str]:
    return [
        str(e.fields["why"]) for e in effects if isinstance(e, Log) and e.event.endswith("decision_stale")
    ]


def _opened(effects: list[Effect]) -> list[PutMigration]:
    """The migrations ``effects`` open (their first record)."""
    return [e for e in effects if isinstance(e, PutMigration) and e.migration.state is State.DECIDED]


def test_settled_at_once_the_answer_opens_the_move() -> None:
    core, *_, ans = _asked()
    assert core.settle(ans)
    effects = core.take_effects()
    assert [(e.migration.container, e.migration.target) for e in _opened(effects)] == [(C1, "b")]
    assert C1 not in core.requests and not _stale(effects)


def test_a_container_that_moved_meanwhile_is_not_moved_from_where_it_was() -> None:
    core, clock, a, _, ans = _asked()
    c = FakeAgent("c", clock)
    core.heartbeat(a.heartbeat(report("c2"), report("c3")), clock())
    core.heartbeat(c.heartbeat(report("c1", CC, pending=True)), clock())
    core.take_effects()
    assert not core.settle(ans)
    effects = core.take_effects()
    assert _stale(effects) == ["the container no longer runs on its source"]
    assert not _opened(effects) and not core.migrations
    assert C1 in core.requests, "the request waits for the next pass, which decides it afresh"
    assert not core.outbox.get(a.worker)


def test_a_request_answered_meanwhile_by_a_pass_on_the_loop_is_not_answered_twice() -> None:
    core, clock, *_, ans = _asked()
    core.tick(clock(), rebalance=False)  # a heartbeat's own pass, on the loop, while the thread ran
    first = _opened(core.take_effects())
    assert len(first) == 1 and core.claims == ans.ask.claims + 1
    assert not core.settle(ans)
    effects = core.take_effects()
    assert not _opened(effects) and len(core.migrations) == 1
    assert not [e for e in effects if isinstance(e, Event) and e.kind == "decision"]


def _rebalance_asked(**migration: object) -> tuple[Coordinator, FakeClock, FakeAgent, FakeAgent, Answer]:
    """r0..r2 (decided by Algorithm 2 before) on a, b idle: the ticker's pass has been asked
    and answered (a rebalancing move a -> b) but not settled yet."""
    pol = policy(
        rebalance={"mode": "balanced", "when": "always"}, migration={"min_residence": 0.0, **migration}
    )
    clock = FakeClock()
    core = Coordinator(policy=pol, now=clock())
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    core.heartbeat(b.heartbeat(), clock())
    core.heartbeat(a.heartbeat(*_frozen()), clock())
    core.take_effects()
    ask = core.prepare(clock(), rebalance=True)
    assert ask is not None
    ans = answer(ask)
    mv = ans.decided.rebalance
    assert mv is not None and (mv.source, mv.target) == ("a", "b")
    return core, clock, a, b, ans


def _frozen(pending: str | None = None) -> tuple[ContainerReport, ...]:
    """r0..r2, converged 300, 60 and 200 s ago (r1 has the smallest converged duration: it moves)."""
    return tuple(
        report(f"r{i}", CC, migrated=True, pending=f"r{i}" == pending, t_cc=START - ago)
        for i, ago in enumerate((300.0, 60.0, 200.0))
    )


def test_a_target_that_said_goodbye_meanwhile_gets_no_job() -> None:
    core, clock, _, b, ans = _rebalance_asked()
    core.goodbye(b.worker, clock())  # its own pass has nothing to decide: no request waits
    core.take_effects()
    assert not core.settle(ans)
    assert _stale(core.take_effects()) == ["the target is no longer a live, schedulable worker"]
    assert not core.migrations


def test_a_cordoned_target_gets_no_job() -> None:
    core, clock, _, b, ans = _rebalance_asked()
    core.drain(b.worker, clock())
    core.take_effects()
    assert not core.settle(ans)
    assert _stale(core.take_effects()) == ["the target is no longer a live, schedulable worker"]
    assert not core.migrations


def test_a_rebalancing_move_is_dropped_once_another_migration_claimed_the_budget() -> None:
    core, clock, a, _, ans = _rebalance_asked(max_concurrent=1)
    # Meanwhile r0 asks to move and its heartbeat's own pass opens a migration (budget: 1).
    core.heartbeat(a.heartbeat(*_frozen(pending="r0")), clock())
    assert len(core.migrations) == 1
    core.take_effects()
    assert not core.settle(ans)
    assert _stale(core.take_effects()) == ["a migration claimed budget meanwhile"]
    assert len(core.migrations) == 1, "the budget of one holds"


def test_a_rebalancing_move_settled_at_once_opens_it() -> None:
    core, *_, ans = _rebalance_asked()
    assert core.settle(ans)
    assert [e.migration.reason for e in _opened(core.take_effects())] == ["rebalance"]


def test_a_stay_decided_meanwhile_by_a_pass_on_the_loop_is_not_decided_twice() -> None:
    clock = FakeClock()
    core = Coordinator(policy=policy(), now=clock())
    a = FakeAgent("a", clock)  # alone: c1 has nowhere to go, it stays
    core.heartbeat(a.heartbeat(*_on_a(pending=False)), clock())
    core.request(ReallocationRequest(a.worker, C1, t_cc=0.0, g=0.0, sent_at=a.now()), clock(), step=False)
    ask = core.prepare(clock(), rebalance=True)
    assert ask is not None
    ans = answer(ask)
    assert isinstance(ans.decided.decision, Stay)
    core.tick(clock(), rebalance=False)  # the same Stay, on the loop: it claims no budget
    assert core.marks[C1].migrations == 1 and core.claims == ask.claims
    core.take_effects()
    assert not core.settle(ans)
    assert not [e for e in core.take_effects() if isinstance(e, Event) and e.kind == "decision"]
    assert core.marks[C1].migrations == 1, "one request, one answer"


def test_the_ask_holds_its_own_copy_of_the_learned_move_costs() -> None:
    core, *_, ans = _asked(policy(migration={"learn_costs": True}))
    before = ans.ask.learned.estimate("default", 0)
    core.move_costs.observe(Observation("default", 0, downtime=1000.0, restore_cpu=1000.0))
    assert ans.ask.learned.estimate("default", 0) == before != core.move_costs.estimate("default", 0)
