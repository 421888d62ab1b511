"""The agent's supervised background tasks: monitor, heartbeat, poll.

Each loop logs a crash and carries on instead of dying silently. While the manager is
away the agent keeps classifying and retries with exponential backoff; nothing it knows
is dropped (pending requests and unacknowledged results ride on the next heartbeat).

Reading the progress logs is the one slow, file-bound part of a tick: it runs in a worker
thread (``Tailer.prefetch``), and only the classification, which changes the agent's
state, runs on the event loop. So /healthz and the manager link stay responsive while a
huge log is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from agent.client import ManagerClient, ManagerRejected, ManagerUnavailable
from agent.core import Agent
from specon import protocol
from specon.progress import Tailer
from specon.protocol import CommandBatch, Goodbye, Poll, ReallocationRequest

log = structlog.get_logger()


@dataclass(slots=True)
class Backoff:
    """Exponential backoff with full jitter, as a setting (kopf-style)."""

    initial: float = 0.5
    maximum: float = 30.0
    attempt: int = 0

    def next(self) -> float:
        delay = min(self.maximum, self.initial * 2**self.attempt)
        self.attempt += 1
        return random.uniform(delay / 2, delay)

    def reset(self) -> None:
        self.attempt = 0


@dataclass(slots=True)
class LinkState:
    """What the agent knows about its manager link (for /healthz and /metrics)."""

    connected: bool = False
    last_ok: float | None = None
    failures: int = 0
    rejected: int = 0
    heartbeats_sent: int = 0


class AgentDaemon:
    def __init__(self, agent: Agent, client: ManagerClient, *, poll_wait: float = 20.0) -> None:
        self.agent = agent
        self.client = client
        self.poll_wait = poll_wait
        self.link = LinkState()
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def policy_interval(self) -> float:
        return self.agent.policy.monitor.interval

    def start(self) -> None:
        for name, fn in (("monitor", self._monitor), ("heartbeat", self._heartbeat), ("poll", self._poll)):
            self._tasks.append(asyncio.create_task(self._supervised(name, fn), name=f"specon-agent-{name}"))

    async def stop(self, *, goodbye: bool = True) -> None:
        """Staged shutdown: stop the loops, let running commands finish, say goodbye."""
        self._stopping.set()
        self._wake.set()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self.agent.running:
            await asyncio.wait(
                list(self.agent.running.values()), timeout=self.agent.policy.migration.grace_period
            )
        if self.agent.unacked:
            # Results of the commands just waited for: the manager must not redo a save.
            hb = self.agent.heartbeat(self.agent.runtime.now())
            with contextlib.suppress(ManagerUnavailable, ManagerRejected):
                await self.client.send(protocol.HEARTBEAT_PATH, hb, timeout=3.0)
        if goodbye:
            with contextlib.suppress(ManagerUnavailable, ManagerRejected):
                msg = Goodbye(worker=self.agent.worker, sent_at=self.agent.runtime.now())
                await self.client.send(protocol.GOODBYE_PATH, msg, timeout=3.0)
        await self.client.close()

    async def _supervised(self, name: str, fn: Callable[[], Awaitable[None]]) -> None:
        while not self._stopping.is_set():
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("specon.agent.task_crashed", task=name)
                await asyncio.sleep(1.0)

    # -- loops -------------------------------------------------------------------------
    async def _monitor(self) -> None:
        """Every Δ: find containers, tail logs, Algorithm 1; send new requests at once."""
        rt = self.agent.runtime
        next_tick = rt.now()
        while not self._stopping.is_set():
            await self.agent.refresh()
            await self.agent.sample_usage()
            await self.read_logs()
            # The reading is done: tick's polls hand over what was read, and tick runs on
            # the loop, where no other coroutine mutates the agent's state meanwhile.
            requests = self.agent.tick(rt.now())
            await self.agent.publish_changes()
            for cid in requests:
                st = self.agent.watched[cid].state
                req = ReallocationRequest(
                    worker=self.agent.worker,
                    container=cid,
                    t_cc=st.t_cc if st.t_cc is not None else rt.now(),
                    g=st.last_g or 0.0,
                    sent_at=rt.now(),
                )
                log.info("specon.agent.request", container=cid, g=req.g)
                self.agent.counters.requests_sent += 1
                await self._exchange(protocol.REQUEST_PATH, req)
            interval = self.policy_interval
            next_tick += interval
            if rt.now() - next_tick > interval:
                next_tick = rt.now()  # fell behind (or the clock jumped): skip, don't burst
            await rt.sleep(max(0.0, min(interval, next_tick - rt.now())))

    async def read_logs(self) -> None:
        """Read every watched container's new log lines in a worker thread (``prefetch``);
        the next ``tick`` polls hand them over without touching a file.

        Safe against the loop meanwhile: a tailer a refresh or a save closes is closed when
        its read returns; a container adopted meanwhile is polled by tick itself (its first
        poll was done at adoption, so that read is at most one poll's worth).
        """
        tailers = [w.tailer for w in self.agent.watched.values()]
        if tailers:
            await asyncio.to_thread(_prefetch, tailers)

    async def _heartbeat(self) -> None:
        backoff = Backoff()
        interval = self.agent.policy.messaging.heartbeat_interval
        while not self._stopping.is_set():
            await self.agent.refresh()
            ok = await self._exchange(protocol.HEARTBEAT_PATH, self.agent.heartbeat(self.agent.runtime.now()))
            if ok:
                self.link.heartbeats_sent += 1
                backoff.reset()
                delay = interval * random.uniform(0.9, 1.1)  # jitter: agents don't beat in step
            else:
                delay = min(interval, backoff.next())
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)

    async def _poll(self) -> None:
        backoff = Backoff()
        while not self._stopping.is_set():
            msg = Poll(worker=self.agent.worker, sent_at=self.agent.runtime.now(), wait=self.poll_wait)
            if await self._exchange(protocol.POLL_PATH, msg, timeout=self.poll_wait + 10.0):
                backoff.reset()
            else:
                await asyncio.sleep(backoff.next())

    # -- one exchange ------------------------------------------------------------------
    async def _exchange(self, path: str, msg: protocol.Message, *, timeout: float = 10.0) -> bool:
        rt = self.agent.runtime
        try:
            batch = await self.client.send(path, msg, timeout=timeout)
        except ManagerUnavailable as exc:
            self.link.failures += 1
            if self.link.connected or self.link.failures == 1:
                log.warning("specon.agent.manager_unreachable", error=str(exc))
            self.link.connected = False
            return False
        except ManagerRejected as exc:
            # Refused (401/403/400): not a working link, whatever the last success was; the
            # loops keep retrying at their interval (a rotated token or a fixed manager heals it).
            self.link.rejected += 1
            self.link.connected = False
            log.error("specon.agent.message_rejected", path=path, status=exc.status, error=str(exc))
            return False
        if not self.link.connected:
            log.info("specon.agent.manager_connected", url=self.client.base_url)
        self.link.connected, self.link.last_ok = True, rt.now()
        self._handle(batch)
        return True

    def _handle(self, batch: CommandBatch) -> None:
        for task in self.agent.accept(batch):
            # Report a finished command at once instead of at the next heartbeat.
            task.add_done_callback(lambda _t: self._wake.set())


def _prefetch(tailers: list[Tailer]) -> None:
    """In a worker thread: each tailer's next poll; one failing never starves the others."""
    for tailer in tailers:
        try:
            tailer.prefetch()
        except Exception:
            log.exception("specon.agent.log_read_failed", tailer=repr(tailer))
