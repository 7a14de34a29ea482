"""Request and response bodies of the public API (pydantic v2), and their conversions.

Every field a client sends has a bound: ids by pattern and length, integers below 2**53 (so
they survive JSON in every client language and fit the stores' 64-bit columns), metadata by
its serialized size (checked in the route, where the limit is known).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from eventlog.conversations import AppendedEvent, ConversationInfo, EventRecord, ToolAttemptStatus
from replay.chat import validate_event_payload

#: letters, digits and ``._:-``, but never ``.`` or ``..`` alone: URL normalisation turns those
#: into other paths, so forwarding and replay could never reach such a conversation
ID_PATTERN = (
    r"^([A-Za-z0-9_:-][A-Za-z0-9._:-]*"
    r"|\.[A-Za-z0-9_:-][A-Za-z0-9._:-]*"
    r"|\.\.[A-Za-z0-9._:-]+)$"
)
JSON_INT_MAX = 2**53 - 1
TOKEN_COUNT_MAX = 10_000_000
EVENTS_PAGE_MAX = 1000

ConversationId = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=ID_PATTERN)]
EventType = Literal[
    "message.user", "message.assistant", "message.system", "message.tool", "prompt.settings",
    "tool.attempt", "tool.effect", "note",
]  # fmt: skip


def iso_utc(ms: int) -> str:
    """ISO-8601 UTC with milliseconds and a ``Z``: ``2026-01-01T00:00:00.000Z``."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateConversationRequest(_Strict):
    conversation_id: ConversationId | None = Field(
        default=None, description="client-chosen id; a random one is generated when absent"
    )
    model_revision: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class ConversationCreated(BaseModel):
    conversation_id: str
    home_region: str
    model_revision: str
    created_at: str

    @classmethod
    def of(cls, info: ConversationInfo) -> ConversationCreated:
        return cls(
            conversation_id=info.conversation_id,
            home_region=info.home_region,
            model_revision=info.model_revision,
            created_at=iso_utc(info.created_at_ms),
        )


class Conversation(BaseModel):
    conversation_id: str
    last_seq: int
    home_region: str
    epoch: int
    model_revision: str
    metadata: dict[str, Any]
    created_at: str

    @classmethod
    def of(cls, info: ConversationInfo) -> Conversation:
        return cls(
            conversation_id=info.conversation_id,
            last_seq=info.last_seq,
            home_region=info.home_region,
            epoch=info.epoch,
            model_revision=info.model_revision,
            metadata=info.metadata,
            created_at=iso_utc(info.created_at_ms),
        )


class AppendEventRequest(_Strict):
    type: EventType
    payload: dict[str, Any] = Field(default_factory=dict)
    token_count: int | None = Field(default=None, ge=0, le=TOKEN_COUNT_MAX)
    expected_seq: int | None = Field(default=None, ge=0, le=JSON_INT_MAX)

    @model_validator(mode="after")
    def _prompt_payload(self) -> AppendEventRequest:
        """Messages and prompt settings must be what an engine accepts: replay sends them as
        stored (``replay.chat``: the payload models and why)."""
        validate_event_payload(self.type, self.payload)
        return self


class EventAppended(BaseModel):
    event_id: str
    seq: int
    acked_by: list[str]
    committed_at: str

    @classmethod
    def of(cls, appended: AppendedEvent) -> EventAppended:
        return cls(
            event_id=appended.event_id,
            seq=appended.seq,
            acked_by=list(appended.acked_by),
            committed_at=iso_utc(appended.committed_at_ms),
        )


class Event(BaseModel):
    event_id: str
    seq: int
    type: str
    payload: dict[str, Any]
    token_count: int
    created_at: str

    @classmethod
    def of(cls, record: EventRecord) -> Event:
        return cls(
            event_id=record.event_id,
            seq=record.seq,
            type=record.event_type,
            payload=record.payload,
            token_count=record.token_count,
            created_at=iso_utc(record.created_at_ms),
        )


class EventPage(BaseModel):
    events: list[Event]
    next_after_seq: int = Field(
        description="pass as after_seq to read on; equal to the request's after_seq when empty"
    )


class ToolAttempt(BaseModel):
    attempt_id: str
    state: Literal["pending", "committed", "failed"]
    events: list[Event]

    @classmethod
    def of(cls, status: ToolAttemptStatus) -> ToolAttempt:
        return cls(
            attempt_id=status.attempt_id,
            state=status.state,
            events=[Event.of(e) for e in status.events],
        )


class ErrorDetail(BaseModel):
    code: str
    message: str
    retryable: bool


class ErrorBody(BaseModel):
    error: ErrorDetail


class Health(BaseModel):
    status: Literal["ok", "starting", "degraded"]
    region: str
    shards_placed: int
    shards_led: int
    #: background loops of this node that stopped or crash-loop (``services.supervisor``)
    unhealthy_loops: list[str] = []
