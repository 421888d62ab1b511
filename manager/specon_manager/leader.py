"""Two or more managers, one leader: election through a ``coordination.k8s.io/v1`` Lease.

``LeaseElector`` campaigns for the Lease ``--leader-elect-lease-name`` and, once it holds
it, renews it every retry period; the decisions are ``specon_manager.lease``'s (client-go's
semantics). ``attach`` ties it to a manager app whose shell starts as a standby:

* elected: the shell ``lead``s (rebuilds its coordinator from the journal as it is now), and
  only then does ``/readyz`` answer 200 and does it mark its pod (``--leader-elect-label-pod``,
  ``specon_manager.leader_pod``), so the Service routes the agents to this replica;
* not elected: the standby serves ``/healthz``, ``/readyz`` (503), ``/metrics`` and the
  status read from the journal, and refuses protocol POSTs (``specon_manager.standby``);
* leadership lost (no renewal within the renew deadline, or another holder seen): the shell
  stands down at once (no input, no journal write) and the process stops with exit code 1,
  as kube-controller-manager does, so Kubernetes restarts it as a standby with a fresh view;
* a graceful stop (SIGTERM) stands down, waits for the journal write in flight, then
  releases the lease (empty holder) so a standby takes over at its next try.

``FencedJournal`` refuses every journal write unless the elector holds an unexpired lease
(``holds``: renewed within the renew deadline), so a leader that stalls (a long GC pause, a
frozen VM) cannot write after its lease could have passed to another replica. What remains
is a write already sent when it stalled: it lands at most the HTTP timeout later; the
journal's optimistic concurrency then makes it fail if the new leader wrote that record.

Why not ``kubernetes.leaderelection`` (the official client's): it runs in threads with
blocking callbacks, uses the client's global configuration (not the manager's
``--kubeconfig``), judges expiry from the holder's ``renewTime`` against the local wall
clock (clock skew between nodes shortens or stretches the lease) and has no release on
shutdown. The calls here go through ``specon.runtime.kubernetes.api.KubeApi`` (JSON in and
out, the one REST client of the project; ``kubernetes`` imports stay in that package), on a
small thread pool of their own, so a slow journal write never delays a renewal.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import random
import signal
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from specon.coordinator.effects import Transactional
from specon.coordinator.migration import Mark, Migration
from specon.model import ContainerId
from specon.runtime.kubernetes.api import KubeApi, KubeError, load_api_client
from specon_manager import lease, standby
from specon_manager.journal import JournalStore
from specon_manager.leader_pod import LeaderPod
from specon_manager.lease import Acquire, Follow, Record, Seen, Timing
from specon_manager.shell import ManagerShell

log = structlog.get_logger()


class LeaseApi(Protocol):
    """What the elector needs of ``KubeApi``."""

    def request(self, method: str, path: str, *, body: object = None) -> Any: ...


def default_identity() -> str:
    """``<pod or host name>_<random>``, unique per process like kube-controller-manager's: a
    restarted manager is a new candidate and waits for the old lease to expire."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


class Outcome(enum.Enum):
    HELD = "held"  # this candidate holds the lease now
    OTHER = "other"  # another candidate holds an unexpired lease
    FAILED = "failed"  # the API refused or did not answer: try again


@dataclass(frozen=True, slots=True)
class _Try:
    outcome: Outcome
    seen: Seen | None
    sent: float | None = None  # when the winning write was sent (monotonic)
    error: str | None = None


class ElectionMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.leader = Gauge(
            "specon_manager_leader", "1 while this manager leads, 0 while it is a standby", registry=registry
        )
        self.transitions = Counter(
            "specon_manager_leader_transitions",
            "Times this manager saw the lease pass to a new holder (itself included)",
            registry=registry,
        )
        self.failures = Counter(
            "specon_manager_lease_failures",
            "Lease reads or writes the API refused or did not answer",
            registry=registry,
        )


