"""The manager's shell around the sans-I/O coordinator (``specon.coordinator.machine``).

It feeds the coordinator the HTTP inputs and the ticker, with the manager's clock, and
performs the effects it leaves: log events through structlog, metric events to the
Prometheus collectors, journal writes in a worker thread (off the event loop: the
Kubernetes journal is an HTTP read-modify-write with retries), and wake-ups for the
long polls of workers that got a command. The ticker's decision pass is answered in a
worker thread too (``tick``).

Write-ahead holds across the thread hop: the coordinator hands a command out only once
the shell has reported the journal writes made before it as durable (``journaled``).
Writes go to the journal in the order the coordinator made them (one writer at a time,
FIFO); a failed write is kept and retried by the next flush (the ticker's, at the
latest), and the commands behind it wait.

With leader election (``specon_manager.leader``) a shell starts as a **standby**
(``standby=True``): its coordinator is only a view of the journal for the status (re-read
every ``STANDBY_REFRESH`` seconds), it takes no input, drives nothing and writes nothing.
``lead`` makes it the leader: the coordinator is rebuilt from the journal as it is at that
moment, so what the last leader left in flight is finished or rolled back from there;
``stand_down`` stops it for good (leadership lost, or the process stopping).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import structlog

from specon.config import Policy
from specon.coordinator.deciding import answer
from specon.coordinator.effects import (
    CORDONS_KEY,
    QUALITY_KEY,
    CommandQueued,
    Event,
    JournalWrite,
    Log,
    PutMigration,
    Recovered,
    cordons_from_text,
    write,
)
from specon.coordinator.machine import RECENT_MIGRATIONS, Coordinator
from specon.coordinator.migration import Migration
from specon.daemon.settings import ManagerSettings
from specon.model import WorkerId
from specon.policy.quality_memory import QualityMemory
from specon.wire.operator import DrainReply
from specon.wire.protocol import CommandBatch, Heartbeat, ReallocationRequest
from specon_manager.journal import JournalStore
from specon_manager.status import drain_reply

log = structlog.get_logger()

Clock = Callable[[], float]


# The ticker's decision passes run in this one thread, never queued behind journal writes.
# A thread, not a process: pickling the 8,000-container snapshot for a process took 70 ms,
# the pass itself about 8. The GIL still serialises the pass's Python with the loop's: on
# the one core bench_daemons pins the manager to, the thread turns a 20 ms stall of the loop
# into slower heartbeats while the pass runs: p99 fell at 2,500 beats/s, not at 80 % of
# saturation (docs/benchmarks.md). Not at a lower nice value: on a core shared with other
# processes a starved thread holding the GIL stalled the loop for seconds.
_DECIDER = ThreadPoolExecutor(1, thread_name_prefix="specon-decision")


# Seconds between a standby's reads of the journal (its status shows what the leader wrote).
# Each read lists every migration record: rarely, as only a person reads a standby's status.
STANDBY_REFRESH = 30.0
# Seconds between the leader's prunings of the journal (ended migrations past retention).
PRUNE_EVERY = 3600.0


def read_back(journal: JournalStore) -> Recovered:
    """What the journal holds, read only (blocking I/O)."""
    return Recovered(
        in_flight=tuple(journal.in_flight()),
        finished=tuple(m for m in journal.all() if not m.in_flight),
        marks=tuple(journal.marks().values()),
        restarted=journal.get_meta("started_at") is not None,
        cordons=cordons_from_text(journal.get_meta(CORDONS_KEY)),
        quality=_quality_of(journal.get_meta(QUALITY_KEY)),
    )


def _quality_of(text: str | None) -> QualityMemory:
    """The journaled quality memory; an unreadable one is logged and started afresh (it only
    informs CPU weights, and the agents' next finished jobs fill it again)."""
    try:
        return QualityMemory.from_text(text)
    except ValueError as exc:
        log.warning("specon.manager.quality_memory_unreadable", error=str(exc))
        return QualityMemory()


def recover(journal: JournalStore, now: float) -> Recovered:
    """Read back what the journal holds and stamp this manager's start (blocking I/O:
    called once, before this manager acts on anything)."""
    recovered = read_back(journal)
    journal.set_meta("started_at", repr(now))
    return recovered


class ManagerShell:
    def __init__(
        self,
        *,
        policy: Policy,
        journal: JournalStore,
        clock: Clock = time.time,
        on_event: Callable[[Event], None] | None = None,
        standby: bool = False,
        journal_retention: float = ManagerSettings().journal_retention,
    ) -> None:
        """``journal_retention``: seconds an ended migration stays in the journal."""
        self.journal = journal
        self.journal_retention = journal_retention
        self._pruned = -math.inf  # the leader's last pruning of the journal: first at its first tick
        self.journal_pruned = 0  # ended migrations deleted from the journal
        self.clock = clock
        self.on_event = on_event
        # Told of every migration that ends, as it is journaled (Kubernetes Events).
        self.on_migration_end: Callable[[Migration], None] | None = None
        self.policy = policy
        # Whether this shell acts: takes inputs, drives migrations, writes the journal.
        self.leading = not standby
        self._retired = False  # stood down: never leads again
        now = clock()
        self._refreshed = now  # a standby's last read of the journal
        self.core = Coordinator(
            policy=policy,
            now=now,
            recovered=read_back(journal) if standby else recover(journal, now),
            timer=time.perf_counter,
        )
        self._pending: list[JournalWrite] = []
        self._waking: set[WorkerId] = set()
        self._writer = asyncio.Lock()
        self._wakeups: dict[WorkerId, asyncio.Event] = {}
        self.journal_failures = 0
        if standby:
            self.core.take_effects()  # a view: its "recovered" log would be the leader's news
        else:
            self._perform()

    # -- leadership -------------------------------------------------------------------------
    async def lead(self) -> None:
        """Become the leader: rebuild the coordinator from the journal as it is now (not as
        it was when this standby started) and start acting. Raises what the journal raises."""
        if self.leading:
            return
        now = self.clock()
        recovered = await asyncio.to_thread(recover, self.journal, now)
        if self._retired:  # lost the lease while reading
            return
        self._rebuild(recovered, now)
        self._pending.clear()
        self.leading = True
        await self.flush()  # logs the recovery; the writes are the inputs' from here on

    def stand_down(self) -> None:
        """Stop acting at once and for good: no input is applied any more (the HTTP face
        refuses them), no journal write is made, queued ones are dropped (the next leader
        reads the journal, so nothing it relies on is lost: commands wait for their writes)."""
        self.leading = False
        self._retired = True
        self._pending.clear()
        self.wake_all()

    async def settle(self) -> None:
        """Wait for a journal write in flight (a write made before ``stand_down``)."""
        async with self._writer:
            pass

    async def refresh(self) -> None:
        """A standby's view: read the journal again (in a thread), so its status shows what
        the leader recorded. Logs and keeps the old view when the journal cannot be read."""
        now = self.clock()
        self._refreshed = now
        try:
            recovered = await asyncio.to_thread(read_back, self.journal)
        except Exception as exc:
            log.warning("specon.manager.standby_refresh_failed", error=str(exc))
            return
        if not self.leading:  # it may have become the leader meanwhile
            self._rebuild(recovered, now)
            self.core.take_effects()

    def _rebuild(self, recovered: Recovered, now: float) -> None:
        """A fresh coordinator from ``recovered``, in this same object: the app's metrics and
        status hold it (``create_app`` watches ``shell.core``). Its revision moves on, so no
        status page cached from the old state is served again."""
        revision = self.core.revision + 1
        Coordinator.__init__(
            self.core, policy=self.policy, now=now, recovered=recovered, timer=time.perf_counter
        )
        self.core.revision = revision

    # -- effects ------------------------------------------------------------------------
    def _perform(self) -> None:
        """Log and count now; queue journal writes and wake-ups for ``flush``."""
        for e in self.core.take_effects():
            if isinstance(e, JournalWrite):
                self._pending.append(e)
                if isinstance(e, PutMigration) and e.migration.state.terminal and self.on_migration_end:
                    self.on_migration_end(e.migration)
            elif isinstance(e, CommandQueued):
                self._waking.add(e.worker)
            elif isinstance(e, Event):
                if self.on_event is not None:
                    self.on_event(e)
            elif isinstance(e, Log):
                (log.warning if e.level == "warning" else log.info)(e.event, **e.fields)

    async def flush(self) -> None:
        """Make the queued journal writes durable (in a thread), then wake the long polls
        of workers with new commands. Never raises: a failed write stays queued. A standby
        writes nothing."""
        if not self.leading:
            return
        self._perform()
        if self._pending:  # an input without writes of its own never queues behind another's
            async with self._writer:  # FIFO: writes reach the journal in the order they were made
                batch, self._pending = self._pending, []
                if batch:
                    try:
                        seq = await asyncio.to_thread(write, self.journal, batch)
                    except Exception as exc:
                        self._pending[:0] = batch  # retried, in order, by the next flush
                        self.journal_failures += 1
                        log.error("specon.manager.journal_failed", writes=len(batch), error=str(exc))
                        return
                    self.core.journaled(seq)
        if self._writer.locked():
            return  # a write is in flight: its writer wakes the polls once it is durable
        waking, self._waking = self._waking, set()
        for w in waking:
            ev = self._wakeups.get(w)
            if ev is not None:
                ev.set()

    # -- inputs -----------------------------------------------------------------------
    async def heartbeat(self, hb: Heartbeat) -> CommandBatch:
        ack = self.core.heartbeat(hb, self.clock())
        await self.flush()
        return self.core.batch_for(hb.worker, self.clock(), ack=ack, quality_held=hb.quality_version)

    async def request(self, req: ReallocationRequest) -> CommandBatch:
        """``NotHostedError`` unless ``req.worker`` runs the container."""
        self.core.request(req, self.clock())
        await self.flush()
        return self.core.batch_for(req.worker, self.clock())

    async def goodbye(self, worker: WorkerId) -> CommandBatch:
        self.core.goodbye(worker, self.clock())
        await self.flush()
        return self.core.batch_for(worker, self.clock())

    async def drain(self, worker: WorkerId, deadline: float | None) -> DrainReply:
        """Cordon ``worker`` and move its jobs off (``UnknownWorkerError``: never heard of)."""
        self.core.drain(worker, self.clock(), deadline=deadline)
        await self.flush()
        return drain_reply(self.core, worker)

    async def uncordon(self, worker: WorkerId) -> DrainReply:
        self.core.uncordon(worker, self.clock())
        await self.flush()
        return drain_reply(self.core, worker)

    async def tick(self) -> None:
        """The ticker's pass: timeouts, pruning, Algorithm 3; retries failed journal writes.
        A standby only refreshes its view of the journal, every ``STANDBY_REFRESH`` seconds."""
        if not self.leading:
            if not self._retired and self.clock() - self._refreshed >= STANDBY_REFRESH:
                await self.refresh()
            return
        ask = self.core.prepare(self.clock(), rebalance=True)
        if ask is not None:
            # The pass's index and Algorithms 2 and 3 run in a thread on an immutable Ask, so
            # heartbeats are answered meanwhile; ``settle`` acts on the loop, re-checking what
            # they changed (``specon.coordinator.deciding``). Why a thread: see ``_DECIDER``.
            ans = await asyncio.get_running_loop().run_in_executor(_DECIDER, answer, ask, time.perf_counter)
            if self.leading:  # not stood down meanwhile
                self.core.settle(ans)
        for w in set(self._wakeups) - self.core.state.workers.keys():
            self._wakeups.pop(w).set()  # a pruned worker's parked poll returns at once
        await self.flush()
        if self.clock() - self._pruned >= PRUNE_EVERY:
            await self.prune()

    async def prune(self) -> None:
        """Forget ended migrations past ``journal_retention`` (in a thread, between writes:
        a deposed leader's deletion is refused like its writes). Logged; never raises."""
        self._pruned = now = self.clock()
        async with self._writer:
            try:
                gone = await asyncio.to_thread(
                    self.journal.forget, now, self.journal_retention, RECENT_MIGRATIONS
                )
            except Exception as exc:
                self.journal_failures += 1
                log.error("specon.manager.journal_prune_failed", error=str(exc))
                return
        self.journal_pruned += gone
        if gone:
            log.info("specon.manager.journal_pruned", migrations=gone, older_than=self.journal_retention)

    async def poll(self, worker: WorkerId, timeout: float) -> CommandBatch:
        """Long poll: return as soon as ``worker`` has a command no reply or poll carried yet.

        Commands stay in the outbox until their result arrives (heartbeat replies repeat
        them); a poll only wakes for ones not sent yet, so it does not spin during a save.
        """
        if worker not in self.core.state.workers:
            # Not heard from (yet, or pruned): it has no commands, and keeps no state here.
            await asyncio.sleep(min(timeout, 1.0))
            return self.core.batch_for(worker, self.clock())
        if not self.core.has_unsent(worker):
            ev = self._wakeups.setdefault(worker, asyncio.Event())
            ev.clear()
            with contextlib.suppress(TimeoutError):  # asyncio.timeout: 3.11's wait_for can swallow a cancel
                async with asyncio.timeout(timeout):
                    await ev.wait()
        return self.core.batch_for(worker, self.clock())

    def wake_all(self) -> None:
        """Release every parked long poll (shutdown must not wait for them)."""
        for ev in self._wakeups.values():
            ev.set()
