"""The schemas of the manager's OpenAPI document (``specon_manager.openapi``), walked from
``specon.wire.protocol``'s type hints.

Nothing here names a message field or states a protocol limit: every schema is walked from
the protocol dataclasses' type hints (the same hints ``specon.wire.codec`` decodes with), its
description from the class docstring and the comments beside each field. What the types
cannot say is the limit each field declares (``specon.wire.limits``, the same declarations
``specon.wire.checks`` enforces), translated to schema keywords by ``_keywords``; the id rule
is ``specon.wire.validate``'s own expression. Only what the manager adds beyond the protocol
(its policy's bounds, its own behaviour) is attached by hand, in ``_RULES`` and ``_NOTES``
(checked at build time: one for a field that no longer exists is an error).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import re
import textwrap
import types
import typing
from typing import Any

from specon.config import MessagingConfig
from specon.wire import codec, protocol
from specon.wire.limits import Finite, Id, Items, Labels, Limit, Range, Taints, Text, limit_of
from specon.wire.protocol import CommandBatch, ErrorReply, Goodbye, Heartbeat, Poll, ReallocationRequest
from specon.wire.status import Status
from specon.wire.validate import ID_REGEX, ID_RULE, MAX_ID_LENGTH

SCHEMA_REF = "#/components/schemas/"

# The one id rule (specon.wire.validate) as an ECMA-262 pattern: matched in full, so neither a
# trailing newline nor a path separator passes; "." and ".." cannot start alphanumeric.
ID_PATTERN = f"^{ID_REGEX}$"
ID_SCHEMA: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_ID_LENGTH,
    "pattern": ID_PATTERN,
    "description": f"{ID_RULE} (specon.wire.validate).",
}
# NewType ids that follow the id rule, by their name.
ID_TYPES = ("WorkerId", "ContainerId")
# A label key, a taint or a toleration: printable text (``str.isprintable``, the checks'
# rule), stated as "no character of this class" (``not`` ``pattern``, which needs no anchors).
PRINTABLE_TEXT = "PrintableText"

# Messages that travel on their own, in the envelope {"version", "kind", ...fields}.
ENVELOPED: tuple[type[Any], ...] = (
    Heartbeat,
    ReallocationRequest,
    Poll,
    Goodbye,
    CommandBatch,
    ErrorReply,
    Status,
)

# --- what the manager adds beyond the protocol's own limits --------------------------------

_MAX_CONTAINERS = MessagingConfig().max_containers_per_heartbeat

# Schema keywords for bounds the manager enforces from its policy (``specon_manager.app``).
_RULES: dict[tuple[type[Any], str], dict[str, Any]] = {
    (Heartbeat, "containers"): {"maxItems": _MAX_CONTAINERS},
}
# What the schema keywords cannot say, added to the field's description (clauses, joined with
# the limits' own by "; ").
_NOTES: dict[tuple[type[Any], str], str] = {
    (Heartbeat, "seq"): "The manager refuses a seq implausibly far ahead of its own clock in µs",
    (Heartbeat, "containers"): "at most the policy's "
    f"messaging.max_containers_per_heartbeat (default {_MAX_CONTAINERS})",
    (Poll, "wait"): "The manager waits at most 60 s, whatever is asked",
}


def _keywords(cls: type[Any], name: str, rule: Limit, tp: Any) -> tuple[dict[str, Any], list[str]]:
    """The schema keywords of a field's declared limit, and the clauses no keyword can say."""
    match rule:
        case Id():
            inner = _non_null(tp)
            if getattr(inner, "__supertype__", None) is None or inner.__name__ not in ID_TYPES:
                raise TypeError(f"openapi: {cls.__name__}.{name} has the id rule but not an id type")
            return {}, []  # the id type's own schema states it
        case Range(lo, hi):
            return {"minimum": lo, "maximum": hi}, []
        case Finite():
            return {}, []  # every JSON number is finite
        case Text(n):
            return {"maxLength": n}, []
        case Labels(count, key, value):
            return {
                "maxProperties": count,
                "propertyNames": {**ref(PRINTABLE_TEXT), "minLength": 1, "maxLength": key},
                "additionalProperties": {"type": "string", "maxLength": value},
            }, []
        case Taints(count, length):
            return {
                "maxItems": count,
                "items": {**ref(PRINTABLE_TEXT), "minLength": 1, "maxLength": length},
            }, []
        case Items(max_items, unique):
            keywords = {} if max_items is None else {"maxItems": max_items}
            return keywords, [] if unique is None else [f"Each {unique} at most once"]
    typing.assert_never(rule)