class LeaseElector:
    """Campaign for one Lease; see the module doc. ``clock`` is monotonic, ``wall`` the
    time written into the Lease (for people reading it: expiry never compares it)."""

    def __init__(
        self,
        api: LeaseApi,
        *,
        namespace: str,
        name: str,
        identity: str,
        timing: Timing | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.namespace, self.name, self.identity = namespace, name, identity
        self.timing = timing or Timing()
        self.clock, self.wall = clock, wall
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.leading = False
        self.leader = ""  # the holder last seen ("" none, or not read yet)
        self.lost: str | None = None  # why this manager stopped leading
        self.metrics: ElectionMetrics | None = None
        self._seen: Seen | None = None
        self._renewed: float | None = None
        self._failing: str | None = None
        # Its own threads: a renewal never queues behind journal writes or status builds.
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="specon-lease")

    def holds(self) -> bool:
        """Whether this manager may act as the leader now (the fence of every journal write)."""
        return self.leading and lease.holds(self._renewed, self.timing, self.clock())

    # -- the campaign ------------------------------------------------------------------------
    async def run(
        self, on_lead: Callable[[], Coroutine[Any, Any, None]], on_lost: Callable[[str], None]
    ) -> None:
        """Campaign until elected, start ``on_lead`` and renew; when leadership is lost (or
        ``on_lead`` fails), call ``on_lost(reason)`` and return. Cancel it to stop."""
        log.info("specon.manager.standby", identity=self.identity, lease=f"{self.namespace}/{self.name}")
        while (await self._attempt()).outcome is not Outcome.HELD:
            await asyncio.sleep(self.timing.retry_period * random.uniform(1.0, lease.JITTER))
        self._set_leading(True)
        assert self._seen is not None
        log.info(
            "specon.manager.leader_acquired",
            identity=self.identity,
            lease=f"{self.namespace}/{self.name}",
            transitions=self._seen.record.transitions,
        )
        taking_over = asyncio.create_task(on_lead(), name="specon-manager-lead")
        try:
            reason = await self._keep(taking_over)
        finally:
            if not taking_over.done():
                taking_over.cancel()
        self.lost = reason
        self._set_leading(False)
        log.error("specon.manager.leader_lost", identity=self.identity, reason=reason)
        on_lost(reason)

    async def _keep(self, taking_over: asyncio.Task[None]) -> str:
        """Renew every retry period until leadership ends; the reason it ended."""
        while True:
            await asyncio.sleep(self.timing.retry_period)
            if taking_over.done() and not taking_over.cancelled() and taking_over.exception() is not None:
                return f"taking over failed: {taking_over.exception()}"
            reason = await self._renew()
            if reason is not None:
                return reason

    async def _renew(self) -> str | None:
        """One renewal, retried within the renew deadline; None once renewed."""
        assert self._renewed is not None
        deadline = self._renewed + self.timing.renew_deadline
        while (left := deadline - self.clock()) > 0:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancel that
            # lands as the try completes, and a stopping leader would then renew forever.
            try:
                async with asyncio.timeout(left):
                    got = await self._attempt()
            except TimeoutError:
                break
            if got.outcome is Outcome.HELD:
                return None
            if got.outcome is Outcome.OTHER:
                return f"the lease is held by {self.leader or 'nobody'}"
            await asyncio.sleep(min(self.timing.retry_period, max(0.0, deadline - self.clock())))
        return f"not renewed within the renew deadline ({self.timing.renew_deadline:g} s)"

    async def _attempt(self) -> _Try:
        """One try to take or renew the lease (blocking calls on the elector's threads); its
        result is applied only if it arrives (a try abandoned at the deadline never counts)."""
        got = await asyncio.get_running_loop().run_in_executor(
            self._pool, self._try, self._seen, self.leading
        )
        self._apply(got)
        return got

    def _apply(self, got: _Try) -> None:
        if got.error is not None:
            if self.metrics is not None:
                self.metrics.failures.inc()
            if got.error != self._failing:  # once per distinct failure, not every second
                log.warning(
                    "specon.manager.lease_failed", lease=f"{self.namespace}/{self.name}", error=got.error
                )
            self._failing = got.error
        else:
            self._failing = None
        if got.seen is None:
            return
        holder = got.seen.record.holder
        if holder and holder != self.leader and (self._seen is not None or holder == self.identity):
            if self.metrics is not None:
                self.metrics.transitions.inc()
            if holder != self.identity and not self.leading:
                log.info("specon.manager.standby", identity=self.identity, leader=holder)
        self.leader = holder
        self._seen = got.seen
        if got.outcome is Outcome.HELD:
            self._renewed = got.sent

    def _try(self, seen: Seen | None, leading: bool) -> _Try:
        """In a thread: read (unless the leader's last write is known to be current), decide,
        write with the version read. Never raises."""
        try:
            if leading and seen is not None and seen.record.holder == self.identity:
                got = self._write(seen, create=False)  # the leader's fast path: no read first
                if got is not None:
                    return got
            now = self.clock()
            current = self._read()
            seen = None if current is None else lease.observe(seen, *current, now)
            if leading and (seen is None or seen.record.holder != self.identity):
                return _Try(Outcome.OTHER, seen)  # it was taken, or given back: never ours again
            decision = lease.decide(self.identity, seen, now)
            if isinstance(decision, Follow):
                return _Try(Outcome.OTHER, seen)
            create = isinstance(decision, Acquire) and decision.create
            # 409: another write came first; whose, the next read tells.
            return self._write(seen, create=create) or _Try(Outcome.FAILED, seen)
        except KubeError as exc:
            return _Try(Outcome.FAILED, seen, error=str(exc))

    def _read(self) -> tuple[Record, str] | None:
        try:
            obj = self.api.request("GET", f"{self.path}/{self.name}")
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return Record.of(obj), str((obj.get("metadata") or {}).get("resourceVersion", ""))

    def _write(self, seen: Seen | None, *, create: bool) -> _Try | None:
        """Write this candidate's claim over ``seen``; None when another write came first (409)."""
        sent = self.clock()
        record = lease.claimed(self.identity, seen, self.timing, self.wall())
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if not create and seen is not None:
            meta["resourceVersion"] = seen.version
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": record.spec(),
        }
        try:
            if create:
                obj = self.api.request("POST", self.path, body=body)
            else:
                obj = self.api.request("PUT", f"{self.path}/{self.name}", body=body)
        except KubeError as exc:
            if exc.status == 409:  # another candidate wrote first (or created it first)
                return None
            raise
        version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        return _Try(Outcome.HELD, Seen(Record.of(obj), version, sent), sent)

    def _set_leading(self, leading: bool) -> None:
        self.leading = leading
        if self.metrics is not None:
            self.metrics.leader.set(1 if leading else 0)

    # -- stopping ----------------------------------------------------------------------------
    async def release(self) -> bool:
        """Stop leading and, if the lease still names this manager, hand it back (empty
        holder) so that a standby takes it at once. True if it was released."""
        self._set_leading(False)
        try:
            done = await asyncio.get_running_loop().run_in_executor(self._pool, self._release)
        except KubeError as exc:
            log.warning("specon.manager.lease_release_failed", error=str(exc))
            return False
        if done:
            log.info("specon.manager.leader_released", identity=self.identity)
        return done

    def _release(self) -> bool:
        for _ in range(2):  # a renewal of ours may race it once
            current = self._read()
            if current is None or current[0].holder != self.identity:
                return False
            record, version = current
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace, "resourceVersion": version},
                "spec": lease.released(record, self.wall()).spec(),
            }
            try:
                self.api.request("PUT", f"{self.path}/{self.name}", body=body)
                return True
            except KubeError as exc:
                if exc.status != 409:
                    raise
        return False

    def check(self) -> None:
        """Read the Lease once (blocking): ``KubeError`` unless it can be read or is absent."""
        self._read()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class NotLeaderError(RuntimeError):
    """A journal write refused: this manager does not hold the lease (any more)."""


