"""The manager's HTTP face: auth, message validation, status JSON and page, metrics, health.

The app runs in-process on 127.0.0.1 (aiohttp's TestServer) over the real manager shell and coordinator
with a fake clock; the ticker is off so nothing moves between requests.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families
from specon_manager.app import SHELL, create_app

from specon.config import Policy
from specon.coordinator.machine import Coordinator
from specon.coordinator.migration import State
from specon.model import Category
from specon.wire import protocol
from specon.wire.protocol import Action, CommandBatch, ErrorReply, Goodbye, Poll, ReallocationRequest
from specon.wire.status import Status
from tests.unit.manager_fakes import START, FakeAgent, FakeClock, only, policy, report, shell

TOKEN = "s3cret-token"
AUTH = {protocol.AUTH_HEADER: f"Bearer {TOKEN}"}
Client = TestClient[web.Request, web.Application]
CC, PC, WC = Category.CONVERGED, Category.PROGRESSING, Category.WATCHING


@contextlib.asynccontextmanager
async def serve(tmp_path: Path, clock: FakeClock, pol: Policy | None = None) -> AsyncIterator[Client]:
    sh = shell(tmp_path, clock, pol)
    async with TestClient(TestServer(create_app(sh, token=TOKEN, tick=False))) as client:
        yield client


def coord_of(client: Client) -> Coordinator:
    app = client.app
    assert app is not None
    return app[SHELL].core


async def post(
    client: Client, path: str, body: bytes, *, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    resp = await client.post(
        path,
        data=body,
        headers={"Content-Type": protocol.CONTENT_TYPE, **(AUTH if headers is None else headers)},
    )
    return resp.status, await resp.read()


def error_of(body: bytes) -> ErrorReply:
    return protocol.decode(body, ErrorReply)


async def metric(client: Client, name: str, **labels: str) -> float | None:
    """One sample of ``/metrics`` (None if absent)."""
    text = await (await client.get("/metrics")).text()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


def valid_bodies(clock: FakeClock) -> dict[str, bytes]:
    a = FakeAgent("a", clock)
    return {
        protocol.HEARTBEAT_PATH: protocol.encode(a.heartbeat(report("c1"))),
        protocol.REQUEST_PATH: protocol.encode(
            ReallocationRequest(
                worker=a.worker, container=report("c1").id, t_cc=1.0, g=0.001, sent_at=a.now()
            )
        ),
        protocol.POLL_PATH: protocol.encode(Poll(worker=a.worker, sent_at=a.now(), wait=0.0)),
        protocol.GOODBYE_PATH: protocol.encode(Goodbye(worker=a.worker, sent_at=a.now())),
    }


ENDPOINTS = (protocol.HEARTBEAT_PATH, protocol.REQUEST_PATH, protocol.POLL_PATH, protocol.GOODBYE_PATH)


# --- authentication ------------------------------------------------------------------------


@pytest.mark.parametrize("path", ENDPOINTS)
@pytest.mark.parametrize(
    "headers",
    [
        {},
        {protocol.AUTH_HEADER: "Bearer wrong"},
        {protocol.AUTH_HEADER: TOKEN},
        {protocol.AUTH_HEADER: f"Basic {TOKEN}"},
    ],
    ids=["none", "wrong", "no-scheme", "basic"],
)
async def test_every_post_needs_the_bearer_token(tmp_path: Path, path: str, headers: dict[str, str]) -> None:
    clock = FakeClock()
    async with serve(tmp_path, clock) as client:
        status, body = await post(client, path, valid_bodies(clock)[path], headers=headers)
        assert status == 401
        assert "token" in error_of(body).error
        assert coord_of(client).state.heartbeats == 0 and not coord_of(client).state.workers
        assert await metric(client, "specon_manager_rejected_messages_total", reason="unauthorized") == 1.0
        # With the token the same body is accepted (a request after the heartbeat that
        # shows the container running there).
        await post(client, protocol.HEARTBEAT_PATH, valid_bodies(clock)[protocol.HEARTBEAT_PATH])
        status, body = await post(client, path, valid_bodies(clock)[path])
        assert status == 200
        protocol.decode(body, CommandBatch)


@pytest.mark.parametrize("path", [protocol.STATUS_PATH, "/", "/metrics", "/healthz"])
async def test_reads_need_no_token(tmp_path: Path, path: str) -> None:
    async with serve(tmp_path, FakeClock()) as client:
        resp = await client.get(path)
        assert resp.status == 200


# --- message validation -------------------------------------------------------------------


def _heartbeat_json(clock: FakeClock) -> dict[str, object]:
    data: dict[str, object] = json.loads(protocol.encode(FakeAgent("a", clock).heartbeat(report("c1"))))
    return data


@pytest.mark.parametrize(
    ("mutate", "path", "words"),
    [
        (lambda d: d.update(version="2.0"), "version", ["'2.0'", protocol.VERSION]),
        (lambda d: d.pop("version"), "version", ["missing"]),
        (lambda d: d.pop("capacity"), "capacity", ["missing"]),
        (lambda d: d["containers"][0].pop("category"), "containers[0].category", ["missing"]),
        (lambda d: d.update(usage="high"), "usage", ["number"]),
        (lambda d: d.update(kind="Goodbye"), "kind", ["Heartbeat", "Goodbye"]),
        (lambda d: d.update(sedq=1), "sedq", ["unknown"]),
    ],
    ids=["major-version", "no-version", "no-field", "nested-field", "bad-type", "wrong-kind", "unknown-key"],
)
async def test_an_invalid_heartbeat_gets_400_naming_the_problem(
    tmp_path: Path, mutate: object, path: str, words: list[str]
) -> None:
    clock = FakeClock()
    data = _heartbeat_json(clock)
    mutate(data)  # type: ignore[operator]
    async with serve(tmp_path, clock) as client:
        status, body = await post(client, protocol.HEARTBEAT_PATH, json.dumps(data).encode())
        assert status == 400
        err = error_of(body)
        assert err.path == path
        for word in words:
            assert word in err.error
        assert not coord_of(client).state.workers
        assert await metric(client, "specon_manager_rejected_messages_total", reason="malformed") == 1.0


@pytest.mark.parametrize(
    "body",
    [b'{"version": "1.0", "kind": "Heartbeat",', b"", b"[]", b"\xff\xfe", b'{"version": "1.0", "x": NaN}'],
    ids=["truncated", "empty", "array", "not-utf8", "nan"],
)
async def test_malformed_json_gets_400_with_a_clear_message(tmp_path: Path, body: bytes) -> None:
    async with serve(tmp_path, FakeClock()) as client:
        status, reply = await post(client, protocol.HEARTBEAT_PATH, body)
        assert status == 400
        err = error_of(reply).error
        assert any(w in err for w in ("not valid JSON", "not UTF-8", "expected a JSON object")), err


async def test_a_goodbye_posted_to_the_heartbeat_endpoint_is_refused(tmp_path: Path) -> None:
    clock = FakeClock()
    async with serve(tmp_path, clock) as client:
        bye = protocol.encode(Goodbye(worker=FakeAgent("a", clock).worker, sent_at=1.0))
        status, reply = await post(client, protocol.HEARTBEAT_PATH, bye)
        assert status == 400
        assert error_of(reply).error == "kind: expected Heartbeat, got Goodbye"


async def test_a_body_over_max_body_bytes_gets_413(tmp_path: Path) -> None:
    clock = FakeClock()
    limit = 4096
    async with serve(tmp_path, clock, policy(messaging={"max_body_bytes": limit})) as client:
        many = tuple(report(f"container-{i:04d}") for i in range(200))
        body = protocol.encode(FakeAgent("a", clock).heartbeat(*many))
        assert len(body) > limit
        status, reply = await post(client, protocol.HEARTBEAT_PATH, body)
        assert status == 413
        assert "too large" in error_of(reply).error
        assert not coord_of(client).state.workers
        assert await metric(client, "specon_manager_rejected_messages_total", reason="too_large") == 1.0
        # A small one still goes through.
        status, _ = await post(
            client, protocol.HEARTBEAT_PATH, protocol.encode(FakeAgent("b", clock).heartbeat())
        )
        assert status == 200


async def test_metrics_count_accepted_heartbeats_and_rejections_by_reason(tmp_path: Path) -> None:
    clock = FakeClock()
    a = FakeAgent("a", clock)
    async with serve(tmp_path, clock) as client:
        first, second = a.heartbeat(), a.heartbeat()
        assert (await post(client, protocol.HEARTBEAT_PATH, protocol.encode(second)))[0] == 200
        assert (await post(client, protocol.HEARTBEAT_PATH, protocol.encode(first)))[
            0
        ] == 200  # stale: answered
        await post(client, protocol.HEARTBEAT_PATH, b"{", headers={})
        await post(client, protocol.HEARTBEAT_PATH, b"{")
        assert await metric(client, "specon_manager_heartbeats_total", worker="a") == 1.0
        for reason in ("stale", "unauthorized", "malformed"):
            assert await metric(client, "specon_manager_rejected_messages_total", reason=reason) == 1.0
        assert await metric(client, "specon_manager_containers", worker="a", category="progressing") == 0.0


async def test_a_forgotten_workers_heartbeat_series_goes_and_comes_back(tmp_path: Path) -> None:
    clock = FakeClock()
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    async with serve(tmp_path, clock) as client:
        for _ in range(2):
            assert (await post(client, protocol.HEARTBEAT_PATH, protocol.encode(a.heartbeat())))[0] == 200
        assert await metric(client, "specon_manager_heartbeats_total", worker="a") == 2.0
        msg = coord_of(client).policy.messaging
        clock.advance(msg.prune_after * msg.worker_timeout + 1)
        assert (await post(client, protocol.HEARTBEAT_PATH, protocol.encode(b.heartbeat())))[0] == 200
        assert client.app is not None
        await client.app[SHELL].tick()  # prunes a, silent past prune_after x worker_timeout
        assert "a" not in coord_of(client).state.workers
        assert await metric(client, "specon_manager_heartbeats_total", worker="a") is None
        assert await metric(client, "specon_manager_workers_forgotten_total") == 1.0
        assert (await post(client, protocol.HEARTBEAT_PATH, protocol.encode(a.heartbeat())))[0] == 200
        assert await metric(client, "specon_manager_heartbeats_total", worker="a") == 1.0
        assert await metric(client, "specon_manager_heartbeats_total", worker="b") == 1.0


# --- status ---------------------------------------------------------------------------------


async def test_status_lists_workers_containers_history_and_migrations(tmp_path: Path) -> None:
    clock = FakeClock()
    a, b = FakeAgent("a", clock, cpu=8.0), FakeAgent("b", clock, cpu=2.0)
    async with serve(tmp_path, clock) as client:
        hb_b = b.heartbeat(report("c4", PC), usage=0.25)
        status, body = await post(client, protocol.HEARTBEAT_PATH, protocol.encode(hb_b))
        assert status == 200 and protocol.decode(body, CommandBatch).ack == hb_b.seq
        clock.advance(5.0)
        hb_a = a.heartbeat(report("c2", PC), report("c3", PC), usage=0.75)
        await post(client, protocol.HEARTBEAT_PATH, protocol.encode(hb_a))
        clock.advance(5.0)
        # c2 changes category; c1 converges and requests: a scores 5, b 2 -> c1 moves to b.
        hb_a = a.heartbeat(report("c1", CC, pending=True), report("c2", WC), report("c3", PC), usage=0.75)
        status, body = await post(client, protocol.HEARTBEAT_PATH, protocol.encode(hb_a))
        assert only(protocol.decode(body, CommandBatch), Action.SAVE).container == "c1"

        resp = await client.get(protocol.STATUS_PATH)
        assert resp.content_type == protocol.CONTENT_TYPE
        st = protocol.decode(await resp.read(), Status)
    assert st.now == START + 10.0 and st.mode == "default" and not st.dry_run
    workers = {str(w.id): w for w in st.workers}
    assert sorted(workers) == ["a", "b"]
    assert all(w.reachable and w.ready for w in st.workers)
    assert (workers["a"].capacity.cpu, workers["a"].usage) == (8.0, 0.75)
    assert (workers["b"].capacity.cpu, workers["b"].usage) == (2.0, 0.25)
    assert workers["a"].containers == ("c1", "c2", "c3") and workers["b"].containers == ("c4",)
    assert workers["b"].heartbeat_age == 10.0
    containers = {str(c.id): c for c in st.containers}
    assert containers["c2"].history == ((START + 5.0, PC), (START + 10.0, WC))
    assert containers["c3"].history == ((START + 5.0, PC),)
    assert containers["c1"].migrated and containers["c1"].migrations == 1 and containers["c1"].pending_request
    (m,) = st.migrations
    assert (m.container, m.source, m.target, m.reason, m.state) == ("c1", "a", "b", "converged", State.SAVING)


async def test_status_page_renders_ids_escaped_and_refreshes_itself(tmp_path: Path) -> None:
    clock = FakeClock()
    async with serve(tmp_path, clock) as client:
        hb = FakeAgent("worker-a", clock).heartbeat(report("job-1", CC), report("job-2", PC))
        hb = dataclasses.replace(hb, address="<b>x</b>")
        await post(client, protocol.HEARTBEAT_PATH, protocol.encode(hb))
        await post(client, protocol.HEARTBEAT_PATH, protocol.encode(FakeAgent("worker-b", clock).heartbeat()))
        resp = await client.get("/")
        assert resp.status == 200 and resp.content_type == "text/html"
        html = await resp.text()
    assert '<meta http-equiv="refresh"' in html
    for word in ("worker-a", "worker-b", "job-1", "&lt;b&gt;x&lt;/b&gt;"):
        assert word in html
    assert "<b>x</b>" not in html


async def test_healthz_reports_ok(tmp_path: Path) -> None:
    async with serve(tmp_path, FakeClock()) as client:
        resp = await client.get("/healthz")
        data = await resp.json()
    assert data["ok"] is True and data["in_flight"] == 0


async def test_a_poll_over_http_returns_a_command_batch(tmp_path: Path) -> None:
    clock = FakeClock()
    async with serve(tmp_path, clock) as client:
        status, body = await post(
            client,
            protocol.POLL_PATH,
            protocol.encode(Poll(worker=FakeAgent("a", clock).worker, sent_at=1.0, wait=0.0)),
        )
        assert status == 200
        batch = protocol.decode(body, CommandBatch)
    assert batch.commands == () and batch.manager_time == START
