"""The OpenAPI document: generated from the protocol, committed, routed, and in step with the decoder."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import Counter
from specon_manager import standby
from specon_manager.admission import PodAdmission
from specon_manager.app import create_app
from specon_manager.auth import Identity
from specon_manager.journal import Journal
from specon_manager.openapi import ENVELOPED, ID_PATTERN, ID_TYPES, main, openapi_document, openapi_json
from specon_manager.shell import ManagerShell

from specon.config import default_policy
from specon.wire import codec, protocol
from specon.wire.limits import Finite, Id, Items, Labels, Range, Taints, Text, limit_of
from specon.wire.pod_writes import PodWriteReply, PodWriteRequest
from specon.wire.status import Status
from specon.wire.validate import is_valid_id
from tests.strategies import Leaves, from_type

DOCUMENT = Path(__file__).resolve().parents[3] / "docs" / "openapi.json"
REGENERATE = "python -m specon_manager.openapi > docs/openapi.json"
TOKEN = "openapi-test-token-" + "0" * 32


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from refs(item)


def python_flavoured(node: Any) -> Any:
    """``node`` with each ``pattern`` as ECMA-262 means it, for jsonschema (which uses Python's
    ``re``, where a final ``$`` also matches before a final newline: ``^a$`` matches ``"a\\n"``)."""
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


def validator(doc: dict[str, Any], name: str) -> jsonschema.Draft202012Validator:
    components = python_flavoured(doc["components"])
    return jsonschema.Draft202012Validator({"$ref": f"#/components/schemas/{name}", "components": components})


def test_the_committed_document_is_the_generated_one() -> None:
    assert DOCUMENT.exists(), f"docs/openapi.json is missing: {REGENERATE}"
    assert DOCUMENT.read_bytes() == openapi_json(), f"docs/openapi.json is stale: {REGENERATE}"


def test_python_m_manager_openapi_prints_the_document(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    assert main() == 0
    printed = capsysbinary.readouterr().out
    assert printed == openapi_json()
    assert json.loads(printed) == openapi_document()


def test_each_call_gives_a_fresh_copy() -> None:
    doc = openapi_document()
    doc["paths"].clear()
    assert openapi_document()["paths"]


def test_the_document_is_openapi_3_1_with_valid_schemas_and_no_dangling_refs() -> None:
    doc = openapi_document()
    assert doc["openapi"].startswith("3.1.")
    assert doc["info"]["version"] == protocol.VERSION
    assert doc["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "description": doc["components"]["securitySchemes"]["bearerAuth"]["description"],
    }
    for schema in doc["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)
    for ref in set(refs(doc)):
        section, _, name = ref.removeprefix("#/components/").partition("/")
        assert name in doc["components"][section], ref
    for path, item in doc["paths"].items():
        for method, op in item.items():
            assert op["responses"], (method, path)
            # A protocol POST (the browser's /login and /logout are form POSTs, not messages; the
            # API server's admission reviews come without a credential: security []).
            content = op.get("requestBody", {}).get("content", {})
            if method == "post" and protocol.CONTENT_TYPE in content and op.get("security") != []:
                codes = set(op["responses"])
                assert {"400", "401", "403", "413"} <= codes and codes & {"200", "202"}, path
                assert op["security"] == [{"bearerAuth": []}]


def test_every_message_field_is_in_its_schema_once() -> None:
    schemas = openapi_document()["components"]["schemas"]
    for cls in protocol.MESSAGE_TYPES:
        schema = schemas[cls.__name__]
        envelope = ["version", "kind"] if cls in ENVELOPED else []
        fields = [f.metadata.get("key", f.name) for f in dataclasses.fields(cls)]
        assert list(schema["properties"]) == [*envelope, *fields], cls.__name__
        assert schema["additionalProperties"] is False
        if envelope:
            assert schema["properties"]["kind"]["const"] == cls.__name__


class _Broker:
    """A pod broker that is never asked: only its route matters here."""

    collector = Counter("specon_test_pod_writes", "unused", registry=None)

    async def write(self, who: Identity, req: PodWriteRequest) -> PodWriteReply:
        raise AssertionError("not called")


def test_the_endpoints_are_the_ones_the_manager_routes(tmp_path: Path) -> None:
    sh = ManagerShell(policy=default_policy(), journal=Journal(tmp_path / "journal.db"))
    # As with --manage-pods: the pod broker and the admission webhook.
    admission = PodAdmission(sh, "specon.io/managed=true")
    app = create_app(sh, token=TOKEN, tick=False, pod_broker=_Broker(), extensions=[admission])
    standby.install(app, sh)  # /readyz, as the daemon adds it
    routed = {
        (route.method.lower(), route.resource.canonical)
        for route in app.router.routes()
        if route.resource is not None and route.method != "HEAD"
    }
    documented = {(method, path) for path, item in openapi_document()["paths"].items() for method in item}
    assert routed == documented


async def test_the_manager_serves_this_document(tmp_path: Path) -> None:
    sh = ManagerShell(policy=default_policy(), journal=Journal(tmp_path / "journal.db"))
    async with TestClient(TestServer(create_app(sh, token=TOKEN, tick=False))) as client:
        resp = await client.get("/openapi.json")
        assert resp.status == 200
        assert resp.content_type == "application/json"
        assert await resp.json() == openapi_document()


@pytest.mark.parametrize(
    "value",
    [
        "job-1",
        "a",
        "A.b_c-9",
        "a" * 253,
        "0",
        "job-1\n",
        "\ud800",
        "../x",
        "..",
        ".",
        "",
        "a" * 254,
        "-a",
        "a b",
    ],
)
def test_the_id_pattern_is_the_id_rule(value: str) -> None:
    schemas = openapi_document()["components"]["schemas"]
    for name in ID_TYPES:
        assert schemas[name]["pattern"] == ID_PATTERN
    # ECMA ``$`` matches only at the end; Python's before a final newline too, hence \Z.
    pattern = ID_PATTERN.removesuffix("$") + r"\Z"
    assert (re.match(pattern, value) is not None) == is_valid_id(value)


@given(st.text(max_size=12))
def test_the_id_pattern_is_the_id_rule_for_any_text(value: str) -> None:
    pattern = ID_PATTERN.removesuffix("$") + r"\Z"
    assert (re.match(pattern, value) is not None) == is_valid_id(value)


def test_every_declared_limit_is_stated_by_the_document() -> None:
    """The limits are declared once, on the protocol's fields; the document carries each one."""
    schemas = openapi_document()["components"]["schemas"]
    stated = 0
    for name, schema in schemas.items():
        cls = getattr(protocol, name, None)  # Resources too: the protocol imports it
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            continue
        for f in dataclasses.fields(cls):
            rule = limit_of(cls, f)
            prop = schema["properties"][codec.wire_key(f)]
            prop = prop["anyOf"][0] if "anyOf" in prop else prop  # the non-null branch
            match rule:
                case None | Finite():
                    continue
                case Id():
                    assert prop["$ref"].rsplit("/", 1)[1] in ID_TYPES, (name, f.name)
                case Range(lo, hi):
                    assert (prop["minimum"], prop["maximum"]) == (lo, hi), (name, f.name)
                case Text(n):
                    assert prop["maxLength"] == n, (name, f.name)
                case Labels(count, key, value):
                    assert prop["maxProperties"] == count and prop["propertyNames"]["maxLength"] == key
                    assert prop["propertyNames"]["$ref"].endswith("/PrintableText")
                    assert prop["additionalProperties"]["maxLength"] == value
                case Taints(count, length):
                    assert prop["maxItems"] == count and prop["items"]["maxLength"] == length
                    assert prop["items"]["$ref"].endswith("/PrintableText")
                case Items(max_items, unique):
                    assert max_items is None or prop["maxItems"] == max_items
                    assert unique is None or f"Each {unique} at most once" in prop["description"]
            stated += 1
    assert stated >= 30


