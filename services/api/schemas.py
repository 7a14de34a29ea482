"""Request and response bodies of the public API (pydantic v2), and their conversions.

Every field a client sends has a bound: ids by pattern and length, integers below 2**53 (so
they survive JSON in every client language and fit the stores' 64-bit columns), metadata by
its serialized size (checked in the route, where the limit is known). Request models are strict
(no coercion of ``"5"`` into 5): what the OpenAPI document calls invalid, the server refuses.
The event bodies, one model per event type, are in ``services.api.event_bodies``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from eventlog.conversations import AppendedEvent, ConversationInfo, EventRecord, ToolAttemptStatus
from services.api.event_bodies import (
    ATTEMPT_ID_MAX,
    ID_PATTERN,
    JSON_INT_MAX,
    TOKEN_COUNT_MAX,
    AppendEventRequest,
)

__all__ = ["ATTEMPT_ID_MAX", "ID_PATTERN", "JSON_INT_MAX", "TOKEN_COUNT_MAX", "AppendEventRequest"]

EVENTS_PAGE_MAX = 1000
CONVERSATION_ID_MAX = 128

ConversationId = Annotated[
    str, StringConstraints(min_length=1, max_length=CONVERSATION_ID_MAX, pattern=ID_PATTERN)
]
EventType = Literal[
    "message.user",
    "message.assistant",
    "message.system",
    "message.tool",
    "prompt.settings",
    "tool.attempt",
    "tool.effect",
    "note",
]
_TIME_EXAMPLE = "2026-01-01T12:00:00.000Z"


def _examples(*examples: dict[str, Any]) -> ConfigDict:
    return ConfigDict(json_schema_extra={"examples": list(examples)})


def iso_utc(ms: int) -> str:
    """ISO-8601 UTC with milliseconds and a ``Z``: ``2026-01-01T00:00:00.000Z``."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class CreateConversationRequest(_Strict):
    """The body is optional: an empty one creates a conversation with a random id. Ids are
    namespaced by tenant: another tenant's conversation with the same id plays no part.
    Creating one of your own ids again with the same model revision and metadata returns it
    (idempotent); with others it is 409 ``conversation_exists``."""

    model_config = _examples(
        {
            "conversation_id": "c-support-42",
            "model_revision": "llama-3.1-8b@2024-07",
            "metadata": {"channel": "web"},
        },
        {},
    )

    conversation_id: ConversationId | None = Field(
        default=None, description="client-chosen id; a random one is generated when absent"
    )
    model_revision: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = Field(
        default=None,
        description="the model revision the conversation is pinned to (KV is reusable only for "
        "it); the cluster's default when absent",
    )
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="free-form JSON object, at most 16 KiB serialized"
    )


_HOME_REGION = (
    "deprecated, the same as leader_region (a conversation has no fixed home: its shard's "
    "leader moves with failovers)"
)


class ConversationCreated(BaseModel):
    model_config = _examples(
        {
            "conversation_id": "c-support-42",
            "leader_region": "us-east",
            "home_region": "us-east",
            "model_revision": "llama-3.1-8b@2024-07",
            "created_at": _TIME_EXAMPLE,
        }
    )

    conversation_id: str
    leader_region: str = Field(description="the region leading the conversation's shard now")
    home_region: str = Field(description=_HOME_REGION, json_schema_extra={"deprecated": True})
    model_revision: str
    created_at: str

    @classmethod
    def of(cls, info: ConversationInfo) -> ConversationCreated:
        return cls(
            conversation_id=info.conversation_id,
            leader_region=info.leader_region,
            home_region=info.leader_region,
            model_revision=info.model_revision,
            created_at=iso_utc(info.created_at_ms),
        )


