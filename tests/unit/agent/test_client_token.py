"""The agent's bearer token from a file that rotates (a projected ServiceAccount token):
re-read when the file changes, the last good one kept while the file is unreadable, and
each request carries the token current when it is sent."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from specon_agent.client import FileToken, ManagerClient, ManagerUnavailable

from specon.model import Resources, WorkerId
from specon.wire import protocol
from specon.wire.protocol import CommandBatch, Heartbeat


def rotate(path: Path, token: str) -> None:
    """What the kubelet does: write a new file beside, then swap the symlink atomically."""
    target = path.parent / f"..{token[:8]}"
    target.write_text(token + "\n")
    tmp = path.parent / "token.tmp"
    tmp.symlink_to(target.name)
    os.replace(tmp, path)


def test_the_file_is_re_read_only_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "token"
    rotate(path, "a" * 40)
    source = FileToken(path)
    assert source() == "a" * 40 and source() == "a" * 40
    assert source.reads == 1
    rotate(path, "b" * 40)
    assert source() == "b" * 40 and source.reads == 2


def test_an_unreadable_file_keeps_the_last_good_token(tmp_path: Path) -> None:
    path = tmp_path / "token"
    with pytest.raises(FileNotFoundError):
        FileToken(path)()  # nothing good yet: the caller hears why
    rotate(path, "a" * 40)
    source = FileToken(path)
    assert source() == "a" * 40
    path.unlink()
    assert source() == "a" * 40
    rotate(path, "   ")
    assert source() == "a" * 40


def test_a_check_vets_every_new_token(tmp_path: Path) -> None:
    def strong(token: str) -> str:
        if len(token) < 32:
            raise ValueError("too short")
        return token

    path = tmp_path / "token"
    rotate(path, "short")
    with pytest.raises(ValueError, match="too short"):
        FileToken(path, check=strong)()
    rotate(path, "c" * 40)
    source = FileToken(path, check=strong)
    assert source() == "c" * 40
    rotate(path, "weak")
    assert source() == "c" * 40  # refused: the last good one stays


@pytest.fixture
async def manager() -> AsyncIterator[tuple[str, list[str]]]:
    seen: list[str] = []

    async def heartbeat(request: web.Request) -> web.Response:
        seen.append(request.headers.get(protocol.AUTH_HEADER, ""))
        return web.Response(
            body=protocol.encode(CommandBatch(manager_time=0.0, policy_generation=0)),
            content_type=protocol.CONTENT_TYPE,
        )

    app = web.Application()
    app.router.add_post(protocol.HEARTBEAT_PATH, heartbeat)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield str(server.make_url("")), seen
    await server.close()


def beat() -> Heartbeat:
    return Heartbeat(
        worker=WorkerId("node-1"),
        address="127.0.0.1:1",
        seq=1,
        sent_at=0.0,
        capacity=Resources(cpu=1.0),
        usage=0.0,
    )


async def test_each_request_carries_the_current_token(tmp_path: Path, manager: tuple[str, list[str]]) -> None:
    url, seen = manager
    path = tmp_path / "token"
    rotate(path, "a" * 40)
    async with ManagerClient(url, FileToken(path)) as client:
        await client.send(protocol.HEARTBEAT_PATH, beat())
        rotate(path, "b" * 40)
        await client.send(protocol.HEARTBEAT_PATH, beat())
    async with ManagerClient(url, "s" * 40) as client:  # a plain string still works
        await client.send(protocol.HEARTBEAT_PATH, beat())
    assert seen == [f"Bearer {'a' * 40}", f"Bearer {'b' * 40}", f"Bearer {'s' * 40}"]


async def test_no_token_yet_is_a_retry_not_a_crash(tmp_path: Path, manager: tuple[str, list[str]]) -> None:
    url, seen = manager
    async with ManagerClient(url, FileToken(tmp_path / "absent")) as client:
        with pytest.raises(ManagerUnavailable, match="no token"):
            await client.send(protocol.HEARTBEAT_PATH, beat())
    assert seen == []
