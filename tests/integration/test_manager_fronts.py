"""``specon-manager --fronts N``: the real decider and its real front processes on 127.0.0.1.

A front answers a heartbeat that passes every check through the decider's socket and passes
everything else to the decider's HTTP app, so every answer, error and counter is what a
manager without fronts gives; fronts that die are started again without a refused
connection; SIGTERM stops them all and removes the sockets; a second manager cannot take the
address.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from manager_proc import MANAGER, Running, manager_env, running_manager, wait_healthy

from specon.model import Category, ContainerId, Resources, WorkerId
from specon.wire import protocol
from specon.wire.protocol import CommandBatch, ContainerReport, ErrorReply, Heartbeat, Poll
from specon.wire.status import Status

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

TOKENS = {
    "w1": "fronts-agent-token-w1-0123456789abcdef0123",
    "w2": "fronts-agent-token-w2-0123456789abcdef0123",
}
READ = "fronts-read-token-0123456789abcdef0123456789"
FRONTS = 2


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[Running]:
    (tmp_path / "agents.yaml").write_text("".join(f"{w}: {t}\n" for w, t in TOKENS.items()))
    (tmp_path / "read").write_text(READ + "\n")
    args = ("--fronts", str(FRONTS), "--agent-tokens", str(tmp_path / "agents.yaml"))
    with running_manager(tmp_path, *args, "--read-token-file", str(tmp_path / "read")) as running:
        yield running


def _auth(token: str) -> dict[str, str]:
    return {protocol.AUTH_HEADER: f"Bearer {token}", "Content-Type": protocol.CONTENT_TYPE}


class Beats:
    """One worker's heartbeats, ``seq`` increasing."""

    def __init__(self, worker: str) -> None:
        self.worker = WorkerId(worker)
        self.seq = 0

    def next(self, containers: int = 1) -> bytes:
        self.seq += 1
        return protocol.encode(
            Heartbeat(
                worker=self.worker,
                address="127.0.0.1:7701",
                seq=self.seq,
                sent_at=time.time(),
                capacity=Resources(cpu=4.0, memory=8 << 30),
                usage=0.3,
                containers=tuple(
                    ContainerReport(id=ContainerId(f"{self.worker}-job-{i}"), category=Category.PROGRESSING)
                    for i in range(containers)
                ),
            )
        )


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        out |= {int(c) for c in (task / "children").read_text().split()}
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def _events(m: Running, name: str) -> list[dict[str, object]]:
    lines = (json.loads(line) for line in m.log.read_text().splitlines() if f'"{name}"' in line)
    return [e for e in lines if e.get("event") == name]


async def _post(session: aiohttp.ClientSession, url: str, body: bytes, **headers: str) -> tuple[int, bytes]:
    async with session.post(url, data=body, headers=headers) as resp:
        return resp.status, await resp.read()


async def _metrics(session: aiohttp.ClientSession, m: Running) -> str:
    async with session.get(f"{m.url}/metrics") as resp:
        return await resp.text()


