"""Errors the client raises, in one hierarchy. An answer of the plane that is not a success
becomes an ``ApiError`` carrying the server's ``code``, ``message``, ``retryable``, the HTTP
status and ``Retry-After``; a request that got no answer at all becomes ``TransportFailed``.

    ConvplaneError                 anything this client raises on purpose
    ├── ApiError                   the plane answered with an error body
    │   ├── InvalidRequest         400  the request is malformed or breaks a rule of the log
    │   ├── Unauthorized           401  missing or unknown API key
    │   ├── Forbidden              403  the key's role may not do this
    │   ├── NotFound               404  no such conversation / tool attempt (or another tenant's)
    │   ├── Conflict               409
    │   │   ├── SeqConflict             expected_seq is not the conversation's last seq
    │   │   ├── EffectConflict          a different tool.effect is already recorded
    │   │   ├── IdempotencyKeyReused    same Idempotency-Key, different request body
    │   │   ├── ConversationExists      the id is taken with another model revision or metadata
    │   │   └── UnknownAttempt          an effect for an attempt never recorded
    │   ├── PayloadTooLarge        413
    │   ├── QuotaExceeded          429  the tenant is over its rate (retryable)
    │   ├── Unavailable            503  retryable; the outcome of a write may be unknown
    │   │   ├── OutcomeUnknown          a forward lost its answer: the write may have landed
    │   │   ├── NoQuorum                nothing new acknowledged
    │   │   ├── NotLeader               carries ``leader_region`` when the node knows it
    │   │   └── Overloaded              admission control shed the request
    │   └── DeadlineExceeded       504  the request's deadline passed (also raised by the client
    │                                   when a call's own deadline leaves no time to try)
    └── TransportFailed            no answer: connection refused or reset, or a timeout

A retryable error that ends a call means its retry budget or deadline ran out. For an append
its outcome is then unknown: append again with ``error.idempotency_key`` (always safe within the
key's retention, 24 h) to learn it.
"""

from __future__ import annotations

from typing import Any

import httpx

from convplane_client._headers import RETRY_AFTER_HEADER, SERVED_BY_HEADER

#: statuses that say "try again" even when a proxy in front of the plane wrote the body
RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})


class ConvplaneError(Exception):
    """Base of every error this client raises on purpose."""

    code = "error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        retryable: bool = False,
        status: int | None = None,
        retry_after_s: float | None = None,
        served_by: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.retryable = retryable
        self.status = status
        self.retry_after_s = retry_after_s
        self.served_by = served_by
        #: the Idempotency-Key the failed append carried: append again with it to learn the
        #: outcome (None for other calls)
        self.idempotency_key: str | None = None
        #: how many requests the call sent before giving up
        self.attempts = 0

    def __str__(self) -> str:
        status = f" {self.status}" if self.status is not None else ""
        return f"{self.code}{status}: {self.message}"


class ApiError(ConvplaneError):
    """The plane answered with ``{"error": {"code", "message", "retryable"}}``."""


class InvalidRequest(ApiError):
    code = "invalid_request"


class Unauthorized(ApiError):
    code = "unauthorized"


class Forbidden(ApiError):
    code = "forbidden"


class NotFound(ApiError):
    code = "not_found"


class Conflict(ApiError):
    code = "conflict"


class SeqConflict(Conflict):
    code = "seq_conflict"


class EffectConflict(Conflict):
    code = "effect_conflict"


class IdempotencyKeyReused(Conflict):
    code = "idempotency_key_reused"


class ConversationExists(Conflict):
    code = "conversation_exists"


class UnknownAttempt(Conflict):
    code = "unknown_attempt"


class PayloadTooLarge(ApiError):
    code = "payload_too_large"


class QuotaExceeded(ApiError):
    code = "quota_exceeded"


class Unavailable(ApiError):
    code = "unavailable"


class OutcomeUnknown(Unavailable):
    code = "outcome_unknown"


class NoQuorum(Unavailable):
    code = "no_quorum"


class NotLeader(Unavailable):
    code = "not_leader"

    def __init__(self, message: str, *, leader_region: str | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        #: the region leading the conversation's shard, when the answering node knew it
        self.leader_region = leader_region


class Overloaded(Unavailable):
    code = "overloaded"


class DeadlineExceeded(ApiError):
    code = "deadline_exceeded"


class TransportFailed(ConvplaneError):
    """No answer: the region could not be reached, or the connection broke or timed out. For a
    write, the request may still have been applied."""

    code = "transport_failed"


_BY_CODE: dict[str, type[ApiError]] = {
    cls.code: cls
    for cls in (
        InvalidRequest, Unauthorized, Forbidden, NotFound, Conflict, SeqConflict, EffectConflict,
        IdempotencyKeyReused, ConversationExists, UnknownAttempt, PayloadTooLarge, QuotaExceeded,
        Unavailable, OutcomeUnknown, NoQuorum, NotLeader, Overloaded, DeadlineExceeded,
    )
}  # fmt: skip
_BY_STATUS: dict[int, type[ApiError]] = {
    400: InvalidRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict,
    413: PayloadTooLarge, 429: QuotaExceeded, 503: Unavailable, 504: DeadlineExceeded,
}  # fmt: skip


def retry_after_s(response: httpx.Response) -> float | None:
    """``Retry-After`` in seconds (the delta form; an HTTP date or garbage reads as absent)."""
    raw = response.headers.get(RETRY_AFTER_HEADER)
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    return value if value >= 0 else None


def error_from_response(response: httpx.Response) -> ApiError:
    """The typed error for a non-2xx answer. A body that is not the plane's error shape (a proxy
    in front of it wrote it) still gets a class by status, retryable when the status says so."""
    detail = _error_detail(response)
    code = detail.get("code")
    if not isinstance(code, str):
        code = f"http_{response.status_code}"
    message = detail.get("message")
    retryable = detail.get("retryable")
    cls = _BY_CODE.get(code) or _BY_STATUS.get(response.status_code, ApiError)
    common: dict[str, Any] = {
        "code": code,
        "retryable": retryable
        if isinstance(retryable, bool)
        else response.status_code in RETRYABLE_STATUSES,
        "status": response.status_code,
        "retry_after_s": retry_after_s(response),
        "served_by": response.headers.get(SERVED_BY_HEADER),
    }
    text = message if isinstance(message, str) else response.text[:200]
    if cls is NotLeader:
        leader = detail.get("leader_region")
        return NotLeader(text, leader_region=leader if isinstance(leader, str) else None, **common)
    return cls(text, **common)


def _error_detail(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    detail = body.get("error") if isinstance(body, dict) else None
    return detail if isinstance(detail, dict) else {}
