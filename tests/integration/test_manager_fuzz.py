"""Fuzz the real ``specon-manager`` over HTTP from its OpenAPI document (issue 8, item 3).

The requests come from ``specon_manager.openapi``'s document: for every POST body, a schema walker
draws messages that break exactly one rule of the schema (a wrong type, a missing or
unknown key, an id outside the id rule, a time past ±9e9 s, a negative usage, NaN and
Infinity tokens, too many items, ...) with everything else valid, so each one reaches the
check it aims at. Around those: bodies that are not JSON or not UTF-8, nesting past any
stack, 20k containers in one heartbeat, bad and foreign ``Authorization`` headers, wrong
content types, odd methods, paths and paging queries, and raw bytes no HTTP client would
send. Some valid traffic keeps the cluster state busy in between.

What must hold: no 5xx, ever; every 4xx from a protocol POST is an ``ErrorReply``; a body
the schema refuses is never accepted; ``/healthz`` answers 200 throughout (latency
printed, bounded generously); afterwards the status JSON (every page), the status page
and ``/metrics`` still answer 200, the manager logged no traceback of its own and exits
cleanly. The browser's login (``POST /login``, ``/logout`` and session cookies on reads) gets
its own bad forms, tokens, cross-site headers and forged cookies: none may log in or read.
Generation is derandomized: the same requests every run.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gzip
import itertools
import json
import math
import re
import signal
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp
import jsonschema
import pytest
import yarl
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from manager_proc import Running, running_manager, wait_healthy
from specon_manager.openapi import openapi_document

from specon.model import Category, ContainerId, Resources, WorkerId
from specon.wire import protocol
from specon.wire.pod_writes import PodOp, PodWriteRequest
from specon.wire.protocol import (
    CommandResult,
    ContainerReport,
    ErrorReply,
    Goodbye,
    Heartbeat,
    Poll,
    ReallocationRequest,
)
from specon.wire.status import Status

T = TypeVar("T")

# Generating the 10,000 requests alone takes 1-5 min on 2 shared cores; then ~1-2 min to send them.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

N_BAD = 10_000  # generated bad requests (the issue asks for at least 10,000), plus the specials
N_LOGIN = 300  # generated bad logins, logouts and forged session cookies, among the specials
CONCURRENCY = 8  # connections to the manager (keep-alive)
NESTED_WEIGHT = 4  # how much likelier a rule is broken inside a nested message than beside it
HEALTH_EVERY = 0.2  # seconds between /healthz probes while the fuzz runs
HEALTH_BOUND = 2.0  # seconds: a generous bound, not to be passed twice in a row; latencies printed
HEALTH_MAX = 5.0  # seconds: no single probe may take longer (a stalled machine rarely stalls so long)
REQUEST_TIMEOUT = 30.0
RAW_TIMEOUT = 2.0  # a raw request the server still waits on (half a request) gets no answer

SHARED_TOKEN = "fuzz-shared-" + "0123456789abcdef" * 3
READ_TOKEN = "fuzz-read-" + "fedcba9876543210" * 3
AGENTS = {f"agent-{i}": f"fuzz-agent-{i}-" + "5a" * 24 for i in range(3)}

DOC = openapi_document()
SCHEMAS: dict[str, Any] = DOC["components"]["schemas"]
# POST path -> the message its body holds (the protocol's POSTs; /login and /logout take forms;
# the operator's drain, a path with a parameter and no envelope, is fuzzed in test_drain_api;
# the API server's admission reviews, no protocol message, in tests/unit/manager/test_admission.py).
POST_BODIES: dict[str, str] = {
    path: body[protocol.CONTENT_TYPE]["schema"]["$ref"].rsplit("/", 1)[1]
    for path, op in DOC["paths"].items()
    if protocol.CONTENT_TYPE in (body := op.get("post", {}).get("requestBody", {}).get("content", {}))
    and "{" not in path
    and "$ref" in body[protocol.CONTENT_TYPE]["schema"]
}
LOGIN_FORM_TYPE = "application/x-www-form-urlencoded"
GET_PATHS = sorted(path for path, op in DOC["paths"].items() if "get" in op and "{" not in path)
PAGED_PATHS = sorted(
    path
    for path, op in DOC["paths"].items()
    if any(p["name"] == "limit" for p in op.get("get", {}).get("parameters", []))
)


def python_flavoured(node: Any) -> Any:
    """``node`` with each ``pattern`` as ECMA-262 means it, for jsonschema (which uses Python's
    ``re``, where a final ``$`` also matches before a final newline)."""
    if isinstance(node, dict):
        return {
            k: v[:-1] + r"\Z"
            if k == "pattern" and isinstance(v, str) and v.endswith("$")
            else python_flavoured(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [python_flavoured(v) for v in node]
    return node


VALIDATORS = {
    name: jsonschema.Draft202012Validator(
        {"$ref": f"#/components/schemas/{name}", "components": python_flavoured(DOC["components"])}
    )
    for name in set(POST_BODIES.values())
}


# --- requests ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Raw:
    """A JSON token written as is (``NaN``, ``1e999``): what ``json.dumps`` will not write."""

    text: str


@dataclass(frozen=True)
class Req:
    """One request; ``label`` names its shape in reports."""

    label: str
    method: str = "POST"
    path: str = "/"  # already percent-encoded, with the query
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    raw: bytes | None = None  # sent as is over a fresh socket instead
    bad: bool = True
    # The body is no valid message (so it must not be accepted): told, or, for a generated
    # message, checked against ``message``'s schema should the manager accept ``value``.
    refuse: bool = False
    message: str | None = None
    value: Any = None
    # The server may drop the connection instead of answering (a body it stops reading).
    may_drop: bool = False


def dumps(value: Any, *, ascii_only: bool = True) -> bytes:
    """JSON with ``Raw`` tokens in place; lone surrogates escaped (ascii) or as raw bytes."""
    raws: list[str] = []

    def swap(v: Any) -> Any:
        if isinstance(v, Raw):
            raws.append(v.text)
            return f"\x00raw{len(raws) - 1}\x00"
        if isinstance(v, dict):
            return {k: swap(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [swap(x) for x in v]
        return v

    text = json.dumps(swap(value), ensure_ascii=ascii_only, allow_nan=True, separators=(",", ":"))
    for i, raw in enumerate(raws):
        text = text.replace(f'"\\u0000raw{i}\\u0000"', raw, 1)
    return text.encode("utf-8", "surrogatepass")


def has_raw(value: Any) -> bool:
    if isinstance(value, Raw):
        return True
    if isinstance(value, dict):
        return any(has_raw(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(has_raw(v) for v in value)
    return False


def schema_valid(message: str, value: Any) -> bool:
    if has_raw(value):
        return False
    try:
        return bool(VALIDATORS[message].is_valid(value))
    except (RecursionError, ValueError):
        return False


def auth(token: str | None) -> tuple[tuple[str, str], ...]:
    headers = [("Content-Type", protocol.CONTENT_TYPE)]
    if token is not None:
        headers.append((protocol.AUTH_HEADER, f"Bearer {token}"))
    return tuple(headers)


# --- the schema walker: valid values, and values that break one rule ---------------------

TEXT = st.characters(codec="utf-8")  # no lone surrogates: those are bad values, drawn on purpose
SMALL_TEXT = st.text(TEXT, max_size=12)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | SMALL_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(SMALL_TEXT, inner, max_size=3),
    max_leaves=4,
)
BAD_IDS = [
    "\ud800",
    "job-\udfff",
    "job-1\n",
    "job-1\r\n",
    "../x",
    "..",
    ".",
    "",
    "a" * 300,
    "a" * 254,
    "job 1",
    "job/1",
    "job\\1",
    "-job",
    "_job",
    "job\x00",
    "jöb",
    "job\t",
    "\n",
    "٣",
    "job-<b>",
    "job-1%0a",
]
# Out of every range the schema states, or not JSON numbers at all.
BAD_NUMBERS: list[Any] = [
    1.7e308,
    -1.7e308,
    9.000001e9,
    -9.000001e9,
    1e300,
    10**400,
    2**63,
    2**64,
    -1,
    -1e-300,
    -(2**63),
    1.0000001,
    Raw("NaN"),
    Raw("Infinity"),
    Raw("-Infinity"),
    Raw("1e999"),
    Raw("-1e999"),
    Raw("1" * 5000),
    Raw("0x10"),
    Raw("01"),
    Raw("+1"),
    Raw(".5"),
]
WRONG_TYPES: list[Any] = [None, True, False, 0, -1, 2.5, "x", "", "1", [], [1], {}, {"a": 1}]
BAD_ENUM = ["", "bogus", "RUNNING", "Converged", "Heartbeat", "Status", "Command", " running"]


def resolve(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` with its ``$ref`` (or one-element ``allOf``) merged in."""
    s = dict(schema)
    while True:
        if "$ref" in s:
            target = SCHEMAS[s.pop("$ref").rsplit("/", 1)[1]]
            s = {**target, **s}
        elif "allOf" in s:
            (inner,) = s.pop("allOf")
            s = {**resolve(inner), **s}
        else:
            return s


