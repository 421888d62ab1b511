"""The boundary checks: derived from the limits declared on the fields, the fast predicate and
the problem walk agree, and each rule says what it always said."""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specon.model import Category, ContainerId, Resources, WorkerId
from specon.wire import checks, protocol
from specon.wire.checks import check
from specon.wire.limits import ID, TIME, Items, Labels, Limit, Range, Taints, Text, limit, limit_of
from specon.wire.protocol import (
    Command,
    CommandBatch,
    CommandResult,
    ContainerReport,
    Goodbye,
    Heartbeat,
    Poll,
)
from specon.wire.status import Status, WorkerStatus
from tests.strategies import Leaves, from_type

# --- values at and just past every declared bound ------------------------------------------------


def declared() -> Iterator[Limit]:
    """Every limit on a field of a message or of a record a message holds."""
    seen: set[object] = set()
    todo: list[Any] = list(protocol.MESSAGE_TYPES)
    while todo:
        tp = todo.pop()
        if tp in seen:
            continue
        seen.add(tp)
        todo += typing.get_args(tp)
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            hints = typing.get_type_hints(tp)
            for f in dataclasses.fields(tp):
                todo.append(hints[f.name])
                if (rule := limit_of(tp, f)) is not None:
                    yield rule


RULES = list(declared())
BOUNDS = [x for r in RULES if isinstance(r, Range) for x in (r.lo, r.hi)]
FLOATS = sorted({y for x in BOUNDS for y in (x, math.nextafter(x, -math.inf), math.nextafter(x, math.inf))})
INTS = sorted({int(x) + d for x in BOUNDS for d in (-1, 0, 1)})
LENGTHS = sorted(
    {n + d for r in RULES if isinstance(r, Text | Taints) for n in [r.max_length] for d in (0, 1)}
)
LABELS = [r for r in RULES if isinstance(r, Labels)]
COUNTS = sorted(
    {r.max_count + d for r in [*LABELS, *(r for r in RULES if isinstance(r, Taints))] for d in (0, 1)}
)
IDS = st.sampled_from(["job-1", "job-2", "a" * 253, "a" * 254, "", ".", "..", "a b", "job-1\n", "-x"])
TEXTS = st.sampled_from(["", "a", "\n", "a\nb", "\x00"]) | st.sampled_from(LENGTHS).map(lambda n: "x" * n)
KEYS = st.sampled_from(["", "k", "\n"]) | st.sampled_from(
    [r.max_key + d for r in LABELS for d in (0, 1)]
).map(lambda n: "k" * n)
VALUES = st.sampled_from(["", "v"]) | st.sampled_from([r.max_value + d for r in LABELS for d in (0, 1)]).map(
    lambda n: "v" * n
)


def _many_texts(inner: st.SearchStrategy[Any], tp: Any) -> st.SearchStrategy[Any]:
    many = st.sampled_from(COUNTS).map(lambda n: tuple(f"t{i}" for i in range(n)))
    return st.lists(inner, max_size=3).map(tuple) | (many if tp is str else st.nothing())


# Values near and past the declared bounds (NaN and infinities too: a message built in
# Python may hold them).
LEAVES = Leaves(
    ids=lambda _tp: IDS,
    ints=st.sampled_from(INTS) | st.integers(-3, 3),
    floats=st.sampled_from([*FLOATS, math.nan, math.inf, -math.inf]) | st.floats(-2.0, 2.0),
    texts=TEXTS,
    anything=st.none(),
    tuples=_many_texts,
    mappings=lambda _inner: (
        st.dictionaries(KEYS, VALUES, max_size=3)
        | st.sampled_from(COUNTS).map(lambda n: {f"k{i}": "v" for i in range(n)})
    ),
)


def values(tp: Any) -> st.SearchStrategy[Any]:
    return from_type(tp, LEAVES)


@pytest.mark.slow
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(protocol.MESSAGE_TYPES).flatmap(values))
def test_the_fast_predicate_and_the_walk_agree(msg: Any) -> None:
    found = checks.problems(msg)
    assert checks.fit(msg) == (not found), found
    assert check(msg) == found


# --- what each rule says ------------------------------------------------------------------------


def report(i: int, **kw: Any) -> ContainerReport:
    return ContainerReport(id=ContainerId(f"job-{i}"), category=Category.PROGRESSING, **kw)


HB = Heartbeat(
    worker=WorkerId("w1"),
    address="10.0.0.1:7701",
    seq=7,
    sent_at=1000.5,
    capacity=Resources(cpu=8.0, memory=16 << 30),
    usage=0.4,
    containers=(report(0), report(1)),
    results=(CommandResult(command="c1", ok=True),),
    labels={"zone": "a"},
)


RULE = "use 1-253 of [A-Za-z0-9._-], starting alphanumeric"


def hb(**changes: Any) -> Heartbeat:
    return dataclasses.replace(HB, **changes)


def stop(**kw: Any) -> CommandBatch:
    cmd = Command(
        **{"id": "c", "action": protocol.Action.STOP, "container": ContainerId("j"), "deadline": 2.0, **kw}
    )
    return CommandBatch(manager_time=1.0, policy_generation=1, commands=(cmd,))


