"""Structured JSON logs of a region node: one JSON object per line, with the request's id,
tenant, conversation, shard, the shard's epoch at this node and the trace id, and no secrets.

The standard library's loggers stay the API (``logging.getLogger("convplane....")``); structlog's
``ProcessorFormatter`` renders their records. Nothing is added to the request path but one
context variable set per authenticated request (``bind_request``): the fields are derived from
it only when a record is actually written. The request id is the client's ``X-Request-Id``
(cut to ``REQUEST_ID_MAX`` characters) or, when it sent none, a random one made at the
request's first log line.

Secrets: API keys and the peer secret reach a node only in headers, which are never logged;
as a second guard every rendered line goes through ``redact``, which masks any bearer
credential or peer-secret header that a message or an exception text might carry.
"""

from __future__ import annotations

import contextvars
import logging
import re
import secrets
from typing import Any, Protocol

import structlog
from opentelemetry import trace
from starlette.requests import Request
from structlog.typing import EventDict

from eventlog.http_headers import REQUEST_ID_HEADER
from eventlog.sharding import shard_of
from services.config import ClusterConfig, TenantConfig


class LoggedNode(Protocol):
    """What a request's log fields read of the node serving it."""

    @property
    def cluster(self) -> ClusterConfig: ...
    @property
    def log(self) -> object: ...


class LoggedRequest(Protocol):
    """What a request's log fields read of it (``services.api.context.RequestContext``)."""

    @property
    def api(self) -> LoggedNode: ...
    @property
    def request(self) -> Request: ...
    @property
    def tenant(self) -> TenantConfig: ...


REQUEST_ID_MAX = 64
REQUEST_ID_SCOPE_KEY = "convplane.request_id"
_current: contextvars.ContextVar[LoggedRequest | None] = contextvars.ContextVar(
    "convplane_request", default=None
)
_SECRETS = re.compile(
    r"(?i)(bearer\s+|authorization[\"']?\s*[:=]\s*[\"']?(?:bearer\s+)?|x-convplane-peer-auth[\"']?\s*[:=]\s*[\"']?)"
    r"[^\s\"',;}]+"
)


def bind_request(ctx: LoggedRequest) -> None:
    """Make ``ctx`` the request the current task's log lines are about."""
    _current.set(ctx)


def redact(text: str) -> str:
    return _SECRETS.sub(r"\1[redacted]", text)


def _request_fields(_: Any, __: str, event: EventDict) -> EventDict:
    ctx = _current.get()
    if ctx is not None:
        scope = ctx.request.scope
        request_id = scope.get(REQUEST_ID_SCOPE_KEY)
        if request_id is None:
            given = ctx.request.headers.get(REQUEST_ID_HEADER, "")[:REQUEST_ID_MAX]
            request_id = scope[REQUEST_ID_SCOPE_KEY] = given or secrets.token_hex(8)
        event["request_id"] = request_id
        event["tenant"] = ctx.tenant.tenant_id
        conversation_id = ctx.request.path_params.get("conversation_id")
        if conversation_id is not None:
            event["conversation"] = conversation_id
            shard = shard_of(conversation_id, ctx.api.cluster.shard_count)
            event["shard"] = shard
            # the epoch is known where this node leads the shard (a LogNode; not every log is)
            leader = getattr(ctx.api.log, "leader", None)
            led = leader(shard) if callable(leader) else None
            if led is not None:
                event["epoch"] = led.epoch
    span = trace.get_current_span().get_span_context()
    if span.is_valid:
        event["trace_id"] = format(span.trace_id, "032x")
        event["span_id"] = format(span.span_id, "016x")
    return event


def _redacted_json(logger: Any, name: str, event: EventDict) -> str:
    rendered = structlog.processors.JSONRenderer()(logger, name, event)
    return redact(rendered if isinstance(rendered, str) else rendered.decode())


def json_formatter(region: str) -> logging.Formatter:
    def add_region(_: Any, __: str, event: EventDict) -> EventDict:
        event["region"] = region
        return event

    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            add_region,
            _request_fields,
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            _redacted_json,
        ],
    )


def configure_logging(region: str, level: str) -> None:
    """Every record of the process as one JSON line on stderr (a node's entry point calls it)."""
    handler = logging.StreamHandler()
    handler.setFormatter(json_formatter(region))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
