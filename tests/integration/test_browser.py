"""The manager's status page in a real browser: headless Chromium, a real ``specon-manager``
with a read token and a worker heartbeating it with its own token.

The browser is driven as a person would drive it, over the DevTools protocol
(``cdp_client``): it opens the page and gets the login form, types the token key by key
and clicks "Log in", sees the workers table, clicks "log out" and gets the form again. The
cookie is checked from both sides: as the browser stored it (HttpOnly, so invisible to
``document.cookie``; SameSite=Strict; the lifetime ``SPECON_MANAGER_SESSION_TTL`` sets) and
as the manager sent it (the ``Set-Cookie`` header the browser received). The token never
appears in a URL or in the manager's log. Chromium is installed from Debian's package when
missing; the tests skip only where that is impossible (no apt-get, not root).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from cdp_client import CDP, Chromium, Page
from manager_proc import Running, chromium_or_skip, manager_env, running_manager, wait_healthy

from specon.model import Category, ContainerId, Resources, WorkerId
from specon.wire import protocol
from specon.wire.protocol import CommandBatch, ContainerReport, Heartbeat

# The first run may install chromium (a few minutes); later runs take seconds.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

READ_TOKEN = "browser-read-token-" + "7f3a" * 8
AGENT_TOKEN = "browser-agent-token-" + "c0de" * 8
WORKER = "worker-1"
SESSION_TTL = 3600
LOGIN_FORM = "!!document.querySelector('form[action=\"/login\"] input[name=token]')"


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chromium]:
    with chromium_or_skip(tmp_path_factory.mktemp("chromium")) as browser:
        yield browser


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[Running]:
    (tmp_path / "read").write_text(READ_TOKEN + "\n")
    (tmp_path / "agents.yaml").write_text(f"{WORKER}: {AGENT_TOKEN}\n")
    args = ("--agent-tokens", str(tmp_path / "agents.yaml"), "--read-token-file", str(tmp_path / "read"))
    env = manager_env(SPECON_MANAGER_SESSION_TTL=str(SESSION_TTL))
    with running_manager(tmp_path, *args, env=env) as running:
        yield running


async def heartbeat_as_the_agent(m: Running) -> None:
    """One heartbeat from worker-1 with its own token, once the manager is healthy."""
    async with aiohttp.ClientSession() as http:
        await wait_healthy(m, http)
        now = time.time()
        hb = Heartbeat(
            worker=WorkerId(WORKER),
            address="127.0.0.1:7701",
            seq=int(now * 1e6),
            sent_at=now,
            capacity=Resources(cpu=4.0, memory=8 << 30),
            usage=0.25,
            containers=(ContainerReport(id=ContainerId("job-1"), category=Category.PROGRESSING),),
        )
        headers = {protocol.AUTH_HEADER: f"Bearer {AGENT_TOKEN}", "Content-Type": protocol.CONTENT_TYPE}
        async with http.post(
            f"{m.url}{protocol.HEARTBEAT_PATH}", data=protocol.encode(hb), headers=headers
        ) as r:
            assert r.status == 200, await r.text()
            protocol.decode(await r.read(), CommandBatch)


async def status_of(page: Page, url: str) -> int:
    """The HTTP status of the page's latest response from ``url``."""
    statuses = [
        e["response"]["status"]
        for e in page.events("Network.responseReceived")
        if e["response"]["url"] == url
    ]
    assert statuses, f"no response from {url} yet"
    return int(statuses[-1])


def header(headers: dict[str, str], name: str) -> str:
    """A response header as the browser received it (several values are joined by newlines)."""
    return next((v for k, v in headers.items() if k.lower() == name), "")


async def session_cookies(page: Page, url: str) -> list[dict[str, object]]:
    return [c for c in await page.cookies(url) if c["name"] == "specon_session"]


