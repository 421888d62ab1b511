"""The drain endpoints: only the operator token may drain or uncordon; bad input gets a clear 4xx."""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from specon_manager.app import SHELL, create_app
from specon_manager.auth import StaticTokens

from specon.wire import protocol
from specon.wire.operator import DrainReply
from tests.unit.manager_fakes import FakeAgent, FakeClock, report, shell

OPERATOR, READ, AGENT = (secrets.token_urlsafe(32) for _ in range(3))
Client = TestClient[web.Request, web.Application]


def bearer(token: str) -> dict[str, str]:
    return {protocol.AUTH_HEADER: f"Bearer {token}"}


@contextlib.asynccontextmanager
async def serve(tmp_path: Path, clock: FakeClock) -> AsyncIterator[Client]:
    sh = shell(tmp_path, clock)
    auth = StaticTokens(agents={"a": AGENT}, read=READ, operator=OPERATOR)
    async with TestClient(TestServer(create_app(sh, auth=auth, guard_reads=True, tick=False))) as client:
        a, b = FakeAgent("a", clock), FakeAgent("b", clock)
        await sh.heartbeat(a.heartbeat(report("j1"), report("j2")))
        await sh.heartbeat(b.heartbeat())
        yield client


async def test_the_operator_token_drains_and_uncordons_and_others_may_not(
    tmp_path: Path, clock: FakeClock
) -> None:
    async with serve(tmp_path, clock) as client:
        for token in (READ, AGENT):
            resp = await client.post("/v1/workers/a/drain", headers=bearer(token))
            assert resp.status == 403, token
        assert (await client.post("/v1/workers/a/drain")).status == 401
        resp = await client.post(
            "/v1/workers/a/drain", data=json.dumps({"deadline": 60}), headers=bearer(OPERATOR)
        )
        assert resp.status == 202
        reply = DrainReply.from_json(await resp.read())
        assert reply.cordoned and reply.jobs == ("j1", "j2") and reply.deadline == clock() + 60
        assert {m.container for m in reply.moves} == {"j1", "j2"}  # evacuations opened at once
        assert client.app is not None and client.app[SHELL].core.state.cordoned == {"a"}
        # Its progress reads like the status: the read token may, an agent's may not.
        assert (await client.get("/v1/workers/a/drain", headers=bearer(READ))).status == 200
        assert (await client.get("/v1/workers/a/drain", headers=bearer(AGENT))).status == 403
        assert (await client.post("/v1/workers/a/uncordon", headers=bearer(READ))).status == 403
        resp = await client.post("/v1/workers/a/uncordon", headers=bearer(OPERATOR))
        assert resp.status == 200 and not DrainReply.from_json(await resp.read()).cordoned
        # The operator token sends no agent message.
        assert (await client.post(protocol.GOODBYE_PATH, headers=bearer(OPERATOR))).status == 403


BAD = [
    ("/v1/workers/nobody/drain", b"", 404, "no worker nobody"),
    ("/v1/workers/a/drain", b"{not json", 400, "not JSON"),
    ("/v1/workers/a/drain", b'{"deadline": -1}', 400, "deadline: expected seconds"),
    ("/v1/workers/a/drain", b'{"deadline": "soon"}', 400, "deadline"),
    ("/v1/workers/..%2Fx/drain", b"", 400, ""),
    ("/v1/workers/nobody/uncordon", b"", 404, "no worker nobody"),
]


@pytest.mark.parametrize("case", BAD, ids=[f"{p}:{b!r}" for p, b, _, _ in BAD])
async def test_bad_drains_get_a_clear_error(
    tmp_path: Path, clock: FakeClock, case: tuple[str, bytes, int, str]
) -> None:
    path, body, status, says = case
    async with serve(tmp_path, clock) as client:
        resp = await client.post(path, data=body, headers=bearer(OPERATOR))
        assert resp.status == status
        assert says in protocol.decode(await resp.read(), protocol.ErrorReply).error


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["deadline", "x"]), inner, max_size=2)
    ),
    max_leaves=6,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(st.binary(max_size=64), JSON_VALUES.map(lambda v: json.dumps(v).encode())))
async def test_any_drain_body_is_answered_202_or_400_never_500(tmp_path: Path, body: bytes) -> None:
    clock = FakeClock()
    async with serve(tmp_path / secrets.token_hex(4), clock) as client:
        resp = await client.post("/v1/workers/a/drain", data=body, headers=bearer(OPERATOR))
        assert resp.status in (202, 400), (body, resp.status, await resp.text())
