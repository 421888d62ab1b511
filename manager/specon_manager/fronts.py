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
import errno
import hashlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import structlog
from aiohttp import web

from specon.wire.protocol import Heartbeat
from specon_manager import relay
from specon_manager.app import METRICS, Handler, relayed_heartbeat
from specon_manager.standby import ELECTED

log = structlog.get_logger()

# A front's restart: after RESTART_AFTER s, doubling to RESTART_MAX s for each exit within
# FAILING_WITHIN s of its start; FAILING_TIMES such exits in a row stop the manager.
RESTART_AFTER = 1.0
RESTART_MAX = 30.0
FAILING_WITHIN = 10.0
FAILING_TIMES = 3
WATCH_EVERY = 0.2
# A front's environment: the decider's pid (a front whose parent is another stops) and the
# fingerprint of the configuration the decider loaded (``config_digest``).
PARENT_ENV = "SPECON_FRONT_PARENT"
CONFIG_ENV = "SPECON_FRONT_CONFIG"
# The reasons a front may count a rejection under (``specon_manager_rejected_messages``).
FRONT_REASONS = frozenset({"malformed", "too_large"})
_PR_SET_PDEATHSIG = 1
BACKLOG = 1024
# A heartbeat as a front packs it (``front.packed``).
HEARTBEATS = msgspec.msgpack.Decoder(Heartbeat)


class Listening:
    """The manager's address, bound once per front with ``SO_REUSEPORT``, and held alone.

    Every address the host name resolves to is bound, as the manager without fronts binds
    them (``localhost``: 127.0.0.1 and ::1), an IPv6 one for IPv6 only. ``SO_REUSEPORT``
    would let a second manager of the same user bind the address too and take half its
    connections; an abstract Unix socket named after the port, which only one process of the
    network namespace can bind, refuses that second manager (on any address of that port) as
    a taken port refuses it without fronts."""

    def __init__(self, host: str, port: int, count: int) -> None:
        if port == 0:
            raise OSError(
                errno.EINVAL, "--fronts needs a port of its own (not 0): every front serves the same one"
            )
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        addresses = list(dict.fromkeys((family, addr) for family, _, _, _, addr in found))
        self.per_front: list[list[socket.socket]] = []
        self._claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            try:
                self._claim.bind(f"\0specon-manager port {port}")
            except OSError as exc:
                why = f"{exc.strerror} (another specon-manager with --fronts serves it)"
                raise OSError(exc.errno, why) from None
            for _ in range(count):
                self.per_front.append([])
                for family, addr in addresses:
                    self.per_front[-1].append(_listening(family, addr))
        except OSError:
            self.close()
            raise

    @property
    def sockets(self) -> list[socket.socket]:
        return [sock for socks in self.per_front for sock in socks]

    def close_sockets(self) -> None:
        """The decider's copies: the address is served until the fronts close theirs too."""
        for sock in self.sockets:
            sock.close()

    def close(self) -> None:
        self.close_sockets()
        self._claim.close()


