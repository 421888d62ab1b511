"""Algorithms 2 and 3 as the coordinator answers them: a decision pass's requests, refusals,
stays and moves, the marks they leave and the migrations they open (or, under dry-run, only
journal). A part of ``specon.coordinator.machine.Coordinator``, kept apart: it reads the
coordinator's state and acts through its journal, outbox and drive, declared below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from specon.config import Policy
from specon.coordinator.effects import Event
from specon.coordinator.migration import Mark, Migration, Reason, State
from specon.coordinator.outbox import mark_command
from specon.coordinator.state import UNMARKED, ClusterState
from specon.model import ContainerId, WorkerId
from specon.policy.decisions import Move, RefusalReason, Stay
from specon.policy.move_costs import MoveCosts
from specon.policy.placement import ClusterIndex
from specon.policy.scheduler import InFlight, decide_pass
from specon.wire.protocol import Command


class Deciding:
    """Algorithm 2's answers and Algorithm 3's moves (a mixin of ``Coordinator``)."""

    policy: Policy
    state: ClusterState
    marks: dict[ContainerId, Mark]
    migrations: dict[str, Migration]
    requests: dict[ContainerId, float]
    virtual: dict[ContainerId, WorkerId]
    move_costs: MoveCosts
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

    def _decide(self, index: ClusterIndex, now: float, *, rebalance: bool) -> bool:
        """Act on one ``decide_pass``: answer a request, defer, or start a rebalancing move."""
        queue = sorted(self.requests, key=self.requests.__getitem__)
        flights = [
            InFlight(m.container, m.source, m.target)
            for m in self.migrations.values()
            if self.holds_budget(m)
        ]
        p = decide_pass(
            index.snapshot,
            requests=queue,
            in_flight=flights,
            policy=self.policy,
            index=index,
            rebalance=rebalance,
            learned=self.move_costs,
        )
        for cid in (*p.dropped, *p.answered):
            self.requests.pop(cid, None)
            self._deferred.discard(cid)
            self._answered[cid] = now
        for cid in p.deferred:
            if cid not in self._deferred:  # count a request once, not once per pass
                self._deferred.add(cid)
                self.emit(Event("request_deferred"))
        for r in p.refused:
            self.emit(Event("decision", {"kind": "refuse"}))
            if r.reason is RefusalReason.MIGRATION_LIMIT:
                # Already answered (e.g. the agent missed our mark): answer again.
                self._mark_command(r.container, now)
                continue
            self._log("specon.manager.request_refused", level="warning", container=r.container,
                      reason=r.reason.value, detail=r.detail)  # fmt: skip
            self.emit(Event("request_refused", {"reason": r.reason.value}))
        d = p.decision
        if d is not None:
            self.emit(Event("decision", {"kind": type(d).__name__.lower()}))
            self._mark(d.container, now)
            scores = dict(d.scores)  # not rounded here: 1,000 workers per decision add up
            if isinstance(d, Stay):
                self._log("specon.manager.stay", container=d.container, worker=d.worker, scores=scores)
                self._mark_command(d.container, now)
            elif isinstance(d, Move):
                self._log("specon.manager.move", container=d.container, source=d.source, target=d.target,
                          scores=scores)  # fmt: skip
                if self._begin(d, now):
                    self._mark_command(d.container, now)
        if p.rebalance is not None:
            mv = p.rebalance
            self._mark(mv.container, now, rebalanced=True)
            self._log("specon.manager.rebalance", container=mv.container, source=mv.source,
                      target=mv.target)  # fmt: skip
            self._begin(mv, now)
        return d is not None or p.rebalance is not None

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
