"""KV affinity (pure): which worker and engine last rebuilt a conversation's KV, bounded LRU.

Learned from replay results; the router reads it to send the conversation's next turn to the
engine whose prefix cache is warm. A hint, not a promise: the engine may have evicted the blocks
since, and the table forgets its least recently touched entries beyond ``entries_max``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from eventlog.errors import InvariantViolation
from replay.model import ReplayResult


@dataclass(frozen=True, slots=True)
class Affinity:
    conversation_id: str
    tenant_id: str
    worker_id: str
    engine_id: str
    model_revision: str
    warm_since_ms: int  # when the replay finished (wall clock)
    prompt_tokens: int


class AffinityTable:
    def __init__(self, entries_max: int) -> None:
        if entries_max < 1:
            raise InvariantViolation("affinity table needs room for one entry")
        self.entries_max = entries_max
        #: (tenant_id, conversation_id) -> affinity: ids are namespaced by tenant
        self._entries: OrderedDict[tuple[str, str], Affinity] = OrderedDict()
        self.evicted_total = 0

    def __len__(self) -> int:
        return len(self._entries)

    def learn(self, result: ReplayResult) -> Affinity | None:
        """Remember the result's worker if it replayed (a newer result replaces an older one)."""
        if result.status != "replayed":
            return None
        key = (result.tenant_id, result.conversation_id)
        old = self._entries.get(key)
        if old is not None and old.warm_since_ms > result.finished_at_ms:
            return old  # results can arrive out of order (redelivery): keep the newest
        affinity = Affinity(
            conversation_id=result.conversation_id,
            tenant_id=result.tenant_id,
            worker_id=result.worker_id,
            engine_id=result.engine_id,
            model_revision=result.model_revision,
            warm_since_ms=result.finished_at_ms,
            prompt_tokens=result.prompt_tokens,
        )
        self._entries[key] = affinity
        self._entries.move_to_end(key)
        while len(self._entries) > self.entries_max:
            self._entries.popitem(last=False)
            self.evicted_total += 1
        return affinity

    def get(self, tenant_id: str, conversation_id: str) -> Affinity | None:
        affinity = self._entries.get((tenant_id, conversation_id))
        if affinity is not None:
            self._entries.move_to_end((tenant_id, conversation_id))
        return affinity
