"""The OpenAPI document: the contract chat applications generate clients from.

Routes declare their bodies, answers and the errors only they give (``errors(404, 409)``);
``build_openapi`` adds what every operation shares, from where the request goes through:

* the edge (``services.api.middleware``) answers every ``/v1`` request 401, 429, 503 or 504
  in admission, 400 for a bad deadline header, and every body 400, 413 or 415;
* validation failures are **400** with the project's error body, everywhere (FastAPI's 422
  is never sent, so it is never documented);
* 429 and 503 always carry ``Retry-After``, 504 may;
* security: ``/v1`` takes a bearer API key, ``/healthz`` and ``/metrics`` nothing;
* ``/peer`` is left out: the client listener, which serves this document, answers every
  ``/peer`` path 404 (other nodes reach them on the peer listener, behind its own gate:
  ``services.bootstrap.listener_gates``), so listing them would document operations it never serves;
* links from a created conversation to its operations (and from a tool attempt to its status),
  so generators and stateful testers follow real data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Body, FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute

from services.api.errors import ERROR_CODES
from services.api.event_bodies import examples_by_type
from services.api.forwarding import DEADLINE_HEADER
from services.api.schemas import ErrorBody

CHAT_APPS, OPERATORS = "chat applications", "operators"
TAGS = [
    {
        "name": CHAT_APPS,
        "description": (
            "conversations, events, transcripts, tool attempts, "
            "routing: what a chat application (a `tenant` key) calls"
        ),
    },
    {
        "name": OPERATORS,
        "description": (
            "regions, placement, evacuate/restore, replay, health "
            "and metrics: what SREs and their tools call"
        ),
    },
]
SECURITY_SCHEMES = {
    "apiKey": {
        "type": "http",
        "scheme": "bearer",
        "description": "`Authorization: Bearer <api key>`. A key has a role: `tenant` (chat "
        "applications: its own conversations only; another tenant's are 404), `operator` "
        "(drills, evacuate/restore, replay, keys) or `viewer` (read-only), and an operation "
        "refuses a key whose role it does not take. The replay service key reads transcripts "
        "on behalf of the tenant named in `X-Convplane-Tenant`.",
    },
}
_STATUS_TEXT = {
    400: "invalid request",
    401: "missing or unknown credentials",
    403: "the key's role does not take this operation",
    404: "not found",
    409: "conflict with the conversation's state",
    413: "body too large",
    415: "body is not JSON",
    429: "tenant over its quota",
    503: "unavailable; retryable (an append's outcome is unknown: retry with the same key)",
    504: "deadline exceeded; retryable (an append's outcome is unknown)",
}
_RETRY_AFTER = {
    "description": "seconds to wait before retrying",
    "schema": {"type": "integer", "minimum": 1},
}
_EDGE_STATUSES = (400, 401, 403, 429, 503, 504)
_BODY_STATUSES = (413, 415)
_DEADLINE_PARAMETER = {
    "name": DEADLINE_HEADER,
    "in": "header",
    "required": False,
    "description": "the request's deadline in milliseconds (default 10000, capped by the node); "
    "forwards carry what is left of it (one that already passed is answered 504)",
    "schema": {"type": "integer", "minimum": 1, "maximum": 10**12 - 1},
    "example": 10000,
}
_CREATED_ID = {"conversation_id": "$response.body#/conversation_id"}
_LINKS = {
    "create_conversation": (
        "201",
        {
            op: {"operationId": op, "parameters": _CREATED_ID}
            for op in (
                "get_conversation",
                "append_event",
                "list_events",
                "get_route",
                "get_affinity",
            )
        },
    ),
    "append_event": (
        "201",
        {
            "tool_attempt": {
                "operationId": "tool_attempt",
                "parameters": {
                    "conversation_id": "$request.path.conversation_id",
                    "attempt_id": "$request.body#/payload/attempt_id",
                },
            }
        },
    ),
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of errors an operation gives beyond those every operation shares."""
    return {s: {"model": ErrorBody, "description": _describe(s)} for s in statuses}