def python_pattern(pattern: str) -> str:
    """An ECMA ``^...$`` pattern for ``re.fullmatch`` (where ``$`` would allow a newline)."""
    return pattern.removeprefix("^").removesuffix("$")


_SIMPLE_PATTERN = re.compile(r"\^(\[[^\]]+\])(\[[^\]]+\])\{0,(\d+)\}\$")


def pattern_text(pattern: str, max_size: int) -> st.SearchStrategy[str]:
    """Texts matching ``pattern``; ``^[first][rest]{0,n}$`` (the id rule) the fast way."""
    simple = _SIMPLE_PATTERN.fullmatch(pattern)
    if simple is None:
        return st.from_regex(python_pattern(pattern), fullmatch=True).filter(lambda t: len(t) <= max_size)
    first, rest = ([c for c in map(chr, range(128)) if re.fullmatch(cls, c)] for cls in simple.group(1, 2))
    tail = st.text(st.sampled_from(rest), max_size=min(int(simple[3]), max_size - 1, 20))
    longest = st.text(st.sampled_from(rest), min_size=int(simple[3]), max_size=int(simple[3]))
    return st.builds(lambda a, b: a + b, st.sampled_from(first), tail | longest)


def type_ok(value: Any, types: str | list[str] | None) -> bool:
    if types is None:
        return True
    allowed = [types] if isinstance(types, str) else types
    checks: dict[str, Callable[[Any], bool]] = {
        "null": lambda v: v is None,
        "boolean": lambda v: isinstance(v, bool),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "string": lambda v: isinstance(v, str),
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
    }
    return any(checks[t](value) for t in allowed)


def valid(schema: Mapping[str, Any]) -> st.SearchStrategy[Any]:
    """Values ``schema`` accepts (small ones: a few items, short texts)."""
    s = resolve(schema)
    if "anyOf" in s:
        return st.one_of([valid(b) for b in s["anyOf"]])
    if "const" in s:
        return st.just(s["const"])
    if "enum" in s:
        return st.sampled_from(s["enum"])
    kind = s.get("type")
    if isinstance(kind, list):
        return st.one_of([valid({**s, "type": t}) for t in kind])
    lo, hi = s.get("minimum"), s.get("maximum")
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        return st.integers(None if lo is None else math.ceil(lo), None if hi is None else math.floor(hi))
    if kind == "number":
        return st.floats(lo, hi, allow_nan=False, allow_infinity=False) | st.integers(
            None if lo is None else math.ceil(lo), None if hi is None else math.floor(hi)
        )
    if kind == "string":
        top = s.get("maxLength", 10**6)
        if "pattern" in s:
            return pattern_text(s["pattern"], top)
        return st.text(TEXT, min_size=s.get("minLength", 0), max_size=min(top, 12))
    if kind == "array":
        return st.lists(
            valid(s["items"]), min_size=s.get("minItems", 0), max_size=min(s.get("maxItems", 2), 2)
        )
    if kind == "object":
        props: dict[str, Any] = s.get("properties", {})
        if props:
            required = s.get("required", [])
            return st.fixed_dictionaries(
                {k: valid(props[k]) for k in required},
                optional={k: valid(v) for k, v in props.items() if k not in required},
            )
        names = s.get("propertyNames", {})
        keys = st.text(
            TEXT, min_size=max(names.get("minLength", 0), 1), max_size=min(names.get("maxLength", 24), 24)
        )
        extra = s.get("additionalProperties", {})
        return st.dictionaries(keys, valid(extra), max_size=min(s.get("maxProperties", 2), 2))
    return JSON_VALUES


Bad = tuple[str, Any]  # (the rule broken, where; the value)


def invalid(schema: Mapping[str, Any], where: str, *, null_ok: bool = False) -> st.SearchStrategy[Bad]:
    """Values that break one rule of ``schema`` (anywhere inside it), all else valid.
    ``null_ok``: null is allowed here (``X | None``), so it breaks nothing."""
    s = resolve(schema)
    if "anyOf" in s:  # X | null: break X, but not into null
        (inner,) = [b for b in s["anyOf"] if resolve(b).get("type") != "null"]
        return invalid(inner, where, null_ok=True)
    kind = s.get("type")
    if isinstance(kind, list):
        rest = [t for t in kind if t != "null"]
        return invalid({**s, "type": rest[0] if len(rest) == 1 else rest}, where, null_ok="null" in kind)
    options: list[st.SearchStrategy[Bad]] = []
    if kind is not None:
        wrong = [v for v in WRONG_TYPES if not type_ok(v, kind) and not (null_ok and v is None)]
        options.append(st.sampled_from(wrong).map(lambda v: (f"{where}: wrong type", v)))
    if "const" in s or "enum" in s:
        allowed = [s["const"]] if "const" in s else s["enum"]
        options.append(
            st.sampled_from([v for v in BAD_ENUM if v not in allowed]).map(
                lambda v: (f"{where}: not allowed", v)
            )
        )
    elif kind == "string":
        if "pattern" in s:
            options.append(st.sampled_from(BAD_IDS).map(lambda v: (f"{where}: bad id {v[:12]!a}", v)))
            options.append(
                st.text(TEXT, max_size=8)
                .filter(lambda t: re.fullmatch(python_pattern(s["pattern"]), t) is None)
                .map(lambda v: (f"{where}: off-pattern text", v))
            )
        if "maxLength" in s:
            options.append(st.just((f"{where}: too long", "x" * (s["maxLength"] + 1))))
    elif kind in ("integer", "number"):
        lo, hi = s.get("minimum"), s.get("maximum")

        def out_of_range(v: Any) -> bool:
            if isinstance(v, Raw):
                return True
            if not type_ok(v, kind):
                return False
            return (lo is not None and v < lo) or (hi is not None and v > hi)

        numbers = [v for v in BAD_NUMBERS if out_of_range(v)]
        if kind == "integer":
            numbers += [1.5, -0.5]
        options.append(st.sampled_from(numbers).map(lambda v: (f"{where}: bad number {v!s:.12}", v)))
    elif kind == "array":
        item = s["items"]
        if "maxItems" in s:
            n = s["maxItems"] + 1
            options.append(valid(item).map(lambda v: (f"{where}: {n} items", [v] * n)))
        one_bad = st.tuples(st.lists(valid(item), max_size=2), invalid(item, f"{where}[]")).map(
            lambda pair: (pair[1][0], [*pair[0], pair[1][1]])
        )
        options += [one_bad.map(_same) for _ in range(NESTED_WEIGHT if holds_objects(item) else 1)]
    elif kind == "object":
        options += _invalid_object(s, where)
    else:  # any JSON: only what is not JSON, or nested past any stack
        options.append(
            st.sampled_from([Raw("NaN"), Raw("-Infinity"), Raw("[" * 3000 + "]" * 3000)]).map(
                lambda v: (f"{where}: not JSON", v)
            )
        )
    return st.one_of(options)


