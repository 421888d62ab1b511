"""The status page in a browser: the login form, ``POST /login`` and ``/logout``, the session cookie.

With a read token configured, a browser (``Accept: text/html``) that opens ``/`` without a
credential gets the login form (401) instead of a JSON error. The form POSTs the token (never
in a URL); the app's ``Authenticator`` checks it exactly as it checks a bearer token, and only
the read token or the shared token may read. A good token opens a session
(``specon_manager.sessions``) and sets a cookie holding only its random id: ``HttpOnly``,
``SameSite=Strict``, ``Path=/``, ``Max-Age`` the session's lifetime, and ``Secure`` (under the
``__Host-`` name) when the request came over HTTPS. The cookie authenticates reads of ``/`` and
``/v1/status`` only; every protocol POST still needs its bearer token.

Cross-site requests: ``SameSite=Strict`` keeps the cookie off any request another site
starts, and ``/login`` and ``/logout`` refuse a request whose ``Sec-Fetch-Site`` (which every
current browser sends, and no page can forge) says another site sent it; from a browser
without it, one whose ``Origin`` names another host than the request's ``Host``. Neither
header: not a browser that could be tricked, allowed. A wrong token costs the same
constant-time comparison as a bearer token, is counted (``specon_manager_logins_total``
and the rejected-messages counter) and logged without the token.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import parse_qs, urlsplit

import structlog
from aiohttp import web

from specon_manager.auth import READER, SHARED, Authenticator, Identity
from specon_manager.metrics import ManagerMetrics
from specon_manager.page import LOGIN_PATH, LOGOUT_PATH, SECURITY_HEADERS, render_login_page
from specon_manager.sessions import Session, SessionStore

log = structlog.get_logger()

PATHS = frozenset({LOGIN_PATH, LOGOUT_PATH})
COOKIE = "specon_session"
# Over HTTPS: the prefix makes the browser refuse the cookie unless it is Secure, Path=/ and
# host-only, so neither plain HTTP nor a sibling domain can plant or overwrite it.
SECURE_COOKIE = "__Host-specon_session"
FORM_TYPE = "application/x-www-form-urlencoded"
MAX_FORM_BYTES = 16 << 10
MAX_TOKEN_LENGTH = 4096
_SAME_SITE = frozenset({"same-origin", "none"})  # Sec-Fetch-Site: our own page, or typed by the user

WRONG_TOKEN = "wrong token"
NOT_A_READER = "this token may not read the status: use the read token (or the shared one)"
SESSION_ENDED = "your session ended: log in again"
CROSS_SITE = "refused: the request came from another site"


def may_read(who: Identity) -> bool:
    """Whether ``who`` may read the status and the page (a per-agent token may not)."""
    return who.name in (READER, SHARED) or who.operator


def cookie_name(request: web.Request) -> str:
    return SECURE_COOKIE if request.secure else COOKIE


def wants_html(request: web.Request) -> bool:
    """A browser navigating (it asks for HTML), not a script."""
    return "text/html" in request.headers.get("Accept", "").lower()


def cross_site(headers: Mapping[str, str]) -> str | None:
    """Why a login or logout with these headers came from another site, or None."""
    fetch_site = headers.get("Sec-Fetch-Site")
    if fetch_site is not None:  # it decides: Origin may be "null" for a same-origin form (privacy)
        return None if fetch_site.lower() in _SAME_SITE else f"Sec-Fetch-Site: {fetch_site[:40]}"
    origin = headers.get("Origin")
    if origin is None:
        return None
    try:
        origin_host = urlsplit(origin).netloc.lower()
    except ValueError:
        origin_host = ""
    # The scheme is not compared: behind a TLS-terminating proxy the browser's is https, ours http.
    if not origin_host or origin_host != headers.get("Host", "").lower():
        return f"Origin: {origin[:80]}"
    return None


def form_token(body: bytes, content_type: str) -> str | None:
    """The ``token`` field of a urlencoded form, or None (no form, no field or several, or
    not a token: non-ASCII, empty or absurdly long)."""
    if content_type != FORM_TYPE or len(body) > MAX_FORM_BYTES:
        return None
    try:
        fields = parse_qs(body.decode("ascii"), keep_blank_values=True, max_num_fields=8, errors="strict")
    except ValueError:  # not ASCII, a bad %-escape, too many fields
        return None
    values = fields.get("token", [])
    if len(values) != 1:
        return None
    token = values[0].strip()
    if not token or len(token) > MAX_TOKEN_LENGTH or not token.isascii():
        return None  # a token is ASCII (as a bearer token must be): nothing else can match
    return token


def login_form(message: str | None, status: int) -> web.Response:
    return web.Response(
        text=render_login_page(message),
        status=status,
        content_type="text/html",
        headers={**SECURITY_HEADERS, "Cache-Control": "no-store"},
    )


def session_of(request: web.Request, sessions: SessionStore) -> tuple[Session | None, bool]:
    """The live session the request's cookie names, and whether it sent a session cookie."""
    sid = request.cookies.get(cookie_name(request))
    if sid is None:
        return None, False
    return sessions.get(sid), True