# --- the schema and the decoder agree ------------------------------------------------------

IDS = st.sampled_from(
    ["job-1", "w", "A.b_c-9", "a" * 253, "a" * 254, "job-1\n", "../x", "", ".", "x y", "-x"]
)
EDGE_FLOATS = [0.0, -0.0, 1e-9, -1e-9, 0.5, 1.0, 1.0000001, 3600.0, 3600.5, 1e6, 1000000.5, 9e9, 9.0000001e9]
EDGE_INTS = [0, 1, -1, 10**6, 10**6 + 1, 2**60, 2**60 + 1, 2**63 - 1, 2**63]
TEXTS = st.text(st.characters(codec="utf-8"), max_size=6) | st.sampled_from(
    ["x" * 512, "x" * 513, "x" * 4096, "x" * 4097, "k" * 317, "k" * 318, "v" * 1025, "\x00", "\n"]
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | TEXTS,
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(TEXTS, inner, max_size=2),
    max_leaves=4,
)
# Rules the decoder keeps that JSON Schema cannot state: unique ids, and printable text beyond
# the Basic Multilingual Plane (``PrintableText``).
UNSAYABLE = ("reported twice",)


def _astral_unprintable(node: Any) -> bool:
    """Whether a text in ``node`` (a decoded JSON value, keys too) holds a character past the
    BMP that is not printable: the one part of the printable rule the schema does not state."""
    if isinstance(node, str):
        return any(ord(c) > 0xFFFF and not c.isprintable() for c in node)
    if isinstance(node, list):
        return any(map(_astral_unprintable, node))
    if isinstance(node, dict):
        return any(_astral_unprintable(k) or _astral_unprintable(v) for k, v in node.items())
    return False


