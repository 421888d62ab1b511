"""Plain data (parsed JSON or YAML) <-> frozen dataclasses, driven by the type hints.

The policy file (``specon.config``) and the wire protocol (``specon.wire.protocol``) both
describe their shapes only as dataclasses; this one codec checks and converts any of
them, so a new field needs a type hint and nothing else.

Supported hints: dataclasses, ``Literal[...]``, ``enum.Enum`` subclasses (by value),
``NewType`` ids, ``bool``, ``int`` (a bool is not an int here), ``float`` (ints
accepted, non-finite values rejected), ``str``, ``X | None``, ``tuple[X, ...]``,
fixed ``tuple[X, Y]``, ``list[X]``, ``dict[str, X]`` and ``object`` (any JSON value).
A field's key on the wire is its name unless ``field(metadata={"key": ...})`` says
otherwise. A key may be left out when the field has a default.

Every problem is collected, not just the first, each with the path of the offending
value (``containers[3].category``). Converters are compiled once per type and raise
nothing on the happy path but the result, so decoding stays cheap: the path is only
built when something is wrong.

Records that go through here: the policy file, the protocol's messages, the monitor
state an agent carries across a restore, the job spec and owner record on the volume,
simulator parameters, and the SQLite journal's rows.

Why this codec and msgspec both (measured by ``python -m bench bench_codec``, a realistic
8-container heartbeat): msgspec decodes it about 10x faster but stops at the first problem;
pydantic v2 lists every problem in strict mode but coerces ``"12"`` to ``12`` unless strict,
has no did-you-mean for a misspelt key and no partial result (the policy file's checks run
on one to report everything at once). So the protocol's messages take msgspec on the happy
path (``specon.wire.fastpath``) and this codec only when msgspec refuses a body, for its
messages; everything else (the policy file, journal rows, ...) is decoded here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import enum
import functools
import json
import math
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

T = TypeVar("T")
PathPart = str | int
Converter = Callable[[Any], Any]

# Marks "no usable value" in a SchemaError: the caller cannot build a partial result.
_NOTHING: Any = object()


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with the input, at ``path`` (keys and list indices from the top)."""

    path: tuple[PathPart, ...]
    message: str

    def __str__(self) -> str:
        return f"{format_path(self.path)}: {self.message}"


class SchemaError(ValueError):
    """The input does not fit the type; ``problems`` lists every mismatch found.

    ``partial`` is the best-effort value with defaults where the input was wrong (for
    a dataclass whose every bad field has a default), so callers can run further
    checks and still report everything at once; it is ``None`` when there is none.
    """

    def __init__(self, problems: Sequence[Problem], partial: Any = _NOTHING) -> None:
        super().__init__("; ".join(str(p) for p in problems))
        self.problems = tuple(problems)
        self._partial = partial

    @property
    def has_partial(self) -> bool:
        return self._partial is not _NOTHING

    @property
    def partial(self) -> Any:
        return None if self._partial is _NOTHING else self._partial

    def under(self, part: PathPart) -> list[Problem]:
        return [Problem((part, *p.path), p.message) for p in self.problems]


def explain(error: SchemaError) -> str:
    """Every problem of ``error`` on one line; one about the whole value (a ``__post_init__``
    check) is its bare message, without ``(top level):``."""
    return "; ".join(str(p) if p.path else p.message for p in error.problems)


def _fail(message: str) -> SchemaError:
    return SchemaError([Problem((), message)])


