"""Errors of the REST layer and their mapping to HTTP.

Every ``ConvplaneError`` becomes its ``http_status`` with ``{"error": {"code", "message",
"retryable"}}``; a ``retry_after_s`` becomes ``Retry-After`` and every 503 carries one. Request
validation failures become 400 ``invalid_request``. Anything else is a bug and stays a 500.
"""

from __future__ import annotations

import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from eventlog.errors import ConvplaneError, Unavailable

VALIDATION_ERRORS_SHOWN_MAX = 5


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


def plain_error(status: int, code: str, message: str, *, retryable: bool = False) -> JSONResponse:
    body = {"error": {"code": code, "message": message, "retryable": retryable}}
    return JSONResponse(body, status_code=status)


def _describe_validation(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:VALIDATION_ERRORS_SHOWN_MAX]:
        where = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{where}: {err.get('msg', 'invalid')}"[:200])
    return "; ".join(parts) or "invalid request"


def install_error_handlers(app: FastAPI, retry_after_default_s: float) -> None:
    async def on_convplane_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ConvplaneError)
        return error_response(exc, retry_after_default_s)

    async def on_validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return plain_error(400, "invalid_request", _describe_validation(exc))

    async def on_http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        response = plain_error(exc.status_code, code, str(exc.detail))
        if exc.headers:
            response.headers.update(exc.headers)
        return response

    app.add_exception_handler(ConvplaneError, on_convplane_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