def _see_page() -> web.Response:
    return web.Response(status=303, headers={"Location": "/", "Cache-Control": "no-store"})


def forget_cookie(request: web.Request, response: web.StreamResponse) -> None:
    response.del_cookie(
        cookie_name(request), path="/", secure=request.secure, httponly=True, samesite="Strict"
    )


def _refused(request: web.Request, metrics: ManagerMetrics) -> web.Response | None:
    reason = cross_site(request.headers)
    if reason is None:
        return None
    metrics.logins.labels(result="cross_site").inc()
    metrics.rejected.labels(reason="forbidden").inc()
    log.warning("specon.manager.login_cross_site", path=request.path, reason=reason, peer=request.remote)
    return login_form(CROSS_SITE, 403)


async def login(
    request: web.Request, auth: Authenticator, sessions: SessionStore, metrics: ManagerMetrics
) -> web.Response:
    """``POST /login``: a session for a read (or shared) token, then 303 to the page."""
    if (refused := _refused(request, metrics)) is not None:
        return refused
    body = await request.read()  # bounded by the app's client_max_size (413 past it)
    token = form_token(body, request.content_type)
    who = None if token is None else await auth.authenticate(token)
    if who is None:
        metrics.logins.labels(result="wrong_token").inc()
        metrics.rejected.labels(reason="unauthorized").inc()
        log.warning("specon.manager.login_failed", peer=request.remote, token_field=token is not None)
        return login_form(WRONG_TOKEN, 401)
    if not may_read(who):
        metrics.logins.labels(result="forbidden").inc()
        metrics.rejected.labels(reason="forbidden").inc()
        log.warning("specon.manager.login_forbidden", identity=who.name, peer=request.remote)
        return login_form(NOT_A_READER, 403)
    old, _ = session_of(request, sessions)
    if old is not None:  # a fresh id for each login: an id planted before it is worth nothing
        sessions.close(old.id)
    session, evicted = sessions.open(who)
    if evicted:
        log.info("specon.manager.sessions_evicted", count=evicted, capacity=sessions.capacity)
    metrics.logins.labels(result="ok").inc()
    log.info("specon.manager.login", identity=who.name, peer=request.remote)
    resp = _see_page()
    resp.set_cookie(
        cookie_name(request),
        session.id,
        max_age=max(int(sessions.ttl), 1),
        path="/",
        secure=request.secure,
        httponly=True,
        samesite="Strict",
    )
    return resp


async def logout(request: web.Request, sessions: SessionStore, metrics: ManagerMetrics) -> web.Response:
    """``POST /logout``: end the session, clear the cookie, 303 to the page (the form again)."""
    if (refused := _refused(request, metrics)) is not None:
        return refused
    session, _ = session_of(request, sessions)
    if session is not None:
        sessions.close(session.id)
        log.info("specon.manager.logout", identity=session.identity.name, peer=request.remote)
    resp = _see_page()
    forget_cookie(request, resp)
    return resp
