"""The manager's HTTP face: protocol endpoints, status JSON and page, /metrics, /healthz.

Every POST needs ``Authorization: Bearer <token>`` (401 otherwise); a body that does not
decode as the expected message gets 400 with an ``ErrorReply`` naming the problem; a
body over ``messaging.max_body_bytes`` gets 413. GETs are read-only and open.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from manager.coordinator import Coordinator
from manager.metrics import ManagerMetrics
from manager.page import render_status_page
from specon import protocol
from specon.protocol import (
    CommandBatch,
    ErrorReply,
    Goodbye,
    Heartbeat,
    MigrationStatus,
    Poll,
    ProtocolError,
    ReallocationRequest,
    Status,
)

log = structlog.get_logger()

COORD = web.AppKey("coordinator", Coordinator)
METRICS = web.AppKey("metrics", ManagerMetrics)
TOKEN = web.AppKey("token", str)
STARTED = web.AppKey("started", float)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _reply(msg: protocol.Message, status: int = 200) -> web.Response:
    return web.Response(body=protocol.encode(msg), status=status, content_type=protocol.CONTENT_TYPE)


def _error(status: int, error: str, path: str | None = None) -> web.Response:
    return _reply(ErrorReply(error=error, path=path), status)


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    metrics = request.app[METRICS]
    if request.method == "POST":
        header = request.headers.get(protocol.AUTH_HEADER, "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), request.app[TOKEN].encode()):
            metrics.rejected.labels(reason="unauthorized").inc()
            log.warning("specon.manager.unauthorized", path=request.path, peer=request.remote)
            return _error(401, "missing or wrong bearer token")
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge as exc:
        metrics.rejected.labels(reason="too_large").inc()
        return _error(413, f"body too large: {exc.text}")


async def _decode(request: web.Request, kind: type[protocol.M]) -> protocol.M | web.Response:
    body = await request.read()
    try:
        return protocol.decode(body, kind)
    except ProtocolError as exc:
        request.app[METRICS].rejected.labels(reason="malformed").inc()
        log.warning("specon.manager.bad_message", path=request.path, error=str(exc), field=exc.path)
        return _error(400, str(exc), exc.path)


async def heartbeat(request: web.Request) -> web.Response:
    msg = await _decode(request, Heartbeat)
    if isinstance(msg, web.Response):
        return msg
    coord = request.app[COORD]
    t0 = time.perf_counter()
    seen = coord.state.heartbeats
    batch = coord.on_heartbeat(msg)
    request.app[METRICS].decision_latency.observe(time.perf_counter() - t0)
    if coord.state.heartbeats > seen:
        request.app[METRICS].heartbeats.labels(worker=msg.worker).inc()
    else:
        request.app[METRICS].rejected.labels(reason="stale").inc()
    return _reply(batch)


async def reallocation_request(request: web.Request) -> web.Response:
    msg = await _decode(request, ReallocationRequest)
    if isinstance(msg, web.Response):
        return msg
    log.info("specon.manager.request_received", worker=msg.worker, container=msg.container, g=msg.g)
    return _reply(request.app[COORD].on_request(msg))


async def poll(request: web.Request) -> web.Response:
    msg = await _decode(request, Poll)
    if isinstance(msg, web.Response):
        return msg
    wait = min(max(msg.wait, 0.0), 60.0)
    batch: CommandBatch = await request.app[COORD].wait_for_commands(msg.worker, wait)
    return _reply(batch)


async def goodbye(request: web.Request) -> web.Response:
    msg = await _decode(request, Goodbye)
    if isinstance(msg, web.Response):
        return msg
    log.info("specon.manager.goodbye", worker=msg.worker)
    request.app[COORD].on_goodbye(msg.worker)
    return _reply(request.app[COORD].batch_for(msg.worker))


def build_status(coord: Coordinator) -> Status:
    now = coord.clock()
    timeout = coord.policy.messaging.worker_timeout
    finished = [m for m in coord.journal.all() if not m.in_flight]
    in_flight = sorted(coord.migrations.values(), key=lambda m: m.decided_at)
    return Status(
        now=now,
        mode=coord.policy.mode,
        policy_generation=coord.generation,
        dry_run=coord.policy.migration.dry_run,
        workers=coord.state.worker_status(now, timeout),
        containers=coord.state.container_status(coord.marks),
        migrations=tuple(MigrationStatus.of(m) for m in [*finished, *in_flight]),
    )


async def status_json(request: web.Request) -> web.Response:
    return _reply(build_status(request.app[COORD]))


async def status_page(request: web.Request) -> web.Response:
    html = render_status_page(build_status(request.app[COORD]))
    return web.Response(text=html, content_type="text/html")


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def healthz(request: web.Request) -> web.Response:
    coord = request.app[COORD]
    return web.json_response(
        {
            "ok": True,
            "uptime": round(time.time() - request.app[STARTED], 3),
            "in_flight": len(coord.migrations),
        }
    )


async def _ticker(app: web.Application) -> AsyncIterator[None]:
    """Drive timeouts and Algorithm 3 even when no message arrives; log, never die, on a bug."""
    coord = app[COORD]

    async def loop() -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                coord.step(rebalance=True)
            except Exception:
                log.exception("specon.manager.tick_failed")

    task = asyncio.create_task(loop(), name="specon-manager-ticker")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def create_app(coord: Coordinator, *, token: str, tick: bool = True) -> web.Application:
    if not token:
        raise ValueError("the manager needs a non-empty bearer token")
    app = web.Application(middlewares=[_guard], client_max_size=coord.policy.messaging.max_body_bytes)
    app[COORD] = coord
    app[TOKEN] = token
    app[STARTED] = time.time()
    m = ManagerMetrics()
    m.watch(coord)
    coord.on_event = m.on_event
    app[METRICS] = m
    app.router.add_post(protocol.HEARTBEAT_PATH, heartbeat)
    app.router.add_post(protocol.REQUEST_PATH, reallocation_request)
    app.router.add_post(protocol.POLL_PATH, poll)
    app.router.add_post(protocol.GOODBYE_PATH, goodbye)
    app.router.add_get(protocol.STATUS_PATH, status_json)
    app.router.add_get("/", status_page)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    if tick:
        app.cleanup_ctx.append(_ticker)
    app.on_shutdown.append(_release_polls)
    return app


async def _release_polls(app: web.Application) -> None:
    app[COORD].wake_all()
