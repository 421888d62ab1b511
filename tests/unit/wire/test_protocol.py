"""The wire protocol: round trips of every message, versioning, and errors that name the field."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from specon.coordinator.migration import Migration, State
from specon.model import Category, ContainerId, Resources, WorkerId
from specon.wire import protocol
from specon.wire.checks import check
from specon.wire.protocol import (
    KINDS,
    MESSAGE_TYPES,
    VERSION,
    Action,
    Command,
    CommandBatch,
    CommandResult,
    ContainerReport,
    Goodbye,
    Heartbeat,
    ProtocolError,
    decode,
    encode,
)
from specon.wire.status import ContainerStatus, MigrationStatus, Status
from tests.strategies import Leaves, from_type

# --- strategies, derived from the type hints like the codec itself -----------------------

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


# Within the protocol's ranges (specon.wire.limits): usage is a share, counts are >= 0; ids
# follow the one id rule.
LEAVES = Leaves(
    ids=lambda _tp: st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True),
    ints=st.integers(0, 10**6),
    floats=st.floats(0.0, 1.0),
    texts=st.text(max_size=12),
    anything=_json,
    mappings=lambda inner: st.dictionaries(
        st.text(st.characters(categories=["L", "N"]), min_size=1, max_size=6), inner, max_size=3
    ),
)


def strategy(tp: Any) -> st.SearchStrategy[Any]:
    return from_type(tp, LEAVES)


any_message = st.one_of(*(strategy(cls) for cls in MESSAGE_TYPES))


def report(i: int, **kw: Any) -> ContainerReport:
    return ContainerReport(id=ContainerId(f"job-{i}"), category=Category.PROGRESSING, **kw)


def heartbeat(n: int = 5) -> Heartbeat:
    return Heartbeat(
        worker=WorkerId("w1"),
        address="10.0.0.1:9100",
        seq=7,
        sent_at=1000.5,
        capacity=Resources(cpu=8.0, memory=16 << 30, gpu=1),
        usage=0.4,
        containers=tuple(report(i, last_g=0.01 * i, step=i) for i in range(n)),
        results=(CommandResult(command="c1", ok=True, checkpoint="/ckpt/job-1", checkpoint_step=40),),
        labels={"zone": "a"},
    )


def wire(msg: protocol.Message) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(encode(msg))
    return out


def error_of(data: bytes | str | dict[str, Any], expected: type[Any] | None = None) -> ProtocolError:
    raw = json.dumps(data) if isinstance(data, dict) else data
    with pytest.raises(ProtocolError) as info:
        decode(raw, expected)
    return info.value


# --- round trips --------------------------------------------------------------------------


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(any_message)
def test_every_message_round_trips(msg: protocol.Message) -> None:
    assume(not check(msg))  # e.g. a container reported twice: decode refuses it
    data = encode(msg)
    assert isinstance(data, bytes)
    assert decode(data) == msg
    assert decode(data.decode(), type(msg)) == msg


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(any_message)
def test_fields_left_out_take_their_defaults(msg: protocol.Message) -> None:
    assume(not check(msg))
    body = wire(msg)
    for f in dataclasses.fields(msg):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            continue
        if getattr(msg, f.name) == default:
            del body[f.name]
    assert decode(json.dumps(body)) == msg


def test_envelope_and_field_names() -> None:
    body = wire(heartbeat(1))
    assert list(body)[:2] == ["version", "kind"]
    assert body["version"] == VERSION and body["kind"] == "Heartbeat"
    assert body["containers"][0]["category"] == "progressing"
    assert body["capacity"] == {"cpu": 8.0, "memory": 16 << 30, "gpu": 1}


def test_no_message_uses_an_envelope_key() -> None:
    for cls in MESSAGE_TYPES:
        names = {str(f.metadata.get("key", f.name)) for f in dataclasses.fields(cls)}
        assert not names & set(protocol.ENVELOPE_KEYS), cls
    assert set(KINDS) == {cls.__name__ for cls in MESSAGE_TYPES}


def test_status_history_round_trips() -> None:
    m = Migration("m1", ContainerId("job"), WorkerId("a"), WorkerId("b"), "converged", decided_at=1.0)
    m = m.to(State.SAVING, at=2.0).to(State.SAVED, at=3.0, stopped_at=3.0, checkpoint="/c", checkpoint_step=9)
    m = m.to(State.RESTORING, at=4.0).to(State.RUNNING, at=5.0, started_at=4.5)
    status = Status(
        now=10.0,
        mode="paper",
        policy_generation=3,
        containers=(
            ContainerStatus(
                id=ContainerId("job"),
                worker=WorkerId("b"),
                category=Category.CONVERGED,
                history=((0.0, Category.PROGRESSING), (60.0, Category.WATCHING), (90.0, Category.CONVERGED)),
                migrated=True,
            ),
        ),
        migrations=(MigrationStatus.of(m),),
    )
    body = wire(status)
    assert body["containers"][0]["history"][1] == [60.0, "watching"]
    assert body["migrations"][0]["state"] == "running"
    assert body["migrations"][0]["downtime"] == 1.5
    assert decode(encode(status), Status) == status


def test_command_batch_remaining_uses_the_manager_clock() -> None:
    cmd = Command(id="c1", action=Action.SAVE, container=ContainerId("job"), deadline=130.0, migration="m1")
    batch = CommandBatch(manager_time=100.0, policy_generation=1, commands=(cmd,), ack=7)
    assert decode(encode(batch), CommandBatch).remaining(cmd) == 30.0
    assert wire(batch)["commands"][0]["action"] == "save"


# --- versions -------------------------------------------------------------------------------


def test_unknown_major_version_is_rejected_naming_both() -> None:
    body = wire(heartbeat()) | {"version": "2.0"}
    err = error_of(body)
    assert err.path == "version"
    assert "'2.0'" in str(err) and VERSION in str(err)


def test_higher_minor_version_ignores_new_fields() -> None:
    body = wire(heartbeat(2)) | {"version": "1.9", "battery": 0.5}
    body["containers"][1]["colour"] = "blue"
    assert decode(json.dumps(body), Heartbeat) == heartbeat(2)


def test_unknown_field_at_our_version_is_an_error() -> None:
    body = wire(heartbeat(2))
    body["containers"][1]["colour"] = "blue"
    err = error_of(body)
    assert err.path == "containers[1].colour"
    assert "unknown key" in str(err)


@pytest.mark.parametrize("version", [None, 1, 1.0, "1", "v1.0", "1.0.0", "", "1.x"])
def test_malformed_or_missing_version(version: object) -> None:
    body = wire(heartbeat())
    if version is None:
        del body["version"]
    else:
        body["version"] = version
    err = error_of(body)
    assert err.path == "version"
    assert VERSION in str(err)


# --- kinds ------------------------------------------------------------------------------------


def test_unknown_kind() -> None:
    err = error_of(wire(heartbeat()) | {"kind": "Telemetry"})
    assert err.path == "kind"
    assert "'Telemetry'" in str(err) and "Heartbeat" in str(err)


def test_missing_kind() -> None:
    body = wire(heartbeat())
    del body["kind"]
    assert error_of(body).path == "kind"


def test_expected_kind_is_enforced() -> None:
    err = error_of(encode(Goodbye(worker=WorkerId("w"), sent_at=1.0)), Heartbeat)
    assert err.path == "kind"
    assert "expected Heartbeat, got Goodbye" in str(err)


def test_encode_refuses_non_messages() -> None:
    with pytest.raises(ProtocolError, match="not a protocol message"):
        encode(report(1))  # type: ignore[arg-type]  # a part, not a message


# --- field errors -------------------------------------------------------------------------------


def test_missing_field_names_its_path() -> None:
    body = wire(heartbeat())
    del body["containers"][3]["category"]
    err = error_of(body)
    assert err.path == "containers[3].category"
    assert "containers[3].category: missing" in str(err)


@pytest.mark.parametrize(
    ("mutate", "path", "words"),
    [
        (lambda b: b.update(seq="7"), "seq", "expected an integer"),
        (lambda b: b.update(seq=7.0), "seq", "expected an integer"),
        (lambda b: b.update(seq=True), "seq", "expected an integer"),
        (lambda b: b.update(usage="high"), "usage", "expected a number"),
        (lambda b: b.update(containers={}), "containers", "expected a list"),
        (lambda b: b["containers"][0].update(category="done"), "containers[0].category", "must be one of"),
        (
            lambda b: b["containers"][0].update(migrated="no"),
            "containers[0].migrated",
            "expected true or false",
        ),
        (lambda b: b["containers"][2].update(phase="zombie"), "containers[2].phase", "must be one of"),
        (lambda b: b["capacity"].update(memory=1.5), "capacity.memory", "expected an integer"),
        (lambda b: b["labels"].update(zone=3), "labels.zone", "expected a string"),
        (lambda b: b["results"][0].update(detail=[]), "results[0].detail", "expected a mapping"),
        (lambda b: b.update(worker=None), "worker", "expected a string"),
    ],
)
def test_wrong_types_name_the_path(mutate: Any, path: str, words: str) -> None:
    body = wire(heartbeat())
    mutate(body)
    err = error_of(body)
    assert err.path == path
    assert words in str(err)


def test_all_field_errors_are_listed() -> None:
    body = wire(heartbeat())
    del body["seq"]
    body["containers"][1]["step"] = "ten"
    err = error_of(body)
    assert "seq: missing" in str(err) and "containers[1].step: expected an integer" in str(err)


def test_nullable_field_accepts_null_only_where_declared() -> None:
    body = wire(heartbeat())
    body["containers"][0]["last_g"] = None
    assert decode(json.dumps(body), Heartbeat).containers[0].last_g is None
    body["usage"] = None
    assert error_of(body).path == "usage"


# --- non-finite numbers -----------------------------------------------------------------------


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_encode_rejects_non_finite_floats_with_the_path(value: float) -> None:
    hb = heartbeat()
    bad = dataclasses.replace(hb, containers=(*hb.containers[:2], report(2, last_g=value)))
    with pytest.raises(ProtocolError) as info:
        encode(bad)
    assert info.value.path == "containers[2].last_g"


def test_encode_rejects_non_finite_inside_free_form_detail() -> None:
    with pytest.raises(ProtocolError) as info:
        encode(CommandResult(command="c", ok=True, detail={"x": [1.0, float("nan")]}))
    assert info.value.path == "detail.x[1]"


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_decode_rejects_non_finite_numbers(token: str) -> None:
    text = encode(Goodbye(worker=WorkerId("w"), sent_at=1.0)).decode().replace("1.0", token)
    with pytest.raises(ProtocolError, match="not valid JSON"):
        decode(text)


# --- garbage -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff\xfe",
        b"{",
        b"[]",
        b"null",
        b'"hello"',
        b"42",
        b"[" * 100_000,
        b'{"a":' * 100_000,
        b"1" * 5000,
        "{}",
        b'{"version":"1.0","kind":"Heartbeat"}',
    ],
)
def test_garbage_is_a_protocol_error(data: bytes | str) -> None:
    with pytest.raises(ProtocolError):
        decode(data)


def test_non_bytes_input_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="expected bytes or str"):
        decode(12)  # type: ignore[call-overload]


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_protocol_error(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        decode(data)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(any_message, st.data())
def test_corrupted_messages_raise_only_protocol_error(msg: protocol.Message, data: st.DataObject) -> None:
    raw = bytearray(encode(msg))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    try:
        decode(bytes(raw))
    except ProtocolError as e:
        assert str(e)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(any_message, st.data())
def test_values_swapped_for_any_json_raise_only_protocol_error(
    msg: protocol.Message, data: st.DataObject
) -> None:
    body = wire(msg)
    keys = [k for k in body if k not in protocol.ENVELOPE_KEYS]
    if keys:
        body[data.draw(st.sampled_from(keys))] = data.draw(_json)
    try:
        decode(json.dumps(body))
    except ProtocolError as e:
        assert e.path is not None


# --- explicit commands and placement constraints (protocol 1.1) -------------------------


def _stop_batch(**command: Any) -> dict[str, Any]:
    cmd = Command(id="m1:stop:w1:0", action=Action.STOP, container=ContainerId("job-1"), deadline=60.0)
    body = wire(CommandBatch(manager_time=10.0, policy_generation=1, commands=(cmd,)))
    body["commands"][0].update(command)
    return body


@pytest.mark.parametrize("action", ["reboot", "Stop", "", None, 3])
def test_an_unknown_action_in_a_batch_is_refused_at_decode_naming_the_known_ones(action: object) -> None:
    e = error_of(_stop_batch(action=action), CommandBatch)
    assert e.path == "commands[0].action"
    assert "commands[0].action" in str(e)
    if isinstance(action, str):
        assert all(a.value in str(e) for a in Action), "the error lists the actions this agent knows"


def test_rollback_is_a_field_of_the_command_and_defaults_to_false() -> None:
    batch = decode(json.dumps(_stop_batch()), CommandBatch)
    assert batch.commands[0].rollback is False
    body = _stop_batch(action="start", rollback=True)
    assert decode(json.dumps(body), CommandBatch).commands[0].rollback is True
    e = error_of(_stop_batch(rollback="yes"), CommandBatch)
    assert e.path == "commands[0].rollback"


def test_container_reports_carry_selector_and_tolerations() -> None:
    hb = dataclasses.replace(
        heartbeat(1),
        taints=("gpu=a100:NoSchedule", "node.kubernetes.io/unschedulable:NoSchedule"),
        containers=(report(1, selector={"zone": "a"}, tolerations=("gpu:NoSchedule", "*:NoExecute")),),
    )
    assert decode(encode(hb), Heartbeat) == hb
    assert wire(hb)["containers"][0]["tolerations"] == ["gpu:NoSchedule", "*:NoExecute"]
    # Left out (a 1.0 agent): no constraints.
    body = wire(heartbeat(1))
    assert "selector" not in body["containers"][0] or body["containers"][0]["selector"] == {}
    body["containers"][0].pop("selector", None)
    body["containers"][0].pop("tolerations", None)
    got = decode(json.dumps(body), Heartbeat).containers[0]
    assert (got.selector, got.tolerations) == ({}, ())


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"tolerations": tuple(f"t{i}" for i in range(129))}, "containers[0].tolerations"),
        ({"tolerations": ("x" * 500,)}, "containers[0].tolerations[0]"),
        ({"tolerations": ("",)}, "containers[0].tolerations[0]"),
        ({"tolerations": ("a\nb",)}, "containers[0].tolerations[0]"),
        ({"selector": {f"k{i}": "v" for i in range(129)}}, "containers[0].selector"),
        ({"selector": {"": "v"}}, "containers[0].selector.''"),
        ({"selector": {"zone": "v" * 2000}}, "containers[0].selector.zone"),
    ],
)
def test_selector_and_tolerations_are_bounded(change: dict[str, Any], path: str) -> None:
    hb = dataclasses.replace(heartbeat(1), containers=(report(0, **change),))
    e = error_of(encode(hb), Heartbeat)
    assert e.path == path, str(e)


def test_heartbeat_taints_are_bounded() -> None:
    assert not check(dataclasses.replace(heartbeat(0), taints=("k" * 317 + "=" + "v" * 63 + ":NoExecute",)))
    assert check(dataclasses.replace(heartbeat(0), taints=("k" * 500,)))[0][0] == "taints[0]"
    many = tuple(f"t{i}" for i in range(129))
    assert check(dataclasses.replace(heartbeat(0), taints=many))[0][0] == "taints"


def test_container_reports_carry_the_cpu_weight_and_older_agents_may_leave_it_out() -> None:
    hb = dataclasses.replace(heartbeat(2), containers=(report(0, cpu_weight=10_000), report(1, cpu_weight=1)))
    assert decode(encode(hb), Heartbeat) == hb
    assert [c["cpu_weight"] for c in wire(hb)["containers"]] == [10_000, 1]
    body = wire(heartbeat(1))  # a 1.1 agent knows no weight: it sends none
    body["version"] = "1.1"
    body["containers"][0].pop("cpu_weight")
    assert decode(json.dumps(body), Heartbeat).containers[0].cpu_weight is None


@pytest.mark.parametrize("weight", [0, 10_001, -3])
def test_a_cpu_weight_outside_cgroup_v2s_range_is_refused(weight: int) -> None:
    hb = dataclasses.replace(heartbeat(1), containers=(report(0, cpu_weight=weight),))
    e = error_of(encode(hb), Heartbeat)
    assert e.path == "containers[0].cpu_weight" and "[1, 10000]" in str(e)


def test_container_status_carries_the_cpu_weight() -> None:
    st = Status(
        now=1.0,
        mode="default",
        policy_generation=1,
        containers=(
            ContainerStatus(
                id=ContainerId("a"), worker=WorkerId("w"), category=Category.PROGRESSING, cpu_weight=250
            ),
        ),
    )
    assert decode(encode(st), Status).containers[0].cpu_weight == 250
