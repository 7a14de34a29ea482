"""The append route's own checks, applied outside FastAPI, for the fast lane.

The fast lane (``services.api.fast_lane``) serves ``POST /v1/conversations/{id}/events`` without
FastAPI's routing, dependency solving and parameter validation, which cost a node more CPU per
append than the log's own work does (``bench/rest.py`` under py-spy). It checks a request with
the route's own constraints (``AppendCheck``):

* the conversation id and the ``Idempotency-Key`` (at most one), their patterns and lengths;
* the body, with the ``AppendEventRequest`` discriminated union applied to the JSON the lane
  already parsed (the body is parsed once).

A request it does not accept, for any reason, goes on to the FastAPI route untouched, so every
refusal is the route's own, word for word: the lane only ever accepts what the route accepts.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError

from services.api import routes
from services.api.event_bodies import AnyEvent, AppendEventRequest
from services.api.schemas import CONVERSATION_ID_MAX, ID_PATTERN

IDEMPOTENCY_KEY_LENGTH_MAX = 255
_CONVERSATION_ID = re.compile(ID_PATTERN)
_IDEMPOTENCY_KEY = re.compile(routes.IDEMPOTENCY_KEY_PATTERN)


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