def _invalid_object(s: dict[str, Any], where: str) -> list[st.SearchStrategy[Bad]]:
    options: list[st.SearchStrategy[Bad]] = []
    props: dict[str, Any] = s.get("properties", {})
    if props:
        whole = valid(s)
        if s.get("required"):
            missing = st.sampled_from(s["required"]).map(lambda key: _missing(where, key))
            options.append(st.tuples(whole, missing).map(lambda t: t[1](t[0])))
        if s.get("additionalProperties") is False:
            options.append(
                st.tuples(
                    whole,
                    st.sampled_from(["bogus", "Worker", "worker ", "__proto__", "constructor", "\ud800"]),
                    JSON_VALUES,
                )
                .filter(lambda t: t[1] not in props)
                .map(lambda t: (f"{where}: unknown key {t[1]!a}", {**t[0], t[1]: t[2]}))
            )
        for key, sub in props.items():
            descent = st.tuples(whole, invalid(sub, f"{where}.{key}")).map(_replaced(key))
            # More of the draws go to the nested messages: they hold most of the rules.
            # (Copies, not the same strategy again: one_of would fold those into one.)
            options += [descent.map(_same) for _ in range(NESTED_WEIGHT if holds_objects(sub) else 1)]
        return options
    names = s.get("propertyNames", {})
    extra = s.get("additionalProperties", {})
    fine = valid(s)
    if "maxProperties" in s:
        n = s["maxProperties"] + 1
        options.append(st.just((f"{where}: {n} entries", {f"k{i}": "v" for i in range(n)})))
    if names.get("minLength", 0) > 0:
        options.append(fine.map(lambda v: (f"{where}: empty key", {**v, "": "v"})))
    if "maxLength" in names:
        long_key = "k" * (names["maxLength"] + 1)
        options.append(fine.map(lambda v: (f"{where}: key too long", {**v, long_key: "v"})))
    if isinstance(extra, dict) and extra:
        options.append(
            st.tuples(fine, st.text(TEXT, min_size=1, max_size=8), invalid(extra, f"{where}[]")).map(
                lambda t: (t[2][0], {**t[0], t[1]: t[2][1]})
            )
        )
    return options


def _same(value: Bad) -> Bad:
    return value


def holds_objects(schema: Mapping[str, Any]) -> bool:
    """An object with properties of its own, or a list of them."""
    s = resolve(schema)
    if s.get("type") == "array":
        s = resolve(s["items"])
    return "properties" in s


def _missing(where: str, key: str) -> Callable[[dict[str, Any]], Bad]:
    def drop(value: dict[str, Any]) -> Bad:
        return f"{where}.{key}: missing", {k: v for k, v in value.items() if k != key}

    return drop


def _replaced(key: str) -> Callable[[tuple[dict[str, Any], Bad]], Bad]:
    def replace(pair: tuple[dict[str, Any], Bad]) -> Bad:
        value, (where, bad) = pair
        return where, {**value, key: bad}

    return replace


@functools.cache
def bad_message(name: str) -> st.SearchStrategy[Bad]:
    """A ``name`` message that breaks one rule; in this manager's own version unless the
    version is the rule broken (a higher minor version would let unknown keys through)."""

    def pin(bad: Bad) -> Bad:
        where, value = bad
        if isinstance(value, dict) and not where.startswith(f"{name}.version"):
            value = {**value, "version": protocol.VERSION}
        if name == "Poll" and isinstance(value, dict) and not where.startswith("Poll.wait"):
            value = {**value, "wait": 0}  # should the manager answer it anyway: never a long wait
        return where, value

    return invalid({"$ref": f"#/components/schemas/{name}"}, name).map(pin)


@functools.cache
def valid_message(name: str) -> st.SearchStrategy[Any]:
    def short_wait(value: Any) -> Any:
        return {**value, "wait": 0} if name == "Poll" else value  # the default is 20 s

    return valid({"$ref": f"#/components/schemas/{name}"}).map(short_wait)


# --- request strategies -------------------------------------------------------------------