# Values near and past the range rules' edges.
LEAVES = Leaves(
    ids=lambda tp: IDS if tp.__name__ in ID_TYPES else from_type(tp.__supertype__, LEAVES),
    ints=st.sampled_from(EDGE_INTS) | st.integers(-5, 10**7),
    floats=st.sampled_from([-x for x in EDGE_FLOATS] + EDGE_FLOATS)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.integers(-5, 5),
    texts=TEXTS,
    anything=JSON,
    tuples=lambda inner, _tp: st.lists(inner, max_size=2).map(tuple),
    mappings=lambda inner: st.dictionaries(TEXTS, inner, max_size=2),
)


def values(tp: Any) -> st.SearchStrategy[Any]:
    return from_type(tp, LEAVES)


CHECKED = (
    protocol.Heartbeat,
    protocol.ReallocationRequest,
    protocol.Poll,
    protocol.Goodbye,
    protocol.CommandBatch,
)
DOC = openapi_document()
VALIDATORS = {cls: validator(DOC, cls.__name__) for cls in CHECKED}


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CHECKED).flatmap(values))
def test_the_schema_refuses_exactly_what_the_decoder_refuses(msg: Any) -> None:
    try:
        wire = protocol.encode(msg)
    except protocol.ProtocolError:
        return  # not even writable (e.g. a float that JSON cannot hold)
    schema_ok = VALIDATORS[type(msg)].is_valid(json.loads(wire))
    try:
        protocol.decode(wire, type(msg))
    except protocol.ProtocolError as exc:
        unsayable = any(rule in str(exc) for rule in UNSAYABLE) or (
            "printable" in str(exc) and _astral_unprintable(json.loads(wire))
        )
        assert not schema_ok or unsayable, f"the schema accepts: {exc}"
    else:
        errors = [e.message for e in VALIDATORS[type(msg)].iter_errors(json.loads(wire))]
        assert schema_ok, f"the decoder accepts what the schema refuses: {errors[:3]}"


def test_printable_text_is_stated_for_every_character_of_the_bmp() -> None:
    """``PrintableText`` refuses exactly what ``str.isprintable`` refuses, one character at a
    time, over the whole Basic Multilingual Plane (surrogates aside: no JSON text holds one)."""
    schema = openapi_document()["components"]["schemas"]["PrintableText"]
    refused = re.compile(schema["not"]["pattern"])
    for code in range(0x10000):
        if 0xD800 <= code <= 0xDFFF:
            continue
        c = chr(code)
        assert (refused.search(c) is None) == c.isprintable(), hex(code)
    valid = jsonschema.Draft202012Validator(schema)
    assert valid.is_valid("topology.kubernetes.io/zone=a:NoSchedule") and valid.is_valid("z\U0001f600")
    assert not valid.is_valid("zone\n") and not valid.is_valid("a\u200bb") and not valid.is_valid("\x7f")


def test_protocol_messages_validate_against_their_schemas() -> None:
    """The status and error replies the manager writes fit their documented shapes."""
    doc = openapi_document()
    status = Status(now=1.0, mode="default", policy_generation=1, next="w:a")
    assert validator(doc, "Status").is_valid(json.loads(protocol.encode(status)))
    error = protocol.ErrorReply(error="no", path="worker")
    assert validator(doc, "ErrorReply").is_valid(json.loads(protocol.encode(error)))
    assert not validator(doc, "ErrorReply").is_valid({"version": protocol.VERSION, "kind": "ErrorReply"})


def test_healthz_matches_its_schema() -> None:
    schema = openapi_document()["components"]["schemas"]["Health"]
    jsonschema.validate({"ok": True, "uptime": 1.5, "in_flight": 0}, schema)
