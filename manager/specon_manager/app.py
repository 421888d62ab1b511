"""The manager's HTTP face: protocol endpoints, status JSON and page, /metrics, /healthz.

Every protocol POST needs ``Authorization: Bearer <token>`` (401 otherwise). The token's identity
(``specon_manager.auth``) must speak for the worker the message names: a per-agent token that
names another worker gets 403. A body that does not decode as the expected message, or
breaks a range rule (``specon.wire.checks``), gets 400 with an ``ErrorReply`` naming
the problem; a body over ``messaging.max_body_bytes`` gets 413. Status (JSON and page)
is paged and, with a read token configured, needs it (or the shared token) as a bearer
token or, from a browser, a session cookie got by logging in (``specon_manager.login``);
``/metrics``, ``/healthz`` and ``/openapi.json`` are open.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Protocol

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from specon.coordinator.draining import UnknownWorkerError
from specon.coordinator.machine import NotHostedError
from specon.daemon.settings import ManagerSettings
from specon.model import Resources, WorkerId
from specon.runtime.kubernetes.admission import WEBHOOK_PATH
from specon.wire import protocol
from specon.wire.operator import DRAIN_PATH, UNCORDON_PATH, DrainRequest
from specon.wire.pod_writes import POD_WRITES_PATH, PodWriteReply, PodWriteRequest
from specon.wire.protocol import (
    CommandBatch,
    ErrorReply,
    Goodbye,
    Heartbeat,
    Poll,
    ProtocolError,
    ReallocationRequest,
)
from specon.wire.validate import InvalidIdError, valid_id
from specon_manager import login
from specon_manager.auth import Authenticator, Identity, StaticTokens
from specon_manager.heap import HeapFreezer
from specon_manager.metrics import ManagerMetrics
from specon_manager.openapi import openapi_json
from specon_manager.page import LOGIN_PATH, LOGOUT_PATH, SECURITY_HEADERS, render_status_page
from specon_manager.sessions import SessionStore
from specon_manager.shell import ManagerShell
from specon_manager.status import BadPageError, Page, build_status, drain_reply

log = structlog.get_logger()

SHELL = web.AppKey("shell", ManagerShell)
METRICS = web.AppKey("metrics", ManagerMetrics)
AUTH = web.AppKey("authenticator", Authenticator)
# Whether GET of status and the page needs a token (a read token was configured).
GUARD_READS = web.AppKey("guard_reads", bool)
STARTED = web.AppKey("started", float)
STATUS_LOCK = web.AppKey("status_lock", asyncio.Lock)
STATUS_CACHE = web.AppKey("status_cache", dict[tuple[str, Page], tuple[float, int, bytes]])
# The operational knobs: ticker period, poll hold, status cache and page sizes.
SETTINGS = web.AppKey("settings", ManagerSettings)
# Browser sessions of the status page (used only with GUARD_READS).
SESSIONS = web.AppKey("sessions", SessionStore)
IDENTITY = web.RequestKey("identity", Identity)  # the caller, set by _guard
# The reader came with a session cookie (not a bearer token): its page has a log-out button.
BY_SESSION = web.RequestKey("by_session", bool)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Extension(Protocol):
    """A part served only in some deployments (``specon_manager.admission.PodAdmission``)."""

    def install(self, app: web.Application, registry: CollectorRegistry) -> None: ...


class PodBroker(Protocol):
    """``specon_manager.pod_broker.PodBroker`` (imported only with the kubernetes extra)."""

    @property
    def collector(self) -> Collector: ...  # its counters, for /metrics

    async def write(self, who: Identity, req: PodWriteRequest) -> PodWriteReply: ...


class NodeRequests(Protocol):
    """``specon.runtime.kubernetes.others.ClusterRequests``: what other pods take of a node."""

    def free(self, node: str, capacity: Resources, jobs: Iterable[str]) -> Resources: ...


# Writes on Kubernetes pods for the agents (``--manage-pods``; absent: 404).
POD_BROKER = web.AppKey("pod_broker", PodBroker)
# With it: each Kubernetes worker's capacity less what its node's other pods request.
NODE_REQUESTS = web.AppKey("node_requests", NodeRequests)


def _reply(msg: protocol.Message, status: int = 200) -> web.Response:
    return web.Response(body=protocol.encode(msg), status=status, content_type=protocol.CONTENT_TYPE)


def error_reply(status: int, error: str, path: str | None = None) -> web.Response:
    """An ``ErrorReply`` with ``status``."""
    return _reply(ErrorReply(error=error, path=path), status)


def bearer(request: web.Request) -> str | None:
    """The bearer token ``request`` carries, if any."""
    header = request.headers.get(protocol.AUTH_HEADER, "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given or not given.isascii():
        return None  # a token is ASCII: anything else cannot match, whatever it decodes to
    return given.strip()


_GUARDED_READS = frozenset({protocol.STATUS_PATH, "/"})
WORKERS_PREFIX = "/v1/workers/"  # the operator's paths (drain, uncordon)
# POSTs without a credential: logging in, and the API server's admission reviews (it sends none).
OPEN_POSTS = frozenset({*login.PATHS, WEBHOOK_PATH})


def _by_cookie(request: web.Request) -> tuple[Identity | None, web.Response | None]:
    """A guarded read without a bearer token: who its session cookie proves, or else the
    login form for a browser opening the page (neither: the bearer token's 401 follows)."""
    session, sent = login.session_of(request, request.app[SESSIONS])
    if session is not None:
        request[BY_SESSION] = True
        return session.identity, None
    if request.path != "/" or not login.wants_html(request):
        return None, None
    form = login.login_form(login.SESSION_ENDED if sent else None, 401)
    if sent:
        login.forget_cookie(request, form)
    return None, form


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    metrics = request.app[METRICS]
    post = request.method == "POST"
    guarded = (post and request.path not in OPEN_POSTS) or (
        request.app[GUARD_READS]
        and (request.path in _GUARDED_READS or request.path.startswith(WORKERS_PREFIX))
    )
    if guarded:
        token = bearer(request)
        if token is None and not post:  # a cookie stands in for the token on reads only, never on a POST
            who, form = _by_cookie(request)
            if form is not None:
                return form
        else:
            who = None if token is None else await request.app[AUTH].authenticate(token)
        if who is None:
            metrics.rejected.labels(reason="unauthorized").inc()
            log.warning("specon.manager.unauthorized", path=request.path, peer=request.remote)
            return error_reply(401, "missing or wrong bearer token")
        if not post and not login.may_read(who):
            metrics.rejected.labels(reason="forbidden").inc()
            return error_reply(403, f"{who.name} may not read the status: use the read token")
        if post and not who.agent and not (who.operator and request.path.startswith(WORKERS_PREFIX)):
            metrics.rejected.labels(reason="forbidden").inc()
            what = "may only drain and uncordon workers" if who.operator else "is read-only"
            return error_reply(403, f"{who.name} {what}")
        request[IDENTITY] = who
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge as exc:
        metrics.rejected.labels(reason="too_large").inc()
        return error_reply(413, f"body too large: {exc.text}")
    except web.HTTPClientError as exc:  # no such route or method: say so as an ErrorReply too
        return error_reply(exc.status, exc.reason)


def _forbidden(request: web.Request, worker: str) -> web.Response | None:
    """403 unless the caller's token speaks for ``worker``."""
    who: Identity = request[IDENTITY]
    if who.may_speak_for(worker):
        return None
    request.app[METRICS].rejected.labels(reason="forbidden").inc()
    log.warning("specon.manager.forbidden", identity=who.name, worker=worker, path=request.path)
    return error_reply(403, f"{who.name} may not speak for worker {worker}", "worker")


async def _decode(request: web.Request, kind: type[protocol.M]) -> protocol.M | web.Response:
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise
    except web.RequestPayloadError as exc:  # e.g. a Content-Encoding that does not decode
        request.app[METRICS].rejected.labels(reason="malformed").inc()
        return error_reply(400, f"unreadable body: {exc}")
    try:
        return protocol.decode(body, kind)
    except ProtocolError as exc:
        request.app[METRICS].rejected.labels(reason="malformed").inc()
        log.warning("specon.manager.bad_message", path=request.path, error=str(exc), field=exc.path)
        return error_reply(400, str(exc), exc.path)


async def heartbeat(request: web.Request) -> web.Response:
    msg = await _decode(request, Heartbeat)
    if isinstance(msg, web.Response):
        return msg
    if (denied := _forbidden(request, msg.worker)) is not None:
        return denied
    if (problem := _state_problem(request.app, msg)) is not None:
        request.app[METRICS].rejected.labels(reason="malformed").inc()
        error, path = problem
        if path == "seq":
            log.warning("specon.manager.seq_implausible", worker=msg.worker, seq=msg.seq)
        return error_reply(400, error, path)
    return _reply(await _apply(request.app, msg))


async def relayed_heartbeat(app: web.Application, msg: Heartbeat) -> bytes | None:
    """The answer to a heartbeat a front (``specon_manager.front``) has authenticated, decoded
    and checked, or None where the HTTP handler would refuse it or a standby gets it: the front
    then sends the request itself, and ``heartbeat`` answers it, counts and logs it."""
    if not app[SHELL].leading or _state_problem(app, msg) is not None:
        return None
    return protocol.encode(await _apply(app, msg))


def _state_problem(app: web.Application, msg: Heartbeat) -> tuple[str, str] | None:
    """``(error, path)`` when the cluster's state refuses ``msg``, which decoded and checked."""
    shell = app[SHELL]
    cap = shell.core.policy.messaging.max_containers_per_heartbeat
    if len(msg.containers) > cap:
        return f"containers: {len(msg.containers)} in one heartbeat, at most {cap}", "containers"
    if not shell.core.state.seq_plausible(msg, shell.clock()):
        return "seq: implausibly far ahead of the manager's clock (expected microseconds)", "seq"
    return None


async def _apply(app: web.Application, msg: Heartbeat) -> CommandBatch:
    if (reqs := app.get(NODE_REQUESTS)) is not None:
        free = reqs.free(msg.worker, msg.capacity, (c.id for c in msg.containers))
        if free != msg.capacity:
            msg = dataclasses.replace(msg, capacity=free)
    metrics = app[METRICS]
    t0 = time.perf_counter()
    batch = await app[SHELL].heartbeat(msg)
    metrics.heartbeat_latency.observe(time.perf_counter() - t0)
    # The ack says whether it was applied (other heartbeats may be applied meanwhile: the
    # journal write is awaited, so a count taken before it would not tell).
    if batch.ack is not None:
        metrics.heartbeat_accepted(msg.worker)
    else:
        metrics.rejected.labels(reason="stale").inc()
    return batch


async def reallocation_request(request: web.Request) -> web.Response:
    msg = await _decode(request, ReallocationRequest)
    if isinstance(msg, web.Response):
        return msg
    if (denied := _forbidden(request, msg.worker)) is not None:
        return denied
    log.info("specon.manager.request_received", worker=msg.worker, container=msg.container, g=msg.g)
    try:
        return _reply(await request.app[SHELL].request(msg))
    except NotHostedError as exc:
        request.app[METRICS].rejected.labels(reason="forbidden").inc()
        log.warning("specon.manager.request_not_hosted", worker=msg.worker, container=msg.container)
        return error_reply(403, str(exc), "container")


async def poll(request: web.Request) -> web.Response:
    msg = await _decode(request, Poll)
    if isinstance(msg, web.Response):
        return msg
    if (denied := _forbidden(request, msg.worker)) is not None:
        return denied
    wait = min(max(msg.wait, 0.0), request.app[SETTINGS].max_poll_wait)
    batch: CommandBatch = await request.app[SHELL].poll(msg.worker, wait)
    return _reply(batch)


async def goodbye(request: web.Request) -> web.Response:
    msg = await _decode(request, Goodbye)
    if isinstance(msg, web.Response):
        return msg
    if (denied := _forbidden(request, msg.worker)) is not None:
        return denied
    log.info("specon.manager.goodbye", worker=msg.worker)
    return _reply(await request.app[SHELL].goodbye(msg.worker))


def _worker(request: web.Request) -> WorkerId | web.Response:
    """The worker the path names (400 for an id that is not one)."""
    try:
        return WorkerId(valid_id(request.match_info["worker"]))
    except InvalidIdError as exc:
        return error_reply(400, str(exc), "worker")


def _operator(request: web.Request) -> WorkerId | web.Response:
    """The worker a drain call names, if the caller holds the operator token (403 otherwise)."""
    who: Identity = request[IDENTITY]
    if not who.operator:
        request.app[METRICS].rejected.labels(reason="forbidden").inc()
        log.warning("specon.manager.forbidden", identity=who.name, path=request.path)
        return error_reply(403, f"{who.name} may not drain or uncordon workers: use the operator token")
    return _worker(request)


async def drain(request: web.Request) -> web.Response:
    worker = _operator(request)
    if isinstance(worker, web.Response):
        return worker
    try:
        req = DrainRequest.parse(await request.read())
    except ValueError as exc:
        request.app[METRICS].rejected.labels(reason="malformed").inc()
        return error_reply(400, str(exc))
    try:
        reply = await request.app[SHELL].drain(worker, req.deadline)
    except UnknownWorkerError:
        return error_reply(404, f"no worker {worker} has been heard from", "worker")
    log.info(
        "specon.manager.drain_requested",
        worker=worker,
        deadline=req.deadline,
        identity=request[IDENTITY].name,
    )
    return _json(reply.to_json(), 202)


async def uncordon(request: web.Request) -> web.Response:
    worker = _operator(request)
    if isinstance(worker, web.Response):
        return worker
    try:
        return _json((await request.app[SHELL].uncordon(worker)).to_json())
    except UnknownWorkerError:
        return error_reply(404, f"no worker {worker} has been heard from", "worker")


async def drain_status(request: web.Request) -> web.Response:
    worker = _worker(request)
    if isinstance(worker, web.Response):
        return worker
    core = request.app[SHELL].core
    if worker not in core.state.workers and worker not in core.cordons:
        return error_reply(404, f"no worker {worker} has been heard from", "worker")
    return _json(drain_reply(core, worker).to_json())


async def pod_writes(request: web.Request) -> web.Response:
    """An agent's write on its node's pods, made by the broker if its checks allow."""
    try:
        req = PodWriteRequest.parse(await request.read())
    except ValueError as exc:
        request.app[METRICS].rejected.labels(reason="malformed").inc()
        return error_reply(400, str(exc))
    return _json((await request.app[POD_BROKER].write(request[IDENTITY], req)).to_json())


def _json(body: bytes, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, content_type=protocol.CONTENT_TYPE)


def _page(request: web.Request) -> Page | web.Response:
    try:
        return Page.parse(request.query.get("limit"), request.query.get("after"), request.app[SETTINGS])
    except BadPageError as exc:
        return error_reply(400, str(exc), "query")


async def _rendered(request: web.Request, kind: str, render: Callable[[Page], bytes]) -> web.Response:
    """A status page, built by one request at a time and shared while nothing changed
    (for at most the ``status_ttl`` setting's seconds: its ages and ``now`` move on).

    Building a page is synchronous work on the event loop: one at a time, each at most a
    page's worth, keeps ``/healthz`` and heartbeats answered between them however many
    clients read; the cache lets many readers of an unchanged cluster share one build.
    """
    page = _page(request)
    if isinstance(page, web.Response):
        return page
    cache, settings = request.app[STATUS_CACHE], request.app[SETTINGS]
    key = (kind, page)
    revision = request.app[SHELL].core.revision
    async with request.app[STATUS_LOCK]:
        hit = cache.get(key)
        now = time.monotonic()
        if hit is None or hit[0] < now or hit[1] != revision:
            if len(cache) >= settings.status_cache_size:
                cache.clear()
            hit = cache[key] = (now + settings.status_ttl, revision, render(page))
            await asyncio.sleep(0)  # let waiting requests (healthz, heartbeats) in between builds
    if kind == "json":
        return web.Response(body=hit[2], content_type=protocol.CONTENT_TYPE)
    headers = (
        {**SECURITY_HEADERS, "Cache-Control": "no-store"} if request.app[GUARD_READS] else SECURITY_HEADERS
    )
    return web.Response(body=hit[2], content_type="text/html", charset="utf-8", headers=headers)


async def status_json(request: web.Request) -> web.Response:
    shell = request.app[SHELL]
    return await _rendered(
        request, "json", lambda p: protocol.encode(build_status(shell.core, shell.clock(), p))
    )


async def status_page(request: web.Request) -> web.Response:
    shell = request.app[SHELL]
    logout = request.get(BY_SESSION, False)
    return await _rendered(
        request,
        "html-session" if logout else "html",
        lambda p: render_status_page(build_status(shell.core, shell.clock(), p), logout=logout).encode(),
    )


async def login_post(request: web.Request) -> web.Response:
    if not request.app[GUARD_READS]:
        return error_reply(404, "no read token is configured: the status page needs no login")
    return await login.login(request, request.app[AUTH], request.app[SESSIONS], request.app[METRICS])


async def logout_post(request: web.Request) -> web.Response:
    if not request.app[GUARD_READS]:
        return error_reply(404, "no read token is configured: the status page needs no login")
    return await login.logout(request, request.app[SESSIONS], request.app[METRICS])


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=openapi_json(), content_type="application/json")