def printable_text_schema() -> dict[str, Any]:
    """``PrintableText``: no character ``str.isprintable`` refuses within the Basic Multilingual
    Plane, written with ``\\uXXXX`` escapes (the same class in ECMA-262 and Python's ``re``).
    Surrogates are left out of the class: an ECMA-262 pattern without the ``u`` flag sees a
    character past the BMP as two of them. Such a character is refused when it is not
    printable (a tag, a private-use or an unassigned code point): the description says so."""
    return {
        "type": "string",
        "not": {"pattern": _non_printable_class()},
        "description": "Printable text (Python's str.isprintable): no control, format, private-use, "
        "unassigned or surrogate character and no separator but the space. The pattern states it for "
        "the Basic Multilingual Plane; a character beyond it that is not printable is refused too.",
    }


@functools.cache
def _non_printable_class() -> str:
    ranges: list[str] = []
    start = None
    for code in range(0x10000 + 1):
        refused = code < 0x10000 and not chr(code).isprintable() and not 0xD800 <= code <= 0xDFFF
        if refused and start is None:
            start = code
        elif not refused and start is not None:
            ranges.append(f"\\u{start:04x}" if start == code - 1 else f"\\u{start:04x}-\\u{code - 1:04x}")
            start = None
    return f"[{''.join(ranges)}]"


def _non_null(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return inner
    return tp


# --- walking the type hints -------------------------------------------------------------


def ref(name: str) -> dict[str, Any]:
    return {"$ref": SCHEMA_REF + name}


def _docstring(cls: type[Any]) -> str | None:
    doc = cls.__doc__
    # A dataclass without a docstring gets its signature as one: not a description.
    if not doc or doc.startswith(f"{cls.__name__}("):
        return None
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())


_FIELD_LINE = re.compile(r"^(\w+)\s*:[^#]*?(?:\s#\s?(.*))?$")


