"""The happy path of ``protocol.decode``: msgspec, falling back to the codec on anything unusual.

The codec (``specon.wire.codec``) lists every problem with its path, which is what a sender
needs, but costs about ten times what msgspec does on a well-formed message. So a message is
first decoded by msgspec into a *mirror* of its dataclass (a ``msgspec.Struct`` per dataclass,
built from the same type hints, unknown keys forbidden) and then converted, in C, to the
dataclass itself (so ``__post_init__`` checks run as before). Whenever msgspec refuses the
body, for whatever reason, ``decode`` returns None and the codec decodes it again: every
error message, path and lenient case (a newer minor version's extra fields) stays the codec's.

The fast path is only ever stricter than the codec, never more lenient: JSON syntax, UTF-8,
``NaN``/``Infinity`` tokens, numbers that overflow, lone UTF-16 surrogate escapes, a bool
or a float where an int is due and unknown keys are all refused by msgspec too. What it accepts it turns
into the same value the codec would (``tests/unit/wire/test_fastpath.py`` proves both on
valid messages and the fuzz corpus). The envelope (``version``, ``kind``) is decoded as two
more fields and must name this exact protocol version and the expected kind; anything else
goes to the codec, which explains it.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from typing import Any, TypeVar, cast

import msgspec

T = TypeVar("T")


def decode(data: bytes | bytearray | str, cls: type[T], version: str) -> T | None:
    """``data`` as a ``cls`` message of protocol ``version`` exactly, or None: take the codec's path.

    The caller still runs the declared limits (``specon.wire.checks``) on the result.
    """
    try:
        envelope: Any = msgspec.json.decode(data, type=_envelope(cast(Any, cls)))
        if envelope.version != version or envelope.kind != cls.__name__:
            return None
        return msgspec.convert(envelope, cls, from_attributes=True)
    except (msgspec.MsgspecError, ValueError, TypeError, RecursionError):
        return None


@functools.cache
def _envelope(cls: type[Any]) -> type[msgspec.Struct]:
    """The mirror of message ``cls`` with the envelope's two keys as fields of its own."""
    extra = [("version", str), ("kind", str)]
    return _struct(cls, tuple(extra), f"{cls.__name__}Envelope")


@functools.cache
def _mirror(cls: type[Any]) -> type[msgspec.Struct]:
    return _struct(cls, (), cls.__name__)


def _struct(cls: type[Any], extra: tuple[tuple[str, Any], ...], name: str) -> type[msgspec.Struct]:
    hints = typing.get_type_hints(cls)
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = list(extra)
    rename: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = _mirrored(hints[f.name])
        key = str(f.metadata.get("key", f.name))
        if key != f.name:
            rename[f.name] = key
        if f.default is not dataclasses.MISSING:
            fields.append((f.name, tp, f.default))
        elif f.default_factory is not dataclasses.MISSING:
            fields.append((f.name, tp, msgspec.field(default_factory=f.default_factory)))
        else:
            fields.append((f.name, tp))
    # Required fields first, as a Python signature needs; msgspec matches by key anyway.
    fields.sort(key=lambda spec: len(spec) == 3)
    return msgspec.defstruct(
        name, fields, forbid_unknown_fields=True, rename=rename or None, frozen=True, kw_only=True
    )


# Generic aliases subscripted with types built at run time (which a type checker cannot see).
_UNION: Any = typing.Union
_TUPLE: Any = tuple
_LIST: Any = list
_DICT: Any = dict


def _mirrored(tp: Any) -> Any:
    """``tp`` with every dataclass in it replaced by its mirror (``object`` is any JSON value)."""
    if tp is object:
        return Any
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _mirror(tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return _UNION[tuple(_mirrored(a) for a in args)]
    if origin is tuple:
        return _TUPLE[tuple(a if a is Ellipsis else _mirrored(a) for a in args)]
    if origin is list:
        return _LIST[_mirrored(args[0])]
    if origin is dict:
        return _DICT[args[0], _mirrored(args[1])]
    return tp  # bool, int, float, str, Literal, NewType