class FencedJournal:
    """A journal whose writes go through only while ``may_write()`` (the elector's
    ``holds``); reads always do. Checked in the writing thread, right before each call."""

    def __init__(self, journal: JournalStore, may_write: Callable[[], bool]) -> None:
        self.inner = journal
        self.may_write = may_write
        self.path = getattr(journal, "path", "")

    def _check(self, what: str) -> None:
        if not self.may_write():
            raise NotLeaderError(f"{what}: this manager does not hold the lease")

    def put(self, m: Migration) -> None:
        self._check(f"migration {m.id}")
        self.inner.put(m)

    def put_mark(self, mark: Mark) -> None:
        self._check(f"marks of {mark.container}")
        self.inner.put_mark(mark)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """The inner journal's, where it has one (the Kubernetes journal writes a batch's marks
        one shard at a time); each write in it is still checked when it is made."""
        with self.inner.transaction() if isinstance(self.inner, Transactional) else contextlib.nullcontext():
            yield

    def set_meta(self, key: str, value: str) -> None:
        self._check(f"meta {key}")
        self.inner.set_meta(key, value)

    def forget(self, now: float, older_than: float, keep_newest: int) -> int:
        self._check("pruning the journal")
        return self.inner.forget(now, older_than, keep_newest)

    def get(self, migration_id: str) -> Migration | None:
        return self.inner.get(migration_id)

    def in_flight(self) -> list[Migration]:
        return self.inner.in_flight()

    def all(self) -> list[Migration]:
        return self.inner.all()

    def marks(self) -> dict[ContainerId, Mark]:
        return self.inner.marks()

    def get_meta(self, key: str) -> str | None:
        return self.inner.get_meta(key)

    def close(self) -> None:
        self.inner.close()


