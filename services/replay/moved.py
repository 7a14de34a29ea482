"""What to replay: summaries of a moved shard's conversations, read through the log's committed
view of the shard (``eventlog.committed_view``), bounded in count and time.

* ``moved_conversations(shard)``: ``list_conversations`` (active within the replay window, most
  recent first, at most ``conversations_per_shard_max``) and, per conversation, its
  ``conversation.created`` entry (seq 0) for the model revision it is pinned to: one small read
  each, ``lookups_max`` at a time, instead of loading every transcript into the leader's state.
* ``conversation(conversation_id)``: one conversation (operator request), paged through its
  entries to sum its tokens.

Both raise ``NotLeader`` when this node does not lead the shard, and ``ReplicaUnavailable`` (or
the store's own ``ConvplaneError``) when the replica does not answer within ``timeout_s``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from eventlog.clock import Clock
from eventlog.committed_view import CommittedView
from eventlog.errors import NotFound, ReplicaUnavailable
from eventlog.model import CONVERSATION_CREATED, ConversationSummary, LogEntry
from eventlog.node import LogNode
from regions.drills import DRILL_TENANT
from replay.scheduler import MovedConversation

log = logging.getLogger("convplane.replay.moved")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class MovedListConfig:
    replay_window_s: float
    conversations_per_shard_max: int
    lookups_max: int = 8  # revision lookups in flight
    timeout_s: float = 5.0  # one replica call
    page_entries: int = 500  # one page of a conversation's entries (operator requests)
    entries_max: int = 100_000  # longest conversation an operator replay reads


class MovedConversationLister:
    def __init__(
        self,
        node: LogNode,
        clock: Clock,
        limits: MovedListConfig,
    ) -> None:
        self.node = node
        self._clock = clock
        self._limits = limits
        self.truncated_shards_total = 0  # listings that hit conversations_per_shard_max
        self.lookup_failures_total = 0

    async def moved_conversations(self, shard: int) -> list[MovedConversation]:
        view = self.node.committed_view(shard)
        since_ms = self._clock.wall_ms() - int(self._limits.replay_window_s * 1000)
        limit = self._limits.conversations_per_shard_max
        summaries = await self._bounded(
            view.list_conversations(since_ms, limit), "list conversations"
        )
        if len(summaries) >= limit:
            self.truncated_shards_total += 1
            log.warning(
                "shard %d: more than %d active conversations; replaying the %d most recent",
                shard,
                limit,
                limit,
            )
        gate = asyncio.Semaphore(self._limits.lookups_max)

        async def one(summary: ConversationSummary) -> MovedConversation | None:
            async with gate:
                try:
                    revision = await self._revision(view, summary)
                except (ReplicaUnavailable, NotFound) as exc:
                    self.lookup_failures_total += 1
                    log.warning("%s: no model revision: %s", summary.conversation_id, exc)
                    return None
            return MovedConversation(
                tenant_id=summary.tenant_id,
                conversation_id=summary.conversation_id,
                model_revision=revision,
                last_activity_ms=summary.last_activity_ms,
                estimated_prompt_tokens=summary.token_count,
                through_seq=summary.last_seq,
            )

        # a drill's canary conversations are measurements, not chats: no KV worth a GPU
        chats = [s for s in summaries if s.tenant_id != DRILL_TENANT]
        moved = await asyncio.gather(*(one(s) for s in chats))
        return [m for m in moved if m is not None]

    async def conversation(self, tenant_id: str, conversation_id: str) -> MovedConversation:
        shard = self.node.shard_of(conversation_id)
        view = self.node.committed_view(shard)
        # paged, summed as it goes: a huge conversation is never held whole
        first: LogEntry | None = None
        last: LogEntry | None = None
        tokens = read = 0
        after_seq = -1
        while read < self._limits.entries_max:
            page = await self._bounded(
                view.read_conversation(
                    tenant_id, conversation_id, after_seq, self._limits.page_entries
                ),
                "read conversation",
            )
            if page:
                first = first or page[0]
                last = page[-1]
            tokens += sum(e.token_count for e in page)
            read += len(page)
            if len(page) < self._limits.page_entries:
                break
            after_seq = page[-1].seq
        if first is None or last is None or first.event_type != CONVERSATION_CREATED:
            raise NotFound(f"no conversation {conversation_id!r}")
        return MovedConversation(
            tenant_id=tenant_id,
            conversation_id=conversation_id,
            model_revision=str(json.loads(first.body)["model_revision"]),
            last_activity_ms=last.created_at_ms,
            estimated_prompt_tokens=tokens,
            through_seq=last.seq,
        )

    async def _revision(self, view: CommittedView, summary: ConversationSummary) -> str:
        first = await self._bounded(
            view.read_conversation(summary.tenant_id, summary.conversation_id, -1, 1),
            "read conversation.created",
        )
        if not first or first[0].event_type != CONVERSATION_CREATED:
            raise NotFound(f"conversation {summary.conversation_id!r} has no created entry")
        return str(json.loads(first[0].body)["model_revision"])

    async def _bounded(self, awaitable: Awaitable[T], what: str) -> T:
        try:
            return await asyncio.wait_for(awaitable, self._limits.timeout_s)
        except TimeoutError as exc:
            raise ReplicaUnavailable(
                f"{what}: replica did not answer in {self._limits.timeout_s}s"
            ) from exc
