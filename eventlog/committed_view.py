"""A shard's committed log as of one commit point, for readers beside the log (replay's planner).

``LogNode.committed_view(shard)`` hands one out while this node serves the shard: it reads from
the replica the shard's leader reads from (known to hold everything committed) and never sees an
entry past the commit point it was taken at. The reader gets these two reads and nothing else of
the store (no writes, no other shard, no uncommitted entries).
"""

from __future__ import annotations

from dataclasses import dataclass

from eventlog.model import ConversationSummary, LogEntry
from eventlog.replica import ReplicaStore


@dataclass(frozen=True, slots=True)
class CommittedView:
    _store: ReplicaStore
    shard: int
    commit_lsn: int

    async def list_conversations(self, since_ms: int, limit: int) -> list[ConversationSummary]:
        """Conversations active since ``since_ms``, most recent first, at most ``limit``."""
        return await self._store.list_conversations(self.shard, since_ms, self.commit_lsn, limit)

    async def read_conversation(
        self, tenant_id: str, conversation_id: str, after_seq: int, limit: int
    ) -> list[LogEntry]:
        """Up to ``limit`` committed entries of one conversation after ``after_seq``."""
        return await self._store.read_conversation(
            self.shard, tenant_id, conversation_id, after_seq, limit, self.commit_lsn
        )
