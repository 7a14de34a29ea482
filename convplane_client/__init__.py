"""convplane's Python client for chat applications: the REST API with the parts that are easy
to get wrong done once. It sends a conversation's requests to the region serving it (``/route``,
``X-Convplane-Served-By``) and falls back to any other region when that one does not answer;
retries what is safe to retry with the same ``Idempotency-Key`` (generated per append when none
is given), within a bounded budget, with jittered backoff, honouring ``Retry-After`` and a
per-call deadline; raises typed errors; and runs a tool's side effect at most once
(``run_tool_once``). ``Client`` blocks, ``AsyncClient`` awaits; both drive the same sans-IO
core (``_core``, ``_operations``). docs/client.md is the guide.

This package talks to the plane over HTTP only and imports none of the server's packages.
"""

from convplane_client._config import ClientConfig, Clock, SystemClock
from convplane_client._errors import (
    ApiError,
    Conflict,
    ConversationExists,
    ConvplaneError,
    DeadlineExceeded,
    EffectConflict,
    Forbidden,
    IdempotencyKeyReused,
    InvalidRequest,
    NoQuorum,
    NotFound,
    NotLeader,
    OutcomeUnknown,
    Overloaded,
    PayloadTooLarge,
    QuotaExceeded,
    SeqConflict,
    TransportFailed,
    Unauthorized,
    Unavailable,
    UnknownAttempt,
)
from convplane_client._headers import (
    DEADLINE_HEADER,
    IDEMPOTENCY_KEY_HEADER,
    IDEMPOTENT_REPLAYED_HEADER,
    RETRY_AFTER_HEADER,
    SERVED_BY_HEADER,
)
from convplane_client._models import (
    Appended,
    Conversation,
    ConversationCreated,
    Event,
    EventPage,
    Route,
    ToolAttempt,
    ToolRun,
    WarmWorker,
)
from convplane_client._operations import ToolFailed, argument_digest
from convplane_client.aio import AsyncClient
from convplane_client.sync import Client

__all__ = [
    "DEADLINE_HEADER",
    "IDEMPOTENCY_KEY_HEADER",
    "IDEMPOTENT_REPLAYED_HEADER",
    "RETRY_AFTER_HEADER",
    "SERVED_BY_HEADER",
    "ApiError",
    "Appended",
    "AsyncClient",
    "Client",
    "ClientConfig",
    "Clock",
    "Conflict",
    "Conversation",
    "ConversationCreated",
    "ConversationExists",
    "ConvplaneError",
    "DeadlineExceeded",
    "EffectConflict",
    "Event",
    "EventPage",
    "Forbidden",
    "IdempotencyKeyReused",
    "InvalidRequest",
    "NoQuorum",
    "NotFound",
    "NotLeader",
    "OutcomeUnknown",
    "Overloaded",
    "PayloadTooLarge",
    "QuotaExceeded",
    "Route",
    "SeqConflict",
    "SystemClock",
    "ToolAttempt",
    "ToolFailed",
    "ToolRun",
    "TransportFailed",
    "Unauthorized",
    "Unavailable",
    "UnknownAttempt",
    "WarmWorker",
    "argument_digest",
]