@pytest.mark.parametrize(
    ("msg", "want"),
    [
        (hb(worker=WorkerId("a b")), [("worker", f"invalid worker id 'a b': {RULE}")]),
        (hb(address="x" * 513), [("address", "longer than 512 characters (513)")]),
        (hb(seq=-1), [("seq", "must be within [0, 9.22337e+18], got -1")]),
        (hb(sent_at=1e10), [("sent_at", "must be a time within ±9e+09 s, got 10000000000.0")]),
        (hb(capacity=Resources(cpu=-1.0)), [("capacity.cpu", "must be within [0, 1e+06], got -1.0")]),
        (hb(usage=1.5), [("usage", "must be within [0, 1], got 1.5")]),
        (hb(containers=(report(0), report(0))), [("containers[1].id", "container job-0 reported twice")]),
        (hb(containers=(report(0, last_g=math.nan),)), [("containers[0].last_g", "must be finite")]),
        (
            hb(containers=(report(0, cpu_weight=0),)),
            [("containers[0].cpu_weight", "must be within [1, 10000], got 0")],
        ),
        (
            hb(containers=(report(0, requests=Resources(gpu=2_000_000)),)),
            [("containers[0].requests.gpu", "must be within [0, 1e+06], got 2000000")],
        ),
        (
            hb(containers=(report(0, job={"": "v"}),)),
            [("containers[0].job.''", "a label key must be 1-317 printable characters")],
        ),
        (
            hb(containers=(report(0, selector={"z": "v" * 1025}),)),
            [("containers[0].selector.z", "a label value must be at most 1024 characters")],
        ),
        (
            hb(containers=(report(0, tolerations=("a\nb",)),)),
            [("containers[0].tolerations[0]", "must be non-empty printable text")],
        ),
        (
            hb(containers=(report(0, tolerations=tuple("t" * 129)),)),
            [("containers[0].tolerations", "more than 128 tolerations (129)")],
        ),
        (
            hb(results=(CommandResult(command="c", ok=True),) * 1001),
            [("results", "more than 1000 results (1001)")],
        ),
        (
            hb(results=(CommandResult(command="c", ok=True, error="e" * 4097),)),
            [("results[0].error", "longer than 4096 characters (4097)")],
        ),
        (hb(labels={f"k{i}": "v" for i in range(129)}), [("labels", "more than 128 labels (129)")]),
        (hb(taints=("t" * 399,)), [("taints[0]", "longer than 398 characters (399)")]),
        (
            Poll(worker=WorkerId("w"), sent_at=1.0, wait=3601.0),
            [("wait", "must be within [0, 3600], got 3601.0")],
        ),
        (
            Goodbye(worker=WorkerId(".."), sent_at=math.inf),
            [
                ("worker", f"invalid worker id '..': {RULE}"),
                ("sent_at", "must be a time within ±9e+09 s, got inf"),
            ],
        ),
        (stop(target=WorkerId("a/b")), [("commands[0].target", f"invalid worker id 'a/b': {RULE}")]),
        (stop(id="c" * 513), [("commands[0].id", "longer than 512 characters (513)")]),
    ],
)
def test_each_rule_names_the_field_and_says_why(msg: Any, want: list[tuple[str, str]]) -> None:
    assert check(msg) == want
    assert not check(HB)


def test_a_long_list_of_bad_records_is_walked_only_so_far() -> None:
    bad = dataclasses.replace(HB, containers=tuple(report(i, step=-1) for i in range(100)))
    found = check(bad)
    assert 50 < len(found) < 100 and found[0][0] == "containers[0].step"


def test_a_borrowed_types_limits_hold_wherever_it_is_carried() -> None:
    """``Resources`` is specon.model's: its limits are declared once (``limits.BORROWED``) and
    hold in a heartbeat's capacity, a report's requests and a status's workers alike."""
    worker = WorkerStatus(WorkerId("w"), "a:1", True, True, 1.0, Resources(cpu=-1.0), 0.5)
    status = Status(now=1.0, mode="default", policy_generation=1, workers=(worker,))
    assert check(status) == [("workers[0].capacity.cpu", "must be within [0, 1e+06], got -1.0")]


# --- the declarations drive it, for any record --------------------------------------------------


@dataclass(frozen=True, slots=True)
class Part:
    name: ContainerId = field(metadata=limit(ID))
    size: int = field(default=0, metadata=limit(Range(0, 10)))


@dataclass(frozen=True, slots=True)
class Order:
    at: float = field(metadata=limit(TIME))
    note: str | None = field(default=None, metadata=limit(Text(3)))
    parts: tuple[Part, ...] = field(default=(), metadata=limit(Items(2, unique="name")))
    plain: int = 0  # no limit: never looked at


def test_any_record_with_declared_limits_is_checked_by_them() -> None:
    assert check(Order(at=1.0, note="abc", parts=(Part(ContainerId("a")), Part(ContainerId("b"), 10)))) == []
    parts = (Part(ContainerId("a"), 11), Part(ContainerId("a")), Part(ContainerId("c")))
    assert check(Order(at=math.nan, note="abcd", parts=parts)) == [
        ("at", "must be a time within ±9e+09 s, got nan"),
        ("note", "longer than 3 characters (4)"),
        ("parts", "more than 2 parts (3)"),
        ("parts[0].size", "must be within [0, 10], got 11"),
        ("parts[1].name", "container a reported twice"),
    ]


def test_a_record_without_limits_costs_nothing() -> None:
    assert check(protocol.ErrorReply(error="x" * 10_000)) == []
    assert checks.fit("not a record")


def test_unique_items_must_be_records() -> None:
    @dataclass(frozen=True)
    class Bad:
        tags: tuple[str, ...] = field(default=(), metadata=limit(Items(unique="name")))

    with pytest.raises(TypeError, match="unique items must be records"):
        check(Bad())
