"""Range and identity checks at the protocol boundary, beyond what the types say.

The codec checks shapes (a float is a finite number, an id is a string); these rules check
meaning, once, for every message decoded. None is written here: each is the limit a field
declares (``specon.wire.limits``), applied to that field wherever the message or a record it
carries holds it. ``check`` returns every problem as ``(path, why)``; an empty list means the
message is fit to act on.

Every heartbeat passes here, so each record class is compiled twice from its declarations:
``ok``, one generated boolean expression that builds no string (the hot path, as fast as
one written by hand), and ``walk``, which names every problem with its path and runs only
when ``ok`` is false. ``tests/unit/wire/test_checks.py`` holds the two to agree.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specon.wire.limits import Finite, Id, Items, Labels, Limit, Range, Taints, Text, limit_of
from specon.wire.validate import is_valid_id, valid_id

Problems = list[tuple[str, str]]
# Problems after which the rest of a list of records is not walked.
_ENOUGH = 50


def check(msg: object) -> Problems:
    """Every meaning problem in ``msg`` (a decoded protocol message)."""
    cls: Any = type(msg)
    compiled = _compiled(cls)
    if compiled is None or compiled.ok(msg):
        return []
    out: Problems = []
    compiled.walk(out, "", msg)
    return out


def fit(msg: object) -> bool:
    """The fast predicate alone: True when ``msg`` has no problem."""
    cls: Any = type(msg)
    compiled = _compiled(cls)
    return compiled is None or compiled.ok(msg)


def problems(msg: object) -> Problems:
    """The walk alone, whatever the predicate says (``check`` runs it only on a misfit)."""
    cls: Any = type(msg)
    compiled = _compiled(cls)
    out: Problems = []
    if compiled is not None:
        compiled.walk(out, "", msg)
    return out


@dataclass(frozen=True, slots=True)
class _Field:
    """A field that has a limit, holds records that have some, or both."""

    name: str
    rule: Limit | None
    optional: bool  # ``X | None``: None passes
    record: Any  # the dataclass it holds (a list of, if ``many``) when that has checks, or None
    checks: _Compiled | None  # the record's
    many: bool
    what: str  # what the field's id, or its items' ``unique`` one, is called ("worker id")


@dataclass(frozen=True, slots=True)
class _Compiled:
    ok: Callable[[Any], bool]
    walk: Callable[[Problems, str, Any], None]


@functools.cache
def _compiled(cls: Any) -> _Compiled | None:
    """The checks of ``cls``; None when neither it nor a record it holds declares a limit."""
    fields = _fields(cls)
    if not fields:
        return None
    names: dict[str, Any] = {"is_valid_id": is_valid_id, "isfinite": math.isfinite}
    body = "\n        and ".join(_conditions(fields, "v", names))
    source = f"def ok(v):\n    return (\n        {body}\n    )\n"
    # Text built above from the declarations, never from input (as dataclasses builds __init__).
    exec(compile(source, f"<checks of {cls.__qualname__}>", "exec"), names)
    return _Compiled(ok=names["ok"], walk=functools.partial(_walk, fields))


@functools.cache
def _fields(cls: Any) -> tuple[_Field, ...]:
    if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
        return ()
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp, optional = _without_none(hints[f.name])
        many = typing.get_origin(tp) in (tuple, list)
        item: Any = typing.get_args(tp)[0] if many else tp
        checks = _compiled(item)
        record = item if checks is not None else None
        rule = limit_of(cls, f)
        if rule is None and record is None:
            continue
        what = _what(tp)
        if isinstance(rule, Items) and rule.unique is not None:
            if not (many and dataclasses.is_dataclass(item)):
                raise TypeError(f"checks: {cls.__name__}.{f.name}: unique items must be records")
            what = _what(typing.get_type_hints(item)[rule.unique])
        out.append(_Field(f.name, rule, optional, record, checks, many, what))
    return tuple(out)


def _without_none(tp: Any) -> tuple[Any, bool]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(rest) == 1:
            return rest[0], True
    return tp, False


def _what(tp: Any) -> str:
    """``WorkerId`` -> "worker id"; anything else -> "id"."""
    name = getattr(tp, "__name__", "") if getattr(tp, "__supertype__", None) is not None else "Id"
    return re.sub(r"(?<!^)(?=[A-Z])", " ", name).lower()


# --- ok: one expression per class, built from the declarations --------------------------------


def _conditions(fields: tuple[_Field, ...], at: str, names: dict[str, Any]) -> list[str]:
    """What must hold of each field of the record ``at`` (Python source); constants are bound
    in ``names``. A record held once is inlined; a list of records calls its own ``ok``."""
    out = []
    for f in fields:
        a = f"{at}.{f.name}"
        parts = [] if f.rule is None else [_condition(f.rule, a, names)]
        if f.checks is not None:
            if f.many:
                parts.append(f"all(map({_bind(names, f.checks.ok)}, {a}))")
            else:
                parts += _conditions(_fields(f.record), a, names)
        cond = " and ".join(f"({p})" for p in parts)
        out.append(f"({a} is None or {cond})" if f.optional else cond)
    return out


def _condition(rule: Limit, a: str, names: dict[str, Any]) -> str:
    def c(value: object) -> str:
        return _bind(names, value)

    match rule:
        case Id():
            return f"is_valid_id({a})"
        case Range(lo, hi):  # NaN and infinities fail one comparison
            return f"{c(lo)} <= {a} <= {c(hi)}"
        case Finite():
            return f"isfinite({a})"
        case Text(n):
            return f"len({a}) <= {c(n)}"
        case Labels(count, key, value):
            return (
                f"not {a} or len({a}) <= {c(count)} and all(k and len(k) <= {c(key)} and k.isprintable()"
                f" and len(x) <= {c(value)} for k, x in {a}.items())"
            )
        case Taints(count, length):
            return (
                f"not {a} or len({a}) <= {c(count)}"
                f" and all(t and len(t) <= {c(length)} and t.isprintable() for t in {a})"
            )
        case Items(max_items, unique):
            parts = [] if max_items is None else [f"len({a}) <= {c(max_items)}"]
            if unique is not None:
                parts.append(f"len({{x.{unique} for x in {a}}}) == len({a})")
            return " and ".join(parts) or "True"
    typing.assert_never(rule)


def _bind(names: dict[str, Any], value: object) -> str:
    name = f"_{len(names)}"
    names[name] = value
    return name


# --- walk: every problem, with its path -------------------------------------------------------


def _walk(fields: tuple[_Field, ...], out: Problems, at: str, v: Any) -> None:
    for f in fields:
        x = getattr(v, f.name)
        if x is None and f.optional:
            continue
        path = f"{at}.{f.name}" if at else f.name
        if f.rule is not None:
            _problems(f, f.rule, out, path, x)
        if f.many:
            _items(f, out, path, x)
        elif f.checks is not None:
            f.checks.walk(out, path, x)


def _items(f: _Field, out: Problems, path: str, x: Any) -> None:
    rule = f.rule if isinstance(f.rule, Items) else Items()
    if rule.max_items is not None and len(x) > rule.max_items:
        out.append((path, f"more than {rule.max_items} {f.name} ({len(x)})"))
    record = f.checks
    if rule.unique is None and record is None:
        return
    seen: set[object] = set()
    for i, item in enumerate(x if rule.max_items is None else x[: rule.max_items]):
        if rule.unique is not None:
            key = getattr(item, rule.unique)
            if key in seen:
                noun = f.what.removesuffix(" id")
                out.append((f"{path}[{i}].{rule.unique}", f"{noun} {key} reported twice"))
            seen.add(key)
        if record is not None and not record.ok(item):
            record.walk(out, f"{path}[{i}]", item)
        if len(out) > _ENOUGH:
            break


def _problems(f: _Field, rule: Limit, out: Problems, path: str, x: Any) -> None:
    match rule:
        case Id():
            if not is_valid_id(x):
                try:
                    valid_id(x, what=f.what)
                except ValueError as exc:
                    out.append((path, str(exc)))
        case Range(lo, hi, time):
            if not lo <= x <= hi:
                within = f"a time within ±{hi:g} s" if time else f"within [{lo:g}, {hi:g}]"
                out.append((path, f"must be {within}, got {x!r}"))
        case Finite():
            if not math.isfinite(x):
                out.append((path, "must be finite"))
        case Text(n):
            if len(x) > n:
                out.append((path, f"longer than {n} characters ({len(x)})"))
        case Labels():
            _labels(rule, out, path, x)
        case Taints():
            _taints(rule, out, path, x, f.name)
        case Items():
            pass  # walked with the items (``_items``)
        case _:
            typing.assert_never(rule)


def _labels(rule: Labels, out: Problems, path: str, labels: dict[str, str]) -> None:
    if len(labels) > rule.max_count:
        out.append((path, f"more than {rule.max_count} labels ({len(labels)})"))
        return
    for k, v in labels.items():
        if not k or len(k) > rule.max_key or not k.isprintable():
            out.append(
                (f"{path}.{ascii(k)[:40]}", f"a label key must be 1-{rule.max_key} printable characters")
            )
        elif len(v) > rule.max_value:
            out.append((f"{path}.{k}", f"a label value must be at most {rule.max_value} characters"))


def _taints(rule: Taints, out: Problems, path: str, values: tuple[str, ...], what: str) -> None:
    if len(values) > rule.max_count:
        out.append((path, f"more than {rule.max_count} {what} ({len(values)})"))
        return
    for i, t in enumerate(values):
        if not t or not t.isprintable():
            out.append((f"{path}[{i}]", "must be non-empty printable text"))
        elif len(t) > rule.max_length:
            out.append((f"{path}[{i}]", f"longer than {rule.max_length} characters ({len(t)})"))
