"""The HTTP face of a manager's role: ``GET /readyz``, and what a standby answers.

``/readyz`` answers 200 while the manager's shell leads and 503 otherwise, so a Kubernetes
Service (whose endpoints are the ready pods) routes the agents to the leader only. A
manager without leader election always leads.

With leader election (``specon_manager.leader``), a standby
* refuses the protocol POSTs (heartbeat, request, poll, goodbye) with 503 and an
  ``ErrorReply`` naming the leader: agents treat a 5xx as "retry later" and retry within a
  heartbeat interval; the caller is authenticated first, so only an agent learns who leads;
* serves ``/healthz`` (with ``"role"`` and ``"leader"`` added), ``/metrics`` and the status
  (JSON and page) of the journal as the leader last wrote it; every answer carries the header
  ``Specon-Role: leader|standby``, and the page says "standby" above everything else.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from html import escape

import structlog
from aiohttp import web

from specon.wire import protocol
from specon.wire.pod_writes import POD_WRITES_PATH
from specon.wire.protocol import ErrorReply
from specon_manager.shell import STANDBY_REFRESH, ManagerShell

log = structlog.get_logger()

READYZ_PATH = "/readyz"
# Set on an app that takes part in leader election (its answers carry ``ROLE_HEADER``).
ELECTED = web.AppKey("elected", bool)
ROLE_HEADER = "Specon-Role"
# The POSTs that carry protocol messages: inputs of the coordinator. (A browser's login is
# not one: a standby's status page may be logged in to.)
# A pod write too: only the leader's decisions allow one, and a standby (or a deposed leader)
# answers 503, which the agent asks again while the leadership moves.
PROTOCOL_POSTS = frozenset(
    {
        protocol.HEARTBEAT_PATH,
        protocol.REQUEST_PATH,
        protocol.POLL_PATH,
        protocol.GOODBYE_PATH,
        POD_WRITES_PATH,
    }
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def refusal(leader: str) -> str:
    """The error a standby answers a protocol POST with."""
    if leader:
        return f"standby: the leader is {leader}; retry"
    return "standby: no leader is elected yet; retry"


def install(app: web.Application, shell: ManagerShell, *, leader: Callable[[], str] | None = None) -> None:
    """Add ``/readyz`` to ``app`` (before it starts); with ``leader`` (the elected holder's
    identity, "" while unknown), the standby's middleware too."""

    async def readyz(_request: web.Request) -> web.Response:
        if shell.leading:
            return web.json_response({"ready": True, "role": "leader"})
        return web.json_response(
            {"ready": False, "role": "standby", "leader": leader() if leader else ""}, status=503
        )

    app.router.add_get(READYZ_PATH, readyz)
    if leader is None:
        return
    app[ELECTED] = True

    @web.middleware
    async def role(request: web.Request, handler: Handler) -> web.StreamResponse:
        # Runs inside the app's own middleware: the caller is authenticated already.
        leading = shell.leading
        if not leading and request.method == "POST" and request.path in PROTOCOL_POSTS:
            log.info("specon.manager.standby_refused", path=request.path, leader=leader())
            reply = ErrorReply(error=refusal(leader()))
            resp: web.StreamResponse = web.Response(
                body=protocol.encode(reply), status=503, content_type=protocol.CONTENT_TYPE
            )
        else:
            resp = await handler(request)
            if not leading and isinstance(resp, web.Response) and resp.status == 200:
                resp = _annotated(request.path, resp, leader())
        resp.headers[ROLE_HEADER] = "leader" if leading else "standby"
        return resp

    app.middlewares.append(role)


def _annotated(path: str, resp: web.Response, leader: str) -> web.Response:
    """A standby's ``/healthz`` (role and leader added) and status page (a banner)."""
    body = resp.body
    if path == "/healthz" and isinstance(body, bytes):
        data = json.loads(body)
        return web.json_response({**data, "role": "standby", "leader": leader})
    if path == "/" and isinstance(body, bytes) and resp.content_type == "text/html":
        banner = (
            '<p class="error" id="standby">standby: this manager does not lead'
            f"{f' (the leader is {escape(leader)})' if leader else ''}; it shows the journal as "
            f"the leader wrote it, read every {STANDBY_REFRESH:g} s</p>"
        )
        resp.body = body.replace(b"<body>", b"<body>\n" + banner.encode(), 1)
    return resp
