"""A standby manager and its take-over, in-process: the shell reads the journal and writes
nothing until it leads, then recovers from the journal as it is at that moment; the HTTP face
(``specon_manager.standby``) answers /readyz, refuses protocol messages with 503 naming the
leader, serves health and the journal's status; two apps wired to one fake Lease API
(``leader.attach``) hand the lead over on a graceful stop."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families
from specon_agent.client import ManagerClient, ManagerUnavailable
from specon_manager import standby
from specon_manager.app import METRICS, create_app
from specon_manager.journal import Journal
from specon_manager.leader import FencedJournal, LeaseElector, attach
from specon_manager.lease import Timing
from specon_manager.shell import STANDBY_REFRESH, ManagerShell

from specon.coordinator.migration import Migration, State
from specon.model import ContainerId, WorkerId
from specon.wire import protocol
from specon.wire.pod_writes import POD_WRITES_PATH
from specon.wire.protocol import ErrorReply
from specon.wire.status import Status
from tests.unit.manager.test_leader import FakeLeases
from tests.unit.manager_fakes import FakeAgent, FakeClock, policy

TOKEN = "s3cret-token-of-at-least-32-bytes!!"
AUTH = {protocol.AUTH_HEADER: f"Bearer {TOKEN}", "Content-Type": protocol.CONTENT_TYPE}
LEADER = "manager-a_0b1c2d3e"
Client = TestClient[web.Request, web.Application]


def saving(mid: str, at: float) -> Migration:
    """A migration the last leader left in flight (its save sent)."""
    return Migration(
        mid, ContainerId(f"c-{mid}"), WorkerId("a"), WorkerId("b"), "converged", State.SAVING, at, at
    )


def old_leader_wrote(path: Path, *migrations: Migration, started: float = 1.0) -> None:
    """What a previous leader left in the journal file ``path``."""
    j = Journal(path)
    j.set_meta("started_at", repr(started))
    for m in migrations:
        j.put(m)
    j.close()


@contextlib.asynccontextmanager
async def standby_app(tmp_path: Path, clock: FakeClock) -> AsyncIterator[tuple[Client, ManagerShell]]:
    sh = ManagerShell(policy=policy(), journal=Journal(tmp_path / "journal.db"), clock=clock, standby=True)
    app = create_app(sh, token=TOKEN, tick=False)
    standby.install(app, sh, leader=lambda: LEADER)
    async with TestClient(TestServer(app)) as client:
        yield client, sh


async def test_a_standby_shows_the_journal_and_writes_nothing(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "journal.db"
    old_leader_wrote(path, saving("m1", 5.0))
    sh = ManagerShell(policy=policy(), journal=Journal(path), clock=clock, standby=True)
    assert list(sh.core.migrations) == ["m1"] and not sh.leading
    for _ in range(3):
        clock.advance(1.0)
        await sh.tick()
    check = Journal(path)
    assert check.get_meta("started_at") == "1.0" and check.all() == [saving("m1", 5.0)]  # untouched
    # The leader goes on writing: the standby's view follows every STANDBY_REFRESH seconds.
    check.put(saving("m2", 6.0))
    clock.advance(STANDBY_REFRESH)
    await sh.tick()
    assert sorted(sh.core.migrations) == ["m1", "m2"] and check.get_meta("started_at") == "1.0"
    check.close()


async def test_the_new_leader_recovers_the_journal_as_it_is_when_elected(
    tmp_path: Path, clock: FakeClock
) -> None:
    path = tmp_path / "journal.db"
    sh = ManagerShell(policy=policy(), journal=Journal(path), clock=clock, standby=True)
    assert sh.core.migrations == {}  # the journal was empty when the standby started
    old_leader_wrote(path, saving("m1", 5.0))  # then the leader decided a move, and died
    watched = sh.core
    clock.advance(30.0)
    await sh.lead()
    assert sh.leading and sh.core is watched  # the same object: the app's metrics follow it
    assert list(sh.core.migrations) == ["m1"] and sh.core.restarted and sh.core.started_at == clock()
    assert Journal(path).get_meta("started_at") == repr(clock())
    # From here it drives the recovered migration like any restarted manager.
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    await sh.heartbeat(a.heartbeat())
    batch = await sh.heartbeat(b.heartbeat())
    assert batch.ack is not None


async def test_a_standby_refuses_protocol_messages_and_serves_health_and_status(
    tmp_path: Path, clock: FakeClock
) -> None:
    old_leader_wrote(tmp_path / "journal.db", saving("m1", 5.0))
    async with standby_app(tmp_path, clock) as (client, sh):
        hb = protocol.encode(FakeAgent("a", clock).heartbeat())
        resp = await client.post(protocol.HEARTBEAT_PATH, data=hb, headers=AUTH)
        assert resp.status == 503 and resp.headers[standby.ROLE_HEADER] == "standby"
        err = protocol.decode(await resp.read(), ErrorReply)
        assert err.error == f"standby: the leader is {LEADER}; retry"
        for path in (protocol.POLL_PATH, protocol.REQUEST_PATH, protocol.GOODBYE_PATH, POD_WRITES_PATH):
            assert (await client.post(path, data=b"{}", headers=AUTH)).status == 503, path
        # Authentication first: a stranger learns nothing about the leader.
        resp = await client.post(
            protocol.HEARTBEAT_PATH, data=hb, headers={"Content-Type": protocol.CONTENT_TYPE}
        )
        assert resp.status == 401
        resp = await client.get(standby.READYZ_PATH)
        assert resp.status == 503 and await resp.json() == {
            "ready": False,
            "role": "standby",
            "leader": LEADER,
        }
        resp = await client.get("/healthz")
        health = await resp.json()
        assert (
            resp.status == 200 and health["ok"] and (health["role"], health["leader"]) == ("standby", LEADER)
        )
        resp = await client.get(protocol.STATUS_PATH)
        status = protocol.decode(await resp.read(), Status)
        assert [m.id for m in status.migrations] == ["m1"] and status.workers == ()
        page = await (await client.get("/")).text()
        assert 'id="standby"' in page and LEADER in page
        # An agent takes the 503 as "manager unavailable": retried within its heartbeat interval.
        agent = ManagerClient(str(client.make_url("")), TOKEN)
        with pytest.raises(ManagerUnavailable, match="503"):
            await agent.send(protocol.HEARTBEAT_PATH, FakeAgent("a", clock).heartbeat())
        await agent.close()
        # Elected: ready, and the same messages are taken.
        await sh.lead()
        assert (await client.get(standby.READYZ_PATH)).status == 200
        resp = await client.post(protocol.HEARTBEAT_PATH, data=hb, headers=AUTH)
        assert resp.status == 200 and resp.headers[standby.ROLE_HEADER] == "leader"
        assert "role" not in await (await client.get("/healthz")).json()
        assert 'id="standby"' not in await (await client.get("/")).text()
        # Leadership lost: refused again at once.
        sh.stand_down()
        assert (await client.get(standby.READYZ_PATH)).status == 503
        assert (await client.post(protocol.HEARTBEAT_PATH, data=hb, headers=AUTH)).status == 503


async def test_a_manager_without_election_is_always_ready(tmp_path: Path, clock: FakeClock) -> None:
    sh = ManagerShell(policy=policy(), journal=Journal(tmp_path / "journal.db"), clock=clock)
    app = create_app(sh, token=TOKEN, tick=False)
    standby.install(app, sh)
    async with TestClient(TestServer(app)) as client:
        resp = await client.get(standby.READYZ_PATH)
        assert resp.status == 200 and await resp.json() == {"ready": True, "role": "leader"}
        assert standby.ROLE_HEADER not in resp.headers


@pytest.mark.slow
async def test_two_replicas_on_one_lease_hand_over_on_a_graceful_stop(tmp_path: Path) -> None:
    """``attach`` end to end in-process: one leads, the other stands by; stopping the leader
    releases the lease and the standby leads from the journal the first one left."""
    api = FakeLeases()
    timing = Timing(lease_duration=30, renew_deadline=10, retry_period=0.05)  # only a release is fast
    path = tmp_path / "journal.db"
    lost: list[str] = []

    def replica(identity: str) -> tuple[web.Application, ManagerShell, LeaseElector]:
        elector = LeaseElector(
            api, namespace="specon", name="specon-manager", identity=identity, timing=timing
        )
        journal = FencedJournal(Journal(path), elector.holds)
        sh = ManagerShell(policy=policy(), journal=journal, standby=True)
        app = create_app(sh, token=TOKEN, tick=False)
        attach(app, sh, elector, registry=app[METRICS].registry, on_lost=lost.append)
        return app, sh, elector

    app_a, sh_a, _ = replica("a")
    app_b, sh_b, el_b = replica("b")
    async with TestClient(TestServer(app_a)) as a:
        await until(lambda: sh_a.leading, "a to lead")
        async with TestClient(TestServer(app_b)) as b:
            await until(lambda: el_b.leader == "a", "b to see a lead")
            assert (await a.get(standby.READYZ_PATH)).status == 200
            assert (await b.get(standby.READYZ_PATH)).status == 503
            assert await sample(b, "specon_manager_leader") == 0
            Journal(path).put(saving("m1", 5.0))  # as a's coordinator would have
            await a.close()  # a graceful stop: a stands down and releases the lease
            assert not sh_a.leading and api.holder().holder in ("", "b")
            await until(lambda: sh_b.leading, "b to lead (a 30 s lease: only a release is this fast)")
            assert list(sh_b.core.migrations) == ["m1"]
            resp = await b.get(standby.READYZ_PATH)
            assert resp.status == 200
            assert await sample(b, "specon_manager_leader") == 1
            # b's first sight of a is no transition it saw happen; its own take is.
            assert await sample(b, "specon_manager_leader_transitions_total") == 1
    assert lost == []  # stopped gracefully, never lost


async def sample(client: Client, name: str) -> float:
    """The value of the sample ``name`` on ``/metrics``."""
    text = await (await client.get("/metrics")).text()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                return float(s.value)
    raise AssertionError(f"{name} not in /metrics")


async def until(cond: object, what: str, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():  # type: ignore[operator]
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def test_the_refusal_says_when_no_leader_is_known() -> None:
    assert standby.refusal("") == "standby: no leader is elected yet; retry"
    assert json.loads(json.dumps(standby.refusal("x"))) == "standby: the leader is x; retry"
