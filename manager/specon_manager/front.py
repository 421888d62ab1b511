"""A front process of the manager (``specon-manager --fronts N``): the heartbeat path, on a core
of its own.

Each front listens on the manager's address with ``SO_REUSEPORT`` (the kernel spreads the
connections over the fronts) and serves TLS as the manager would. A heartbeat is answered
here when every check passes: a bearer token that speaks for the worker it names, a body
that decodes and keeps every declared limit (``specon.wire.protocol.decode``, the same
code the manager runs). It then goes to the decider as a frame (``specon_manager.relay``),
and the decider's ``CommandBatch`` comes back as the answer. Everything else, and any
heartbeat that is not answered that way, is passed to the decider's own HTTP app as it came
(``X-Forwarded-For`` and ``-Proto`` added): its answers, errors, log lines and counters
are the ones a manager without fronts gives. A front holds no cluster state and writes
nothing; it exits when the decider goes (its channel closes, or the decider dies).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import msgspec
import structlog
from aiohttp import web
from multidict import CIMultiDict

from specon.wire import protocol
from specon.wire.protocol import Heartbeat, ProtocolError
from specon_manager import relay
from specon_manager.app import bearer, error_reply
from specon_manager.auth import Authenticator
from specon_manager.standby import ROLE_HEADER

log = structlog.get_logger()

# Seconds a starting front waits for the decider's sockets.
CONNECT_TIMEOUT = 60.0
# Headers that describe one hop, not the request (RFC 9110 §7.6.1), and those the proxy sets.
_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Content-Length",
        "Content-Encoding",  # bodies are passed on decoded, both ways
        "X-Forwarded-For",
        "X-Forwarded-Proto",
    )
)


class Channel:
    """The front's end of the frame socket: one request in flight per id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[tuple[bytes, bytes]]] = {}
        self._reader = asyncio.create_task(self._read(reader), name="specon-front-channel")
        self.closed = asyncio.Event()

    async def ask(self, payload: bytes) -> tuple[bytes, bytes]:
        """The decider's ``(kind, payload)`` answer to a heartbeat frame."""
        ident = next(self._ids)
        fut: asyncio.Future[tuple[bytes, bytes]] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = fut
        try:
            self._writer.write(relay.frame(ident, relay.HEARTBEAT, payload))
            return await fut
        finally:
            self._waiting.pop(ident, None)

    def tell_rejected(self, reason: str) -> None:
        self._writer.write(relay.frame(0, relay.REJECTED, reason.encode()))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        frames = relay.Frames()
        try:
            while data := await reader.read(1 << 16):
                for ident, kind, payload in frames.feed(data):
                    fut = self._waiting.get(ident)
                    if fut is not None and not fut.done():
                        fut.set_result((kind, payload))
        except (OSError, relay.FrameError) as exc:
            log.error("specon.front.channel_broken", error=str(exc))
        finally:
            for fut in self._waiting.values():
                if not fut.done():
                    fut.set_result((relay.DECLINED, b""))
            self.closed.set()

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        self._writer.close()


