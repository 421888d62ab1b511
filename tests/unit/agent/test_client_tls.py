"""The agent's client and the manager link's security: no token to a plain-HTTP manager off
loopback (refused before any connection), none through a redirect, a verifying context only;
a failed TLS handshake logged once per distinct reason and retried until the manager has a
good certificate (a real aiohttp server on 127.0.0.1 with a throwaway CA's certificates);
requests bound to a source address only when ``--source-address`` asks."""

from __future__ import annotations

import os
import shutil
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from specon_agent import client as client_module
from specon_agent.__main__ import build_parser as agent_parser
from specon_agent.client import ManagerClient, ManagerRejected, ManagerTLSError, ManagerUnavailable
from structlog.testing import capture_logs

from specon.daemon.manager_url import InsecureURLError
from specon.daemon.tls import ServerCertificate, client_context
from specon.testing.certs import TestCA
from specon.wire import protocol
from specon.wire.protocol import CommandBatch
from tests.unit.agent.test_client_token import beat

TOKEN = "t" * 40


def _batch() -> web.Response:
    return web.Response(
        body=protocol.encode(CommandBatch(manager_time=0.0, policy_generation=0)),
        content_type=protocol.CONTENT_TYPE,
    )


@dataclass
class Manager:
    url: str
    seen: list[str]


async def _serve(handler: Any, ssl_context: ssl.SSLContext | None = None) -> tuple[web.AppRunner, Manager]:
    seen: list[str] = []

    async def record(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get(protocol.AUTH_HEADER, ""))
        return await handler(request)  # type: ignore[no-any-return]

    app = web.Application()
    app.router.add_post(protocol.HEARTBEAT_PATH, record)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    # Port 0: the kernel's pick, bound at once.
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    port = runner.addresses[0][1]
    scheme = "https" if ssl_context else "http"
    return runner, Manager(f"{scheme}://127.0.0.1:{port}", seen)


# -- refused before any connection ----------------------------------------------------------


