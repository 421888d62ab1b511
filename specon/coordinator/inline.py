"""A synchronous shell around the coordinator: every effect performed at once, in order.

The simulator drives the coordinator through it (with an in-memory journal and
simulated agents for ``on_command``), and so do the unit tests (with the SQLite
journal). The manager's own shell (``specon_manager.shell``) performs the same effects with
the journal off its event loop.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from specon.config import Policy
from specon.coordinator.effects import (
    CommandQueued,
    Event,
    JournalWrite,
    JournalWriter,
    Log,
    Recovered,
    write,
)
from specon.coordinator.machine import Coordinator
from specon.coordinator.migration import Cordon, Mark, Migration
from specon.coordinator.state import ClusterState
from specon.model import ContainerId, WorkerId
from specon.policy.decisions import Move
from specon.wire.protocol import Command, CommandBatch, Heartbeat, ReallocationRequest

Clock = Callable[[], float]


class InlineCoordinator:
    def __init__(
        self,
        *,
        policy: Policy,
        journal: JournalWriter,
        clock: Clock,
        recovered: Recovered | None = None,
        state: ClusterState | None = None,
        timer: Clock | None = None,
        on_event: Callable[[Event], None] | None = None,
        on_log: Callable[[Log], None] | None = None,
        on_command: Callable[[CommandQueued], None] | None = None,
    ) -> None:
        self.journal = journal
        self.clock = clock
        self.on_event = on_event
        self.on_log = on_log
        self.on_command = on_command
        self.core = Coordinator(policy=policy, now=clock(), recovered=recovered, state=state, timer=timer)
        self.perform()

    def perform(self) -> None:
        """Perform what the core asked for: journal writes first (write-ahead), then the rest."""
        effects = self.core.take_effects()
        self.core.journaled(write(self.journal, (e for e in effects if isinstance(e, JournalWrite))))
        for e in effects:
            if isinstance(e, Event):
                if self.on_event is not None:
                    self.on_event(e)
            elif isinstance(e, Log):
                if self.on_log is not None:
                    self.on_log(e)
            elif isinstance(e, CommandQueued) and self.on_command is not None:
                self.on_command(e)

    # -- inputs ---------------------------------------------------------------------------
    def on_heartbeat(self, hb: Heartbeat) -> CommandBatch:
        now = self.clock()
        ack = self.core.heartbeat(hb, now)
        self.perform()
        return self.core.batch_for(hb.worker, now, ack=ack, quality_held=hb.quality_version)

    def on_request(self, req: ReallocationRequest) -> CommandBatch:
        now = self.clock()
        try:
            self.core.request(req, now)
        finally:
            self.perform()
        return self.core.batch_for(req.worker, now)

    def on_goodbye(self, worker: WorkerId) -> None:
        self.core.goodbye(worker, self.clock())
        self.perform()

    def on_drain(self, worker: WorkerId, *, deadline: float | None = None) -> Cordon:
        try:
            return self.core.drain(worker, self.clock(), deadline=deadline)
        finally:
            self.perform()

    def on_uncordon(self, worker: WorkerId) -> bool:
        try:
            return self.core.uncordon(worker, self.clock())
        finally:
            self.perform()

    def step(self, *, rebalance: bool = False) -> bool:
        """One pass; True if it decided something."""
        decided = self.core.tick(self.clock(), rebalance=rebalance)
        self.perform()
        return decided

    def batch_for(self, worker: WorkerId) -> CommandBatch:
        return self.core.batch_for(worker, self.clock())

    def record_dry_run(self, move: Move, now: float) -> Migration:
        m = self.core.record_dry_run(move, now)
        self.perform()
        return m

    # -- the core's state, read-only by convention ------------------------------------------
    @property
    def policy(self) -> Policy:
        return self.core.policy

    @property
    def state(self) -> ClusterState:
        return self.core.state

    @property
    def migrations(self) -> dict[str, Migration]:
        return self.core.migrations

    @property
    def marks(self) -> dict[ContainerId, Mark]:
        return self.core.marks

    @property
    def outbox(self) -> dict[WorkerId, dict[str, Command]]:
        return self.core.outbox

    @property
    def requests(self) -> dict[ContainerId, float]:
        return self.core.requests

    @property
    def virtual(self) -> dict[ContainerId, WorkerId]:
        return self.core.virtual

    @property
    def recent(self) -> deque[Migration]:
        return self.core.recent
