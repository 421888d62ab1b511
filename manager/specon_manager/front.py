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
from yarl import URL

from specon.wire import protocol
from specon.wire.protocol import Heartbeat, ProtocolError
from specon_manager import relay
from specon_manager.app import OPEN_POSTS, WORKERS_PREFIX, bearer, error_reply
from specon_manager.auth import Authenticator, Identity
from specon_manager.standby import ROLE_HEADER

log = structlog.get_logger()

# Seconds a starting front waits for the decider's sockets.
CONNECT_TIMEOUT = 60.0
# Headers that describe one hop, not the message (RFC 9110 §7.6.1), and those the front sets.
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
    )
)
# A request body is passed on as the front's server decoded it; the caller's address and
# scheme are the front's to say.
_NOT_PASSED_ON = _HOP | {"content-encoding", "x-forwarded-for", "x-forwarded-proto"}
# Headers aiohttp's client adds by itself: the decider gets only what the caller sent.
_NOT_ADDED = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
# Signals that stop a front: the first starts its graceful shutdown, later ones change nothing
# (a process group's SIGTERM and the decider's own reach a front one after the other).
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Channel:
    """The front's end of the frame socket: one request in flight per id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[tuple[bytes, bytes]]] = {}
        self._reader = asyncio.create_task(self._read(reader), name="specon-front-channel")
        self.closed = asyncio.Event()

    async def ask(self, payload: bytes) -> tuple[bytes, bytes]:
        """The decider's ``(kind, payload)`` answer to a heartbeat frame (declined once closed)."""
        if self.closed.is_set():
            return relay.DECLINED, b""
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
        if request.method != "POST":
            return await self._pass_on(request, None)
        who = None
        if request.path not in OPEN_POSTS:  # a bearer token, checked before the body as ``_guard`` does
            token = bearer(request)
            who = None if token is None else await self.auth.authenticate(token)
            refused = who is None or not (
                who.agent or (who.operator and request.path.startswith(WORKERS_PREFIX))
            )
            if refused:  # the decider's 401 or 403, which it answers without reading the body
                return await self._pass_on(request, b"")
        read = await self._read(request)
        if isinstance(read, web.Response):
            return read
        if read is not None and who is not None and who.agent and request.path == protocol.HEARTBEAT_PATH:
            answered = await self._answer(read, who)
            if answered is not None:
                return answered
        return await self._pass_on(request, read)

    async def _read(self, request: web.Request) -> bytes | web.Response | None:
        """The body, as the handler reads it (its errors counted as the decider counts them);
        None: too large or of unknown length, streamed to the decider to refuse or take."""
        length = request.content_length
        if length is None or length > self.max_body:
            return None
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge as exc:  # larger once decoded
            self._rejected("too_large")
            return error_reply(413, f"body too large: {exc.text}")
        except web.RequestPayloadError as exc:  # e.g. a Content-Encoding that does not decode
            self._rejected("malformed")
            return error_reply(400, f"unreadable body: {exc}")

    def _rejected(self, reason: str) -> None:
        if self._channel is not None:
            self._channel.tell_rejected(reason)

    async def _answer(self, body: bytes, who: Identity) -> web.Response | None:
        """The decider's answer to a heartbeat that passes every check; None: pass it on."""
        if self._channel is None:
            return None
        try:
            msg = protocol.decode(body, Heartbeat)
        except ProtocolError:
            return None
        frame = packed(msg) if who.may_speak_for(msg.worker) else None
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
        """``request`` as the decider's HTTP app answers it: its body as read, or streamed."""
        assert self._session is not None
        headers = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in _NOT_PASSED_ON)
        headers["X-Forwarded-For"] = request.remote or ""
        headers["X-Forwarded-Proto"] = request.scheme
        data = body if body is not None else (request.content if request.body_exists else None)
        # The path as it came: yarl would resolve dot segments the decider's router refuses.
        url = URL(f"http://manager{request.raw_path}", encoded=True)
        try:
            async with self._session.request(
                request.method, url, headers=headers, data=data, allow_redirects=False
            ) as upstream:
                payload = await upstream.read()
                out = CIMultiDict((k, v) for k, v in upstream.headers.items() if k.lower() not in _HOP)
                if request.method == "HEAD" and (length := upstream.headers.get("Content-Length")):
                    out["Content-Length"] = length  # of the body a GET would have, as HEAD says
                    return web.Response(status=upstream.status, headers=out)
                return web.Response(status=upstream.status, body=payload, headers=out)
        except aiohttp.ClientError as exc:
            log.error("specon.front.decider_unreachable", path=request.path, error=str(exc))
            return error_reply(503, "the manager's decider is not reachable; retry")

    async def context(self, _app: web.Application) -> AsyncIterator[None]:
        """Connect to the decider (waiting for it to listen), serve, and exit when it goes."""
        reader, writer = await _connect(self.sockets / relay.BEATS_SOCKET)
        self._channel = Channel(reader, writer)
        connector = aiohttp.UnixConnector(path=str(self.sockets / relay.HTTP_SOCKET), limit=0)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT),
            auto_decompress=False,  # answers pass through as the decider wrote them
            cookie_jar=aiohttp.DummyCookieJar(),  # a cookie is its caller's, never the front's
            skip_auto_headers=_NOT_ADDED,
        )
        watch = asyncio.create_task(self._exit_when_closed(self._channel), name="specon-front-watch")
        _stop_once(asyncio.get_running_loop())
        yield
        watch.cancel()
        await self._session.close()
        await self._channel.close()

    @staticmethod
    async def _exit_when_closed(channel: Channel) -> None:
        await channel.closed.wait()
        log.warning("specon.front.decider_gone")
        os.kill(os.getpid(), signal.SIGTERM)  # run_app's own shutdown


def _stop_once(loop: asyncio.AbstractEventLoop) -> None:
    """The first stop signal shuts the front down gracefully; a second would cut that short
    (``run_app`` raises ``GracefulExit`` again inside its cleanup), so from then on they do
    nothing (the decider kills a front that does not finish in its grace)."""

    def stop() -> None:
        for sig in _STOP_SIGNALS:  # still caught, so no signal kills the front meanwhile
            loop.add_signal_handler(sig, _ignored)
        raise web.GracefulExit

    for sig in _STOP_SIGNALS:
        loop.add_signal_handler(sig, stop)


def _ignored() -> None:
    """A stop signal after the first."""


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
