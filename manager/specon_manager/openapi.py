"""The manager's HTTP API as an OpenAPI 3.1 document, generated from ``specon.wire.protocol``.

Nothing here names a message field or states a protocol limit: the schemas are walked from
the protocol's type hints and declared limits (``specon_manager.openapi_schemas``); this module
adds the endpoints around them: paths, security, the error replies.

``openapi_document()`` is the document (built once); ``python -m specon_manager.openapi`` prints
it, which is how ``docs/openapi.json`` is regenerated::

    python -m specon_manager.openapi > docs/openapi.json

A test checks that the committed file equals the generated one.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import sys
from typing import Any

from specon.runtime.kubernetes.admission import WEBHOOK_PATH
from specon.wire import protocol
from specon.wire.operator import DRAIN_PATH, UNCORDON_PATH, DrainReply, DrainRequest
from specon.wire.pod_writes import POD_WRITES_PATH, PodWriteReply, PodWriteRequest
from specon.wire.protocol import CommandBatch, ErrorReply, Goodbye, Heartbeat, Poll, ReallocationRequest
from specon.wire.status import Status
from specon_manager.login import COOKIE, FORM_TYPE, MAX_TOKEN_LENGTH, SECURE_COOKIE
from specon_manager.openapi_schemas import ENVELOPED, ID_PATTERN, ID_TYPES, SchemaBuilder, ref
from specon_manager.page import LOGIN_PATH, LOGOUT_PATH
from specon_manager.status import DEFAULT_LIMIT, MAX_LIMIT

# The schema walker's names the tests use, from here as before.
__all__ = [
    "ENVELOPED",
    "ID_PATTERN",
    "ID_TYPES",
    "main",
    "openapi_document",
    "openapi_json",
]

OPENAPI_VERSION = "3.1.0"
JSON_SCHEMA_DIALECT = "https://spec.openapis.org/oas/3.1/dialect/base"
# --- the document -----------------------------------------------------------------------


def _error_response(description: str) -> dict[str, Any]:
    return {"description": description, "content": {protocol.CONTENT_TYPE: {"schema": ref("ErrorReply")}}}


_ERRORS = {
    "400": (
        "BadRequest",
        "Not a valid message: not UTF-8 JSON, wrong kind or version, a missing or "
        "mistyped field, or a value out of range. The ErrorReply names the field.",
    ),
    "401": ("Unauthorized", "No bearer token, or one the manager does not know."),
    "403": (
        "Forbidden",
        "The token may not do this: it speaks for another worker, the container is not "
        "the worker's, the token is read-only, or only the operator token may do this.",
    ),
    "404": ("NotFound", "No worker of that id has been heard from."),
    "413": ("TooLarge", "The body is over the policy's messaging.max_body_bytes."),
}


def _error_refs(*codes: str) -> dict[str, Any]:
    return {code: {"$ref": f"#/components/responses/{_ERRORS[code][0]}"} for code in codes}


def _post(b: SchemaBuilder, cls: type[Any], summary: str, description: str) -> dict[str, Any]:
    return {
        "post": {
            "operationId": cls.__name__[0].lower() + cls.__name__[1:],
            "summary": summary,
            "description": description,
            "security": [{"bearerAuth": []}],
            "requestBody": {
                "required": True,
                "content": {protocol.CONTENT_TYPE: {"schema": b.message(cls)}},
            },
            "responses": {
                "200": {
                    "description": "The commands for this worker (possibly none).",
                    "content": {protocol.CONTENT_TYPE: {"schema": b.message(CommandBatch)}},
                },
                **_error_refs("400", "401", "403", "413"),
            },
        }
    }


_PAGE_PARAMETERS: list[dict[str, Any]] = [
    {
        "name": "limit",
        "in": "query",
        "required": False,
        "description": "Entries on this page (workers, then containers, then migrations).",
        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT},
    },
    {
        "name": "after",
        "in": "query",
        "required": False,
        "description": "The cursor of the page to read: the previous page's Status.next "
        "(w:<worker id>, c:<container id> or m:<n>); empty or absent for the first page.",
        "schema": {"type": "string", "maxLength": 300, "pattern": "^((w|c):.*|m:[0-9]+)?$"},
    },
]
_READ_SECURITY: list[dict[str, list[str]]] = [{}, {"bearerAuth": []}, {"sessionCookie": []}]
_READ_NOTE = (
    " Open unless the manager runs with a read token, then it needs the read token or the shared one"
    f" as a bearer token, or a browser's session cookie from POST {LOGIN_PATH}."
)
_HTML: dict[str, Any] = {"text/html": {"schema": {"type": "string"}}}
_LOGIN_FORM = "The login form (HTML) again, with a message saying why."
_SEE_PAGE: dict[str, Any] = {
    "Location": {"description": "/ (the status page).", "schema": {"type": "string", "const": "/"}}
}
_NO_LOGIN = _error_response("No read token is configured: the status page is open and has no login.")


def _session_post(operation: str, summary: str, description: str, done: str) -> dict[str, Any]:
    """/login or /logout: a form POST from the browser, answered with a redirect to the page."""
    op: dict[str, Any] = {
        "operationId": operation,
        "summary": summary,
        "description": description
        + " Refused (403) when Sec-Fetch-Site says another site sent it, or its Origin names another "
        "host than its Host.",
        "security": [{}],
        "responses": {
            "303": {"description": done, "headers": {**_SEE_PAGE}},
            "403": {"description": _LOGIN_FORM, "content": _HTML},
            "404": _NO_LOGIN,
        },
    }
    return {"post": op}


def _login() -> dict[str, Any]:
    item = _session_post(
        "login",
        "Log a browser in to the status page",
        "The form the status page shows a browser without a credential. The token is checked as a "
        "bearer token is; only the read token or the shared token may log in. Sets the session cookie: "
        "HttpOnly, SameSite=Strict, Path=/, Secure over HTTPS, for SPECON_MANAGER_SESSION_TTL seconds.",
        "Logged in: Set-Cookie holds the session's random id (never the token); see the page.",
    )
    op = item["post"]
    op["requestBody"] = {
        "required": True,
        "content": {
            FORM_TYPE: {
                "schema": {
                    "type": "object",
                    "properties": {
                        "token": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": MAX_TOKEN_LENGTH,
                            "description": "The read token or the shared token (ASCII).",
                        }
                    },
                    "required": ["token"],
                }
            }
        },
    }
    op["responses"]["303"]["headers"]["Set-Cookie"] = {
        "description": f"{COOKIE}=<session id>; HttpOnly; SameSite=Strict; Path=/; Max-Age=<ttl>.",
        "schema": {"type": "string"},
    }
    op["responses"].update(
        {
            "401": {"description": 'The login form (HTML) again, saying "wrong token".', "content": _HTML},
            **_error_refs("413"),
        }
    )
    op["responses"] = dict(sorted(op["responses"].items()))
    order = ("operationId", "summary", "description", "security", "requestBody", "responses")
    return {"post": {key: op[key] for key in order}}


_WORKER_PARAMETER: dict[str, Any] = {
    "name": "worker",
    "in": "path",
    "required": True,
    "description": "The worker's id, as the status shows it.",
    "schema": {"type": "string"},
}


def _drain_answer(b: SchemaBuilder, description: str) -> dict[str, Any]:
    return {"description": description, "content": {protocol.CONTENT_TYPE: {"schema": b.of(DrainReply)}}}


def _drain(b: SchemaBuilder) -> dict[str, Any]:
    return {
        "post": {
            "operationId": "drain",
            "parameters": [_WORKER_PARAMETER],
            "summary": "Drain a worker: no new jobs, and each of its jobs moved off with a fresh checkpoint",
            "description": "The operator token only. A deadline (seconds) bounds each save; a save cut "
            "short restores the job from its newest complete checkpoint (the move's lost_steps).",
            "security": [{"bearerAuth": []}],
            "requestBody": {
                "required": False,
                "content": {protocol.CONTENT_TYPE: {"schema": b.of(DrainRequest)}},
            },
            "responses": {
                "202": _drain_answer(b, "Cordoned: the jobs still on it and its moves so far."),
                **_error_refs("400", "401", "403", "404", "413"),
            },
        },
        "get": {
            "operationId": "drainStatus",
            "parameters": [_WORKER_PARAMETER],
            "summary": "A worker's drain: cordoned or not, the jobs still on it, its moves",
            "description": "Read like the status." + _READ_NOTE,
            "security": _READ_SECURITY,
            "responses": {
                "200": _drain_answer(b, "The worker's drain."),
                **_error_refs("400", "401", "403", "404"),
            },
        },
    }


@functools.cache
def _build() -> dict[str, Any]:
    b = SchemaBuilder()
    paths: dict[str, Any] = {
        protocol.HEARTBEAT_PATH: _post(
            b,
            Heartbeat,
            "An agent's heartbeat",
            "Every heartbeat_interval seconds. Answered with the commands for this worker; ack is the "
            "heartbeat's seq.",
        ),
        protocol.REQUEST_PATH: _post(
            b,
            ReallocationRequest,
            "A converged container asks to move",
            "Sent at once when a container in CC slows further (Algorithm 2).",
        ),
        protocol.POLL_PATH: _post(
            b,
            Poll,
            "Wait for commands (long poll)",
            "Answered as soon as the manager has a command for this worker, or after wait seconds.",
        ),
        protocol.GOODBYE_PATH: _post(
            b, Goodbye, "An agent leaves cleanly", "The manager stops waiting for this worker's heartbeats."
        ),
        DRAIN_PATH: _drain(b),
        UNCORDON_PATH: {
            "post": {
                "operationId": "uncordon",
                "parameters": [_WORKER_PARAMETER],
                "summary": "Let a drained worker take jobs again",
                "description": "Moves already under way go on. The operator token only.",
                "security": [{"bearerAuth": []}],
                "responses": {
                    "200": _drain_answer(b, "The worker's drain, now uncordoned."),
                    **_error_refs("400", "401", "403", "404"),
                },
            },
        },
        POD_WRITES_PATH: {
            "post": {
                "operationId": "podWrite",
                "summary": "A Kubernetes agent asks for a write on its node's managed pods",
                "description": "Served with --manage-pods (404 otherwise). Made with the manager's identity "
                "only while the manager's own save (evict), start (create) or stop (delete of a running "
                "pod) of that job on that worker is pending, and only on a managed pod of that job bound "
                "to that node. A refusal is a 200 whose outcome names the runtime failure.",
                "security": [{"bearerAuth": []}],
                "requestBody": {
                    "required": True,
                    "content": {protocol.CONTENT_TYPE: {"schema": b.of(PodWriteRequest)}},
                },
                "responses": {
                    "200": {
                        "description": "Done, or why not (outcome).",
                        "content": {protocol.CONTENT_TYPE: {"schema": b.of(PodWriteReply)}},
                    },
                    **_error_refs("400", "401", "403", "404", "413"),
                },
            },
        },
        WEBHOOK_PATH: {
            "post": {
                "operationId": "admitPod",
                "summary": "The API server asks where a managed pod it creates should be scheduled",
                "description": "Served with --manage-pods (404 otherwise); called by kube-apiserver as a "
                "mutating admission webhook (components/webhook), without a credential. Always allows the "
                "pod; the answer's JSON Patch adds only node affinities: required, to the move's current "
                "target, for a pod of a job being moved; preferred, to Algorithm 2's best nodes, for any "
                "other managed pod. See docs/kubernetes.md.",
                "security": [],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "description": "An admission.k8s.io/v1 AdmissionReview of a Pod.",
                                "required": ["apiVersion", "kind", "request"],
                            }
                        }
                    },
                },
                "responses": {
                    "200": {
                        "description": "The AdmissionReview's response: allowed, with a JSONPatch or none.",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    },
                    "400": {
                        "description": "Not an admission.k8s.io/v1 AdmissionReview of a pod.",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    },
                    **_error_refs("413"),
                },
            },
        },
        protocol.STATUS_PATH: {
            "get": {
                "operationId": "status",
                "summary": "The cluster as the manager sees it, paged",
                "description": "Workers, then containers, then migrations, each by id; follow Status.next."
                + _READ_NOTE,
                "security": _READ_SECURITY,
                "parameters": _PAGE_PARAMETERS,
                "responses": {
                    "200": {
                        "description": "One page of the cluster's status.",
                        "content": {protocol.CONTENT_TYPE: {"schema": b.message(Status)}},
                    },
                    **_error_refs("400", "401", "403"),
                },
            }
        },
        "/": {
            "get": {
                "operationId": "statusPage",
                "summary": "The status page (HTML), paged like /v1/status",
                "description": "A human-readable rendering of one status page." + _READ_NOTE,
                "security": _READ_SECURITY,
                "parameters": _PAGE_PARAMETERS,
                "responses": {
                    "200": {
                        "description": "The page.",
                        "content": {"text/html": {"schema": {"type": "string"}}},
                    },
                    "401": {
                        "description": "No credential, or a wrong one. A browser (Accept: text/html) "
                        "without a bearer token gets the login form (HTML); anything else an ErrorReply.",
                        "content": {**_HTML, **_error_response("")["content"]},
                    },
                    **_error_refs("400", "403"),
                },
            }
        },
        LOGIN_PATH: _login(),
        LOGOUT_PATH: _session_post(
            "logout",
            "Log a browser out",
            "Ends the session the cookie names and clears the cookie.",
            "Logged out: the cookie is cleared; / shows the login form again.",
        ),
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics",
                "security": [{}],
                "responses": {
                    "200": {
                        "description": "The Prometheus text exposition format.",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        "/healthz": {
            "get": {
                "operationId": "healthz",
                "summary": "Liveness",
                "security": [{}],
                "responses": {
                    "200": {
                        "description": "The manager serves.",
                        "content": {protocol.CONTENT_TYPE: {"schema": ref("Health")}},
                    }
                },
            }
        },
        "/readyz": {
            "get": {
                "operationId": "readyz",
                "summary": "Readiness: whether this replica leads",
                "description": "200 while this manager leads (always, without --leader-elect); 503 on a "
                "standby, so a Kubernetes Service routes agents to the leader only. The body says the "
                'role and, on a standby, the leader\'s identity ("" while unknown).',
                "security": [{}],
                "responses": {
                    "200": {
                        "description": 'This replica leads: {"ready": true, "role": "leader"}.',
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    },
                    "503": {
                        "description": 'A standby: {"ready": false, "role": "standby", '
                        '"leader": "<identity>"}.',
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    },
                },
            }
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document",
                "security": [{}],
                "responses": {
                    "200": {
                        "description": "The OpenAPI document of this API.",
                        "content": {protocol.CONTENT_TYPE: {"schema": {"type": "object"}}},
                    }
                },
            }
        },
    }
    b.message(ErrorReply)
    if unused := b.unused_rules():
        raise TypeError(f"openapi: range rules for fields no message has: {', '.join(unused)}")
    schemas = dict(sorted(b.schemas.items()))
    schemas["Health"] = {
        "title": "Health",
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "uptime": {"type": "number", "description": "Seconds since the manager started."},
            "in_flight": {"type": "integer", "minimum": 0, "description": "Migrations in flight."},
        },
        "required": ["ok"],
    }
    doc = inspect.cleandoc(protocol.__doc__ or "")
    return {
        "openapi": OPENAPI_VERSION,
        "jsonSchemaDialect": JSON_SCHEMA_DIALECT,
        "info": {
            "title": "specon manager",
            "version": protocol.VERSION,
            "description": doc,
        },
        "servers": [{"url": "http://127.0.0.1:7700", "description": "specon-manager's default --listen"}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "responses": {
                name: _error_response(description)
                for name, description in (_ERRORS[c] for c in sorted(_ERRORS))
            },
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A per-agent token (speaks for its own worker only), the shared token "
                    "(every worker) or the read token (status and page only).",
                },
                "sessionCookie": {
                    "type": "apiKey",
                    "in": "cookie",
                    "name": COOKIE,
                    "description": f"A browser's session, from POST {LOGIN_PATH} (named {SECURE_COOKIE} "
                    "over HTTPS). Reads only: GET / and GET /v1/status.",
                },
            },
        },
        "security": [{"bearerAuth": []}],
    }


def openapi_document() -> dict[str, Any]:
    """The manager's API as an OpenAPI 3.1 document (a fresh copy; built once)."""
    return copy.deepcopy(_build())


@functools.cache
def openapi_json() -> bytes:
    """The document as the bytes ``GET /openapi.json`` and ``docs/openapi.json`` hold."""
    return (json.dumps(_build(), indent=2, ensure_ascii=False) + "\n").encode()


def main() -> int:
    sys.stdout.buffer.write(openapi_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