TOKENS = [SHARED_TOKEN, *AGENTS.values()]
BAD_AUTH: list[tuple[str, tuple[tuple[str, str], ...]]] = [
    ("no Authorization", auth(None)),
    ("wrong token", auth("x" * 64)),
    ("token prefix", auth(SHARED_TOKEN[:-1])),
    ("token plus a byte", auth(SHARED_TOKEN + "x")),
    ("Bearer only", (("Authorization", "Bearer"),)),
    ("Bearer and space", (("Authorization", "Bearer "),)),
    ("Basic", (("Authorization", "Basic dXNlcjpwYXNz"),)),
    ("token without scheme", (("Authorization", SHARED_TOKEN),)),
    ("non-ASCII token", (("Authorization", "Bearer é☃" + SHARED_TOKEN),)),
    ("non-ASCII scheme", (("Authorization", "Bëarer " + SHARED_TOKEN),)),
    ("emoji", (("Authorization", "Bearer \U0001f600"),)),
    ("read token posts", auth(READ_TOKEN)),
    (
        "two Authorization headers",
        (("Authorization", "Bearer x"), ("Authorization", f"Bearer {SHARED_TOKEN}")),
    ),
    ("huge token", (("Authorization", "Bearer " + "t" * 7000),)),
]
CONTENT_TYPES = [
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/json; charset=latin-1",
    "application/xml",
    "",
    "\u00e9/json",
]
ODD_METHODS = ["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "POST", "TRACE"]
ODD_PATHS = [
    "/v1/heartbeat/",
    "/V1/HEARTBEAT",
    "/v1//heartbeat",
    "/v1/../v1/status",
    "/v1/%2e%2e/v1/status",
    "/%ff",
    "/%ed%a0%80",
    "/v1/heartbeat%00",
    "/v1/heartbeat;x",
    "/v2/heartbeat",
    "//",
    "/..",
    "/v1/status/../../etc/passwd",
    "/metrics?x=%ff",
    "/healthz?%00",
    "/" + "a" * 4000,
    "/openapi.json/x",
    "/v1",
]
BAD_LIMITS = [
    "0",
    "-1",
    "10001",
    "1e3",
    "abc",
    "",
    " 1",
    "1 ",
    "٣",
    "²",
    "9" * 30,
    "1" * 5000,
    "0x10",
    "1.0",
    "+5",
    "%ff",
]
BAD_AFTERS = [
    "x:1",
    "w",
    ":",
    "m:",
    "m:abc",
    "m:-1",
    "m:²",
    "m:٣",
    "m:" + "9" * 40,
    "m:1.5",
    "w:" + "a" * 400,
    "w:\ud800",
    "c:job-1\n",
    "%ff",
    "%ed%a0%80",
    "w:%00",
    "c:../x",
    "m:1e9",
]
RAW_BODIES: list[tuple[str, bytes]] = [
    ("empty", b""),
    ("null", b"null"),
    ("list", b"[]"),
    ("string", b'"Heartbeat"'),
    ("number", b"1"),
    ("not JSON", b"hello"),
    ("truncated", b'{"version":"1.1","kind":"Heartbeat","worker":'),
    ("trailing garbage", b'{"version":"1.1","kind":"Goodbye","worker":"agent-0","sent_at":1}x'),
    ("BOM", b'\xef\xbb\xbf{"version":"1.1","kind":"Goodbye","worker":"agent-0","sent_at":1}'),
    ("invalid UTF-8", b'{"version":"1.1","kind":"Goodbye","worker":"\xff\xfe","sent_at":1}'),
    ("UTF-8 surrogate bytes", b'{"version":"1.1","kind":"Goodbye","worker":"\xed\xa0\x80","sent_at":1}'),
    ("overlong UTF-8", b'{"version":"1.1","kind":"Goodbye","worker":"\xc0\xaf","sent_at":1}'),
    ("UTF-16", '{"version":"1.1","kind":"Goodbye"}'.encode("utf-16")),
    ("latin-1", '{"version":"1.1","kind":"Goodbye","worker":"jöb","sent_at":1}'.encode("latin-1")),
    ("NaN", b'{"version":"1.1","kind":"Goodbye","worker":"agent-0","sent_at":NaN}'),
    ("Infinity", b'{"version":"1.1","kind":"Goodbye","worker":"agent-0","sent_at":-Infinity}'),
    ("1e999", b'{"version":"1.1","kind":"Goodbye","worker":"agent-0","sent_at":1e999}'),
    (
        "5000-digit int",
        b'{"version":"1.1","kind":"Goodbye","worker":"agent-0","sent_at":' + b"9" * 5000 + b"}",
    ),
    (
        "duplicate keys",
        b'{"version":"1.1","kind":"Goodbye","worker":"agent-0","worker":"\\ud800","sent_at":1}',
    ),
    ("nul byte", b'{"version":"1.1","kind":"Goodbye","worker":"agent-0\\u0000","sent_at":1}'),
    ("nested lists", b"[" * 100_000 + b"]" * 100_000),
    ("nested objects", b'{"a":' * 50_000 + b"1" + b"}" * 50_000),
    ("unclosed nesting", b"[" * 200_000),
    (
        "deep nesting with a surrogate",
        b'{"version":"1.1","kind":"Heartbeat","labels":' + b"[" * 900 + b'"\\ud800"' + b"]" * 900 + b"}",
    ),
    (
        "deep spec with a surrogate",
        b'{"version":"1.1","kind":"Heartbeat","worker":"agent-0","address":"a","seq":1,"sent_at":1,'
        b'"capacity":{},"usage":0,"results":[{"command":"c","ok":true,"spec":{"x":'
        + b"[" * 980
        + b'"\\udfff"'
        + b"]" * 980
        + b"}}]}",
    ),
    ("surrogate key", b'{"version":"1.1","kind":"Heartbeat","\\ud800":1}'),
    (
        "escaped surrogate pair halves",
        b'{"version":"1.1","kind":"Goodbye","worker":"\\udc00\\ud800","sent_at":1}',
    ),
]


def _heartbeat_data(worker: str, containers: list[dict[str, Any]], seq: int | None = None) -> dict[str, Any]:
    return {
        "version": protocol.VERSION,
        "kind": "Heartbeat",
        "worker": worker,
        "address": "127.0.0.1:1",
        "seq": seq if seq is not None else int(time.time() * 1e6),
        "sent_at": time.time(),
        "capacity": {"cpu": 8.0, "memory": 1 << 34},
        "usage": 0.5,
        "containers": containers,
    }


def encoded(value: str) -> str:
    """``value`` percent-encoded for a query, unless it already is (``%ff``, sent as is)."""
    if re.fullmatch(r"([A-Za-z0-9:._-]|%[0-9A-Fa-f]{2})*", value) and "%" in value:
        return value
    return quote(value, safe="", errors="surrogatepass")


@st.composite
def bad_requests(draw: st.DrawFn) -> Req:
    """One bad request, of one of several shapes."""
    shape = draw(
        st.sampled_from(["body"] * 12 + ["raw", "auth", "content-type", "method", "query", "worker"])
    )
    path = draw(st.sampled_from([protocol.HEARTBEAT_PATH, *sorted(POST_BODIES)]))  # the richest twice
    name = POST_BODIES[path]
    token = draw(st.sampled_from(TOKENS))
    if shape == "body":
        where, value = draw(bad_message(name))
        ascii_only = draw(st.booleans())
        label = f"POST {path} {where}" + ("" if ascii_only else " (raw UTF-8)")
        # A body that cannot be written as UTF-8 by a correct writer (a lone surrogate as
        # raw bytes) is sent anyway: it is exactly what an attacker would send.
        body = dumps(value, ascii_only=ascii_only)
        return Req(
            label,
            "POST",
            path,
            auth(SHARED_TOKEN),
            body,
            message=name,
            value=value,
            may_drop=len(body) > (1 << 20),
        )
    if shape == "raw":
        what, body = draw(
            st.sampled_from(RAW_BODIES) | st.binary(max_size=64).map(lambda b: ("random bytes", b))
        )
        return Req(f"POST {path} body: {what}", "POST", path, auth(SHARED_TOKEN), body, refuse=True)
    if shape == "auth":
        what, headers = draw(st.sampled_from(BAD_AUTH))
        body = dumps(draw(valid_message(name)))
        if "Content-Type" not in dict(headers):
            headers = (*headers, ("Content-Type", protocol.CONTENT_TYPE))
        return Req(f"POST {path} auth: {what}", "POST", path, headers, body)
    if shape == "content-type":
        ctype = draw(st.sampled_from(CONTENT_TYPES))
        body = dumps(draw(valid_message(name)))
        headers = ((protocol.AUTH_HEADER, f"Bearer {token}"), ("Content-Type", ctype))
        return Req(f"POST {path} Content-Type {ctype!a}", "POST", path, headers, body)
    if shape == "method":
        method = draw(st.sampled_from(ODD_METHODS))
        target = draw(st.sampled_from([*sorted(POST_BODIES), *GET_PATHS, *ODD_PATHS]))
        if (method == "POST" and target in POST_BODIES) or (
            method in ("GET", "HEAD") and target in GET_PATHS
        ):
            method = "PUT"
        return Req(f"{method} {target[:60]}", method, target, auth(token), b"{}")
    if shape == "query":
        target = draw(st.sampled_from(PAGED_PATHS))
        limit = draw(st.none() | st.sampled_from(BAD_LIMITS) | st.integers().map(str))
        after = draw(st.none() | st.sampled_from(BAD_AFTERS) | st.text(TEXT, max_size=12))
        parts = [
            f"{key}={encoded(value)}"
            for key, value in (("limit", limit), ("after", after))
            if value is not None
        ]
        reader = draw(st.sampled_from([None, READ_TOKEN, SHARED_TOKEN, "wrong"]))
        headers = () if reader is None else ((protocol.AUTH_HEADER, f"Bearer {reader}"),)
        query = "&".join(parts)
        return Req(f"GET {target}?{query[:60]}", "GET", f"{target}?{query}", headers)
    # shape == "worker": a valid message for a worker this agent's token does not speak for
    value = draw(valid_message(name))
    agent, agent_token = draw(st.sampled_from(sorted(AGENTS.items())))
    value["worker"] = draw(st.sampled_from([w for w in AGENTS if w != agent] + ["nobody"]))
    return Req(f"POST {path} as {agent} for another worker", "POST", path, auth(agent_token), dumps(value))


def generate(strategy: st.SearchStrategy[T], n: int) -> list[T]:
    """``n`` examples of ``strategy``, the same ones every run (derandomized)."""
    out: list[T] = []

    @settings(
        max_examples=n,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(value: T) -> None:
        out.append(value)

    collect()
    return out


def valid_requests(n: int) -> list[Req]:
    """Schema-valid messages (odd but allowed values) with the shared token: traffic that
    may change the cluster state between the bad requests."""
    messages = st.sampled_from(sorted(POST_BODIES)).flatmap(
        lambda path: st.tuples(st.just(path), valid_message(POST_BODIES[path]))
    )
    return [
        Req(f"POST {path} valid", "POST", path, auth(SHARED_TOKEN), dumps(value), bad=False)
        for path, value in generate(messages, n)
    ]


def _container(i: int, category: Category = Category.WATCHING) -> dict[str, Any]:
    return {"id": f"job-{i}", "category": category.value}


def base_messages() -> dict[str, Any]:
    """One valid message of each POST body, every optional part present (as plain data)."""
    now = time.time()
    worker, container = WorkerId("agent-0"), ContainerId("agent-0-poison")
    hb = Heartbeat(
        worker=worker,
        address="127.0.0.1:1",
        seq=int(now * 1e6),
        sent_at=now,
        capacity=Resources(cpu=4.0, memory=1 << 30, gpu=1),
        usage=0.5,
        containers=(
            ContainerReport(
                id=container,
                category=Category.CONVERGED,
                last_g=0.1,
                t_cc=now - 10,
                step=1,
                requests=Resources(cpu=1.0, memory=1, gpu=0),
                job={"model": "m"},
            ),
        ),
        results=(
            CommandResult(
                command="c-1",
                ok=False,
                error="e",
                checkpoint="p",
                checkpoint_step=1,
                finished_at=now,
                spec={"x": 1},
                detail={"y": [1]},
            ),
        ),
        labels={"zone": "a"},
        taints=("gpu",),
    )
    messages = (
        hb,
        ReallocationRequest(worker=worker, container=container, t_cc=now - 10, g=0.01, sent_at=now),
        Poll(worker=worker, sent_at=now, wait=0.0),
        Goodbye(worker=worker, sent_at=now),
    )
    out = {type(m).__name__: json.loads(protocol.encode(m)) for m in messages}
    # Plain JSON, no envelope (served with --manage-pods only: this manager answers 404).
    write = PodWriteRequest(
        worker=worker,
        op=PodOp.ANNOTATE,
        container=container,
        namespace="training",
        name="p",
        uid="u",
        grace=1.0,
        checkpoint="c.json",
        annotations={"specon.io/category": "converged"},
    )
    return {**out, "PodWriteRequest": json.loads(write.to_json())}


FieldPath = tuple[str | int, ...]


def leaves(
    schema: Mapping[str, Any], value: Any, path: FieldPath = ()
) -> Iterator[tuple[FieldPath, dict[str, Any]]]:
    """Every scalar in ``value`` with its schema (the first item of each list)."""
    s = resolve(schema)
    if "anyOf" in s:
        (s,) = [resolve(b) for b in s["anyOf"] if resolve(b).get("type") != "null"]
    if "properties" in s and isinstance(value, dict):
        for key, sub in s["properties"].items():
            if key in value:
                yield from leaves(sub, value[key], (*path, key))
    elif s.get("type") == "array" and isinstance(value, list) and value:
        yield from leaves(s["items"], value[0], (*path, 0))
    else:
        yield path, s


def poisons(s: Mapping[str, Any]) -> list[Any]:
    """The bad values for one scalar's schema that the issue names, and their kin."""
    if "pattern" in s:
        return BAD_IDS
    if "enum" in s or "const" in s:
        return BAD_ENUM[:3]
    kind = s.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if "number" in kinds or "integer" in kinds:
        lo, hi = s.get("minimum"), s.get("maximum")
        out = [v for v in BAD_NUMBERS if isinstance(v, Raw) or v > (hi if hi is not None else math.inf)]
        return out + [v for v in BAD_NUMBERS if not isinstance(v, Raw) and lo is not None and v < lo]
    if "string" in kinds:
        return ["\ud800", *(["x" * (s["maxLength"] + 1)] if "maxLength" in s else [])]
    if "object" in kinds and "propertyNames" in s:  # labels
        keys = s["propertyNames"]
        return [
            {"": "v"},
            {"k" * (keys["maxLength"] + 1): "v"},
            {"\ud800": "v"},
            {"k": "v" * (s["additionalProperties"]["maxLength"] + 1)},
            {f"k{i}": "v" for i in range(s["maxProperties"] + 1)},
        ]
    if "object" in kinds:  # any JSON inside
        return [{"x": Raw("NaN")}, {"x": Raw("[" * 3000 + "]" * 3000)}, {"x": "\udfff"}]
    return []


def replaced(value: Any, path: FieldPath, new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, str(head): replaced(value[head], rest, new)}
    return [replaced(v, rest, new) if i == head else v for i, v in enumerate(value)]


def known_poisons() -> list[Req]:
    """The values the issue names (a lone surrogate or a newline in an id, a 1.7e308 time,
    negative usage, NaN, ...) at every field of every message they can go to, each paging
    query that broke the status page, and each bad Authorization header: always sent,
    whatever the generator draws."""
    out: list[Req] = []
    for path, name in sorted(POST_BODIES.items()):
        base = base_messages()[name]
        for where, schema in leaves(SCHEMAS[name], base):
            for poison in poisons(schema):
                value = replaced(base, where, poison)
                field_name = ".".join(map(str, where))
                out.append(
                    Req(
                        f"POST {path} {name}.{field_name} = {poison!a:.24}",
                        "POST",
                        path,
                        auth(SHARED_TOKEN),
                        dumps(value),
                        message=name,
                        value=value,
                    )
                )
        for what, headers in BAD_AUTH:
            out.append(Req(f"POST {path} auth: {what}", "POST", path, headers, dumps(base)))
    read = ((protocol.AUTH_HEADER, f"Bearer {READ_TOKEN}"),)
    for target in PAGED_PATHS:
        out += [
            Req(f"GET {target}?after={a!a:.40}", "GET", f"{target}?after={encoded(a)}", read)
            for a in BAD_AFTERS
        ]
        out += [
            Req(f"GET {target}?limit={v!a:.40}", "GET", f"{target}?limit={encoded(v)}", read)
            for v in BAD_LIMITS
        ]
    return out


HEADER_TEXT = st.characters(codec="utf-8", exclude_categories=("Cc",))  # no CR, LF or NUL in a header
CROSS_SITE_HEADERS: list[tuple[tuple[str, str], ...]] = [
    (("Sec-Fetch-Site", "cross-site"),),
    (("Sec-Fetch-Site", "same-site"),),
    (("Sec-Fetch-Site", "\u00e9" * 3),),
    (("Origin", "http://evil.example"),),
    (("Origin", "null"),),
    (("Origin", "http://[::1"),),
    (("Origin", "http://127.0.0.1.evil.example"),),
    (("Origin", "http://127.0.0.1:1"),),
    (("Origin", "http://127.0.0.1:1"), ("Sec-Fetch-Site", "cross-site")),
]
# Cookie headers that must open nothing: forged, garbage, or a token where a session id goes.
FORGED_COOKIES = [
    "specon_session=" + "A" * 43,
    "specon_session=" + READ_TOKEN,
    "specon_session=" + SHARED_TOKEN,
    "__Host-specon_session=" + "A" * 43,
    "specon_session=",
    "specon_session",
    "specon_session=" + "x" * 5000,
    'specon_session="\\"',
    "specon_session=a; specon_session=b",
    "=; ;;=x",
    "specon_session=\u00e9\u2603",
    "a=b" + "; c=d" * 300,
]


@st.composite
def login_requests(draw: st.DrawFn) -> Req:
    """A bad login (a wrong, an agent's or a mangled token; not a form; from another site), a
    logout that may come from anywhere, or a read with a forged session cookie."""
    shape = draw(st.sampled_from(["login"] * 4 + ["logout", "read"]))
    if shape == "read":
        cookie = draw(
            st.sampled_from(FORGED_COOKIES)
            | st.text(HEADER_TEXT, max_size=40).map(lambda t: "specon_session=" + t)
        )
        path = draw(st.sampled_from(["/", protocol.STATUS_PATH]))
        accept = draw(st.sampled_from(["text/html", "*/*", "application/json", ""]))
        headers: tuple[tuple[str, str], ...] = (("Cookie", cookie), ("Accept", accept))
        return Req(f"GET {path} with a forged session cookie", "GET", path, headers, refuse=True)
    token = draw(
        st.sampled_from(
            [*AGENTS.values(), "x" * 64, READ_TOKEN[:-1], READ_TOKEN + "x", "", " ", "é" + READ_TOKEN]
        )
        | st.text(TEXT, max_size=40)
    )
    body = draw(
        st.sampled_from(
            [
                b"token=" + quote(token, errors="surrogatepass").encode(),
                b"token=" + token.encode("utf-8", "surrogatepass"),
                b"token=" + quote(token, errors="surrogatepass").encode() + b"&token=" + READ_TOKEN.encode(),
                b"tok=" + READ_TOKEN.encode(),
            ]
        )
        | st.sampled_from([b for _, b in RAW_BODIES])
        | st.binary(max_size=64)
    )
    ctype = draw(st.sampled_from([LOGIN_FORM_TYPE] * 4 + CONTENT_TYPES))
    extra = draw(
        st.sampled_from([(), (), *CROSS_SITE_HEADERS, *((("Cookie", c),) for c in FORGED_COOKIES[:4])])
    )
    path = "/login" if shape == "login" else "/logout"
    headers = (("Content-Type", ctype), *extra)
    # A logout needs no session (it clears the cookie either way): only a login can be refused.
    return Req(
        f"POST {path} {ctype[:30]!a} {extra[:1]!a:.60}", "POST", path, headers, body, refuse=path == "/login"
    )


def special_requests() -> list[Req]:
    """Bad requests too big or too odd for the generator: each one once."""
    out: list[Req] = []
    minimal = [_container(i) for i in range(20_000)]
    body = dumps(_heartbeat_data("agent-0", minimal))
    out.append(
        Req(
            f"20k containers ({len(body)} bytes)",
            "POST",
            protocol.HEARTBEAT_PATH,
            auth(SHARED_TOKEN),
            body,
            refuse=True,
            may_drop=len(body) > 1 << 20,
        )
    )
    verbose = [
        {**_container(i), "job": {"model": "m" * 20}, "requests": {"cpu": 1.0, "memory": 1 << 30}}
        for i in range(20_000)
    ]
    body = dumps(_heartbeat_data("agent-0", verbose))
    out.append(
        Req(
            f"20k verbose containers ({len(body)} bytes)",
            "POST",
            protocol.HEARTBEAT_PATH,
            auth(SHARED_TOKEN),
            body,
            refuse=True,
            may_drop=True,
        )
    )
    cap = SCHEMAS["Heartbeat"]["properties"]["containers"]["maxItems"]
    body = dumps(_heartbeat_data("agent-1", [_container(i) for i in range(cap + 1)]))
    out.append(
        Req(
            f"{cap + 1} containers",
            "POST",
            protocol.HEARTBEAT_PATH,
            auth(SHARED_TOKEN),
            body,
            refuse=True,
        )
    )
    dup = dumps(_heartbeat_data("agent-1", [_container(1), _container(1)]))
    out.append(Req("a container twice", "POST", protocol.HEARTBEAT_PATH, auth(SHARED_TOKEN), dup))
    far = dumps(_heartbeat_data("agent-2", [], seq=2**62))
    out.append(Req("seq 2**62", "POST", protocol.HEARTBEAT_PATH, auth(SHARED_TOKEN), far))
    big = b'{"version":"1.1","kind":"Goodbye","worker":"agent-0","sent_at":1,"x":"' + b"a" * (1 << 20) + b'"}'
    out.append(
        Req(
            "body over max_body_bytes",
            "POST",
            protocol.GOODBYE_PATH,
            auth(SHARED_TOKEN),
            big,
            refuse=True,
            may_drop=True,
        )
    )
    out.append(
        Req(
            "gzip that is not",
            "POST",
            protocol.GOODBYE_PATH,
            (*auth(SHARED_TOKEN), ("Content-Encoding", "gzip")),
            b"not gzip at all",
            refuse=True,
        )
    )
    bomb = gzip.compress(b"[" * (64 << 20))  # 64 MiB of nesting in ~64 KiB
    out.append(
        Req(
            f"gzip bomb ({len(bomb)} bytes, 64 MiB inflated)",
            "POST",
            protocol.HEARTBEAT_PATH,
            (*auth(SHARED_TOKEN), ("Content-Encoding", "gzip")),
            bomb,
            refuse=True,
            may_drop=True,
        )
    )
    goodbye = dumps({"version": protocol.VERSION, "kind": "Goodbye", "worker": "agent-1", "sent_at": 1.0})
    out.append(
        Req(
            "gzip of a valid goodbye for a worker the token does not speak for",
            "POST",
            protocol.GOODBYE_PATH,
            (*auth(AGENTS["agent-0"]), ("Content-Encoding", "gzip")),
            gzip.compress(goodbye),
        )
    )
    out.append(
        Req(
            "deflate bomb-ish",
            "POST",
            protocol.GOODBYE_PATH,
            (*auth(SHARED_TOKEN), ("Content-Encoding", "deflate")),
            b"\x78\x9c" + b"\x00" * 64,
            refuse=True,
        )
    )
    out += [Req(f"raw: {what}", raw=raw, may_drop=True) for what, raw in raw_http_requests()]
    return out


def raw_http_requests() -> list[tuple[str, bytes]]:
    """Requests no HTTP client library would send."""
    goodbye = b'{"version":"1.1","kind":"Goodbye","worker":"agent-0","sent_at":1}'

    def post(headers: bytes, body: bytes = goodbye, path: bytes = b"/v1/goodbye") -> bytes:
        return b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers + b"\r\n" + body

    cl = b"Content-Length: %d\r\n" % len(goodbye)
    return [
        (
            "latin-1 Authorization",
            post(b"Authorization: Bearer \xe9\xff" + SHARED_TOKEN.encode() + b"\r\n" + cl),
        ),
        ("UTF-8 surrogate in Authorization", post(b"Authorization: Bearer \xed\xa0\x80\r\n" + cl)),
        ("NUL in Authorization", post(b"Authorization: Bearer a\x00b\r\n" + cl)),
        (
            "obs-fold Authorization",
            post(b"Authorization: Bearer\r\n " + SHARED_TOKEN.encode() + b"\r\n" + cl),
        ),
        ("negative Content-Length", post(b"Content-Length: -1\r\n")),
        ("non-numeric Content-Length", post(b"Content-Length: abc\r\n")),
        ("two Content-Lengths", post(cl + b"Content-Length: 3\r\n")),
        ("short Content-Length", post(b"Content-Length: 5\r\n")),
        ("huge Content-Length", post(b"Content-Length: 99999999999999999999\r\n")),
        ("CL and chunked", post(cl + b"Transfer-Encoding: chunked\r\n")),
        ("bad chunk", post(b"Transfer-Encoding: chunked\r\n", b"zz\r\nabc\r\n0\r\n\r\n")),
        (
            "chunk size overflow",
            post(b"Transfer-Encoding: chunked\r\n", b"ffffffffffffffffff\r\nab\r\n0\r\n\r\n"),
        ),
        ("header without colon", post(b"Authorization Bearer x\r\n" + cl)),
        ("header name with space", post(b"Auth orization: Bearer x\r\n" + cl)),
        ("huge header", post(b"X-Big: " + b"a" * 100_000 + b"\r\n" + cl)),
        ("many headers", post(b"".join(b"X-%d: y\r\n" % i for i in range(500)) + cl)),
        ("invalid method", b"G\x00T / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        ("lowercase method", b"get /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        ("unknown method", b"BREW /v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        ("HTTP/0.9", b"GET /\r\n\r\n"),
        ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
        ("HTTP/9.9", b"GET / HTTP/9.9\r\nHost: x\r\n\r\n"),
        ("TLS hello", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64),
        ("absolute URI", b"GET http://evil/v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        ("asterisk target", b"OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        ("raw non-ASCII path", b"GET /v1/st\xc3\xa4tus HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        ("raw invalid UTF-8 path", b"GET /\xff\xfe HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        (
            "raw invalid UTF-8 query",
            b"GET /v1/status?after=w:\xed\xa0\x80 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        ),
        ("no Host", b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n"),
        ("only CRLF", b"\r\n\r\n\r\n"),
        ("LF only line ends", b"GET /healthz HTTP/1.1\nHost: x\nConnection: close\n\n"),
        ("pipelined garbage", b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGARBAGE\r\n\r\n"),
    ]


def state_requests() -> list[Req]:
    """Valid traffic from the agents with their own tokens: workers, containers, requests."""
    out: list[Req] = []
    now = time.time()
    for i, (worker, token) in enumerate(sorted(AGENTS.items())):
        containers = [
            ContainerReport(
                id=ContainerId(f"{worker}-job-{j}"),
                category=list(Category)[j % len(Category)],
                t_cc=now - 30 if j % len(Category) == 2 else None,
                job={"model": f"m{j}", "note": "ünïcode ok"},
                requests=Resources(cpu=0.5),
            )
            for j in range(300 if i == 0 else 20)
        ]
        hb = Heartbeat(
            worker=WorkerId(worker),
            address=f"127.0.0.1:{7800 + i}",
            seq=int(now * 1e6) + i,
            sent_at=now,
            capacity=Resources(cpu=16.0, memory=1 << 36),
            usage=0.25 * i,
            containers=tuple(containers),
        )
        out.append(
            Req(
                f"state heartbeat {worker}",
                "POST",
                protocol.HEARTBEAT_PATH,
                auth(token),
                protocol.encode(hb),
                bad=False,
            )
        )
        for c in containers:
            if c.category is Category.CONVERGED:
                req = ReallocationRequest(
                    worker=WorkerId(worker), container=c.id, t_cc=now - 30, g=0.01, sent_at=now
                )
                out.append(
                    Req(
                        f"state request {worker}",
                        "POST",
                        protocol.REQUEST_PATH,
                        auth(token),
                        protocol.encode(req),
                        bad=False,
                    )
                )
        poll = Poll(worker=WorkerId(worker), sent_at=now, wait=0.0)
        out.append(
            Req(
                f"state poll {worker}",
                "POST",
                protocol.POLL_PATH,
                auth(token),
                protocol.encode(poll),
                bad=False,
            )
        )
    bye = Goodbye(worker=WorkerId("agent-2"), sent_at=now)
    out.append(
        Req(
            "state goodbye",
            "POST",
            protocol.GOODBYE_PATH,
            auth(AGENTS["agent-2"]),
            protocol.encode(bye),
            bad=False,
        )
    )
    return out


# --- sending ------------------------------------------------------------------------------


@dataclass
class Outcome:
    req: Req
    status: int | None  # None: no HTTP answer (the server closed the connection)
    body: bytes = b""
    error: str | None = None
    seconds: float = 0.0


async def send_raw(host: str, port: int, req: Req) -> Outcome:
    assert req.raw is not None
    t0 = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(req.raw)
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(65536), RAW_TIMEOUT)
        finally:
            writer.close()
    except (OSError, TimeoutError) as exc:
        return Outcome(req, None, error=f"{type(exc).__name__}: {exc}", seconds=time.perf_counter() - t0)
    match = re.match(rb"HTTP/1\.[01] (\d{3})", answer)
    status = int(match[1]) if match else None
    return Outcome(req, status, answer.partition(b"\r\n\r\n")[2], seconds=time.perf_counter() - t0)


async def send(session: aiohttp.ClientSession, base: str, req: Req) -> Outcome:
    """Send ``req``; once more on a new connection if a kept-alive one was closed under it
    (the server may close a connection after an answer, e.g. to a body it did not read)."""
    t0 = time.perf_counter()
    url = yarl.URL(base + req.path, encoded=True)
    error = ""
    for attempt in range(2):
        # The second try on a connection of its own.
        headers = [*req.headers, ("Connection", "close")] if attempt else list(req.headers)
        try:
            async with session.request(
                req.method,
                url,
                data=req.body if req.method not in ("GET", "HEAD") or req.body else None,
                headers=headers,
                skip_auto_headers=("Content-Type",),
                allow_redirects=False,
            ) as resp:
                body = await resp.read()
                return Outcome(req, resp.status, body, seconds=time.perf_counter() - t0)
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            error = f"{type(exc).__name__}: {exc}"[:300]
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"[:300]
            break
    return Outcome(req, None, error=error, seconds=time.perf_counter() - t0)


async def send_all(base: str, reqs: list[Req], concurrency: int = CONCURRENCY) -> list[Outcome]:
    url = yarl.URL(base)
    host, port = url.host or "127.0.0.1", url.port or 80
    results: list[Outcome | None] = [None] * len(reqs)
    next_index = iter(range(len(reqs)))
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False) as session:

        async def worker() -> None:
            for i in next_index:
                req = reqs[i]
                results[i] = await (
                    send_raw(host, port, req) if req.raw is not None else send(session, base, req)
                )

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return [r for r in results if r is not None]


@dataclass
class Health:
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


async def watch_health(base: str, stop: asyncio.Event, health: Health) -> None:
    """Probe /healthz every HEALTH_EVERY seconds on its own connection until ``stop``."""
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1), timeout=timeout) as session:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                async with session.get(f"{base}/healthz") as resp:
                    await resp.read()
                    if resp.status != 200:
                        health.failures.append(f"/healthz answered {resp.status}")
            except (aiohttp.ClientError, TimeoutError) as exc:
                health.failures.append(f"/healthz: {type(exc).__name__}: {exc}")
            health.latencies.append(time.perf_counter() - t0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), HEALTH_EVERY)


# --- judging ------------------------------------------------------------------------------


def problems_of(outcome: Outcome) -> list[str]:
    """What is wrong with one answer (an empty list: nothing)."""
    req, status = outcome.req, outcome.status
    out: list[str] = []
    if status is None:
        if not req.may_drop:
            out.append(f"no answer ({outcome.error})")
        return out
    if status >= 500:
        out.append(f"{status}: {outcome.body[:200]!r}")
    if req.method == "POST" and req.path in POST_BODIES and 400 <= status < 500:
        try:
            protocol.decode(outcome.body, ErrorReply)
        except protocol.ProtocolError as exc:
            out.append(f"{status} without an ErrorReply ({exc}): {outcome.body[:120]!r}")
    # A 303 is what a login that worked answers (with the session cookie).
    accepted = 200 <= status < 400 and req.raw is None
    if accepted and (req.refuse or (req.message is not None and not schema_valid(req.message, req.value))):
        out.append(f"accepted ({status}) a body the schema refuses")
    return out


# aiohttp logs an unparseable request with a traceback of its parser's exception, and a
# body it cannot decompress when it drains it after the answer (a 5xx from either shows
# as a 5xx); those tracebacks are aiohttp's own, not the manager's.
_PARSER_ERROR = re.compile(r"aiohttp\.(http_exceptions\.|_http_parser\.|web_protocol\.RequestPayloadError)")
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")


def manager_tracebacks(log: str) -> list[str]:
    """The exception each traceback in ``log`` ended with (the last of a chain), numbers
    folded, aiohttp's parser errors left out."""
    found: list[str] = []
    lines = log.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("Traceback (most recent call last)"):
            i += 1
            continue
        while True:  # to the exception line of this traceback, then on through its chain
            i += 1
            while i < len(lines) and (lines[i].startswith((" ", "\t")) or not lines[i].strip()):
                i += 1
            last = lines[i] if i < len(lines) else "?"
            j = i + 1
            while j < len(lines) and (lines[j].startswith(" ") or not lines[j].strip()):
                j += 1  # the exception message's further lines
            if j < len(lines) and lines[j].startswith(_CHAINED):
                i = j + 1
                while i < len(lines) and not lines[i].startswith("Traceback"):
                    i += 1
                continue
            break
        if not _PARSER_ERROR.match(last):
            found.append(re.sub(r"\d+", "N", last)[:300])
        i += 1
    return found


# --- the manager process ------------------------------------------------------------------


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[Running]:
    (tmp_path / "shared").write_text(SHARED_TOKEN + "\n")
    (tmp_path / "read").write_text(READ_TOKEN + "\n")
    (tmp_path / "agents.yaml").write_text("".join(f"{w}: {t}\n" for w, t in AGENTS.items()))
    args = ["--agent-tokens", str(tmp_path / "agents.yaml"), "--token-file", str(tmp_path / "shared")]
    with running_manager(tmp_path, *args, "--read-token-file", str(tmp_path / "read")) as running:
        yield running


@dataclass
class Report:
    outcomes: list[Outcome]
    health: Health
    seconds: float

    def failures(self) -> dict[tuple[str, str], int]:
        """(request shape, problem) -> how many times, the numbers in shapes folded."""
        found: Counter[tuple[str, str]] = Counter()
        for o in self.outcomes:
            for p in problems_of(o):
                found[(o.req.label, re.sub(r"\d{3,}", "N", p)[:200])] += 1
        return dict(found)

    def summary(self) -> str:
        counts = Counter(o.status for o in self.outcomes)
        statuses = {k: counts[k] for k in sorted(counts, key=lambda k: (k is None, k or 0))}
        bad = sum(o.req.bad for o in self.outcomes)
        lat = sorted(self.health.latencies) or [0.0]
        return (
            f"sent {len(self.outcomes)} requests ({bad} bad) in {self.seconds:.1f} s; "
            f"status histogram: {statuses}; "
            f"/healthz x{len(self.health.latencies)}: median {statistics.median(lat) * 1000:.1f} ms, "
            f"p95 {lat[int(0.95 * (len(lat) - 1))] * 1000:.1f} ms, max {lat[-1] * 1000:.1f} ms"
        )


async def fuzz(base: str, reqs: list[Req]) -> Report:
    stop = asyncio.Event()
    health = Health()
    watcher = asyncio.create_task(watch_health(base, stop, health))
    t0 = time.perf_counter()
    outcomes = await send_all(base, reqs)
    seconds = time.perf_counter() - t0
    stop.set()
    await watcher
    return Report(outcomes, health, seconds)


def all_requests() -> list[Req]:
    """State first, then the generated bad requests with valid traffic and the specials
    spread among them, then state again: the same list every run."""
    bad = generate(bad_requests(), N_BAD)
    mixed: list[Req] = []
    valid = valid_requests(N_BAD // 20)
    specials = [*known_poisons(), *special_requests(), *generate(login_requests(), N_LOGIN)]
    extra = [*valid, *specials]
    step = max(len(bad) // max(len(extra), 1), 1)
    for i, req in enumerate(bad):
        mixed.append(req)
        if i % step == 0 and extra:
            mixed.append(extra.pop(0))
    return [*state_requests(), *mixed, *extra, *state_requests()]


async def check_still_serving(base: str) -> list[str]:
    """Status (every page), the page and /metrics answer 200 after the fuzz."""
    problems: list[str] = []
    read = {protocol.AUTH_HEADER: f"Bearer {READ_TOKEN}"}
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        after: str | None = ""
        pages = 0
        while after is not None and pages < 100:
            params = {"limit": "200", "after": after}
            async with session.get(f"{base}{protocol.STATUS_PATH}", params=params, headers=read) as resp:
                body = await resp.read()
                if resp.status != 200:
                    problems.append(
                        f"GET {protocol.STATUS_PATH} after={after!r}: {resp.status} {body[:200]!r}"
                    )
                    break
                try:
                    status = protocol.decode(body, Status)
                except protocol.ProtocolError as exc:
                    problems.append(f"GET {protocol.STATUS_PATH} after={after!r}: not a Status: {exc}")
                    break
            async with session.get(f"{base}/", params=params, headers=read) as resp:
                if resp.status != 200 or "text/html" not in resp.headers.get("Content-Type", ""):
                    problems.append(f"GET / after={after!r}: {resp.status} {(await resp.read())[:200]!r}")
            after = status.next
            pages += 1
        for path, headers in (("/", read), (protocol.STATUS_PATH, read), ("/metrics", {}), ("/healthz", {})):
            async with session.get(f"{base}{path}", headers=headers) as resp:
                if resp.status != 200:
                    problems.append(f"GET {path}: {resp.status} {(await resp.read())[:200]!r}")
        problems += await check_browser_login(session, base)
    return problems


async def check_browser_login(session: aiohttp.ClientSession, base: str) -> list[str]:
    """A browser still logs in with the read token, reads the page by cookie, and logs out."""
    form = {"Content-Type": LOGIN_FORM_TYPE}
    async with session.post(
        f"{base}/login", data=f"token={READ_TOKEN}", headers=form, allow_redirects=False
    ) as resp:
        cookie = resp.cookies.get("specon_session")
        if resp.status != 303 or cookie is None:
            return [f"POST /login with the read token: {resp.status} {(await resp.read())[:200]!r}"]
    sent = {"Cookie": f"specon_session={cookie.value}", "Accept": "text/html"}
    async with session.get(f"{base}/", headers=sent) as resp:
        if resp.status != 200 or 'action="/logout"' not in await resp.text():
            return [f"GET / with the session cookie: {resp.status}"]
    async with session.post(f"{base}/logout", headers=sent, allow_redirects=False) as resp:
        if resp.status != 303:
            return [f"POST /logout: {resp.status}"]
    async with session.get(f"{base}{protocol.STATUS_PATH}", headers=sent) as resp:
        return [] if resp.status == 401 else [f"GET {protocol.STATUS_PATH} after logout: {resp.status}"]


def test_fuzz_the_manager_from_its_openapi_document(manager: Running) -> None:
    t0 = time.perf_counter()
    reqs = all_requests()
    generated = time.perf_counter() - t0
    n_bad = sum(r.bad for r in reqs)
    assert n_bad >= N_BAD

    async def run() -> tuple[Report, list[str]]:
        async with aiohttp.ClientSession() as session:
            await wait_healthy(manager, session)
        report = await fuzz(manager.url, reqs)
        return report, await check_still_serving(manager.url)

    report, after = asyncio.run(run())
    alive = manager.proc.poll() is None
    manager.proc.send_signal(signal.SIGTERM)
    code = manager.proc.wait(30)
    log = manager.log.read_text(errors="replace")

    print(f"generated {len(reqs)} requests in {generated:.1f} s")
    print(report.summary())
    failures = report.failures()
    listed = "\n".join(f"  {n:5d} x {label} -> {problem}" for (label, problem), n in sorted(failures.items()))
    tracebacks = Counter(manager_tracebacks(log))
    tb_listed = "\n".join(f"  {n:5d} x {line}" for line, n in tracebacks.most_common())
    assert alive, f"the manager died during the fuzz:\n{log[-3000:]}"
    assert not failures, f"{sum(failures.values())} bad answers:\n{listed}\nmanager tracebacks:\n{tb_listed}"
    assert not report.health.failures, report.health.failures[:20]
    # Over HEALTH_BOUND twice in a row: the manager's loop is held up. Once, among hundreds of
    # probes: as likely the machine (2 shared cores, this process's own loop probing too).
    lat = report.health.latencies
    assert max(lat) < HEALTH_MAX, report.summary()
    assert not any(min(pair) >= HEALTH_BOUND for pair in itertools.pairwise(lat)), report.summary()
    assert len(report.health.latencies) >= 5
    assert not after, after
    assert not tracebacks, f"the manager logged tracebacks:\n{tb_listed}"
    assert "tick_failed" not in log
    assert code == 0, log[-3000:]