class Conversation(BaseModel):
    model_config = _examples(
        {
            "conversation_id": "c-support-42",
            "last_seq": 3,
            "leader_region": "us-east",
            "home_region": "us-east",
            "epoch": 2,
            "model_revision": "llama-3.1-8b@2024-07",
            "metadata": {"channel": "web"},
            "created_at": _TIME_EXAMPLE,
        }
    )

    conversation_id: str
    last_seq: int = Field(description="seq of the last committed event (0: none yet)")
    leader_region: str = Field(description="the region leading the conversation's shard now")
    home_region: str = Field(description=_HOME_REGION, json_schema_extra={"deprecated": True})
    epoch: int = Field(description="epoch of the shard's current leader")
    model_revision: str
    metadata: dict[str, Any]
    created_at: str

    @classmethod
    def of(cls, info: ConversationInfo) -> Conversation:
        return cls(
            conversation_id=info.conversation_id,
            last_seq=info.last_seq,
            leader_region=info.leader_region,
            home_region=info.leader_region,
            epoch=info.epoch,
            model_revision=info.model_revision,
            metadata=info.metadata,
            created_at=iso_utc(info.created_at_ms),
        )


class EventAppended(BaseModel):
    model_config = _examples(
        {
            "event_id": "e-3f1a",
            "seq": 4,
            "acked_by": ["us-east", "eu-west"],
            "committed_at": _TIME_EXAMPLE,
        }
    )

    event_id: str
    seq: int = Field(description="the event's place in the conversation: 1, 2, 3, ... gapless")
    acked_by: list[str] = Field(description="regions whose replicas durably hold the event")
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
    model_config = _examples(
        {
            "event_id": "e-3f1a",
            "seq": 1,
            "type": "message.user",
            "payload": {"content": "What's the weather in Paris?"},
            "token_count": 9,
            "created_at": _TIME_EXAMPLE,
        }
    )

    event_id: str
    seq: int
    type: EventType
    payload: dict[str, Any] = Field(description="the payload exactly as appended")
    token_count: int
    created_at: str

    @classmethod
    def of(cls, record: EventRecord) -> Event:
        return cls(
            event_id=record.event_id,
            seq=record.seq,
            type=record.event_type,  # type: ignore[arg-type]  # the log only holds EVENT_TYPES
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
    model_config = _examples(
        {
            "attempt_id": "att-1",
            "state": "pending",
            "events": [
                {
                    "event_id": "e-77",
                    "seq": 2,
                    "type": "tool.attempt",
                    "payload": {
                        "attempt_id": "att-1",
                        "tool": "get_weather",
                        "argument_digest": "9f2c",
                    },
                    "token_count": 0,
                    "created_at": _TIME_EXAMPLE,
                }
            ],
        }
    )

    attempt_id: str
    state: Literal["pending", "committed", "failed"] = Field(
        description="pending: no effect recorded (the tool may or may not have run: ask the "
        "external system with attempt_id as its idempotency key); committed / failed: the "
        "recorded effect"
    )
    events: list[Event] = Field(description="the attempt and its effect, when recorded")

    @classmethod
    def of(cls, status: ToolAttemptStatus) -> ToolAttempt:
        return cls(
            attempt_id=status.attempt_id,
            state=status.state,
            events=[Event.of(e) for e in status.events],
        )


class ErrorDetail(BaseModel):
    code: str = Field(description="stable error code (the table in the API description)")
    message: str = Field(description="for people; do not parse")
    retryable: bool = Field(description="whether the same request may succeed later")
    shard: int | None = Field(default=None, description="not_leader only: the shard")
    leader_region: str | None = Field(
        default=None, description="not_leader only: the region that leads the shard, if known"
    )


class ErrorBody(BaseModel):
    model_config = _examples(
        {
            "error": {
                "code": "seq_conflict",
                "message": "expected_seq 3 but last seq is 4",
                "retryable": False,
            }
        }
    )

    error: ErrorDetail


class Health(BaseModel):
    model_config = _examples(
        {
            "status": "ok",
            "region": "us-east",
            "shards_placed": 22,
            "shards_led": 22,
            "unhealthy_loops": [],
        }
    )
    status: Literal["ok", "starting", "degraded"]
    region: str
    shards_placed: int
    shards_led: int
    #: background loops of this node that stopped or crash-loop (``services.supervisor``)
    unhealthy_loops: list[str] = []