@pytest.mark.parametrize(
    "url", ["http://198.51.100.9:7700", "http://specon-manager:7700", "http://10.0.0.1:7700"]
)
def test_plain_http_off_loopback_is_refused_before_any_connection(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_connection(*_a: object, **_k: object) -> None:
        raise AssertionError("a connector was made")

    monkeypatch.setattr(client_module.aiohttp, "TCPConnector", no_connection)
    with pytest.raises(InsecureURLError, match="refusing to send the bearer token in clear text") as err:
        ManagerClient(url, TOKEN)
    assert "--insecure-http" in str(err.value)
    # Said so explicitly: allowed (a trusted network).
    assert ManagerClient(url, TOKEN, insecure_http=True).base_url == url


@pytest.mark.parametrize("url", ["http://127.0.0.1:7700", "http://[::1]:7700", "http://localhost:7700"])
def test_plain_http_on_loopback_is_allowed(url: str) -> None:
    assert ManagerClient(url + "/", TOKEN).base_url == url


def test_a_context_that_does_not_verify_is_refused() -> None:
    lax = ssl.create_default_context()
    lax.check_hostname = False
    lax.verify_mode = ssl.CERT_NONE
    with pytest.raises(ValueError, match="must be verified"):
        ManagerClient("https://198.51.100.2:7700", TOKEN, ssl_context=lax)


async def test_a_redirect_is_not_followed_with_the_token() -> None:
    async def elsewhere(_request: web.Request) -> web.Response:
        return _batch()

    other_runner, other = await _serve(elsewhere)

    async def redirect(_request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(other.url + protocol.HEARTBEAT_PATH)

    runner, manager = await _serve(redirect)
    try:
        async with ManagerClient(manager.url, TOKEN) as client:
            with pytest.raises(ManagerRejected) as err:
                await client.send(protocol.HEARTBEAT_PATH, beat())
        assert err.value.status == 307
        assert manager.seen == [f"Bearer {TOKEN}"] and other.seen == []
    finally:
        await runner.cleanup()
        await other_runner.cleanup()


# -- TLS failures -------------------------------------------------------------------------


@pytest.fixture
async def tls_manager(tmp_path: Path) -> AsyncIterator[tuple[Manager, ServerCertificate, TestCA, Path]]:
    """A manager on 127.0.0.1 serving an *expired* certificate, and where its files live."""
    ca = TestCA.create(tmp_path / "ca")
    live = tmp_path / "live"
    ca.issue(live, names=["127.0.0.1"], not_after=datetime.now(UTC) - timedelta(hours=1))
    cert = ServerCertificate(live / "server.crt", live / "server.key")

    async def ok(_request: web.Request) -> web.Response:
        return _batch()

    runner, manager = await _serve(ok, cert.context)
    try:
        yield manager, cert, ca, live
    finally:
        await runner.cleanup()


def _renew(ca: TestCA, live: Path, names: list[str], stamp: int) -> None:
    fresh = live.parent / f"fresh{stamp}"
    for path in ca.issue(fresh, names=names):
        os.utime(path, ns=(stamp, stamp))
        shutil.move(path, live / path.name)


async def test_a_tls_failure_is_logged_once_per_reason_retried_and_healed(
    tls_manager: tuple[Manager, ServerCertificate, TestCA, Path],
) -> None:
    manager, cert, ca, live = tls_manager
    with capture_logs() as logs:
        async with ManagerClient(manager.url, TOKEN, ssl_context=client_context(ca.cert_path)) as client:
            for _ in range(3):
                with pytest.raises(ManagerTLSError, match="certificate has expired"):
                    await client.send(protocol.HEARTBEAT_PATH, beat())
            # A renewed certificate, but for another name: a new reason, logged once more.
            _renew(ca, live, ["manager.example"], 1_700_000_000_000_000_000)
            assert cert.reload_if_changed()
            for _ in range(2):
                with pytest.raises(ManagerUnavailable, match="IP address mismatch"):
                    await client.send(protocol.HEARTBEAT_PATH, beat())
            # The right one: the next retry goes through.
            _renew(ca, live, ["127.0.0.1"], 1_700_000_001_000_000_000)
            assert cert.reload_if_changed()
            batch = await client.send(protocol.HEARTBEAT_PATH, beat())
            assert batch.policy_generation == 0
            assert client.tls_errors == 5
    agent_logs = [e for e in logs if e["event"].startswith("specon.agent.")]
    assert [(e["event"], e.get("reason")) for e in agent_logs] == [
        ("specon.agent.tls_error", "certificate verify failed: certificate has expired"),
        (
            "specon.agent.tls_error",
            "certificate verify failed: IP address mismatch, certificate is not valid for '127.0.0.1'.",
        ),
        ("specon.agent.tls_ok", None),
    ]
    assert agent_logs[0]["log_level"] == "error" and "expired" in agent_logs[0]["hint"]
    assert TOKEN not in repr(logs)
    # No handshake went through before the good certificate: the token never left the client.
    assert manager.seen == [f"Bearer {TOKEN}"]


async def test_https_to_a_plain_http_port_says_so(tmp_path: Path) -> None:
    async def ok(_request: web.Request) -> web.Response:
        return _batch()

    runner, manager = await _serve(ok)
    ca = TestCA.create(tmp_path / "ca")
    try:
        url = manager.url.replace("http://", "https://")
        with capture_logs() as logs:
            async with ManagerClient(url, TOKEN, ssl_context=client_context(ca.cert_path)) as client:
                with pytest.raises(ManagerTLSError, match="wrong version number"):
                    await client.send(protocol.HEARTBEAT_PATH, beat())
        assert "started without --tls-cert" in logs[0]["hint"]
        assert manager.seen == []
    finally:
        await runner.cleanup()


async def test_the_default_context_verifies_against_the_system_store(
    tls_manager: tuple[Manager, ServerCertificate, TestCA, Path],
) -> None:
    manager, cert, ca, live = tls_manager
    _renew(ca, live, ["127.0.0.1"], 1_700_000_000_000_000_000)
    assert cert.reload_if_changed()
    async with ManagerClient(manager.url, TOKEN) as client:  # no CA given: the system's
        with pytest.raises(ManagerTLSError, match="unable to get local issuer certificate"):
            await client.send(protocol.HEARTBEAT_PATH, beat())
    assert manager.seen == []


# -- source address -------------------------------------------------------------------------


async def test_requests_leave_from_the_source_address_only_when_asked() -> None:
    remotes: list[str | None] = []

    async def ok(request: web.Request) -> web.Response:
        remotes.append(request.remote)
        return _batch()

    runner, manager = await _serve(ok)
    try:
        async with ManagerClient(manager.url, TOKEN, source_address="127.0.0.3") as client:
            await client.send(protocol.HEARTBEAT_PATH, beat())
        async with ManagerClient(manager.url, TOKEN) as client:
            await client.send(protocol.HEARTBEAT_PATH, beat())
    finally:
        await runner.cleanup()
    assert remotes == ["127.0.0.3", "127.0.0.1"]


def test_the_agent_options_bind_nothing_unless_asked(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--volume", "/v", "--listen", "127.0.0.5:7701"]
    args = agent_parser().parse_args(base)
    assert args.source_address is None and args.listen == ("127.0.0.5", 7701)
    assert agent_parser().parse_args([*base, "--source-address", "[::1]"]).source_address == "::1"
    with pytest.raises(SystemExit) as err:
        agent_parser().parse_args([*base, "--source-address", "manager.example"])
    assert err.value.code == 2
    assert "--source-address: expected an IP address" in capsys.readouterr().err
