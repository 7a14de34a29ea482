"""Errors of the REST layer and their mapping to HTTP.

Every ``ConvplaneError`` becomes its ``http_status`` with ``{"error": {"code", "message",
"retryable"}}``; a ``retry_after_s`` becomes ``Retry-After`` and every 503 carries one. Request
validation failures become 400 ``invalid_request`` (never FastAPI's 422). A 405 names the
path's methods in ``Allow``. Anything else is a bug and stays a 500.

``ERROR_CODES`` lists every code a client can see, with its status and meaning; the OpenAPI
document prints it, and a test checks that every error class's code is in it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from eventlog.errors import ConvplaneError, Unavailable, error_body

log = logging.getLogger("convplane.api")

VALIDATION_ERRORS_SHOWN_MAX = 5
_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")

#: code -> (HTTP status, what it means, what the client should do)
ERROR_CODES: dict[str, tuple[int, str]] = {
    "invalid_request": (400, "the request breaks the schema or a rule of the log; do not retry"),
    "unauthorized": (401, "missing or unknown API key (or peer secret, on /peer)"),
    "forbidden": (403, "the key's role (tenant, operator, viewer) does not take this operation"),
    "not_found": (404, "no such conversation, attempt or path (another tenant's is not found)"),
    "method_not_allowed": (405, "the path does not take this method (`Allow` lists those it does)"),
    "seq_conflict": (409, "`expected_seq` is not the conversation's last seq"),
    "effect_conflict": (409, "a different `tool.effect` is already recorded for the attempt"),
    "preflight_failed": (
        409,
        "a drill's preflight refused it (nothing changed); the reason says why",
    ),
    "unknown_attempt": (409, "a `tool.effect` for an attempt that was never recorded"),
    "idempotency_key_reused": (409, "the same `Idempotency-Key` with a different body"),
    "conversation_exists": (
        409,
        "your own conversation with this id exists with another model revision or metadata",
    ),
    "conflict": (409, "the request conflicts with the current state"),
    "payload_too_large": (413, "the body is over the node's limit"),
    "unsupported_media_type": (415, "a body that is not `application/json`"),
    "quota_exceeded": (429, "the tenant is over its rate; retry after `Retry-After`"),
    "unavailable": (503, "not serving right now; retry after `Retry-After`"),
    "no_quorum": (503, "fewer than a quorum of replicas answered; nothing new acknowledged"),
    "not_leader": (503, "no region leads the shard yet (`leader_region` hints at the next)"),
    "fenced": (503, "a newer leader took the shard; retry"),
    "leadership_changed": (503, "the shard was re-led during the call; nothing written, retry"),
    "overloaded": (503, "admission shed the request (concurrency limit and queue full)"),
    "replica_unavailable": (503, "a replica store could not be reached"),
    "outcome_unknown": (503, "the deadline passed before the ack: retry with the same key"),
    "forward_failed": (503, "the shard's leader region could not be reached"),
    "deadline_exceeded": (504, "the request's deadline passed (a write's outcome is unknown)"),
}


class OutcomeUnknown(Unavailable):
    """An append's deadline passed while its outcome was unknown: it may still commit."""

    code = "outcome_unknown"


class ForwardFailed(Unavailable):
    """The shard's leader region could not be reached, or the request was already forwarded."""

    code = "forward_failed"


def error_response(exc: ConvplaneError, retry_after_default_s: float = 1.0) -> JSONResponse:
    headers: dict[str, str] = {}
    retry_after_s = exc.retry_after_s
    if retry_after_s is None and exc.http_status == 503:
        retry_after_s = retry_after_default_s
    if retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
    return JSONResponse(exc.to_body(), status_code=exc.http_status, headers=headers)


def refusal(
    exc: ConvplaneError, retry_after_default_s: float, count_error: Callable[[str], None]
) -> JSONResponse:
    """The answer to a convplane error, counted by its code (metrics) and logged at debug: the
    app's handler and the fast lane (``services.api.fast_lane``) both answer so."""
    count_error(exc.code)
    log.debug("refused with %s: %s", exc.code, exc.message)
    return error_response(exc, retry_after_default_s)


def plain_error(status: int, code: str, message: str, *, retryable: bool = False) -> JSONResponse:
    return JSONResponse(error_body(code, message, retryable=retryable), status_code=status)


#: how much of a client's own value an error message repeats (the rest of it is the client's)
ECHOED_VALUE_CHARS_MAX = 64


def _describe_validation(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:VALIDATION_ERRORS_SHOWN_MAX]:
        where = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{where}: {_validation_message(err)}")
    return "; ".join(parts) or "invalid request"


def _validation_message(err: Any) -> str:
    """pydantic's message, cut where it would echo the client's input at length; a bad or
    missing discriminator (an event's ``type``) names every accepted value, in full."""
    ctx = err.get("ctx") or {}
    if err.get("type") == "union_tag_invalid":
        tag = str(ctx.get("tag", ""))[:ECHOED_VALUE_CHARS_MAX]
        return f"unknown {ctx.get('discriminator')} {tag!r}: expected one of {ctx.get('expected_tags')}"
    if err.get("type") == "union_tag_not_found":
        return f"missing {ctx.get('discriminator')}"
    return str(err.get("msg", "invalid"))[:200]


def allowed_methods(request: Request) -> list[str]:
    """Every method some route takes on the request's path, probed through the router's own
    matching (Starlette's 405 names only the first route that matched the path, and a path with
    a GET and a POST route, or routes of included routers, has more)."""
    return [
        method
        for method in _METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] == Match.FULL
            for route in request.app.router.routes
        )
    ]


def install_error_handlers(
    app: FastAPI, retry_after_default_s: float, count_error: Callable[[str], None]
) -> None:
    """``count_error`` is called with the code of every convplane error answered (metrics)."""

    async def on_convplane_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ConvplaneError)
        return refusal(exc, retry_after_default_s, count_error)

    async def on_validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return plain_error(400, "invalid_request", _describe_validation(exc))

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        response = plain_error(exc.status_code, code, str(exc.detail))
        if exc.headers:
            response.headers.update(exc.headers)
        if exc.status_code == 405:
            response.headers["Allow"] = ", ".join(allowed_methods(request))
        return response

    app.add_exception_handler(ConvplaneError, on_convplane_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