def event_body() -> Any:
    """The append body: discriminated by ``type``, with one example per event type."""
    return Body(discriminator="type", openapi_examples=examples_by_type())


def operation_id(route: APIRoute) -> str:
    """Operation ids are the handlers' names (``create_conversation``): what generated
    clients call their functions."""
    return route.name


def install_openapi(app: FastAPI, shard_count: Callable[[], int | None]) -> None:
    """Serve ``build_openapi``'s document at ``/openapi.json`` (built once, on first use)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app, shard_count())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def build_openapi(app: FastAPI, shard_count: int | None) -> dict[str, Any]:
    doc = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description + "\n\n" + error_code_table(),
        routes=app.routes,
        tags=TAGS,
    )
    components = doc.setdefault("components", {})
    components["securitySchemes"] = SECURITY_SCHEMES
    schemas = components.setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    doc["paths"] = {p: item for p, item in doc["paths"].items() if not p.startswith("/peer/")}
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            _complete(path, method, operation)
    _limit_shard(schemas, shard_count)
    return doc


def error_code_table() -> str:
    rows = [
        f"| `{code}` | {status} | {meaning} |" for code, (status, meaning) in ERROR_CODES.items()
    ]
    return "\n".join(["## Error codes", "", "| code | status | meaning |", "|---|---|---|", *rows])


def _describe(status: int) -> str:
    codes = ", ".join(f"`{c}`" for c, (s, _) in ERROR_CODES.items() if s == status)
    return f"{_STATUS_TEXT[status]} ({codes})"


def _complete(path: str, method: str, operation: dict[str, Any]) -> None:
    responses: dict[str, Any] = operation["responses"]
    responses.pop("422", None)
    _one_of_closed_forms(operation)
    for parameter in operation.get("parameters", ()):
        _drop_null(parameter)
    statuses: tuple[int, ...] = ()
    if path.startswith("/v1/"):
        statuses = _EDGE_STATUSES + (_BODY_STATUSES if method in ("post", "put", "patch") else ())
        operation["security"] = [{"apiKey": []}]
        operation.setdefault("parameters", []).append(_DEADLINE_PARAMETER)
        operation.setdefault("tags", [OPERATORS])
    else:
        operation["security"] = []
    for shared in statuses:
        responses.setdefault(str(shared), {"description": _describe(shared)})
        responses[str(shared)].setdefault("content", _error_content())
    for code, response in responses.items():
        if code in ("429", "503", "504"):
            header = {**_RETRY_AFTER, "required": code != "504"}
            response.setdefault("headers", {})["Retry-After"] = header
    link = _LINKS.get(operation.get("operationId", ""))
    if link is not None:
        linked_code, links = link
        responses[linked_code]["links"] = links


def _error_content() -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}


def _one_of_closed_forms(operation: dict[str, Any]) -> None:
    """A request body that is a union of closed models without a discriminator (the replay
    request: ids or a shard) is ``oneOf``, not pydantic's ``anyOf``: no body is both."""
    for media in operation.get("requestBody", {}).get("content", {}).values():
        schema = media.get("schema", {})
        if "anyOf" in schema and all("$ref" in alt for alt in schema["anyOf"]):
            schema["oneOf"] = schema.pop("anyOf")


def _drop_null(parameter: dict[str, Any]) -> None:
    """An optional parameter is absent, never null: ``anyOf: [X, null]`` becomes ``X``."""
    schema = parameter["schema"]
    alternatives = [a for a in schema.get("anyOf", ()) if a.get("type") != "null"]
    if len(alternatives) == 1 and len(schema["anyOf"]) == 2:
        del schema["anyOf"]
        schema.update(alternatives[0])


def _limit_shard(schemas: dict[str, Any], shard_count: int | None) -> None:
    """A replayed shard is below the cluster's shard count, which the node knows once it runs."""
    if shard_count is not None and "ReplayShard" in schemas:
        schemas["ReplayShard"]["properties"]["shard"]["maximum"] = shard_count - 1
