"""A heartbeat a front relays is decided exactly as one the decider's HTTP handler decodes.

Two managers over the same journal state and clock take the same heartbeats, one through
``POST /v1/heartbeat`` and one through ``relayed_heartbeat`` (what the decider runs for a
front's frame): every answer is the same, bytes and all. What the handler would refuse for the
cluster's state, and anything a standby gets, is declined (None) without a side effect, for the
front to send as HTTP.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer
from specon_manager.app import METRICS, SHELL, create_app, relayed_heartbeat

from specon.model import Category
from specon.wire import protocol
from specon.wire.protocol import Heartbeat
from tests.unit.manager.test_app import AUTH, TOKEN, metric
from tests.unit.manager_fakes import FakeAgent, FakeClock, policy, report, shell

CC, PC = Category.CONVERGED, Category.PROGRESSING


def _beats(clock: FakeClock) -> list[Heartbeat]:
    """Two workers; one job converges and asks to move (a command comes back), a stale repeat."""
    a, b = FakeAgent("a", clock), FakeAgent("b", clock, cpu=16.0)
    out = [a.heartbeat(report("c1"), report("c2")), b.heartbeat(report("c3"))]
    out.append(a.heartbeat(report("c1", CC, pending=True, t_cc=a.now()), report("c2")))
    out.append(b.heartbeat(report("c3")))
    out.append(dataclasses.replace(out[-1]))  # the same seq again: stale
    out.append(a.heartbeat(report("c1", CC, pending=True, t_cc=a.now()), report("c2")))
    return out


async def test_relayed_heartbeats_are_answered_as_the_handler_answers(tmp_path: Path) -> None:
    clock = FakeClock()
    beats = _beats(clock)
    by_http = create_app(shell(tmp_path / "http", clock), token=TOKEN, tick=False)
    relayed = create_app(shell(tmp_path / "relay", clock), token=TOKEN, tick=False)
    moved = False
    async with TestClient(TestServer(by_http)) as client:
        for hb in beats:
            resp = await client.post(protocol.HEARTBEAT_PATH, data=protocol.encode(hb), headers=AUTH)
            assert resp.status == 200
            expected = await resp.read()
            assert await relayed_heartbeat(relayed, hb) == expected
            moved |= bool(protocol.decode(expected, protocol.CommandBatch).commands)
        assert moved, "the sequence should draw a command"
        accepted = await metric(client, "specon_manager_heartbeats_total", worker="a")
    assert relayed[METRICS].heartbeats.labels(worker="a")._value.get() == accepted == 3
    assert relayed[METRICS].rejected.labels(reason="stale")._value.get() == 1


async def test_what_the_handler_refuses_is_declined_without_a_trace(tmp_path: Path) -> None:
    clock = FakeClock()
    app = create_app(
        shell(tmp_path, clock, policy(messaging={"max_containers_per_heartbeat": 2})), token=TOKEN, tick=False
    )
    a = FakeAgent("a", clock)
    too_many = a.heartbeat(report("c1"), report("c2"), report("c3"))
    far_ahead = dataclasses.replace(a.heartbeat(report("c1")), seq=2**62)
    for hb in (too_many, far_ahead):
        assert await relayed_heartbeat(app, hb) is None
    assert not app[SHELL].core.state.workers
    assert app[METRICS].rejected.labels(reason="malformed")._value.get() == 0


async def test_a_standby_declines_every_relayed_heartbeat(tmp_path: Path) -> None:
    clock = FakeClock()
    app = create_app(shell(tmp_path, clock), token=TOKEN, tick=False)
    app[SHELL].leading = False
    assert await relayed_heartbeat(app, FakeAgent("a", clock).heartbeat(report("c1", PC))) is None
    assert not app[SHELL].core.state.workers