def field_comments(cls: type[Any]) -> dict[str, str]:
    """The comments written beside (after) or just above each field of ``cls``."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source (frozen, zipped): descriptions from docstrings only
        return {}
    out: dict[str, str] = {}
    above: list[str] = []
    for line in source.splitlines()[1:]:
        if not line.startswith("    ") or line.startswith("     "):
            above = [] if line.strip() else above
            continue
        body = line.strip()
        if body.startswith(("def ", "@")):
            break
        if body.startswith("#"):
            above.append(body.lstrip("#").strip())
            continue
        match = _FIELD_LINE.match(body)
        if match is not None:
            text = [*above, match[2] or ""]
            joined = " ".join(t for t in text if t)
            if joined:
                out[match[1]] = joined
        above = []
    return out


class SchemaBuilder:
    """Schemas of the protocol's types, collected as they are asked for (``schemas``)."""

    def __init__(self) -> None:
        self.schemas: dict[str, dict[str, Any]] = {}
        self.used_rules: set[tuple[type[Any], str]] = set()
        self._nested: set[str] = set()

    def unused_rules(self) -> list[str]:
        """The fields of ``_RULES`` and ``_NOTES`` no schema built so far has (a stale rule)."""
        unused = (set(_RULES) | set(_NOTES)) - self.used_rules
        return sorted(f"{cls.__name__}.{name}" for cls, name in unused)

    def message(self, cls: type[Any]) -> dict[str, Any]:
        """A ``$ref`` to ``cls`` as a message on its own (with the envelope)."""
        self._dataclass(cls, envelope=True)
        return ref(cls.__name__)

    def of(self, tp: Any) -> dict[str, Any]:
        """The schema of values of type hint ``tp``."""
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            self._dataclass(tp, envelope=False)
            return ref(tp.__name__)
        supertype = getattr(tp, "__supertype__", None)
        if supertype is not None:  # a NewType
            name = tp.__name__
            if name in ID_TYPES:
                self.schemas.setdefault(name, {"title": name, **ID_SCHEMA})
                return ref(name)
            return self.of(supertype)
        if tp is bool:
            return {"type": "boolean"}
        if tp is int:
            return {"type": "integer"}
        if tp is float:
            return {"type": "number"}
        if tp is str:
            return {"type": "string"}
        if tp is object or tp is Any:
            return {"description": "Any JSON value (finite numbers only)."}
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return self._enum(tp)
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is typing.Literal:
            return {"type": _json_type(args[0]), "enum": list(args)}
        if origin in (typing.Union, types.UnionType):
            rest = [a for a in args if a is not type(None)]
            if len(rest) != 1 or len(args) != 2:
                raise TypeError(f"openapi: only 'X | None' unions are supported, not {tp!r}")
            return _nullable(self.of(rest[0]))
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": self.of(args[0])}
        if origin is tuple:
            items = [self.of(a) for a in args]
            return {
                "type": "array",
                "prefixItems": items,
                "items": False,
                "minItems": len(items),
                "maxItems": len(items),
            }
        if origin is list:
            return {"type": "array", "items": self.of(args[0])}
        if origin is dict and args and args[0] is str:
            return {"type": "object", "additionalProperties": self.of(args[1])}
        raise TypeError(f"openapi: unsupported type {tp!r}")

    def _enum(self, cls: type[enum.Enum]) -> dict[str, Any]:
        values = [m.value for m in cls]
        schema: dict[str, Any] = {"title": cls.__name__, "type": _json_type(values[0]), "enum": values}
        if (doc := _docstring(cls)) is not None:
            schema["description"] = doc
        self.schemas.setdefault(cls.__name__, schema)
        return ref(cls.__name__)

    def _dataclass(self, cls: type[Any], *, envelope: bool) -> None:
        name = cls.__name__
        if envelope != (cls in ENVELOPED):
            raise TypeError(f"openapi: {name} is {'not ' if envelope else ''}a message on its own")
        if name in self.schemas:
            return
        placeholder: dict[str, Any] = {}
        self.schemas[name] = placeholder  # recursion guard, filled in below
        hints = typing.get_type_hints(cls)
        comments = field_comments(cls)
        properties: dict[str, Any] = {}
        required: list[str] = []
        if envelope:
            properties["version"] = {
                "type": "string",
                "pattern": rf"^{protocol.MAJOR}\.[0-9]{{1,6}}$",
                "examples": [protocol.VERSION],
                "description": f"MAJOR.MINOR; this manager speaks {protocol.VERSION}. A higher minor "
                "version's unknown fields are ignored; at this minor version or below they are refused.",
            }
            properties["kind"] = {"type": "string", "const": name}
            required += ["version", "kind"]
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            key = codec.wire_key(f)
            schema = self.of(hints[f.name])
            description = comments.get(f.name)
            rule = limit_of(cls, f)
            keywords, notes = ({}, []) if rule is None else _keywords(cls, f.name, rule, hints[f.name])
            if isinstance(rule, Labels | Taints):
                self.schemas.setdefault(PRINTABLE_TEXT, printable_text_schema())
            if (extra := _RULES.get((cls, f.name))) is not None:
                self.used_rules.add((cls, f.name))
                keywords = {**keywords, **extra}
            if (note := _NOTES.get((cls, f.name))) is not None:
                self.used_rules.add((cls, f.name))
                notes = [*notes, note]
            if keywords:
                schema = _constrain(schema, keywords)
            if notes:
                text = "; ".join(notes) + "."
                description = f"{description} {text}" if description else text
            value = _default(f)
            if value is dataclasses.MISSING:
                required.append(key)
            else:
                schema = {**schema, "default": codec.encoder(hints[f.name])(value)}
            if description:
                schema = {**schema, "description": description}
            properties[key] = schema
        placeholder.update({"title": name, "type": "object"})
        if (doc := _docstring(cls)) is not None:
            placeholder["description"] = doc
        placeholder["properties"] = properties
        if required:
            placeholder["required"] = required
        placeholder["additionalProperties"] = False


def _default(f: dataclasses.Field[Any]) -> Any:
    """The field's default value (made by its factory), or ``dataclasses.MISSING``."""
    if f.default is not dataclasses.MISSING:
        return f.default
    factory = f.default_factory
    return factory() if callable(factory) else dataclasses.MISSING


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    raise TypeError(f"openapi: no JSON type for {value!r}")


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in schema or "enum" in schema or not isinstance(schema.get("type"), str):
        return {"anyOf": [schema, {"type": "null"}]}
    return {**schema, "type": [schema["type"], "null"]}


def _constrain(schema: dict[str, Any], rule: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with the keywords of ``rule``, inside the non-null branch of a nullable."""
    if "anyOf" in schema:
        inner, null = schema["anyOf"]
        return {**schema, "anyOf": [_constrain(inner, rule), null]}
    if "$ref" in schema:
        return {"allOf": [schema], **rule}
    return {**schema, **rule}