class Front:
    def __init__(self, auth: Authenticator, sockets: Path, max_body: int) -> None:
        self.auth = auth
        self.sockets = sockets
        self.max_body = max_body
        self._channel: Channel | None = None
        self._session: aiohttp.ClientSession | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body: bytes | None = None
        length = request.content_length
        if length is not None and length <= self.max_body:
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge as exc:  # larger once decoded
                self._rejected("too_large")
                return error_reply(413, f"body too large: {exc.text}")
            except web.RequestPayloadError as exc:  # e.g. a Content-Encoding that does not decode
                self._rejected("malformed")
                return error_reply(400, f"unreadable body: {exc}")
            if request.method == "POST" and request.path == protocol.HEARTBEAT_PATH:
                answered = await self._answer(request, body)
                if answered is not None:
                    return answered
        return await self._pass_on(request, body)

    def _rejected(self, reason: str) -> None:
        if self._channel is not None:
            self._channel.tell_rejected(reason)

    async def _answer(self, request: web.Request, body: bytes) -> web.Response | None:
        """The decider's answer to a heartbeat every check passes; None: pass it on."""
        token = bearer(request)
        if token is None or self._channel is None:
            return None
        who = await self.auth.authenticate(token)
        if who is None or not who.agent:
            return None
        try:
            msg = protocol.decode(body, Heartbeat)
        except ProtocolError:
            return None
        if not who.may_speak_for(msg.worker):
            return None
        frame = packed(msg)
        if frame is None:
            return None
        kind, payload = await self._channel.ask(frame)
        if kind not in (relay.ANSWER, relay.ANSWER_AS_LEADER):
            return None
        resp = web.Response(body=payload, content_type=protocol.CONTENT_TYPE)
        if kind == relay.ANSWER_AS_LEADER:
            resp.headers[ROLE_HEADER] = "leader"
        return resp

    async def _pass_on(self, request: web.Request, body: bytes | None) -> web.StreamResponse:
        """``request`` as the decider's HTTP app answers it."""
        assert self._session is not None
        headers = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in _HOP)
        headers["X-Forwarded-For"] = request.remote or ""
        headers["X-Forwarded-Proto"] = request.scheme
        data = body if body is not None else (request.content if request.body_exists else None)
        try:
            async with self._session.request(
                request.method, f"http://manager{request.rel_url}", headers=headers, data=data
            ) as upstream:
                payload = await upstream.read()
                out = CIMultiDict((k, v) for k, v in upstream.headers.items() if k.lower() not in _HOP)
                return web.Response(status=upstream.status, body=payload, headers=out)
        except aiohttp.ClientError as exc:
            log.error("specon.front.decider_unreachable", path=request.path, error=str(exc))
            return error_reply(503, "the manager's decider is not reachable; retry")

    async def context(self, _app: web.Application) -> AsyncIterator[None]:
        """Connect to the decider (waiting for it to listen), serve, and exit when it goes."""
        reader, writer = await _connect(self.sockets / relay.BEATS_SOCKET)
        self._channel = Channel(reader, writer)
        connector = aiohttp.UnixConnector(path=str(self.sockets / relay.HTTP_SOCKET), limit=0)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT)
        self._session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)
        watch = asyncio.create_task(self._exit_when_closed(self._channel), name="specon-front-watch")
        yield
        watch.cancel()
        await self._session.close()
        await self._channel.close()

    @staticmethod
    async def _exit_when_closed(channel: Channel) -> None:
        await channel.closed.wait()
        log.warning("specon.front.decider_gone")
        os.kill(os.getpid(), signal.SIGTERM)  # run_app's own shutdown


def packed(msg: Heartbeat) -> bytes | None:
    """``msg`` as the decider reads it (``fronts.HEARTBEATS``); None where msgpack cannot
    carry it (an integer past 64 bits in a command's free-form detail, which JSON allows)."""
    try:
        return msgspec.msgpack.encode(msg)
    except (OverflowError, TypeError, ValueError):
        return None


async def _connect(path: Path) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    deadline = asyncio.get_running_loop().time() + CONNECT_TIMEOUT
    while True:
        try:
            return await asyncio.open_unix_connection(str(path), limit=relay.MAX_FRAME)
        except OSError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.05)


def front_app(
    auth: Authenticator,
    sockets: Path,
    max_body: int,
    *,
    extra: Callable[[web.Application], AsyncIterator[None]] | None = None,
) -> web.Application:
    """The front's app; ``extra``: a cleanup context of its own (the TLS files' reloader)."""
    front = Front(auth, sockets, max_body)
    app = web.Application(client_max_size=max_body)
    app.router.add_route("*", "/{tail:.*}", front.handle)
    app.cleanup_ctx.append(front.context)
    if extra is not None:
        app.cleanup_ctx.append(extra)
    return app
