"""The agent's supervised background tasks: monitor, heartbeat, poll.

Each loop logs a crash and carries on instead of dying silently. While the manager is
away the agent keeps classifying and retries with exponential backoff (tenacity's
``AsyncRetrying``, one per loop, tuned by ``AgentSettings``); nothing it knows is dropped
(pending requests and unacknowledged results ride on the next heartbeat).

Reading the progress logs is the one slow, file-bound part of a tick: it runs in a worker
thread (``Tailer.prefetch``), and only the classification, which changes the agent's
state, runs on the event loop. So /healthz and the manager link stay responsive while a
huge log is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_result
from tenacity.wait import wait_base, wait_exponential, wait_random_exponential

from specon.daemon.settings import AgentSettings
from specon.progress import Tailer
from specon.wire import protocol
from specon.wire.protocol import CommandBatch, Goodbye, Poll, ReallocationRequest
from specon_agent.client import ManagerClient, ManagerRejected, ManagerUnavailable
from specon_agent.core import Agent

log = structlog.get_logger()

Nap = Callable[[float], Awaitable[None]]
Exchange = Callable[[], Awaitable[bool]]  # True: it went through


def backoff(settings: AgentSettings, cap: float | None = None) -> wait_base:
    """The wait before retry n: a random point between half and all of
    ``min(cap, backoff_max, backoff_initial * 2**(n-1))``, so that agents that lost the
    manager together do not come back in step, and none retries in a busy loop."""
    top = settings.backoff_max if cap is None else min(cap, settings.backoff_max)
    half = settings.backoff_initial / 2
    return wait_exponential(multiplier=half, max=top / 2) + wait_random_exponential(
        multiplier=half, max=top / 2
    )


def _failed(ok: bool) -> bool:
    return not ok


def _gave_up(_state: RetryCallState) -> bool:
    return False  # the daemon is stopping: the exchange did not go through


# Seconds between GPU-sharing passes at the least (an NVML read and a plan take milliseconds).
GPU_MIN_PERIOD = 0.5


@dataclass(slots=True)
class LinkState:
    """What the agent knows about its manager link (for /healthz and /metrics)."""

    connected: bool = False
    last_ok: float | None = None
    failures: int = 0
    rejected: int = 0
    heartbeats_sent: int = 0
    # Sent before the runtime's listing came back (``AgentDaemon._listed``).
    heartbeats_unlisted: int = 0


class AgentDaemon:
    """The agent's loops; their timeouts and backoff come from ``agent.settings``."""

    def __init__(self, agent: Agent, client: ManagerClient) -> None:
        self.agent = agent
        self.client = client
        self.settings: AgentSettings = agent.settings
        self.link = LinkState()
        # Each manager loop's retrying (its statistics say which attempt it is on).
        self.retrying: dict[str, AsyncRetrying] = {}
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        # The heartbeat's refresh of the containers while the runtime is still listing, and
        # since when (monotonic seconds).
        self._listing: asyncio.Task[None] | None = None
        self._listing_since = 0.0
        # Priority on the GPUs (``specon_agent.gpu_share``), the agent's; one pass at a time.
        self.gpu_share = agent.gpu_share
        self._gpu_lock = asyncio.Lock()

    @property
    def policy_interval(self) -> float:
        return self.agent.policy.monitor.interval

    @property
    def gpu_period(self) -> float:
        """Seconds between two GPU-sharing passes between monitor ticks: half a quantum (a switch
        is due at most half a quantum late), never under ``GPU_MIN_PERIOD``."""
        return max(GPU_MIN_PERIOD, self.agent.policy.gpu.quantum / 2)

    def start(self) -> None:
        loops = [("monitor", self._monitor), ("heartbeat", self._heartbeat), ("poll", self._poll)]
        # Freezing in quanta needs passes more often than Δ (30 s by default), on the GPUs only.
        if self.agent.gpus.reader is not None and self.agent.policy.gpu.mechanism in ("freeze", "both"):
            loops.append(("gpu", self._gpus))
        for name, fn in loops:
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
        if self._listing is not None:
            self._listing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # its error is no news now
                await self._listing
        try:  # no job stays frozen behind an agent that left (suspended ones are resumed by the next)
            await self.gpu_share.close()
        except Exception:
            log.exception("specon.agent.gpu_close_failed")
        if self.agent.running:
            await asyncio.wait(
                list(self.agent.running.values()), timeout=self.agent.policy.migration.grace_period
            )
        if self.agent.unacked:
            # Results of the commands just waited for: the manager must not redo a save.
            hb = self.agent.heartbeat(self.agent.runtime.now())
            with contextlib.suppress(ManagerUnavailable, ManagerRejected):
                await self.client.send(protocol.HEARTBEAT_PATH, hb, timeout=self.settings.shutdown_timeout)
        if goodbye:
            with contextlib.suppress(ManagerUnavailable, ManagerRejected):
                msg = Goodbye(worker=self.agent.worker, sent_at=self.agent.runtime.now())
                await self.client.send(protocol.GOODBYE_PATH, msg, timeout=self.settings.shutdown_timeout)
        await self.client.close()

    async def _supervised(self, name: str, fn: Callable[[], Awaitable[None]]) -> None:
        while not self._stopping.is_set():
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("specon.agent.task_crashed", task=name)
                await asyncio.sleep(self.settings.crash_pause)

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
            await self.agent.apply_priority(rt.now())  # weights read the categories just decided
            await self.share_gpus()
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

    async def _gpus(self) -> None:
        """Between monitor ticks, every ``gpu_period``: a fresh GPU sample and a sharing pass,
        so a quantum ends on time (the weights are the last tick's)."""
        rt = self.agent.runtime
        while not self._stopping.is_set():
            await rt.sleep(self.gpu_period)
            if self.agent.gpu_sample is None or not self.agent.gpu_sample.devices:
                continue  # no GPU seen (yet): the monitor tick samples again
            await self.agent.sample_gpus()
            await self.share_gpus()

    async def share_gpus(self) -> None:
        """The GPU sharing's pass (``specon_agent.gpu_share``): the same priority rule among
        the jobs of each GPU. A failure is logged; the loop goes on."""
        agent = self.agent
        try:
            async with self._gpu_lock:
                await self.gpu_share.step(
                    agent.runtime.now(),
                    sample=agent.gpu_sample,
                    running=agent.running_jobs(),
                    fair=agent.cpu_weights.fair,
                    priority=agent.policy.priority,
                    specs={cid: w.info.spec for cid, w in agent.watched.items()},
                    shares=agent.cpu_weights.shares,
                )
        except Exception:
            log.exception("specon.agent.gpu_share_crashed")

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

    def _retried(
        self, name: str, exchange: Exchange, *, cap: float | None = None, sleep: Nap = asyncio.sleep
    ) -> Exchange:
        """``exchange``, retried while it fails, backing off, until it goes through (True) or
        the daemon stops (False); each call starts from the first delay again. An exception
        from it (a bug, not the manager being away) is not retried: it reaches ``_supervised``."""
        retrying = AsyncRetrying(
            wait=backoff(self.settings, cap),
            retry=retry_if_result(_failed),
            stop=self._stop_retrying,
            retry_error_callback=_gave_up,
            sleep=sleep,
        )
        self.retrying[name] = retrying
        return retrying.wraps(exchange)

    def _stop_retrying(self, _state: RetryCallState) -> bool:
        # Checked after each failed exchange: a stopping daemon gives up instead of retrying
        # (``stop`` wakes a heartbeat's wait, and a ``wait_for`` woken as it is cancelled may
        # swallow the cancellation).
        return self._stopping.is_set()

    async def _heartbeat(self) -> None:
        interval = self.agent.policy.messaging.heartbeat_interval
        # A finished command (``_wake``) cuts a wait short, a retry's too: its result goes at once.
        beat = self._retried("heartbeat", self._beat, cap=interval, sleep=self._nap)
        while not self._stopping.is_set():
            if await beat():
                self.link.heartbeats_sent += 1
                await self._nap(interval * random.uniform(0.9, 1.1))  # jitter: agents don't beat in step

    async def _beat(self) -> bool:
        messaging = self.agent.policy.messaging
        listed = await self._listed(messaging.heartbeat_interval)
        if not listed:
            if time.monotonic() - self._listing_since > messaging.worker_timeout:
                return False  # a runtime stuck listing for so long: let the worker fall silent
            self.link.heartbeats_unlisted += 1
        hb = self.agent.heartbeat(self.agent.runtime.now(), new_results=listed)
        return await self._exchange(protocol.HEARTBEAT_PATH, hb)

    async def _listed(self, within: float) -> bool:
        """Refresh the containers for a heartbeat; False when the runtime is still listing
        after ``within`` seconds. A Docker engine answers a listing only once a container it
        is starting has started (its inspect waits for the container's lock): seconds under
        load. The heartbeat then goes with the containers as last listed instead of waiting,
        so a slow start never makes the worker look silent to the manager (a restore given up
        as 'worker unreachable' while it ran); the listing carries on for the next beat."""
        if self._listing is None:
            self._listing = asyncio.create_task(self.agent.refresh(), name="specon-agent-listing")
            self._listing_since = time.monotonic()
        done, _ = await asyncio.wait({self._listing}, timeout=within)
        if not done:
            return False
        task, self._listing = self._listing, None
        task.result()  # a failed listing fails the beat, as it always did
        return True

    async def _nap(self, seconds: float) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):  # asyncio.timeout: 3.11's wait_for can swallow a cancel
            async with asyncio.timeout(seconds):
                await self._wake.wait()

    async def _poll(self) -> None:
        poll = self._retried("poll", self._poll_once)
        while not self._stopping.is_set():
            await poll()

    async def _poll_once(self) -> bool:
        wait = self.settings.poll_wait
        msg = Poll(worker=self.agent.worker, sent_at=self.agent.runtime.now(), wait=wait)
        return await self._exchange(protocol.POLL_PATH, msg, timeout=wait + self.settings.poll_timeout_margin)

    # -- one exchange ------------------------------------------------------------------
    async def _exchange(self, path: str, msg: protocol.Message, *, timeout: float | None = None) -> bool:
        rt = self.agent.runtime
        if timeout is None:
            timeout = self.settings.request_timeout
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