async def test_fronts_answer_what_passes_and_the_decider_everything_else(manager: Running) -> None:
    url = f"{manager.url}{protocol.HEARTBEAT_PATH}"
    w1 = Beats("w1")
    async with aiohttp.ClientSession() as session:
        await wait_healthy(manager, session)
        assert len(_children(manager.proc.pid)) == FRONTS

        for _ in range(5):
            status, body = await _post(session, url, w1.next(3), **_auth(TOKENS["w1"]))
            assert status == 200 and protocol.decode(body, CommandBatch).ack == w1.seq
        # Refused by the decider's own handler, passed on by the front: the same answers.
        status, body = await _post(session, url, Beats("w2").next(), **_auth(TOKENS["w1"]))
        assert status == 403 and "may not speak for worker w2" in protocol.decode(body, ErrorReply).error
        spoofed = {"X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "https"}
        status, body = await _post(session, url, w1.next(), **spoofed, **_auth("not-a-token"))
        assert status == 401
        status, body = await _post(
            session, url, b'{"version":"1.6","kind":"Heartbeat"}', **_auth(TOKENS["w1"])
        )
        assert status == 400 and protocol.decode(body, ErrorReply).path == "worker"
        status, body = await _post(session, url, b"x" * (2 << 20), **_auth(TOKENS["w1"]))
        assert status == 413 and "too large" in protocol.decode(body, ErrorReply).error
        # A long poll is held by the decider and answered through the front.
        poll = protocol.encode(Poll(worker=WorkerId("w1"), sent_at=time.time(), wait=0.5))
        t0 = time.monotonic()
        status, body = await _post(session, f"{manager.url}{protocol.POLL_PATH}", poll, **_auth(TOKENS["w1"]))
        assert status == 200 and time.monotonic() - t0 >= 0.4
        protocol.decode(body, CommandBatch)

        async with session.get(f"{manager.url}{protocol.STATUS_PATH}") as resp:
            assert resp.status == 401  # the read token guards it, as without fronts
        async with session.head(f"{manager.url}/healthz") as resp:
            assert resp.status == 200 and int(resp.headers["Content-Length"]) > 0
        # The path as it came: not resolved to /v1/status on the way (the router's 404).
        assert (await _raw(manager, "GET", "/v1/workers/../status", b"", _auth(READ)))[0] == 404
        async with session.get(f"{manager.url}{protocol.STATUS_PATH}", headers=_auth(READ)) as resp:
            status_doc = protocol.decode(await resp.read(), Status)
        metrics = await _metrics(session, manager)
    assert [w.id for w in status_doc.workers] == ["w1"] and len(status_doc.containers) == 3
    assert 'specon_manager_heartbeats_total{worker="w1"} 5.0' in metrics
    assert "specon_manager_relayed_heartbeats_total 5.0" in metrics
    # unauthorized: the heartbeat and the status read without a token.
    for reason, count in (("forbidden", 1), ("unauthorized", 2), ("malformed", 1), ("too_large", 1)):
        assert f'specon_manager_rejected_messages_total{{reason="{reason}"}} {count}.0' in metrics, reason
    unauthorized = _events(manager, "specon.manager.unauthorized")
    # The address the front saw, not the one the caller's header claimed.
    assert [e["peer"] for e in unauthorized] == ["127.0.0.1", "127.0.0.1"]


async def test_a_front_killed_is_started_again_and_no_heartbeat_is_refused(manager: Running) -> None:
    url = f"{manager.url}{protocol.HEARTBEAT_PATH}"
    w1 = Beats("w1")
    async with aiohttp.ClientSession() as session:
        await wait_healthy(manager, session)
        before = _children(manager.proc.pid)
        victim = min(before)
        os.kill(victim, signal.SIGKILL)
        # New connections each time: some land on the dead front's socket, whose backlog the
        # decider keeps until the new front accepts them.
        for _ in range(40):
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh:
                status, _ = await _post(fresh, url, w1.next(), **_auth(TOKENS["w1"]))
            assert status == 200
            await asyncio.sleep(0.05)
        deadline = time.monotonic() + 20
        while len(_children(manager.proc.pid) - {victim}) < FRONTS and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert len(_children(manager.proc.pid) - {victim}) == FRONTS
    (exited,) = _events(manager, "specon.manager.front_exited")
    assert exited["pid"] == victim and exited["code"] == -signal.SIGKILL


async def test_sigterm_stops_the_fronts_and_removes_the_sockets(manager: Running) -> None:
    async with aiohttp.ClientSession() as session:
        await wait_healthy(manager, session)
    fronts = _children(manager.proc.pid)
    (serving,) = _events(manager, "specon.manager.fronts")
    sockets = Path(str(serving["sockets"]))
    assert sockets.is_dir() and oct(sockets.stat().st_mode & 0o777) == "0o700"
    manager.proc.send_signal(signal.SIGTERM)
    assert manager.proc.wait(20) == 0
    assert not any(_alive(pid) for pid in fronts)
    assert not sockets.exists()
    assert "Traceback" not in manager.log.read_text()


async def test_a_second_manager_cannot_take_the_address(manager: Running, tmp_path: Path) -> None:
    async with aiohttp.ClientSession() as session:
        await wait_healthy(manager, session)
    port = manager.url.rsplit(":", 1)[1]
    (tmp_path / "other").mkdir()
    for fronts in ("1", "0"):
        argv = [str(MANAGER), "--listen", f"127.0.0.1:{port}", "--fronts", fronts]
        argv += ["--token-file", str(tmp_path / "read"), "--state-dir", str(tmp_path / "other" / fronts)]
        other = subprocess.run(
            argv, capture_output=True, text=True, env=manager_env(), timeout=30, check=False
        )
        assert other.returncode == 1 and "address already in use" in other.stderr.lower(), other.stderr


async def test_a_browser_login_through_a_front_is_that_browsers_alone(manager: Running) -> None:
    """The session cookie reaches the browser that logged in (the 303 is not followed by the
    front), and the front keeps no cookie of its own for the next caller."""
    form = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "text/html"}
    jar = aiohttp.CookieJar(unsafe=True)  # cookies of an IP address's site too
    async with aiohttp.ClientSession(cookie_jar=jar) as browser, aiohttp.ClientSession() as stranger:
        await wait_healthy(manager, browser)
        async with browser.post(
            f"{manager.url}/login", data=f"token={READ}", headers=form, allow_redirects=False
        ) as resp:
            assert resp.status == 303 and resp.headers["Location"] == "/"
            assert "specon_session" in resp.headers["Set-Cookie"]
        async with browser.get(f"{manager.url}/", headers={"Accept": "text/html"}) as resp:
            assert resp.status == 200 and "log out" in (await resp.text()).lower()
        async with stranger.get(f"{manager.url}/", headers={"Accept": "text/html"}) as resp:
            assert resp.status == 401  # the login form, not the page
        async with stranger.get(f"{manager.url}{protocol.STATUS_PATH}") as resp:
            assert resp.status == 401


