"""msgspec's happy path of ``protocol.decode`` (``specon.wire.fastpath``) against the codec's.

What must hold: on a valid message the fast path is taken and gives the codec's value; on
any body whatever, ``protocol.decode`` answers exactly as the codec alone would (the same
message, or the same error and path), so the fast path is never more lenient.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specon.model import Category, ContainerId, WorkerId
from specon.wire import fastpath, protocol
from specon.wire.protocol import (
    CommandBatch,
    CommandResult,
    ContainerReport,
    Heartbeat,
    Poll,
    ProtocolError,
    decode,
    encode,
)
from specon.wire.status import LossWindow
from tests.unit.wire.test_protocol import any_message, heartbeat


def codec_only(raw: bytes | str, cls: type[Any]) -> object:
    """What ``protocol.decode`` answers without the fast path: the message or the error."""
    with mock.patch.object(fastpath, "decode", return_value=None):
        return outcome(raw, cls)


def outcome(raw: bytes | str, cls: type[Any]) -> object:
    try:
        return decode(raw, cls)
    except ProtocolError as e:
        return ("error", str(e), e.path)


def same_as_codec(raw: bytes | str, cls: type[Any]) -> object:
    got = outcome(raw, cls)
    assert got == codec_only(raw, cls)
    return got


def rich_heartbeat() -> Heartbeat:
    """Every kind of field set: optional ones, a window, results with free-form JSON."""
    base = heartbeat(3)
    window = LossWindow(first_step=0, last_step=90, loss=(2.5, 1.25, 0.5), steps_per_second=3.5)
    return Heartbeat(
        worker=base.worker,
        address=base.address,
        seq=base.seq,
        sent_at=base.sent_at,
        capacity=base.capacity,
        usage=base.usage,
        containers=(
            *base.containers,
            ContainerReport(
                id=ContainerId("job-w"),
                category=Category.CONVERGED,
                phase="stopped",
                t_cc=990.0,
                migrated=True,
                pending_request=True,
                remaining_work=12.5,
                job={"model": "vae", "steps": "100"},
                selector={"disk": "ssd"},
                tolerations=("gpu:NoSchedule", "*"),
                cpu_weight=200,
                window=window,
            ),
        ),
        results=(
            CommandResult(
                command="c2",
                ok=False,
                error="boom",
                finished_at=999.0,
                spec={"image": "x", "argv": ["a", 1, 2.5, None, True], "env": {"K": "v"}},
                detail={"nested": [[{"deep": 10**30}]]},
            ),
        ),
        labels={"zone": "b"},
        taints=("dedicated=ml:NoSchedule",),
    )


def test_a_valid_heartbeat_takes_the_fast_path_to_the_codecs_value() -> None:
    msg = rich_heartbeat()
    raw = encode(msg)
    fast = fastpath.decode(raw, Heartbeat, protocol.VERSION)
    assert fast is not None
    assert fast == msg == codec_only(raw, Heartbeat)
    assert type(fast.containers[-1].category) is Category
    assert type(fast.capacity.cpu) is float  # an int on the wire is a float, as the codec gives
    assert isinstance(fast.containers, tuple) and isinstance(fast.results[0].spec["argv"], list)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_message)
def test_every_valid_message_decodes_alike(msg: protocol.Message) -> None:
    raw = encode(msg)
    assert same_as_codec(raw, type(msg)) == codec_only(raw, type(msg))
    fast = fastpath.decode(raw, type(msg), protocol.VERSION)
    assert fast is not None, "a message this specon encoded must take the fast path"
    assert fast == msg


def _body(**changes: Any) -> str:
    obj = json.loads(encode(rich_heartbeat()))
    obj.update(changes)
    return json.dumps(obj)


def _container(**changes: Any) -> str:
    obj = json.loads(encode(rich_heartbeat()))
    obj["containers"][0].update(changes)
    return json.dumps(obj)


@pytest.mark.parametrize(
    ("raw", "refused"),
    [
        (_body(surplus=1), True),  # an unknown key at our version
        (_container(surplus=1), True),
        (_body(version="1.0"), False),  # an older minor version: the codec's path, accepted
        (_body(version="1.99", surplus=1), False),  # a newer minor: its extra keys ignored
        (_body(version="2.0"), True),
        (_body(version=1.3), True),
        (_body(kind="Poll"), True),
        (_body(seq=True), True),  # a bool is not an int
        (_body(seq=7.0), True),  # nor is a float
        (_body(seq=-1), True),  # the checks still run on the fast path's result
        (_body(usage=1.5), True),
        (_body(usage=1), False),  # an int where a float is due
        (_body(worker="../etc"), True),
        (_body(labels={"zone": "\ud800"}), True),  # a lone surrogate
        (_body(labels={"zone": "\U0001f600"}), False),  # a surrogate pair is fine
        (_body(labels={"zone": "\udc00"}), True),
        (_body(labels={"zone": "\\ud800\udc00"}), True),  # an escaped backslash, then a lone low half
        (_container(category="Converged"), True),
        (_container(phase="sleeping"), True),
        (_container(step=None, last_g=None), False),
        (_container(id=None), True),
        (_body(containers=None), True),
        (_body(capacity={"cpu": 1, "memory": 2, "gpus": 1}), True),
        (
            _body(results=[{"command": "c", "ok": True, "spec": {"x": [1] * 3}, "detail": {"n": 10**40}}]),
            False,
        ),
        (_body(results=[{"command": "c", "ok": True, "detail": {"x": "[" * 5000}}]), False),
        ('{"version":"1.3","kind":"Heartbeat","usage":1e999}', True),
        ('{"version":"1.3","kind":"Heartbeat","usage":NaN}', True),
        (_body()[:-1] + ',"seq":8}', False),  # a repeated key: the last one counts
        (_body() + " x", True),
        (b'{"version":"1.3","kind":"Heartbeat","address":"\xff"}', True),
        ('{"version":"1.3","kind":"Heartbeat","labels":' + "[" * 100_000 + "]" * 100_000 + "}", True),
        ("[]", True),
        ("", True),
    ],
)
def test_protocol_decode_answers_as_the_codec_alone(raw: str | bytes, refused: bool) -> None:
    got = same_as_codec(raw, Heartbeat)
    assert isinstance(got, tuple) is refused, got


def test_other_kinds_take_the_fast_path_too() -> None:
    for msg in (
        Poll(worker=WorkerId("w"), sent_at=1.0, wait=3),
        CommandBatch(manager_time=5.0, policy_generation=2),
    ):
        raw = encode(msg)
        assert fastpath.decode(raw, type(msg), protocol.VERSION) == msg == same_as_codec(raw, type(msg))


_SPLICES = st.sampled_from(
    [
        b"",
        b"0",
        b"-1",
        b"1e999",
        b"true",
        b"null",
        b'"x"',
        b"[]",
        b"{}",
        b",",
        b":",
        b'"',
        b"\\",
        b"\\ud800",
        b"\xff",
        b"9" * 30,
    ]
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mangled_bodies_are_answered_as_the_codec_answers(data: st.DataObject) -> None:
    raw = encode(rich_heartbeat())
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(raw)))
        cut = data.draw(st.integers(0, 4))
        raw = raw[:at] + data.draw(_SPLICES) + raw[at + cut :]
    same_as_codec(raw, Heartbeat)


def test_a_non_message_class_is_not_decoded_by_either_path() -> None:
    raw = encode(Poll(worker=WorkerId("w"), sent_at=1.0)).replace(b'"Poll"', b'"LossWindow"')
    with pytest.raises(ProtocolError, match="unknown message kind"):
        decode(raw, LossWindow)  # type: ignore[type-var]


@settings(max_examples=200, deadline=None)
@given(
    st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**70), 2**70),
    st.integers(-(2**70), 2**70),
    st.none() | st.integers(-(2**70), 2**70),
)
def test_the_plain_batch_is_written_as_the_codec_writes_it(t: float, gen: int, ack: int | None) -> None:
    batch = CommandBatch(manager_time=t, policy_generation=gen, ack=ack)
    with mock.patch.object(protocol, "_plain_batch", return_value=None):
        by_codec = encode(batch)
    assert encode(batch) == by_codec
    assert [f.name for f in dataclasses.fields(CommandBatch)] == [
        "manager_time",
        "policy_generation",
        "commands",
        "ack",
        "quality_version",
        "quality",
    ]


@pytest.mark.parametrize("t", [math.nan, math.inf, -math.inf])
def test_a_plain_batch_with_a_non_finite_time_is_refused_as_before(t: float) -> None:
    with pytest.raises(ProtocolError, match="manager_time"):
        encode(CommandBatch(manager_time=t, policy_generation=1))