def _listening(family: socket.AddressFamily, addr: tuple[Any, ...]) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(addr)
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


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

    def __init__(self, app: web.Application, tasks: set[asyncio.Task[None]]) -> None:
        self.app = app
        self.frames = relay.Frames()
        self.transport: asyncio.Transport | None = None
        self.tasks = tasks  # every connection's, awaited before the decider's journal closes

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
    """Starts a front per listening socket with the manager's command line and keeps them
    running: one that exits is started again after a back-off (1 s, doubling to 30 s); one
    that exits within 10 s of its start three times in a row stops the manager (exit 1), as a
    manager that cannot serve should, instead of leaving its socket's connections unanswered."""

    def __init__(
        self, listening: Listening, argv: Sequence[str], sockets: Path, *, config: str, grace: float
    ) -> None:
        self.listening = listening
        self.argv = [sys.executable, "-m", "specon_manager", *argv, "--front-of", str(sockets)]
        self.env = {**os.environ, PARENT_ENV: str(os.getpid()), CONFIG_ENV: config}
        self.grace = grace
        n = len(listening.per_front)
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * n
        self.started = [0.0] * n
        self.quick_exits = [0] * n
        self.stopping = False
        self.failed = False

    def start(self, i: int) -> None:
        fds = [sock.fileno() for sock in self.listening.per_front[i]]
        argv = [*self.argv, *(a for fd in fds for a in ("--front-socket", str(fd)))]
        proc = subprocess.Popen(argv, pass_fds=fds, env=self.env)
        self.procs[i] = proc
        self.started[i] = time.monotonic()
        log.info("specon.manager.front_started", front=i, pid=proc.pid)

    async def keep(self) -> None:
        """Start every front and start again each one that exits, until ``stop``. An exit is
        acted on a watch later: a process group's stop signal reaches a front (one still
        starting dies of it at once) as it reaches the decider, whose handler says it is
        stopping only when the loop gets to it."""
        due: dict[int, float] = {}
        noticed: set[int] = set()
        for i in range(len(self.procs)):
            self.start(i)
        while not self.stopping:
            await asyncio.sleep(WATCH_EVERY)
            now = time.monotonic()
            for i, proc in enumerate(self.procs):  # no await in here: ``stop`` cannot interleave
                if i in due:
                    if now >= due[i]:
                        del due[i]
                        self.start(i)
                    continue
                if proc is None or proc.poll() is None:
                    continue
                if i not in noticed:
                    noticed.add(i)
                    continue
                noticed.discard(i)
                quick = now - self.started[i] < FAILING_WITHIN
                self.quick_exits[i] = self.quick_exits[i] + 1 if quick else 0
                log.warning("specon.manager.front_exited", front=i, pid=proc.pid, code=proc.returncode)
                if self.quick_exits[i] >= FAILING_TIMES:
                    log.error(
                        "specon.manager.front_failing",
                        front=i,
                        exits=self.quick_exits[i],
                        code=proc.returncode,
                    )
                    self.failed = True
                    os.kill(os.getpid(), signal.SIGTERM)  # run_app's own shutdown
                    return
                due[i] = now + min(RESTART_MAX, RESTART_AFTER * 2 ** max(0, self.quick_exits[i] - 1))

    async def stop(self) -> None:
        """New connections are refused from now on; each front finishes what it holds."""
        self.stopping = True
        self.listening.close_sockets()
        live = [p for p in self.procs if p is not None and p.poll() is None]
        for p in live:
            p.send_signal(signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace
        while any(p.poll() is None for p in live) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        for p in live:
            if p.poll() is None:
                p.kill()
            p.wait()


def config_digest(policy: object, files: Sequence[str | Path | None]) -> str:
    """A fingerprint of what a front must load as the decider did: the policy and the token
    files (a restarted front re-reads them; one that finds them changed refuses to serve)."""
    h = hashlib.sha256(repr(policy).encode())
    h.update(os.environ.get("SPECON_TOKEN", "").encode())
    for path in files:
        h.update(b"\0" if path is None else b"\1" + Path(path).read_bytes())
    return h.hexdigest()


def serve_fronts(
    app: web.Application,
    listening: Listening,
    argv: Sequence[str],
    sockets: Path,
    *,
    config: str,
    grace: float,
) -> tuple[str, Fronts]:
    """Make ``app`` the decider of a front per ``listening`` socket: the frame socket and the
    fronts live with it. Returns the path its HTTP app is to be served on (``run_app(path=)``)
    and the fronts (``failed``: they could not be kept running)."""
    app.middlewares.insert(0, forwarded)
    fronts = Fronts(listening, argv, sockets, config=config, grace=grace)
    answering: set[asyncio.Task[None]] = set()

    async def stop_fronts(_app: web.Application) -> None:
        await fronts.stop()  # after the polls they pass on are released (``_release_polls``)

    def stopping() -> None:
        """The decider's own SIGTERM or SIGINT (replacing ``run_app``'s handler, which only
        raises): from this moment a front that exits is not started again, nor logged as lost
        (a process group's signal reaches the fronts at the same time)."""
        fronts.stopping = True
        raise web.GracefulExit

    async def ctx(_app: web.Application) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping)
        server = await loop.create_unix_server(
            lambda: _Beats(app, answering), str(sockets / relay.BEATS_SOCKET)
        )
        keeper = asyncio.create_task(fronts.keep(), name="specon-manager-fronts")
        log.info("specon.manager.fronts", fronts=len(listening.per_front), sockets=str(sockets))
        yield
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
        if answering:  # relayed heartbeats still being applied: before the journal closes
            await asyncio.wait(answering, timeout=grace)
        server.close()
        await server.wait_closed()
        listening.close()
        shutil.rmtree(sockets, ignore_errors=True)

    app.cleanup_ctx.append(ctx)
    app.on_shutdown.append(stop_fronts)
    return str(sockets / relay.HTTP_SOCKET), fronts


def become_front() -> str | None:
    """In a front, first thing: die with the decider (``PR_SET_PDEATHSIG``), however it dies;
    None, or why this process cannot be its front (its parent is gone already)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    parent = os.environ.get(PARENT_ENV, "")
    if not parent.isdigit() or os.getppid() != int(parent):
        return "the manager that started this front is gone"
    return None