async def _raw(m: Running, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    """One request written whole, in one write: a server may answer before it reads the
    body (as the manager does a 401), and a client still writing would see the reset."""
    host, port = m.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write(
        f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: {len(body)}\r\n"
        f"Connection: close\r\n{head}\r\n".encode()
        + body
    )
    answer = await reader.read()
    writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


async def test_the_token_is_checked_before_the_body_is_read(manager: Running) -> None:
    path = protocol.HEARTBEAT_PATH
    garbage = {"Content-Encoding": "gzip"}
    async with aiohttp.ClientSession() as session:
        await wait_healthy(manager, session)
        status, _ = await _raw(manager, "POST", path, b"not gzip at all", {**garbage, **_auth("not-a-token")})
        assert status == 401
        status, body = await _raw(
            manager, "POST", path, b"not gzip at all", {**garbage, **_auth(TOKENS["w1"])}
        )
        assert status == 400 and "unreadable body" in protocol.decode(body, ErrorReply).error
        metrics = await _metrics(session, manager)
    assert 'specon_manager_rejected_messages_total{reason="unauthorized"} 1.0' in metrics
    assert 'specon_manager_rejected_messages_total{reason="malformed"} 1.0' in metrics


def _started(pid: int) -> bool:
    """Whether front ``pid`` has started serving: it catches SIGTERM from then on."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return bool(int(status["SigCgt"], 16) & (1 << (signal.SIGTERM - 1)))


async def test_a_second_stop_signal_does_not_cut_a_fronts_shutdown_short(manager: Running) -> None:
    """Every front gets SIGTERM twice (as from a process group's signal and the decider's own)
    while long polls are held through them: each poll is still answered, each front exits 0."""
    async with aiohttp.ClientSession() as session:
        await wait_healthy(manager, session)
    fronts = _children(manager.proc.pid)
    deadline = time.monotonic() + 30
    while not all(_started(pid) for pid in fronts) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert all(_started(pid) for pid in fronts)
    poll = protocol.encode(Poll(worker=WorkerId("w1"), sent_at=time.time(), wait=2.0))

    async def held() -> int:  # a connection of its own: the kernel picks its front
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
            status, _ = await _post(s, f"{manager.url}{protocol.POLL_PATH}", poll, **_auth(TOKENS["w1"]))
            return status

    polls = [asyncio.create_task(held()) for _ in range(8)]
    await asyncio.sleep(0.5)  # all eight held by now
    for _ in range(2):
        for pid in fronts:
            os.kill(pid, signal.SIGTERM)
        await asyncio.sleep(0.1)
    assert await asyncio.gather(*polls) == [200] * 8
    deadline = time.monotonic() + 20
    while len(_events(manager, "specon.manager.front_exited")) < FRONTS and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    exited = _events(manager, "specon.manager.front_exited")
    assert {e["pid"] for e in exited} == fronts and {e["code"] for e in exited} == {0}


async def test_fronts_that_cannot_serve_what_the_manager_loaded_stop_it(
    manager: Running, tmp_path: Path
) -> None:
    """A token added to the file after the start would be honoured by a restarted front and
    not by the decider: the front refuses to start, and after three tries the manager stops."""
    async with aiohttp.ClientSession() as session:
        await wait_healthy(manager, session)
    with (tmp_path / "agents.yaml").open("a") as f:
        f.write("w3: fronts-agent-token-w3-0123456789abcdef0123\n")
    os.kill(min(_children(manager.proc.pid)), signal.SIGKILL)
    assert manager.proc.wait(60) == 1
    (failing,) = _events(manager, "specon.manager.front_failing")
    assert failing["code"] == 2
    assert "the policy or a token file changed since the manager started" in manager.log.read_text()