def elector_for(
    journal: JournalStore,
    *,
    kubeconfig: str | None,
    namespace: str,
    name: str,
    identity: str | None,
    timing: Timing,
    label_pod: str | None = None,
) -> tuple[LeaseElector, FencedJournal, LeaderPod | None]:
    """The elector of ``specon-manager --leader-elect``, ``journal`` fenced by it and, with
    ``label_pod``, the pod it marks while leading; reads the Lease once (absent is fine) so
    that a missing permission fails at start: ``ValueError``."""
    try:
        client = load_api_client(kubeconfig)
    except Exception as exc:  # the client raises several unrelated types for a bad config
        raise ValueError(f"no Kubernetes configuration: {exc}") from exc
    # A call never outlasts half the renew deadline: a hung one leaves time for a retry.
    api = KubeApi(client, timeout=max(timing.retry_period, timing.renew_deadline / 2))
    elector = LeaseElector(
        api, namespace=namespace, name=name, identity=identity or default_identity(), timing=timing
    )
    try:
        elector.check()
    except KubeError as exc:
        raise ValueError(f"cannot read the Lease {namespace}/{name}: {exc}") from exc
    pod = (
        None
        if not label_pod
        else LeaderPod(api, namespace=namespace, pod=label_pod, retry_period=timing.retry_period)
    )
    return elector, FencedJournal(journal, elector.holds), pod


def _exit_as_standby(_reason: str) -> None:
    """The process stops (exit code 1, see ``specon_manager.__main__``) and Kubernetes
    restarts it: a new candidate with a fresh view, never a leader that missed a turn."""
    signal.raise_signal(signal.SIGTERM)


def attach(
    app: web.Application,
    shell: ManagerShell,
    elector: LeaseElector,
    *,
    registry: CollectorRegistry,
    on_lost: Callable[[str], None] = _exit_as_standby,
    pod: LeaderPod | None = None,
) -> None:
    """Run ``elector`` with ``app`` (before it starts): ``shell`` (built with
    ``standby=True`` on a ``FencedJournal``) leads when elected; the standby's HTTP face;
    the leader/transition metrics in ``registry``; the lease released on a graceful stop;
    ``pod`` (this replica's) marked while it leads (``specon_manager.leader_pod``)."""
    elector.metrics = ElectionMetrics(registry)
    elector.metrics.leader.set(0)
    standby.install(app, shell, leader=lambda: elector.leader)

    tasks: list[asyncio.Task[None]] = []

    def lost(reason: str) -> None:
        shell.stand_down()
        on_lost(reason)

    async def stop_campaign() -> None:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def lead() -> None:
        await shell.lead()
        if pod is not None:  # taken over: the Service may send the agents here now
            await pod.keep_marking(still=lambda: elector.leading)

    async def campaign(_app: web.Application) -> AsyncIterator[None]:
        if pod is not None:  # an earlier process's mark on this pod (it was killed leading)
            await pod.unmark()
        tasks.append(asyncio.create_task(elector.run(lead, lost), name="specon-manager-election"))
        yield
        await stop_campaign()
        elector.close()

    async def step_down(_app: web.Application) -> None:
        # After the app's own shutdown hook has flushed the journal: stop acting and
        # campaigning (a candidate would take the lease back), let the write in flight
        # land, then hand the lease over.
        shell.stand_down()
        await stop_campaign()
        if pod is not None and pod.wanted:  # no agent is sent here from now on (also a mark in flight)
            await pod.unmark()
        await shell.settle()
        await elector.release()

    app.cleanup_ctx.append(campaign)
    app.on_shutdown.append(step_down)
