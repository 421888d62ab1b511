"""The frames between the manager's fronts and its decider, and what a heartbeat becomes in them."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from specon_manager import relay
from specon_manager.front import packed
from specon_manager.fronts import HEARTBEATS

from specon.wire.protocol import CommandResult, Heartbeat
from tests.unit.wire.test_protocol import heartbeat, strategy


def test_frames_come_out_whole_however_the_bytes_are_cut() -> None:
    sent = [(1, relay.HEARTBEAT, b"x" * 300), (2, relay.ANSWER, b""), (2**63, relay.DECLINED, b"\x00\xff")]
    stream = b"".join(relay.frame(*f) for f in sent)
    for cut in range(len(stream) + 1):
        frames = relay.Frames()
        got = [*frames.feed(stream[:cut]), *frames.feed(stream[cut:])]
        assert got == sent
    one_by_one = relay.Frames()
    assert [f for i in range(len(stream)) for f in one_by_one.feed(stream[i : i + 1])] == sent


@pytest.mark.parametrize("head", [relay.frame(1, b"X", b"abc"), relay.frame(1, b"\0", b"")])
def test_a_frame_no_front_sends_is_refused(head: bytes) -> None:
    with pytest.raises(relay.FrameError):
        list(relay.Frames().feed(head))


def test_a_frame_over_the_limit_is_refused_before_its_bytes_arrive() -> None:
    head = relay.frame(1, relay.HEARTBEAT, b"")
    too_long = (relay.MAX_FRAME + 1).to_bytes(4, "big") + head[4:]
    with pytest.raises(relay.FrameError, match="not a relay frame"):
        list(relay.Frames().feed(too_long))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strategy(Heartbeat))
def test_the_decider_reads_the_heartbeat_the_front_checked(hb: Heartbeat) -> None:
    payload = packed(hb)
    assert payload is not None
    assert HEARTBEATS.decode(payload) == hb


def test_a_heartbeat_msgpack_cannot_carry_is_passed_on_as_http() -> None:
    """JSON allows an integer of any size in a command's detail; msgpack stops at 64 bits."""
    hb = dataclasses.replace(
        heartbeat(), results=(CommandResult(command="c", ok=True, detail={"n": 10**40}),)
    )
    assert packed(hb) is None
    assert packed(heartbeat()) == msgspec.msgpack.encode(heartbeat())
