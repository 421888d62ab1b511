"""The generic dataclass codec behind the policy file and the wire protocol."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Literal, NewType

import pytest

from specon.wire import codec
from specon.wire.codec import SchemaError, from_data, to_data

Name = NewType("Name", str)


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True)
class Inner:
    x: int
    y: float = 1.0


@dataclass(frozen=True)
class Outer:
    name: Name
    colour: Colour
    inner: Inner
    size: Literal["s", "m"] = "s"
    pair: tuple[float, Colour] = (0.0, Colour.RED)
    items: list[Inner] = field(default_factory=list)
    tags: dict[str, int] = field(default_factory=dict)
    note: str | None = None
    renamed: bool = field(default=False, metadata={"key": "isRenamed"})


@dataclass(frozen=True)
class Checked:
    n: int

    def __post_init__(self) -> None:
        if self.n < 0:
            raise ValueError("n must be >= 0")


def test_round_trip_of_every_supported_shape() -> None:
    value = Outer(
        name=Name("a"),
        colour=Colour.BLUE,
        inner=Inner(3, 2.5),
        size="m",
        pair=(1.5, Colour.BLUE),
        items=[Inner(1), Inner(2, 0.5)],
        tags={"k": 1},
        note="n",
        renamed=True,
    )
    data = to_data(value)
    assert data["isRenamed"] is True and "renamed" not in data
    assert data["pair"] == [1.5, "blue"]
    assert from_data(Outer, data) == value


def test_problems_carry_paths_and_all_are_collected() -> None:
    data = {
        "name": 1,
        "colour": "green",
        "inner": {"y": "big"},
        "pair": [1.0],
        "items": [{"x": 1}, {"x": "2"}],
        "tags": {"a": 1, "b": None},
        "extra": 0,
    }
    with pytest.raises(SchemaError) as info:
        from_data(Outer, data)
    paths = [codec.format_path(p.path) for p in info.value.problems]
    assert paths == ["name", "colour", "inner.x", "inner.y", "pair", "items[1].x", "tags.b", "extra"]
    assert not info.value.has_partial  # inner.x is required and missing


def test_partial_value_uses_defaults_for_bad_fields() -> None:
    with pytest.raises(SchemaError) as info:
        from_data(Inner, {"x": 1, "y": "no"})
    assert info.value.partial == Inner(1)


def test_post_init_refusal_is_a_problem() -> None:
    with pytest.raises(SchemaError, match="n must be >= 0"):
        from_data(Checked, {"n": -1})


def test_lenient_mode_ignores_unknown_keys() -> None:
    assert from_data(Inner, {"x": 1, "new": True}, strict=False) == Inner(1)
    with pytest.raises(SchemaError, match="unknown key"):
        from_data(Inner, {"x": 1, "new": True})


def test_unsupported_types_fail_when_compiled() -> None:
    with pytest.raises(TypeError, match=r"only 'X \| None'"):
        codec.decoder(int | str)
    with pytest.raises(TypeError, match="unsupported"):
        codec.decoder(set[int])


def test_format_path() -> None:
    assert codec.format_path(()) == "(top level)"
    assert codec.format_path(("a", 3, "b")) == "a[3].b"
    assert codec.format_path(("a", "not a name")) == "a['not a name']"


def test_describe_never_fails() -> None:
    assert codec.describe(10**5000) == "integer <huge>"
    assert codec.describe("x" * 100).endswith("...")
    assert codec.describe({"a": 1}) == "mapping"
    assert codec.describe(None) == "null"


def test_encoding_rejects_non_finite_with_path() -> None:
    with pytest.raises(SchemaError) as info:
        to_data(Outer(name=Name("a"), colour=Colour.RED, inner=Inner(1, float("nan"))))
    assert str(info.value.problems[0]) == "inner.y: must be a finite number, got nan"


def test_encoding_rejects_a_wrong_enum_value() -> None:
    bad = Outer(name=Name("a"), colour="purple", inner=Inner(1))  # type: ignore[arg-type]
    with pytest.raises(SchemaError, match="colour: not a Colour"):
        to_data(bad)
