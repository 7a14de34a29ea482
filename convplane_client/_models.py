"""What the plane answers, typed (pydantic v2). Models ignore fields they do not know, so a
newer plane that adds one does not break an older client."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

EventType = Literal[
    "message.user", "message.assistant", "message.system", "message.tool", "prompt.settings",
    "tool.attempt", "tool.effect", "note",
]  # fmt: skip
ToolState = Literal["pending", "committed", "failed"]
EffectStatus = Literal["committed", "failed"]


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class ConversationCreated(_Answer):
    conversation_id: str
    leader_region: str
    model_revision: str
    created_at: datetime


class Conversation(_Answer):
    conversation_id: str
    last_seq: int
    leader_region: str
    epoch: int
    model_revision: str
    metadata: dict[str, Any]
    created_at: datetime


class Appended(_Answer):
    """An acknowledged append: a quorum of regions (``acked_by``) holds it durably."""

    event_id: str
    seq: int
    acked_by: list[str]
    committed_at: datetime
    #: the Idempotency-Key the append carried (the caller's or the one the client generated)
    idempotency_key: str
    #: True when the plane answered a retry with the original result (200,
    #: ``Idempotent-Replayed: true``): the append had landed before
    replayed: bool = False
    served_by: str | None = None


class Event(_Answer):
    event_id: str
    seq: int
    type: str
    payload: dict[str, Any]
    token_count: int
    created_at: datetime


class EventPage(_Answer):
    events: list[Event]
    next_after_seq: int


class WarmWorker(_Answer):
    worker_id: str
    engine_id: str
    engine_url: str | None
    model_revision: str
    warm_since: str
    prompt_tokens: int


class Route(_Answer):
    """Where the conversation's next turn should go: the region leading it, the replay worker
    whose KV is warm, and what to send the engine (``model_revision``, ``cache_salt``)."""

    conversation_id: str
    region: str
    shard: int
    epoch: int
    placement_version: int
    worker: WarmWorker | None = None
    model_revision: str | None = None
    cache_salt: str | None = None


class ToolAttempt(_Answer):
    """An attempt's state: ``pending`` (no effect recorded: the tool may or may not have run),
    or the recorded effect's status, with the attempt's events."""

    attempt_id: str
    state: ToolState
    events: list[Event] = Field(default_factory=list)

    def effect(self) -> Event | None:
        return next((e for e in self.events if e.type == "tool.effect"), None)


class ToolRun(_Answer):
    """The outcome of ``run_tool_once``: the attempt's recorded effect."""

    attempt_id: str
    state: EffectStatus
    #: the tool's result as recorded with the effect (``payload.result``)
    result: Any = None
    #: why it failed, as recorded (``payload.error``)
    error: str | None = None
    #: whether this call ran the tool (False: an earlier run's effect was already recorded)
    ran: bool

    @classmethod
    def recorded(cls, attempt: ToolAttempt, *, ran: bool) -> ToolRun:
        effect = attempt.effect()
        payload = effect.payload if effect is not None else {}
        state: EffectStatus = "failed" if attempt.state == "failed" else "committed"
        error = payload.get("error")
        return cls(
            attempt_id=attempt.attempt_id,
            state=state,
            result=payload.get("result"),
            error=error if isinstance(error, str) else None,
            ran=ran,
        )