async def healthz(request: web.Request) -> web.Response:
    coord = request.app[SHELL].core
    return web.json_response(
        {
            "ok": True,
            "uptime": round(time.time() - request.app[STARTED], 3),
            "in_flight": len(coord.migrations),
        }
    )


async def _ticker(app: web.Application) -> AsyncIterator[None]:
    """Drive timeouts and Algorithm 3 even when no message arrives; log, never die, on a bug."""
    shell, period = app[SHELL], app[SETTINGS].ticker_period
    heap = HeapFreezer()

    async def loop() -> None:
        while True:
            await asyncio.sleep(period)
            try:
                await shell.tick()
                state = shell.core.state
                heap.maybe_freeze(len(state.containers) + len(state.workers))
            except Exception:
                log.exception("specon.manager.tick_failed")

    task = asyncio.create_task(loop(), name="specon-manager-ticker")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def create_app(
    shell: ManagerShell,
    *,
    token: str | None = None,
    auth: Authenticator | None = None,
    guard_reads: bool = False,
    tick: bool = True,
    settings: ManagerSettings | None = None,
    pod_broker: PodBroker | None = None,
    node_requests: NodeRequests | None = None,
    extensions: Iterable[Extension] = (),
) -> web.Application:
    """The manager app. ``auth`` decides who may call; ``token`` alone is a shared token
    (every worker). ``guard_reads``: status and the page need a read or shared token.
    ``settings``: the operational knobs (default: ``ManagerSettings()``). ``pod_broker``:
    serve ``POST /v1/kubernetes/pods`` (Kubernetes agents' pod writes). ``node_requests``:
    take other pods' requests off each Kubernetes worker's reported capacity. ``extensions``:
    further routes (the pod admission webhook)."""
    if auth is None:
        if not token:
            raise ValueError("the manager needs a bearer token or an authenticator")
        auth = StaticTokens(shared=token)
    app = web.Application(middlewares=[_guard], client_max_size=shell.core.policy.messaging.max_body_bytes)
    app[SHELL] = shell
    app[AUTH] = auth
    app[GUARD_READS] = guard_reads
    app[SETTINGS] = settings or ManagerSettings()
    app[SESSIONS] = SessionStore(app[SETTINGS].session_ttl)
    app[STATUS_LOCK] = asyncio.Lock()
    app[STATUS_CACHE] = {}
    app[STARTED] = time.time()
    m = ManagerMetrics()
    m.watch(shell.core)
    m.watch_journal(lambda: shell.journal_failures, lambda: shell.journal_pruned)
    shell.on_event = m.on_event
    app[METRICS] = m
    app.router.add_post(protocol.HEARTBEAT_PATH, heartbeat)
    app.router.add_post(protocol.REQUEST_PATH, reallocation_request)
    app.router.add_post(protocol.POLL_PATH, poll)
    app.router.add_post(protocol.GOODBYE_PATH, goodbye)
    app.router.add_get(protocol.STATUS_PATH, status_json)
    app.router.add_post(DRAIN_PATH, drain)
    app.router.add_get(DRAIN_PATH, drain_status)
    app.router.add_post(UNCORDON_PATH, uncordon)
    app.router.add_get("/", status_page)
    app.router.add_post(LOGIN_PATH, login_post)
    app.router.add_post(LOGOUT_PATH, logout_post)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/openapi.json", openapi)
    if pod_broker is not None:
        app[POD_BROKER] = pod_broker
        m.registry.register(pod_broker.collector)
        app.router.add_post(POD_WRITES_PATH, pod_writes)
    if node_requests is not None:
        app[NODE_REQUESTS] = node_requests
    for ext in extensions:
        ext.install(app, m.registry)
    if tick:
        app.cleanup_ctx.append(_ticker)
    app.on_shutdown.append(_release_polls)
    return app


async def _release_polls(app: web.Application) -> None:
    app[SHELL].wake_all()
    await app[SHELL].flush()  # journal what is still queued before the process ends