def format_path(path: Sequence[PathPart]) -> str:
    """``("containers", 3, "category")`` -> ``containers[3].category``; ``()`` -> ``(top level)``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out or "(top level)"


def describe(value: object) -> str:
    """A short, always-printable description of an input value for error messages."""
    kind = {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        dict: "mapping",
        list: "list",
        type(None): "null",
    }.get(type(value), type(value).__name__)
    if value is None:
        return "null"
    if isinstance(value, dict | list | tuple):
        return kind
    try:
        text = repr(value)
    except ValueError:  # an int too long to print (sys.set_int_max_str_digits)
        text = "<huge>"
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{kind} {text}"


def suggest(word: object, choices: Sequence[str]) -> str:
    """``"; did you mean 'x'?"`` for a near miss, else ``""``."""
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, choices, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def from_data(tp: type[T], data: object, *, strict: bool = True) -> T:
    """Convert ``data`` to ``tp``; ``SchemaError`` lists every problem.

    ``strict``: unknown mapping keys are problems (with a did-you-mean); when false
    they are ignored, for newer peers that may add fields.
    """
    return cast(T, decoder(cast(Any, tp), strict)(data))


def to_data(value: object, tp: object | None = None) -> Any:
    """The plain-data form of ``value`` (of type ``tp``, default its own class).

    Raises ``SchemaError`` for values plain data cannot hold (non-finite floats).
    """
    return encoder(type(value) if tp is None else tp)(value)


def dumps(value: object, tp: object | None = None) -> bytes:
    """``value`` as compact UTF-8 JSON (plain JSON: no protocol envelope)."""
    return json.dumps(to_data(value, tp), separators=(",", ":")).encode()


def loads(tp: type[T], body: bytes | str, *, strict: bool = True) -> T:
    """``body``, JSON, as ``tp``; ``ValueError`` saying what is wrong (not JSON, or every
    problem ``from_data`` finds)."""
    try:
        return from_data(tp, json.loads(body), strict=strict)
    except SchemaError as exc:
        raise ValueError(explain(exc)) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None


# --- decoders -------------------------------------------------------------------------


@functools.cache
def decoder(tp: Any, strict: bool = True) -> Converter:
    """The compiled converter for ``tp`` (cached; types must not refer to themselves)."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _dataclass_decoder(tp, strict)
    supertype = getattr(tp, "__supertype__", None)
    if supertype is not None:  # NewType: checked as its base type
        return decoder(supertype, strict)
    if tp is bool:
        return _decode_bool
    if tp is int:
        return _decode_int
    if tp is float:
        return _decode_float
    if tp is str:
        return _decode_str
    if tp is object or tp is Any:
        return _decode_json
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum_decoder(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return _literal_decoder(args)
    if origin in (typing.Union, types.UnionType):
        return _optional_decoder(decoder(_optional_arg(tp, args), strict))
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _sequence_decoder(decoder(args[0], strict), tuple)
    if origin is tuple:
        return _fixed_tuple_decoder(tuple(decoder(a, strict) for a in args))
    if origin is list:
        return _sequence_decoder(decoder(args[0], strict), list)
    if origin is dict and args and args[0] is str:
        return _dict_decoder(decoder(args[1], strict))
    raise TypeError(f"codec: unsupported type {tp!r}")


def _optional_arg(tp: object, args: tuple[Any, ...]) -> Any:
    rest = [a for a in args if a is not type(None)]
    if len(rest) != 1 or len(args) != 2:
        raise TypeError(f"codec: only 'X | None' unions are supported, not {tp!r}")
    return rest[0]


def _decode_bool(v: object) -> bool:
    if type(v) is bool:
        return v
    raise _fail(f"expected true or false, got {describe(v)}")


def _decode_int(v: object) -> int:
    if type(v) is int:
        return v
    raise _fail(f"expected an integer, got {describe(v)}")


def _decode_float(v: object) -> float:
    if type(v) is float:
        if math.isfinite(v):
            return v
    elif type(v) is int:
        try:
            return float(v)
        except OverflowError:
            raise _fail("number is too large") from None
    else:
        raise _fail(f"expected a number, got {describe(v)}")
    raise _fail(f"must be a finite number, got {v!r}")


def _decode_str(v: object) -> str:
    if isinstance(v, str):
        return v
    raise _fail(f"expected a string, got {describe(v)}")


def _decode_json(v: object) -> object:
    _check_json(v)
    return v


def _check_json(v: object) -> None:
    """Plain JSON only: null, booleans, ints, finite floats, strings, lists, string-keyed maps."""
    if v is None or isinstance(v, bool | int | str):
        return
    if isinstance(v, float):
        if not math.isfinite(v):
            raise _fail(f"must be a finite number, got {v!r}")
        return
    if isinstance(v, list | tuple):
        for i, item in enumerate(v):
            try:
                _check_json(item)
            except SchemaError as e:
                raise SchemaError(e.under(i)) from None
        return
    if isinstance(v, dict):
        for key, item in v.items():
            if not isinstance(key, str):
                raise _fail(f"keys must be strings, got {describe(key)}")
            try:
                _check_json(item)
            except SchemaError as e:
                raise SchemaError(e.under(key)) from None
        return
    raise _fail(f"expected a JSON value, got {describe(v)}")


def _enum_decoder(cls: type[enum.Enum]) -> Converter:
    table = {m.value: m for m in cls}
    names = [str(m.value) for m in cls]

    def decode(v: object) -> enum.Enum:
        try:
            member = table[v]
        except (KeyError, TypeError):
            pass
        else:
            if type(v) is type(member.value) or v is member:
                return member
        raise _fail(f"must be one of {', '.join(map(repr, names))}; got {describe(v)}{suggest(v, names)}")

    return decode


def _literal_decoder(allowed: tuple[object, ...]) -> Converter:
    names = [str(a) for a in allowed]
    shown = repr(allowed[0]) if len(allowed) == 1 else "one of " + ", ".join(map(repr, allowed))

    def decode(v: object) -> object:
        for a in allowed:
            if type(v) is type(a) and v == a:
                return a
        raise _fail(f"must be {shown}; got {describe(v)}{suggest(v, names)}")

    return decode


def _optional_decoder(inner: Converter) -> Converter:
    def decode(v: object) -> object:
        return None if v is None else inner(v)

    return decode


def _sequence_decoder(item: Converter, build: Callable[[list[Any]], Any]) -> Converter:
    def decode(v: object) -> object:
        if not isinstance(v, list | tuple):
            raise _fail(f"expected a list, got {describe(v)}")
        out: list[Any] = []
        problems: list[Problem] = []
        for i, x in enumerate(v):
            try:
                out.append(item(x))
            except SchemaError as e:
                problems += e.under(i)
        if problems:
            raise SchemaError(problems)
        return build(out)

    return decode


def _fixed_tuple_decoder(items: tuple[Converter, ...]) -> Converter:
    def decode(v: object) -> tuple[Any, ...]:
        if not isinstance(v, list | tuple) or len(v) != len(items):
            raise _fail(f"expected a list of {len(items)} items, got {describe(v)}")
        out: list[Any] = []
        problems: list[Problem] = []
        for i, (conv, x) in enumerate(zip(items, v, strict=True)):
            try:
                out.append(conv(x))
            except SchemaError as e:
                problems += e.under(i)
        if problems:
            raise SchemaError(problems)
        return tuple(out)

    return decode


def _dict_decoder(value: Converter) -> Converter:
    def decode(v: object) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise _fail(f"expected a mapping, got {describe(v)}")
        out: dict[str, Any] = {}
        problems: list[Problem] = []
        for key, x in v.items():
            if not isinstance(key, str):
                problems.append(Problem((), f"keys must be strings, got {describe(key)}"))
                continue
            try:
                out[key] = value(x)
            except SchemaError as e:
                problems += e.under(key)
        if problems:
            raise SchemaError(problems)
        return out

    return decode


def wire_key(f: dataclasses.Field[Any]) -> str:
    return str(f.metadata.get("key", f.name))


def _dataclass_decoder(cls: type[Any], strict: bool) -> Converter:
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    # (key on the wire, attribute name, converter, whether the key may be left out)
    specs = [
        (
            wire_key(f),
            f.name,
            decoder(hints[f.name], strict),
            f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING,
        )
        for f in fields
        if f.init
    ]
    known = [key for key, *_ in specs]
    known_set = frozenset(known)

    def decode(v: object) -> object:
        if not isinstance(v, dict):
            raise _fail(f"expected a mapping, got {describe(v)}")
        kwargs: dict[str, Any] = {}
        problems: list[Problem] = []
        complete = True  # every field has a value or a default: a partial can be built
        found = 0
        for key, name, conv, optional in specs:
            if key in v:
                found += 1
                try:
                    kwargs[name] = conv(v[key])
                except SchemaError as e:
                    problems += e.under(key)
                    if e.has_partial:
                        kwargs[name] = e.partial
                    elif not optional:
                        complete = False
            elif not optional:
                problems.append(Problem((key,), "missing"))
                complete = False
        if strict and found != len(v):
            for key in v:
                if key not in known_set:
                    if isinstance(key, str):
                        hint = suggest(key, known) or f" (known: {', '.join(known)})"
                        problems.append(Problem((key,), f"unknown key{hint}"))
                    else:
                        problems.append(Problem((), f"keys must be strings, got {describe(key)}"))
        if problems:
            partial = _NOTHING
            if complete:
                with contextlib.suppress(SchemaError):
                    partial = _build(cls, kwargs)
            raise SchemaError(problems, partial)
        return _build(cls, kwargs)

    return decode


def _build(cls: type[Any], kwargs: dict[str, Any]) -> Any:
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:  # a __post_init__ check refused the values
        raise _fail(str(e)) from None


# --- encoders -------------------------------------------------------------------------


@functools.cache
def encoder(tp: Any) -> Converter:
    """The compiled plain-data encoder for values of type ``tp`` (cached)."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _dataclass_encoder(tp)
    supertype = getattr(tp, "__supertype__", None)
    if supertype is not None:
        return encoder(supertype)
    if tp in (bool, int, str):
        return _identity
    if tp is float:
        return _encode_float
    if tp is object or tp is Any:
        return _decode_json  # checks it is plain JSON, returns it unchanged
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum_encoder(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return _identity
    if origin in (typing.Union, types.UnionType):
        inner = encoder(_optional_arg(tp, args))
        return lambda v: None if v is None else inner(v)
    if origin in (tuple, list):
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return _fixed_tuple_encoder(tuple(encoder(a) for a in args))
        return _sequence_encoder(encoder(args[0]))
    if origin is dict and args and args[0] is str:
        return _dict_encoder(encoder(args[1]))
    raise TypeError(f"codec: unsupported type {tp!r}")


def _identity(v: object) -> object:
    return v


def _encode_float(v: object) -> object:
    if isinstance(v, float) and not math.isfinite(v):
        raise _fail(f"must be a finite number, got {v!r}")
    return v


def _enum_encoder(cls: type[enum.Enum]) -> Converter:
    def encode(v: object) -> object:
        if type(v) is cls:  # the usual case, without the lookup cls(v) does
            return v.value
        try:
            return cls(v).value
        except (ValueError, TypeError):
            raise _fail(f"not a {cls.__name__}: {describe(v)}") from None

    return encode


def _sequence_encoder(item: Converter) -> Converter:
    if item is _identity:
        return list

    def encode(v: Sequence[Any]) -> list[Any]:
        out = []
        for i, x in enumerate(v):
            try:
                out.append(item(x))
            except SchemaError as e:
                raise SchemaError(e.under(i)) from None
        return out

    return encode


def _fixed_tuple_encoder(items: tuple[Converter, ...]) -> Converter:
    def encode(v: Sequence[Any]) -> list[Any]:
        out = []
        for i, (conv, x) in enumerate(zip(items, v, strict=True)):
            try:
                out.append(conv(x))
            except SchemaError as e:
                raise SchemaError(e.under(i)) from None
        return out

    return encode


def _dict_encoder(value: Converter) -> Converter:
    if value is _identity:
        return dict

    def encode(v: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for key, x in v.items():
            try:
                out[key] = value(x)
            except SchemaError as e:
                raise SchemaError(e.under(key)) from None
        return out

    return encode


def _dataclass_encoder(cls: type[Any]) -> Converter:
    hints = typing.get_type_hints(cls)
    # (key, attribute, converter or None when the value is already plain), in field order
    specs = [
        (wire_key(f), f.name, None if (enc := encoder(hints[f.name])) is _identity else enc)
        for f in dataclasses.fields(cls)
    ]

    def encode(v: object) -> dict[str, Any]:
        out = {}
        for key, name, enc in specs:
            x = getattr(v, name)
            if enc is None:
                out[key] = x
                continue
            try:
                out[key] = enc(x)
            except SchemaError as e:
                raise SchemaError(e.under(key)) from None
        return out

    return encode
