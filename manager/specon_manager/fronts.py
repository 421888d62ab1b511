"""The decider's side of ``specon-manager --fronts N``: the manager past one core.

One process, the **decider**, keeps everything that is state: the coordinator, the journal,
the outbox, the ticker, leader election. It serves its HTTP app on a Unix socket only, and
heartbeats that a front has checked on a second one, as frames (``specon_manager.relay``).
``N`` **front** processes (``specon_manager.front``) serve the manager's address and do per
request what needs no state: TLS, HTTP, the bearer token, decoding and every range check.
The decider then pays per heartbeat only for what it must do itself (docs/architecture.md,
"Past one core").

The decider binds the address itself, once per front, with ``SO_REUSEPORT`` (the kernel
spreads connections over the sockets), and hands each front its socket: an address in use
fails the start as without fronts, and connections that arrive while a front restarts wait
in its socket's backlog. Fronts run with the manager's own command line, die with the
decider (``PR_SET_PDEATHSIG``) and are started again when one exits. Both Unix sockets lie
in a fresh directory only the manager's user can enter; the frame socket also refuses a
peer of another user.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import msgspec
import structlog
from aiohttp import web

from specon.wire.protocol import Heartbeat
from specon_manager import relay
from specon_manager.app import METRICS, Handler, relayed_heartbeat
from specon_manager.standby import ELECTED

log = structlog.get_logger()

# Seconds between a front's exit and its restart; and a stopping front's grace.
RESTART_AFTER = 1.0
STOP_GRACE = 5.0
# The reasons a front may count a rejection under (``specon_manager_rejected_messages``).
FRONT_REASONS = frozenset({"malformed", "too_large"})
_PR_SET_PDEATHSIG = 1
BACKLOG = 1024
# A heartbeat as a front packs it (``front.packed``).
HEARTBEATS = msgspec.msgpack.Decoder(Heartbeat)


class Listening:
    """The manager's address, bound once per front with ``SO_REUSEPORT``, and held alone.

    ``SO_REUSEPORT`` would let a second manager of the same user bind the address too and
    take half its connections; an abstract Unix socket named after the address, which only
    one process can bind, refuses that second manager as a taken port refuses it without
    fronts."""

    def __init__(self, host: str, port: int, count: int) -> None:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        self.sockets: list[socket.socket] = []
        self._claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            try:
                self._claim.bind(f"\0specon-manager {addr}")
            except OSError as exc:
                why = f"{exc.strerror} (another specon-manager with --fronts serves it)"
                raise OSError(exc.errno, why) from None
            for _ in range(count):
                sock = socket.socket(family, kind, proto)
                self.sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                sock.bind(addr)
                sock.listen(BACKLOG)
        except OSError:
            self.close()
            raise

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()
        self._claim.close()


def socket_dir() -> Path:
    """A new directory for the two sockets, mode 0700 (short: a socket path has 107 bytes)."""
    return Path(tempfile.mkdtemp(prefix="specon-manager-"))


@web.middleware
async def forwarded(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The caller's address and scheme as the front saw them. Trusted: only a front reaches the
    decider's socket (a front sets both headers, whatever the caller sent)."""
    remote = request.headers.get("X-Forwarded-For")
    scheme = request.headers.get("X-Forwarded-Proto")
    if remote is None or scheme not in ("http", "https"):
        return await handler(request)
    return await handler(request.clone(remote=remote, scheme=scheme))


class _Beats(asyncio.Protocol):
    """One front's frame connection."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.frames = relay.Frames()
        self.transport: asyncio.Transport | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        if uid != os.getuid():
            log.error("specon.manager.front_refused", uid=uid)
            transport.close()

    def data_received(self, data: bytes) -> None:
        try:
            for ident, kind, payload in self.frames.feed(data):
                if kind == relay.HEARTBEAT:
                    task = asyncio.create_task(self._answer(ident, payload))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
                elif kind == relay.REJECTED:
                    reason = payload.decode(errors="replace")
                    if reason in FRONT_REASONS:
                        self.app[METRICS].rejected.labels(reason=reason).inc()
        except relay.FrameError as exc:
            log.error("specon.manager.front_frame_refused", error=str(exc))
            assert self.transport is not None
            self.transport.close()

    async def _answer(self, ident: int, payload: bytes) -> None:
        kind, body = relay.DECLINED, b""
        try:
            answer = await relayed_heartbeat(self.app, HEARTBEATS.decode(payload))
        except msgspec.DecodeError as exc:  # a front of another version: it sends it as HTTP
            log.warning("specon.manager.front_heartbeat_unreadable", error=str(exc))
        except Exception:  # the HTTP handler answers it (a 500 there, if it fails again)
            log.exception("specon.manager.front_heartbeat_failed")
        else:
            if answer is not None:
                kind, body = (relay.ANSWER_AS_LEADER if self.app.get(ELECTED) else relay.ANSWER), answer
                self.app[METRICS].relayed.inc()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(relay.frame(ident, kind, body))


class Fronts:
    """Starts ``count`` fronts with the manager's command line and keeps them running."""

    def __init__(self, listening: Sequence[socket.socket], argv: Sequence[str], sockets: Path) -> None:
        self.listening = listening
        self.argv = [sys.executable, "-m", "specon_manager", *argv, "--front-of", str(sockets)]
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * len(listening)
        self.stopping = False

    def start(self, i: int) -> None:
        fd = self.listening[i].fileno()
        proc = subprocess.Popen(
            [*self.argv, "--front-socket", str(fd)],
            pass_fds=(fd,),
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - a prctl before exec only
        )
        self.procs[i] = proc
        log.info("specon.manager.front_started", front=i, pid=proc.pid)

    async def keep(self) -> None:
        """Start every front and start again each one that exits, until ``stop``."""
        for i in range(len(self.procs)):
            self.start(i)
        while not self.stopping:
            await asyncio.sleep(RESTART_AFTER)
            for i, proc in enumerate(self.procs):
                if proc is not None and proc.poll() is not None and not self.stopping:
                    log.warning("specon.manager.front_exited", front=i, pid=proc.pid, code=proc.returncode)
                    self.start(i)

    async def stop(self) -> None:
        self.stopping = True
        live = [p for p in self.procs if p is not None and p.poll() is None]
        for p in live:
            p.send_signal(signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STOP_GRACE
        while any(p.poll() is None for p in live) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        for p in live:
            if p.poll() is None:
                p.kill()
            p.wait()


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the decider dies, however it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def serve_fronts(app: web.Application, listening: Listening, argv: Sequence[str], sockets: Path) -> str:
    """Make ``app`` the decider of a front per ``listening`` socket: the frame socket and the
    fronts live with it; returns the path its HTTP app is to be served on (``run_app(path=)``)."""
    app.middlewares.insert(0, forwarded)
    fronts = Fronts(listening.sockets, argv, sockets)

    async def stop_fronts(_app: web.Application) -> None:
        await fronts.stop()  # after the polls they pass on are released (``_release_polls``)

    async def ctx(_app: web.Application) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        server = await loop.create_unix_server(lambda: _Beats(app), str(sockets / relay.BEATS_SOCKET))
        keeper = asyncio.create_task(fronts.keep(), name="specon-manager-fronts")
        log.info("specon.manager.fronts", fronts=len(listening.sockets), sockets=str(sockets))
        yield
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
        server.close()
        await server.wait_closed()
        listening.close()
        shutil.rmtree(sockets, ignore_errors=True)

    app.cleanup_ctx.append(ctx)
    app.on_shutdown.append(stop_fronts)
    return str(sockets / relay.HTTP_SOCKET)
