"""Hypothesis strategies for values of a type hint: the one walk over dataclasses, ids, enums,
literals, optionals, tuples and mappings that the protocol, checks and OpenAPI tests share.
Each test says only what its leaves look like (``Leaves``)."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

Strategy = st.SearchStrategy[Any]


@dataclass(frozen=True)
class Leaves:
    """What each kind of leaf draws; the containers around them are ``from_type``'s."""

    ids: Callable[[Any], Strategy]  # a NewType id (its type given, for tests that tell them apart)
    ints: Strategy
    floats: Strategy
    texts: Strategy
    anything: Strategy  # a field typed ``object`` (free JSON)
    # A variable-length tuple of the element strategy (and of the element type).
    tuples: Callable[[Strategy, Any], Strategy] = lambda inner, _tp: st.lists(inner, max_size=3).map(tuple)
    # A mapping with values of the element strategy.
    mappings: Callable[[Strategy], Strategy] = lambda inner: st.dictionaries(
        st.text(max_size=6), inner, max_size=3
    )


def from_type(tp: Any, leaves: Leaves) -> Strategy:
    """Values of type hint ``tp`` with leaves from ``leaves``."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        hints = typing.get_type_hints(tp)
        fields = {f.name: from_type(hints[f.name], leaves) for f in dataclasses.fields(tp) if f.init}
        return st.builds(tp, **fields)
    if getattr(tp, "__supertype__", None) is not None:
        return leaves.ids(tp)
    if tp is bool:
        return st.booleans()
    if tp is int:
        return leaves.ints
    if tp is float:
        return leaves.floats
    if tp is str:
        return leaves.texts
    if tp is object:
        return leaves.anything
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from(list(tp))
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in args if a is not type(None)]
        return st.none() | from_type(inner, leaves)
    if origin is tuple and args[1:] == (Ellipsis,):
        return leaves.tuples(from_type(args[0], leaves), args[0])
    if origin is tuple:
        return st.tuples(*(from_type(a, leaves) for a in args))
    if origin is dict:
        return leaves.mappings(from_type(args[1], leaves))
    raise TypeError(f"no strategy for {tp!r}")
