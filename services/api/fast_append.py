"""The append operation served without the framework's per-request machinery.

``POST /v1/conversations/{id}/events`` is what chat applications call most, and FastAPI's
routing, dependency solving and parameter validation cost a node more CPU per append than the
log's own work does (``bench/rest.py`` under py-spy). Two places serve it with the route's own
parts: the fast lane (``services.api.fast_lane``), straight from the client listener, for
the requests it takes; and ``FastAppend``, from ``EdgeMiddleware``, for the appends that still
come through the app (a body in several packets, a CORS request, ...). Both check with
``AppendCheck``:

* the conversation id, the ``Idempotency-Key`` and the body are checked with the route's own
  constraints (the id's pattern and length, the key's pattern and length, the
  ``AppendEventRequest`` discriminated union applied to the JSON the edge already parsed: the
  body is parsed once);
* the caller is authenticated by the route's own dependency (``context.request_context``);
* ``routes.append_event`` runs as FastAPI would run it, and a ``ConvplaneError`` becomes the
  error body the app's handler makes (``errors.error_response``).

A request it does not accept, for any reason (an invalid id, key or body, no or a bad API key,
a repeated header), goes on to the FastAPI route untouched, so every refusal is the route's
own, word for word. The fast path only ever accepts what the route accepts.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from eventlog.errors import ConvplaneError
from eventlog.http_headers import IDEMPOTENCY_KEY_HEADER_RAW
from services.api import routes
from services.api.context import request_context
from services.api.errors import refusal
from services.api.event_bodies import AnyEvent, AppendEventRequest
from services.api.schemas import CONVERSATION_ID_MAX, ID_PATTERN

#: where ``EdgeMiddleware`` leaves the JSON it parsed while checking the body
PARSED_BODY_SCOPE_KEY = "convplane.parsed_body"
IDEMPOTENCY_KEY_LENGTH_MAX = 255
_APPEND_PATH = re.compile(r"^/v1/conversations/([^/]+)/events$")
_CONVERSATION_ID = re.compile(ID_PATTERN)
_IDEMPOTENCY_KEY = re.compile(routes.IDEMPOTENCY_KEY_PATTERN)
_NOT_PARSED = object()


class AppendCheck:
    """The route's own constraints on an append, applied outside FastAPI: the conversation id
    (its pattern and length), the ``Idempotency-Key`` (at most one, its pattern and length) and
    the body (the ``AppendEventRequest`` union, on JSON already parsed)."""

    def __init__(self) -> None:
        self._events: TypeAdapter[AnyEvent] = TypeAdapter(AppendEventRequest)

    def accepted(
        self, conversation_id: str, keys: list[bytes], parsed: Any
    ) -> tuple[AnyEvent, str | None] | None:
        """The validated body and key, or None where the route would refuse the request."""
        if not valid_conversation_id(conversation_id) or len(keys) > 1:
            return None
        idempotency_key = bytes(keys[0]).decode("latin-1") if keys else None
        if idempotency_key is not None and not _valid_key(idempotency_key):
            return None
        try:
            return self._events.validate_python(parsed), idempotency_key
        except ValidationError:
            return None


class FastAppend:
    def __init__(
        self,
        retry_after_default_s: float,
        count_error: Callable[[str], None],
        check: AppendCheck | None = None,
    ) -> None:
        self._retry_after_default_s = retry_after_default_s
        self._count_error = count_error  # metrics by error code, as the app's handler counts
        self._check = check or AppendCheck()  # shared with the fast lane (one validator)
        #: the route this path stands in for (its template names the request in metrics)
        self._route = declared_route(routes.append_event.__name__)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Serve ``scope`` if it is an append this path accepts; False: the app serves it."""
        if scope["method"] != "POST":
            return False
        matched = _APPEND_PATH.match(scope["path"])
        parsed = scope.get(PARSED_BODY_SCOPE_KEY, _NOT_PARSED)
        if matched is None or parsed is _NOT_PARSED:
            return False
        conversation_id = matched.group(1)
        keys = [v for k, v in scope["headers"] if bytes(k) == IDEMPOTENCY_KEY_HEADER_RAW]
        accepted = self._check.accepted(conversation_id, keys, parsed)
        if accepted is None:
            return False
        body, idempotency_key = accepted
        scope["path_params"] = {"conversation_id": conversation_id}
        scope["route"] = self._route
        request = Request(scope, receive)
        try:
            ctx = await request_context(request)
        except ConvplaneError:
            return False
        try:
            response = await routes.append_event(ctx, conversation_id, body, idempotency_key)
        except ConvplaneError as exc:
            response = refusal(exc, self._retry_after_default_s, self._count_error)
        await response(scope, receive, send)
        return True


def valid_conversation_id(conversation_id: str) -> bool:
    """Whether the routes take ``conversation_id`` in their path (its pattern and length)."""
    return (
        len(conversation_id) <= CONVERSATION_ID_MAX
        and _CONVERSATION_ID.fullmatch(conversation_id) is not None
    )


def _valid_key(key: str) -> bool:
    return len(key) <= IDEMPOTENCY_KEY_LENGTH_MAX and _IDEMPOTENCY_KEY.fullmatch(key) is not None


def declared_route(name: str) -> APIRoute:
    """The route of ``services.api.routes`` whose endpoint is called ``name``."""
    for route in routes.router.routes:
        if isinstance(route, APIRoute) and route.name == name:
            return route
    raise LookupError(f"services.api.routes declares no route {name}")
