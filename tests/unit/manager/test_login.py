"""The status page in a browser: the login form, POST /login and /logout, the session cookie.

The app runs in-process on 127.0.0.1 (aiohttp's TestServer) over the real shell with a read
token; cookies are sent by hand (no cookie jar), so each test says exactly what the browser
would send.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from http.cookies import SimpleCookie
from pathlib import Path

import aiohttp
import pytest
import structlog
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from specon_manager.app import SESSIONS, create_app
from specon_manager.auth import StaticTokens
from specon_manager.login import (
    COOKIE,
    CROSS_SITE,
    NOT_A_READER,
    SECURE_COOKIE,
    SESSION_ENDED,
    WRONG_TOKEN,
    cross_site,
    form_token,
)
from specon_manager.sessions import SessionStore

from specon.daemon.settings import ManagerSettings
from specon.wire import protocol
from specon.wire.protocol import ErrorReply
from specon.wire.status import Status
from tests.unit.manager.test_app import metric
from tests.unit.manager_fakes import FakeAgent, FakeClock, report, shell

READ = "read-token-" + "r" * 32
SHARED = "shared-token-" + "s" * 32
AGENT = "agent-token-" + "a" * 32
TTL = 600.0
HTML = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}
Client = TestClient[web.Request, web.Application]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def as_https(request: web.Request, handler: Handler) -> web.StreamResponse:
    """What a TLS listener gives the app: a request whose ``secure`` is true."""
    return await handler(request.clone(scheme="https"))


@contextlib.asynccontextmanager
async def serve(
    tmp_path: Path,
    *,
    read: str | None = READ,
    sessions: SessionStore | None = None,
    https: bool = False,
) -> AsyncIterator[Client]:
    clock = FakeClock()
    auth = StaticTokens(agents={"worker-a": AGENT}, shared=SHARED, read=read)
    settings = ManagerSettings(session_ttl=TTL)
    app = create_app(
        shell(tmp_path, clock), auth=auth, guard_reads=read is not None, tick=False, settings=settings
    )
    if sessions is not None:
        app[SESSIONS] = sessions
    if https:
        app.middlewares.insert(0, as_https)
    hb = FakeAgent("worker-a", clock).heartbeat(report("job-1"))
    async with TestClient(TestServer(app), cookie_jar=aiohttp.DummyCookieJar()) as client:
        resp = await client.post(
            protocol.HEARTBEAT_PATH,
            data=protocol.encode(hb),
            headers={protocol.AUTH_HEADER: f"Bearer {AGENT}", "Content-Type": protocol.CONTENT_TYPE},
        )
        assert resp.status == 200
        yield client


async def log_in(
    client: Client, token: str, *, headers: dict[str, str] | None = None, cookie: str | None = None
) -> aiohttp.ClientResponse:
    sent = {"Content-Type": "application/x-www-form-urlencoded", **(headers or {})}
    if cookie is not None:
        sent["Cookie"] = cookie
    return await client.post("/login", data=f"token={token}", headers=sent, allow_redirects=False)


def set_cookie(resp: aiohttp.ClientResponse) -> SimpleCookie:
    jar: SimpleCookie = SimpleCookie()
    for header in resp.headers.getall("Set-Cookie", []):
        jar.load(header)
    return jar


async def session_cookie(client: Client, token: str = READ) -> str:
    resp = await log_in(client, token)
    assert resp.status == 303, await resp.text()
    return f"{COOKIE}={set_cookie(resp)[COOKIE].value}"


# --- without a read token: open as before, no form ---------------------------------------------


async def test_without_a_read_token_the_page_is_open_and_there_is_no_login(tmp_path: Path) -> None:
    async with serve(tmp_path, read=None) as client:
        resp = await client.get("/", headers=HTML)
        html = await resp.text()
        assert resp.status == 200 and "worker-a" in html
        assert 'action="/login"' not in html and 'action="/logout"' not in html
        for path in ("/login", "/logout"):
            resp = await client.post(path, data="token=x", allow_redirects=False)
            assert resp.status == 404
            assert "no read token" in protocol.decode(await resp.read(), ErrorReply).error


# --- the form --------------------------------------------------------------------------------


async def test_a_browser_without_a_credential_gets_the_login_form(tmp_path: Path) -> None:
    async with serve(tmp_path) as client:
        resp = await client.get("/", headers=HTML)
        html = await resp.text()
        assert resp.status == 401 and resp.content_type == "text/html"
        assert '<form class="login" method="post" action="/login">' in html
        assert 'type="password" id="token" name="token"' in html
        assert "worker-a" not in html and 'class="error"' not in html
        assert resp.headers["Cache-Control"] == "no-store"
        assert "frame-ancestors 'none'" in resp.headers["Content-Security-Policy"]
        assert "form-action 'self'" in resp.headers["Content-Security-Policy"]
        assert resp.headers["X-Frame-Options"] == "DENY"
        assert not resp.headers.getall("Set-Cookie", [])


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/", {}),
        ("/", {"Accept": "*/*"}),
        ("/", {"Accept": "application/json"}),
        (protocol.STATUS_PATH, HTML),
    ],
    ids=["no-accept", "any", "json", "status-json-from-a-browser"],
)
async def test_scripts_and_the_status_json_keep_the_401_error_reply(
    tmp_path: Path, path: str, headers: dict[str, str]
) -> None:
    async with serve(tmp_path) as client:
        resp = await client.get(path, headers=headers)
        assert resp.status == 401
        assert "bearer token" in protocol.decode(await resp.read(), ErrorReply).error


async def test_a_bearer_token_reads_exactly_as_before(tmp_path: Path) -> None:
    async with serve(tmp_path) as client:
        for token in (READ, SHARED):
            resp = await client.get("/", headers={**HTML, protocol.AUTH_HEADER: f"Bearer {token}"})
            html = await resp.text()
            assert resp.status == 200 and "worker-a" in html
            assert 'action="/logout"' not in html  # no session: nothing to log out of
        resp = await client.get("/", headers={**HTML, protocol.AUTH_HEADER: "Bearer wrong"})
        assert resp.status == 401
        protocol.decode(await resp.read(), ErrorReply)  # a wrong bearer token: the script's 401
        resp = await client.get("/", headers={protocol.AUTH_HEADER: f"Bearer {AGENT}"})
        assert resp.status == 403


# --- logging in ------------------------------------------------------------------------------


@pytest.mark.parametrize("token", [READ, SHARED], ids=["read", "shared"])
async def test_a_good_token_opens_a_session_in_an_httponly_strict_cookie(tmp_path: Path, token: str) -> None:
    async with serve(tmp_path) as client:
        with structlog.testing.capture_logs() as logs:
            resp = await log_in(client, token)
        assert resp.status == 303 and resp.headers["Location"] == "/"
        (header,) = resp.headers.getall("Set-Cookie")
        morsel = set_cookie(resp)[COOKIE]
        assert morsel["httponly"] is True and morsel["samesite"] == "Strict" and morsel["path"] == "/"
        assert morsel["max-age"] == str(int(TTL)) and not morsel["secure"]
        assert "Secure" not in header and "Domain" not in header
        assert token not in header and len(morsel.value) == 43
        assert [e["event"] for e in logs] == ["specon.manager.login"]
        assert token not in repr(logs) and morsel.value not in repr(logs)
        assert await metric(client, "specon_manager_logins_total", result="ok") == 1.0

        cookie = f"{COOKIE}={morsel.value}"
        resp = await client.get("/", headers={**HTML, "Cookie": cookie})
        html = await resp.text()
        assert resp.status == 200 and "worker-a" in html and "job-1" in html
        assert '<form class="logout" method="post" action="/logout">' in html
        assert resp.headers["Cache-Control"] == "no-store"
        resp = await client.get(protocol.STATUS_PATH, headers={"Cookie": cookie})
        assert resp.status == 200
        assert [w.id for w in protocol.decode(await resp.read(), Status).workers] == ["worker-a"]


async def test_the_cookie_never_authenticates_a_protocol_post(tmp_path: Path) -> None:
    clock = FakeClock()
    async with serve(tmp_path) as client:
        cookie = await session_cookie(client, SHARED)  # even the shared token's session
        body = protocol.encode(FakeAgent("worker-a", clock).heartbeat())
        resp = await client.post(
            protocol.HEARTBEAT_PATH,
            data=body,
            headers={"Cookie": cookie, "Content-Type": protocol.CONTENT_TYPE},
        )
        assert resp.status == 401
        assert "bearer token" in protocol.decode(await resp.read(), ErrorReply).error


async def test_a_wrong_token_gets_the_form_again_counted_and_logged_without_it(tmp_path: Path) -> None:
    wrong = "not-the-token-" + "x" * 30
    async with serve(tmp_path) as client:
        with structlog.testing.capture_logs() as logs:
            resp = await log_in(client, wrong)
        html = await resp.text()
        assert resp.status == 401 and resp.content_type == "text/html"
        assert f'<p class="error" id="message" role="alert">{WRONG_TOKEN}</p>' in html
        assert 'action="/login"' in html and wrong not in html
        assert not resp.headers.getall("Set-Cookie", [])
        assert [e["event"] for e in logs] == ["specon.manager.login_failed"]
        assert wrong not in repr(logs)
        assert await metric(client, "specon_manager_logins_total", result="wrong_token") == 1.0
        assert await metric(client, "specon_manager_rejected_messages_total", reason="unauthorized") == 1.0


async def test_an_agents_token_may_not_log_in(tmp_path: Path) -> None:
    async with serve(tmp_path) as client:
        resp = await log_in(client, AGENT)
        assert resp.status == 403
        assert NOT_A_READER in await resp.text()
        assert not resp.headers.getall("Set-Cookie", [])
        assert await metric(client, "specon_manager_logins_total", result="forbidden") == 1.0


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/x-www-form-urlencoded", b""),
        ("application/x-www-form-urlencoded", b"tok=" + READ.encode()),
        ("application/x-www-form-urlencoded", b"token=" + READ.encode() + b"&token=" + READ.encode()),
        ("application/x-www-form-urlencoded", b"token=%ff%fe"),
        ("application/x-www-form-urlencoded", b"token=%C3%A9" + READ.encode()),
        ("application/x-www-form-urlencoded", b"token=" + READ.encode() + b"\xff"),
        ("application/x-www-form-urlencoded", b"&".join(b"f%d=1" % i for i in range(20))),
        ("application/x-www-form-urlencoded", b"token=" + b"t" * 20_000),
        ("application/json", b'{"token": "' + READ.encode() + b'"}'),
        ("multipart/form-data; boundary=x", b'--x\r\nContent-Disposition: form-data; name="token"\r\n\r\n'),
        ("text/plain", READ.encode()),
    ],
    ids=[
        "empty",
        "other-field",
        "twice",
        "bad-utf8-escape",
        "non-ascii",
        "raw-byte",
        "many-fields",
        "huge",
        "json",
        "multipart",
        "text",
    ],
)
async def test_a_login_that_is_no_form_with_one_token_is_a_wrong_token(
    tmp_path: Path, content_type: str, body: bytes
) -> None:
    async with serve(tmp_path) as client:
        resp = await client.post(
            "/login", data=body, headers={"Content-Type": content_type}, allow_redirects=False
        )
        assert resp.status == 401
        assert WRONG_TOKEN in await resp.text()


async def test_a_body_over_the_limit_gets_413(tmp_path: Path) -> None:
    async with serve(tmp_path) as client:
        resp = await log_in(client, "t" * (2 << 20))
        assert resp.status == 413


async def test_the_token_may_come_with_spaces_around_it(tmp_path: Path) -> None:
    async with serve(tmp_path) as client:
        resp = await log_in(client, f"+{READ}%0A")  # pasted with a space and a newline
        assert resp.status == 303


# --- logging out, expiry ---------------------------------------------------------------------


async def test_logging_out_ends_the_session_and_clears_the_cookie(tmp_path: Path) -> None:
    async with serve(tmp_path) as client:
        cookie = await session_cookie(client)
        resp = await client.post("/logout", headers={"Cookie": cookie}, allow_redirects=False)
        assert resp.status == 303 and resp.headers["Location"] == "/"
        morsel = set_cookie(resp)[COOKIE]
        assert morsel.value == "" and morsel["max-age"] == "0" and morsel["path"] == "/"
        # The old cookie, sent anyway, opens nothing: the form, saying why, and clearing it.
        resp = await client.get("/", headers={**HTML, "Cookie": cookie})
        assert resp.status == 401 and SESSION_ENDED in await resp.text()
        assert set_cookie(resp)[COOKIE]["max-age"] == "0"
        resp = await client.get(protocol.STATUS_PATH, headers={"Cookie": cookie})
        assert resp.status == 401


async def test_a_session_ends_after_its_ttl(tmp_path: Path) -> None:
    clock = FakeClock()
    async with serve(tmp_path, sessions=SessionStore(TTL, clock=clock)) as client:
        cookie = await session_cookie(client)
        clock.advance(TTL - 1)
        assert (await client.get("/", headers={**HTML, "Cookie": cookie})).status == 200
        clock.advance(1)
        resp = await client.get("/", headers={**HTML, "Cookie": cookie})
        assert resp.status == 401 and SESSION_ENDED in await resp.text()


async def test_a_new_login_replaces_the_session_it_came_with(tmp_path: Path) -> None:
    async with serve(tmp_path) as client:
        first = await session_cookie(client)
        resp = await log_in(client, READ, cookie=first)
        second = f"{COOKIE}={set_cookie(resp)[COOKIE].value}"
        assert second != first
        assert (await client.get(protocol.STATUS_PATH, headers={"Cookie": first})).status == 401
        assert (await client.get(protocol.STATUS_PATH, headers={"Cookie": second})).status == 200


async def test_a_wrong_bearer_token_is_not_rescued_by_a_cookie(tmp_path: Path) -> None:
    async with serve(tmp_path) as client:
        cookie = await session_cookie(client)
        resp = await client.get(
            protocol.STATUS_PATH, headers={"Cookie": cookie, protocol.AUTH_HEADER: "Bearer wrong"}
        )
        assert resp.status == 401


async def test_the_cached_page_of_a_session_reader_is_not_served_to_a_bearer_reader(tmp_path: Path) -> None:
    async with serve(tmp_path) as client:
        cookie = await session_cookie(client)
        assert 'action="/logout"' in await (await client.get("/", headers={"Cookie": cookie})).text()
        html = await (await client.get("/", headers={protocol.AUTH_HEADER: f"Bearer {READ}"})).text()
        assert 'action="/logout"' not in html


# --- cross-site requests and HTTPS -----------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Origin": "http://127.0.0.1:1"},
    ],
    ids=["cross-site", "same-site", "foreign-origin", "null-origin", "other-port"],
)
async def test_login_and_logout_from_another_site_are_refused(
    tmp_path: Path, headers: dict[str, str]
) -> None:
    async with serve(tmp_path) as client:
        resp = await log_in(client, READ, headers=headers)
        assert resp.status == 403 and CROSS_SITE in await resp.text()
        assert not resp.headers.getall("Set-Cookie", [])
        cookie = await session_cookie(client)
        resp = await client.post("/logout", headers={"Cookie": cookie, **headers}, allow_redirects=False)
        assert resp.status == 403
        assert (await client.get(protocol.STATUS_PATH, headers={"Cookie": cookie})).status == 200
        assert await metric(client, "specon_manager_logins_total", result="cross_site") == 2.0


async def test_a_same_origin_form_post_is_accepted(tmp_path: Path) -> None:
    async with serve(tmp_path) as client:
        host = f"{client.host}:{client.port}"
        headers = {"Sec-Fetch-Site": "same-origin", "Origin": f"http://{host}"}
        assert (await log_in(client, READ, headers=headers)).status == 303


async def test_over_https_the_cookie_is_secure_under_the_host_prefix(tmp_path: Path) -> None:
    async with serve(tmp_path, https=True) as client:
        resp = await log_in(client, READ)
        assert resp.status == 303
        (header,) = resp.headers.getall("Set-Cookie")
        morsel = set_cookie(resp)[SECURE_COOKIE]
        assert morsel["secure"] is True and morsel["httponly"] is True and morsel["samesite"] == "Strict"
        assert "Domain" not in header and morsel["path"] == "/"
        good = f"{SECURE_COOKIE}={morsel.value}"
        assert (await client.get(protocol.STATUS_PATH, headers={"Cookie": good})).status == 200
        # The same id under the plain name (as a plain-HTTP page could plant it) opens nothing.
        plain = f"{COOKIE}={morsel.value}"
        assert (await client.get(protocol.STATUS_PATH, headers={"Cookie": plain})).status == 401


# --- the pure rules --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "refused"),
    [
        ({}, False),
        ({"Host": "m:7700"}, False),
        ({"Sec-Fetch-Site": "same-origin"}, False),
        ({"Sec-Fetch-Site": "none"}, False),
        ({"Sec-Fetch-Site": "Same-Origin"}, False),
        ({"Sec-Fetch-Site": "same-site"}, True),
        ({"Sec-Fetch-Site": "cross-site"}, True),
        ({"Sec-Fetch-Site": ""}, True),
        ({"Origin": "http://m:7700", "Host": "m:7700"}, False),
        ({"Origin": "https://M:7700", "Host": "m:7700"}, False),
        ({"Origin": "http://m:7701", "Host": "m:7700"}, True),
        ({"Origin": "http://m", "Host": "m:7700"}, True),
        ({"Origin": "http://m:7700"}, True),
        ({"Origin": "null", "Host": "m:7700"}, True),
        ({"Origin": "", "Host": "m:7700"}, True),
        ({"Origin": "http://[::1", "Host": "m:7700"}, True),
        ({"Origin": "http://m:7700", "Host": "m:7700", "Sec-Fetch-Site": "cross-site"}, True),
        ({"Origin": "null", "Host": "m:7700", "Sec-Fetch-Site": "same-origin"}, False),
    ],
)
def test_cross_site_tells_another_sites_request(headers: dict[str, str], refused: bool) -> None:
    assert (cross_site(headers) is not None) == refused


@pytest.mark.parametrize(
    ("body", "token"),
    [
        (b"token=abc", "abc"),
        (b"token=a%2Bb+c", "a+b c"),
        (b"token=+abc+", "abc"),
        (b"other=1&token=abc", "abc"),
        (b"token=", None),
        (b"token=abc&token=abd", None),
        (b"token=%E2%98%83", None),
        (b"token=%zz", "%zz"),  # not an escape: as typed
        (b"t\xc3\xa9=1&token=abc", None),
    ],
)
def test_form_token_reads_one_ascii_token_field(body: bytes, token: str | None) -> None:
    assert form_token(body, "application/x-www-form-urlencoded") == token
    assert form_token(body, "multipart/form-data") is None
