"""Algorithms 2 and 3 as the coordinator answers them: a decision pass's requests, refusals,
stays and moves, the marks they leave and the migrations they open (or, under dry-run, only
journal). A part of ``specon.coordinator.machine.Coordinator``, kept apart: it reads the
coordinator's state and acts through its journal, outbox and drive, declared below.

A pass is three steps, so that a shell may run the expensive middle one off its event loop
(``specon_manager.shell``): ``_ask`` takes an immutable ``Ask`` of everything the pass reads
(on the loop), ``answer`` indexes it and runs ``decide_pass`` (pure, any thread), ``settle``
acts on the ``Answer`` (on the loop), re-checking what inputs may have changed meanwhile.
Run back to back (``Coordinator.tick``) the three are exactly the one pass they replace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from specon.config import Policy
from specon.coordinator.effects import Event
from specon.coordinator.migration import Mark, Migration, Reason, State
from specon.coordinator.outbox import mark_command
from specon.coordinator.state import UNMARKED, ClusterState
from specon.model import ClusterSnapshot, ContainerId, WorkerId
from specon.policy.decisions import Move, RefusalReason, Stay
from specon.policy.move_costs import MoveCosts
from specon.policy.placement import ClusterIndex
from specon.policy.scheduler import InFlight, Pass, decide_pass
from specon.wire.protocol import Command


@dataclass(frozen=True, slots=True)
class Ask:
    """Everything one decision pass reads, taken on the loop; immutable (the snapshot is
    frozen, the learned costs a copy), so ``answer`` may run in any thread meanwhile."""

    now: float
    snapshot: ClusterSnapshot
    # The waiting requests, oldest first, each with the time it was first seen.
    requests: tuple[tuple[ContainerId, float], ...]
    in_flight: tuple[InFlight, ...]
    rebalance: bool
    policy: Policy
    learned: MoveCosts
    claims: int  # the coordinator's ``claims`` when asked (see ``Deciding._stale``)
    built: float  # seconds taking the snapshot took (part of the ``decision_pass`` event)


@dataclass(frozen=True, slots=True)
class Answer:
    ask: Ask
    decided: Pass
    took: float  # seconds ``answer`` took


def answer(ask: Ask, timer: Callable[[], float] = lambda: 0.0) -> Answer:
    """Decide ``ask``: Algorithms 2 and 3 over one index of its snapshot (pure; no state is read)."""
    t0 = timer()
    p = decide_pass(
        ask.snapshot,
        requests=[cid for cid, _ in ask.requests],
        in_flight=ask.in_flight,
        policy=ask.policy,
        index=ClusterIndex.of(ask.snapshot),  # one per pass, shared by 2 and 3 (it dominates both)
        rebalance=ask.rebalance,
        learned=ask.learned,
    )
    return Answer(ask, p, timer() - t0)


class Deciding:
    """Algorithm 2's answers and Algorithm 3's moves (a mixin of ``Coordinator``)."""

    policy: Policy
    state: ClusterState
    marks: dict[ContainerId, Mark]
    migrations: dict[str, Migration]
    requests: dict[ContainerId, float]
    virtual: dict[ContainerId, WorkerId]
    move_costs: MoveCosts
    timer: Callable[[], float]
    claims: int
    _deferred: set[ContainerId]
    _answered: dict[ContainerId, float]

    if TYPE_CHECKING:  # the coordinator's, used here
        _log: Callable[..., None]

        def emit(self, event: Event) -> None: ...
        def record(self, m: Migration) -> None: ...
        def holds_budget(self, m: Migration) -> bool: ...
        def _put_mark(self, new: Mark) -> None: ...
        def _new_id(self, now: float) -> str: ...
        def _send(self, worker: WorkerId, cmd: Command) -> None: ...
        def _drive(self, mid: str, now: float, alive: frozenset[WorkerId]) -> None: ...
        def _view(self, now: float) -> ClusterSnapshot: ...

    def _rebalance_may_trigger(self) -> bool:
        """A cheap pre-check of Algorithm 3's trigger, before any snapshot is built."""
        cfg = self.policy.rebalance
        if cfg.mode == "off" or any(self.holds_budget(m) for m in self.migrations.values()):
            return False
        if cfg.when == "always":
            return True
        # Every running container migrated (there is at least one): one not yet ends the scan.
        any_running = False
        for r in self.state.containers.values():
            if r.report.phase == "running":
                if not (r.report.migrated or self.marks.get(r.id, UNMARKED).migrations > 0):
                    return False
                any_running = True
        return any_running

    def _ask(self, now: float, *, rebalance: bool) -> Ask:
        """What this pass reads, as it is now (on the loop: the snapshot is the costly part here)."""
        t0 = self.timer()
        snapshot = self._view(now)
        return Ask(
            now=now,
            snapshot=snapshot,
            requests=tuple(sorted(self.requests.items(), key=lambda r: r[1])),
            in_flight=tuple(
                InFlight(m.container, m.source, m.target)
                for m in self.migrations.values()
                if self.holds_budget(m)
            ),
            rebalance=rebalance,
            policy=self.policy,
            learned=self.move_costs.copy(),
            claims=self.claims,
            built=self.timer() - t0,
        )

    def settle(self, ans: Answer) -> bool:
        """Act on ``ans``: answer requests, defer, or start a decided move; True if it decided.

        Inputs applied since its ``Ask`` (a shell running ``answer`` in a thread) may have
        settled part of it already; what is re-checked, and why:

        * a request is acted on only while the same request still waits (same first-seen
          time): another pass (a heartbeat's own, on the loop) may have answered it, or a
          pruning dropped it; answering it twice would send two answers or two moves;
        * a decision or rebalancing move is acted on only if ``_stale`` finds nothing. Else
          nothing is done and its request keeps waiting: the next pass decides it afresh.

        Back to back with its ``Ask`` (``Coordinator.tick``) every check holds, so the pass
        acts exactly as one decided on the spot.
        """
        ask, p, now = ans.ask, ans.decided, ans.ask.now
        seen = dict(ask.requests)
        waiting = {cid for cid in seen if self.requests.get(cid) == seen[cid]}
        d = p.decision
        if d is not None and (d.container not in waiting or self._stale(d, ask)):
            d = None
        mv = p.rebalance if p.rebalance is not None and not self._stale(p.rebalance, ask) else None
        answered = [r.container for r in p.refused] + ([] if d is None else [d.container])
        for cid in (*p.dropped, *answered):
            if cid in waiting:
                self.requests.pop(cid, None)
                self._deferred.discard(cid)
                self._answered[cid] = now
        for cid in p.deferred:
            if cid in waiting and cid not in self._deferred:  # count a request once, not once per pass
                self._deferred.add(cid)
                self.emit(Event("request_deferred"))
        for r in p.refused:
            if r.container not in waiting:
                continue
            self.emit(Event("decision", {"kind": "refuse"}))
            if r.reason is RefusalReason.MIGRATION_LIMIT:
                # Already answered (e.g. the agent missed our mark): answer again.
                self._mark_command(r.container, now)
                continue
            self._log("specon.manager.request_refused", level="warning", container=r.container,
                      reason=r.reason.value, detail=r.detail)  # fmt: skip
            self.emit(Event("request_refused", {"reason": r.reason.value}))
        if d is not None:
            self.emit(Event("decision", {"kind": type(d).__name__.lower()}))
            self._mark(d.container, now)
            scores = dict(d.scores)  # not rounded here: 1,000 workers per decision add up
            if isinstance(d, Stay):
                self._log("specon.manager.stay", container=d.container, worker=d.worker, scores=scores)
                self._mark_command(d.container, now)
            else:
                self._log("specon.manager.move", container=d.container, source=d.source, target=d.target,
                          scores=scores)  # fmt: skip
                if self._begin(d, now):
                    self._mark_command(d.container, now)
        if mv is not None:
            self._mark(mv.container, now, rebalanced=True)
            self._log("specon.manager.rebalance", container=mv.container, source=mv.source,
                      target=mv.target)  # fmt: skip
            self._begin(mv, now)
        self.emit(Event("decision_pass", duration=ask.built + ans.took))
        return d is not None or mv is not None

    def _stale(self, d: Stay | Move, ask: Ask) -> bool:
        """Whether ``d``, decided on ``ask``, no longer holds (logged when so):

        * a migration claimed budget since (``claims``: one began, maybe for this very
          container, or a parked one is back): the budget and loads the pass counted are gone;
        * the container no longer runs where the pass saw it (it moved, finished, vanished
          or its worker was pruned): a save would go to a worker without it;
        * a move's target is no longer a live, schedulable worker (silent, said goodbye,
          cordoned, pruned): the job would be started where it cannot run.

        A migration that *ended* meanwhile only freed budget: the decision stands.
        """
        cid = d.container
        source = d.worker if isinstance(d, Stay) else d.source
        where = self.state.running_on(cid)
        where = self.virtual.get(cid, where) if where is not None else None  # dry-run counts it there
        why = None
        if self.claims != ask.claims:
            why = "a migration claimed budget meanwhile"
        elif where != source:
            why = "the container no longer runs on its source"
        elif isinstance(d, Move) and (
            d.target in self.state.cordoned
            or d.target not in self.state.alive(ask.now, self.policy.messaging.worker_timeout)
        ):
            why = "the target is no longer a live, schedulable worker"
        if why is not None:
            self._log("specon.manager.decision_stale", container=cid, source=source,
                      target=getattr(d, "target", None), why=why)  # fmt: skip
        return why is not None

    def _mark(self, cid: ContainerId, now: float, *, rebalanced: bool = False) -> None:
        """Algorithm 2 decided for ``cid`` (the first time keeps its time), or 3 moved it."""
        old = self.marks.get(cid) or Mark(cid)
        if rebalanced:
            self._put_mark(replace(old, rebalances=old.rebalances + 1))
        else:
            first = old.migrated_at if old.migrated_at is not None else now
            self._put_mark(replace(old, migrated_at=first, migrations=old.migrations + 1))

    def _mark_command(self, cid: ContainerId, now: float) -> None:
        worker = self.state.running_on(cid)
        if worker is None:
            return
        self._send(worker, mark_command(cid, now, self.policy))

    def new_migration(self, move: Move, now: float) -> Migration:
        reason: Reason = move.reason
        return Migration(
            self._new_id(now), move.container, move.source, move.target, reason, State.DECIDED, now, now
        )

    def _begin(self, move: Move, now: float) -> bool:
        """Carry out a decided move: a journaled migration (save on the source, start on the
        target), or under dry-run only its record. True when it was a dry run."""
        if self.policy.migration.dry_run:
            self.record_dry_run(move, now)
            return True
        self.open_migration(move, now)
        return False

    def record_dry_run(self, move: Move, now: float) -> Migration:
        """Journal ``move`` as decided but never executed (dry-run), and let later decisions
        count the container on its target, as they would after a live move."""
        self.virtual[move.container] = move.target
        m = self.new_migration(move, now)
        m = m.to(State.FAILED, at=now, error="dry-run: decided, not executed")
        m = m.to(State.ROLLED_BACK, at=now)
        self.record(m)
        self.emit(Event("migration_finished", {"result": "dry_run", "reason": m.reason}))
        self._log("specon.manager.dry_run_move", container=move.container, source=move.source,
                  target=move.target, reason=move.reason)  # fmt: skip
        return m

    def open_migration(self, move: Move, now: float) -> None:
        m = self.new_migration(move, now)
        self.record(m)
        self.migrations[m.id] = m
        self._log("specon.manager.migration_decided", migration=m.id, container=m.container,
                  source=m.source, target=m.target, reason=m.reason)  # fmt: skip
        self._drive(m.id, now, self.state.alive(now, self.policy.messaging.worker_timeout))