async def test_a_browser_logs_in_sees_the_workers_and_logs_out(
    chromium: Chromium, manager: Running, tmp_path: Path
) -> None:
    await heartbeat_as_the_agent(manager)
    home = f"{manager.url}/"
    async with CDP.connect(chromium.ws_url) as cdp, cdp.page() as page:
        await page.navigate(home)
        await page.wait_for(LOGIN_FORM)
        assert await status_of(page, home) == 401
        assert WORKER not in await page.evaluate("document.body.innerText")

        await page.type_text("#token", READ_TOKEN)
        assert await page.evaluate("document.querySelector('#token').value") == READ_TOKEN
        await page.click("#login")
        await page.wait_for(
            f"document.body.innerText.includes('Workers') && document.body.innerText.includes('{WORKER}')"
        )
        assert await page.evaluate("location.href") == home  # redirected back to the page itself
        rows = await page.evaluate(
            "Array.from(document.querySelector('table').rows)"
            ".map(r => Array.from(r.cells).map(c => c.innerText))"
        )
        assert rows[0][:3] == ["worker", "agent", "reachable"]
        assert rows[1][:3] == [WORKER, "127.0.0.1:7701", "yes"]
        assert "job-1" in await page.evaluate("document.body.innerText")
        await page.screenshot(tmp_path / "status-page.png")
        assert (tmp_path / "status-page.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

        # The cookie as the browser keeps it: out of the page's scripts' reach, same-site only.
        assert await page.evaluate("document.cookie") == ""
        (cookie,) = await session_cookies(page, home)
        assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict" and cookie["secure"] is False
        assert cookie["path"] == "/" and cookie["domain"] == "127.0.0.1"
        assert READ_TOKEN not in str(cookie["value"]) and len(str(cookie["value"])) == 43
        assert abs(float(str(cookie["expires"])) - (time.time() + SESSION_TTL)) < 120
        # The cookie as the manager sent it, in the login's 303.
        (sent,) = [
            header(e["headers"], "set-cookie")
            for e in page.events("Network.responseReceivedExtraInfo")
            if e.get("statusCode") == 303 and header(e["headers"], "set-cookie")
        ]
        attributes = [a.strip() for a in sent.split(";")]
        assert attributes[0] == f"specon_session={cookie['value']}"
        assert {"HttpOnly", "Path=/", "SameSite=Strict", f"Max-Age={SESSION_TTL}"} <= set(attributes)
        assert "Secure" not in attributes
        # The login went as a POST: the token in its body, in no URL.
        requests = page.events("Network.requestWillBeSent")
        logins = [r["request"] for r in requests if r["request"]["url"] == f"{manager.url}/login"]
        assert logins and all(r["method"] == "POST" for r in logins)
        assert not [r["request"]["url"] for r in requests if READ_TOKEN in r["request"]["url"]]

        await page.click("#logout")
        await page.wait_for(LOGIN_FORM)
        assert await page.evaluate("location.href") == home
        assert not await session_cookies(page, home)
        await page.navigate(home)  # and it stays logged out
        await page.wait_for(LOGIN_FORM)
        assert await status_of(page, home) == 401
        assert WORKER not in await page.evaluate("document.body.innerText")

    log = manager.log.read_text()
    assert READ_TOKEN not in log and str(cookie["value"]) not in log
    assert '"specon.manager.login"' in log and '"specon.manager.logout"' in log


async def test_a_wrong_token_in_the_browser_gets_the_form_again_saying_so(
    chromium: Chromium, manager: Running
) -> None:
    await heartbeat_as_the_agent(manager)
    home, login = f"{manager.url}/", f"{manager.url}/login"
    wrong = "not-the-read-token-" + "0" * 24
    async with CDP.connect(chromium.ws_url) as cdp, cdp.page() as page:
        await page.navigate(home)
        await page.wait_for(LOGIN_FORM)
        for token, message, status in (
            (wrong, "wrong token", 401),
            (AGENT_TOKEN, "this token may not read the status", 403),  # an agent's token reads nothing
        ):
            await page.type_text("#token", token)
            await page.click("#login")
            await page.wait_for("(document.querySelector('#message') || {}).innerText")
            assert message in await page.evaluate("document.querySelector('#message').innerText")
            assert await status_of(page, login) == status
            assert await page.evaluate(LOGIN_FORM)
            assert await page.evaluate("document.querySelector('#token').value") == ""  # not echoed back
            assert WORKER not in await page.evaluate("document.body.innerText")
            assert not await session_cookies(page, home)
            await page.navigate(home)
            await page.wait_for(LOGIN_FORM)

    async with aiohttp.ClientSession() as http, http.get(f"{manager.url}/metrics") as resp:
        metrics = await resp.text()
    assert 'specon_manager_logins_total{result="wrong_token"} 1.0' in metrics
    assert 'specon_manager_logins_total{result="forbidden"} 1.0' in metrics
    log = manager.log.read_text()
    assert '"specon.manager.login_failed"' in log and '"specon.manager.login_forbidden"' in log
    assert wrong not in log and AGENT_TOKEN not in log
