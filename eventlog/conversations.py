"""The application-facing port of the log: what the REST layer calls.

``eventlog.node.LogNode`` implements it for the shards a region leads; calls for a shard the
region does not lead raise ``NotLeader`` (with the leader's region when known) so the router can
forward them.

**Conversation ids are namespaced by tenant.** A conversation is keyed by ``(tenant_id,
conversation_id)``: two tenants may use the same id for two independent conversations (own seqs,
idempotency keys and tool attempts), and no call tells a tenant whether another tenant's
conversation with that id exists; what another tenant holds is invisible, never ``NotFound``-vs-
``Conflict``. The shard is a function of the id alone (``eventlog.sharding``), so the same id of
two tenants lives in one shard under two keys; the tenant is part of the key within the shard.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Literal

ToolAttemptState = Literal["pending", "committed", "failed"]


@dataclass(frozen=True, slots=True)
class ConversationInfo:
    conversation_id: str
    tenant_id: str
    leader_region: str  # region leading the conversation's shard now
    model_revision: str
    metadata: dict[str, Any]
    created_at_ms: int
    last_seq: int
    shard: int
    epoch: int


@dataclass(frozen=True, slots=True)
class AppendedEvent:
    event_id: str
    conversation_id: str
    seq: int
    event_type: str
    acked_by: tuple[str, ...]  # regions whose replicas durably hold the event
    committed_at_ms: int
    shard: int
    epoch: int
    lsn: int
    replayed: bool  # True when an Idempotency-Key retry returned the original result


@dataclass(frozen=True, slots=True)
class EventRecord:
    event_id: str
    conversation_id: str
    seq: int
    event_type: str
    payload: dict[str, Any]
    token_count: int
    created_at_ms: int


@dataclass(frozen=True, slots=True)
class ToolAttemptStatus:
    attempt_id: str
    state: ToolAttemptState
    events: tuple[EventRecord, ...]


class ConversationLog(ABC):
    @abstractmethod
    async def create_conversation(
        self,
        tenant_id: str,
        conversation_id: str,
        model_revision: str,
        metadata: dict[str, Any],
    ) -> ConversationInfo:
        """Idempotent on (tenant_id, conversation_id): creating the tenant's existing
        conversation again with the same model_revision and metadata returns it; with others it
        is a Conflict. Another tenant's conversation with the same id plays no part."""

    @abstractmethod
    async def append_event(
        self,
        tenant_id: str,
        conversation_id: str,
        event_type: str,
        payload: dict[str, Any],
        *,
        token_count: int | None = None,
        expected_seq: int | None = None,
        idempotency_key: str | None = None,
    ) -> AppendedEvent:
        """Append once W replicas hold it. Raises InvalidRequest, NotFound, SeqConflict,
        EffectConflict, IdempotencyKeyReused, NoQuorum/NotLeader/Fenced (outcome unknown: retry
        with the same idempotency key is safe)."""

    @abstractmethod
    async def get_conversation(self, tenant_id: str, conversation_id: str) -> ConversationInfo: ...

    @abstractmethod
    async def list_events(
        self, tenant_id: str, conversation_id: str, after_seq: int, limit: int
    ) -> list[EventRecord]:
        """Committed events with seq > after_seq, in seq order (seq 0, the creation, excluded)."""

    @abstractmethod
    async def tool_attempt(
        self, tenant_id: str, conversation_id: str, attempt_id: str
    ) -> ToolAttemptStatus: ...
