"""The leader's cache of conversation states: least recently used first out, bounded in count
*and* in estimated bytes (``ConversationState.size_bytes``), so neither many conversations nor
one huge one can grow a node's memory past ``conversation_cache_max`` /
``conversation_cache_bytes_max``.

A state that has writes in flight is never evicted (its decisions are not yet in any replica a
reload would read): the caller says which states are evictable. States grow as appends apply;
``account`` charges the growth after each change.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable

from eventlog.conversation_state import ConversationState

#: (shard, tenant_id, conversation_id): a conversation is keyed by its tenant and its id
ConversationKey = tuple[int, str, str]
#: most states one ``evict`` call looks at (bounded work per call; later calls go on)
EVICT_SCAN_MAX = 1024


class ConversationCache:
    def __init__(self, entries_max: int, bytes_max: int) -> None:
        self.entries_max = entries_max
        self.bytes_max = bytes_max
        self._states: OrderedDict[ConversationKey, ConversationState] = OrderedDict()
        self.size_bytes = 0
        self.evicted_total = 0

    def __len__(self) -> int:
        return len(self._states)

    def get(self, key: ConversationKey) -> ConversationState | None:
        return self._states.get(key)

    def put(self, key: ConversationKey, state: ConversationState) -> None:
        self.drop(key)
        self._states[key] = state
        state.counted_bytes = 0
        self.account(state)

    def account(self, state: ConversationState) -> None:
        """Charge what ``state`` grew (or shrank) by since it was last counted."""
        self.size_bytes += state.size_bytes - state.counted_bytes
        state.counted_bytes = state.size_bytes

    def touch(self, key: ConversationKey) -> None:
        self._states.move_to_end(key)

    def drop(self, key: ConversationKey) -> None:
        state = self._states.pop(key, None)
        if state is not None:
            self.size_bytes -= state.counted_bytes

    def drop_shard(self, shard: int) -> None:
        for key in [k for k in self._states if k[0] == shard]:
            self.drop(key)

    def holds_shard(self, shard: int) -> bool:
        return any(k[0] == shard for k in self._states)

    def evict(self, evictable: Callable[[ConversationKey, ConversationState], bool]) -> None:
        """Drop least recently used evictable states until both bounds hold, looking at no
        more than ``EVICT_SCAN_MAX`` states (states with writes in flight are passed over)."""
        if len(self._states) <= self.entries_max and self.size_bytes <= self.bytes_max:
            return  # the common case: no walk over the cache on the hot path
        for key in list(itertools.islice(self._states, EVICT_SCAN_MAX)):
            if len(self._states) <= self.entries_max and self.size_bytes <= self.bytes_max:
                return
            if evictable(key, self._states[key]):
                self.drop(key)
                self.evicted_total += 1
