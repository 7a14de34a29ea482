"""The replica port: what the protocol core needs from one region's durable store.

One ``ReplicaStore`` is one region's database. Its two writes, ``prepare`` and ``append``, are the
acceptor side of per-shard Multi-Paxos with Raft's log matching; the rules below are the whole
contract, and ``eventlog.memory_replica.MemoryReplica`` is the reference implementation that
every other store must match (the suite in ``tests/replica_conformance.py``).

prepare(shard, epoch, tail_max)
    If ``epoch <= promised``: ``Rejected(promised)``. Else make ``promised = epoch`` durable and
    return ``Promised(status, tail, tail_complete)`` where ``tail`` is the replica's entries with
    ``lsn > status.commit_lsn`` (lsn order, at most ``tail_max``).

append(shard, epoch, prev_lsn, prev_epoch, entries, leader_commit_lsn, expected_store_id,
       positions)
    0. If ``expected_store_id`` is set and is not ``identity()``: ``IdentityMismatch``, nothing
       written, checked in the same transaction (statement) as the write, so that no moment
       remains between the check and the write in which the store could be swapped. A leader
       names the identity its node's sweep vouched for (``eventlog.identity``): a wiped store
       must not adopt a deposed leader's epoch, be refilled and count toward its acks.
    ``entries`` are contiguous from ``prev_lsn + 1`` with non-decreasing epochs, none above
    ``epoch`` (a new leader re-sends the recovered tail with its original stamps, followed by its
    own barrier entry); anything else is a caller bug: ``InvariantViolation``.
    1. If ``epoch < promised``: ``Rejected(promised)``. Else ``promised = max(promised, epoch)``.
    2. If ``prev_lsn > 0`` and the replica has no entry ``(prev_lsn, prev_epoch)``:
       ``Mismatch(last_lsn)``.
    3. For each entry: an existing entry at the same lsn with the same epoch is kept (it is the
       same entry); one with another epoch is deleted together with every entry after it; then
       the entry is written. Entries after the batch that did not conflict are kept.
    4. ``match = prev_lsn + len(entries)``; ``commit_lsn = max(commit_lsn,
       min(leader_commit_lsn, match))``. All of it durable before replying ``Accepted(match)``.
    5. On ``Accepted`` only: each of ``positions`` (region -> ``HeldPosition``) is kept for the
       shard unless the store holds a higher one for that region, in the same transaction.

positions(shard)
    Region -> the highest ``HeldPosition`` any append left here for the shard: what the
    leaders knew each *other* replica to hold. A new leader compares a voter's log with the
    positions the other stores keep for it (``eventlog.recovery.rolled_back_voters``).

read_page_snapshot(shard, tenant_id, conversation_id, after_seq, limit, max_lsn)
    ``read_conversation``'s page together with ``identity()`` and ``status(shard)`` *as of the
    same read*: one snapshot of the store, not three calls in turn. A transcript read checks
    its source with them (``LogNode``): a page is complete only if the store that read it held
    every entry up to ``max_lsn`` when it read it. Asked after the read, a status can describe
    a later state: a database restored from a physical copy (the same identity) under the read
    and refilled by its leader before the status was asked would pass with a short page.

identity() / registry() / record_identity(region, record)
    The store's durable identity (``store_id``, new with every new database) and its registry
    of what each region's replica is known as; ``record_identity`` writes one registry row
    unless the row already holds a higher generation. See ``eventlog.identity``.

Reads never change state and see only what is durable. ``max_lsn`` bounds reads to the committed
prefix the caller knows of.

Errors: a store that cannot be reached raises ``ReplicaUnavailable`` (translated from the driver's
exception at the adapter); the core treats it like a lost message and retries under its budget.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

from eventlog.identity import IdentityRecord
from eventlog.model import (
    AppendReply,
    ConversationSummary,
    HeldPosition,
    LogEntry,
    PageSnapshot,
    PrepareReply,
    ShardStatus,
)

T = TypeVar("T")


class ReplicaStore(ABC):
    """One region's durable replica of every shard's log."""

    #: the region this replica belongs to
    region: str

    @abstractmethod
    async def prepare(self, shard: int, epoch: int, tail_max: int) -> PrepareReply: ...

    @abstractmethod
    async def append(
        self,
        shard: int,
        epoch: int,
        prev_lsn: int,
        prev_epoch: int,
        entries: Sequence[LogEntry],
        leader_commit_lsn: int,
        expected_store_id: str | None = None,
        positions: Mapping[str, HeldPosition] | None = None,
    ) -> AppendReply: ...

    @abstractmethod
    async def positions(self, shard: int) -> dict[str, HeldPosition]:
        """Region -> the highest position appends left here for ``shard``."""

    @abstractmethod
    async def status(self, shard: int) -> ShardStatus: ...

    @abstractmethod
    async def read_log(self, shard: int, after_lsn: int, limit: int) -> list[LogEntry]:
        """Entries with ``lsn > after_lsn`` in lsn order, at most ``limit``."""

    @abstractmethod
    async def read_conversation(
        self,
        shard: int,
        tenant_id: str,
        conversation_id: str,
        after_seq: int,
        limit: int,
        max_lsn: int,
    ) -> list[LogEntry]:
        """The conversation's entries with ``seq > after_seq`` and ``lsn <= max_lsn``, seq order.
        A conversation is keyed by its tenant *and* its id: two tenants' conversations with one
        id are two conversations (``eventlog.conversations``)."""

    @abstractmethod
    async def read_page_snapshot(
        self,
        shard: int,
        tenant_id: str,
        conversation_id: str,
        after_seq: int,
        limit: int,
        max_lsn: int,
    ) -> PageSnapshot:
        """``read_conversation``'s page with this store's identity and the shard's status, all
        three read in one snapshot of the store."""

    @abstractmethod
    async def list_conversations(
        self, shard: int, active_since_ms: int, max_lsn: int, limit: int
    ) -> list[ConversationSummary]:
        """Conversations (never the barrier entries, whose conversation_id is ""), one per
        (tenant_id, conversation_id), with an entry at ``created_at_ms >= active_since_ms`` (and
        ``lsn <= max_lsn``), most recently active first, at most ``limit``; ``token_count`` and
        ``last_seq`` are over all of the conversation's entries up to ``max_lsn``."""

    @abstractmethod
    async def identity(self) -> str:
        """This store's ``store_id``."""

    @abstractmethod
    async def registry(self) -> dict[str, IdentityRecord]:
        """Region -> the identity this store knows that region's replica by."""

    @abstractmethod
    async def record_identity(self, region: str, record: IdentityRecord) -> None:
        """Write ``region``'s row unless it holds a higher generation already."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Default: nothing to release."""


class ReplicaStoreWrapper(ReplicaStore):
    """A store in front of another (``inner``): every call goes through ``around``, the one
    place a wrapper decides what happens to it (a simulated network link delays or drops it, a
    drill's black-hole refuses it, the node times it). ``close`` closes ``inner``."""

    def __init__(self, inner: ReplicaStore) -> None:
        self.region = inner.region
        self._inner = inner

    async def around(self, call: str, read_only: bool, thunk: Callable[[], Awaitable[T]]) -> T:
        """Run ``thunk`` (the same call on ``inner``); ``read_only``: the call changes nothing
        on the replica. Default: just run it."""
        return await thunk()

    async def prepare(self, shard: int, epoch: int, tail_max: int) -> PrepareReply:
        return await self.around(
            "prepare", False, lambda: self._inner.prepare(shard, epoch, tail_max)
        )

    async def append(
        self,
        shard: int,
        epoch: int,
        prev_lsn: int,
        prev_epoch: int,
        entries: Sequence[LogEntry],
        leader_commit_lsn: int,
        expected_store_id: str | None = None,
        positions: Mapping[str, HeldPosition] | None = None,
    ) -> AppendReply:
        return await self.around(
            "append",
            False,
            lambda: self._inner.append(
                shard,
                epoch,
                prev_lsn,
                prev_epoch,
                entries,
                leader_commit_lsn,
                expected_store_id,
                positions,
            ),
        )

    async def positions(self, shard: int) -> dict[str, HeldPosition]:
        return await self.around("positions", True, lambda: self._inner.positions(shard))

    async def status(self, shard: int) -> ShardStatus:
        return await self.around("status", True, lambda: self._inner.status(shard))

    async def read_log(self, shard: int, after_lsn: int, limit: int) -> list[LogEntry]:
        return await self.around(
            "read_log", True, lambda: self._inner.read_log(shard, after_lsn, limit)
        )

    async def read_conversation(
        self,
        shard: int,
        tenant_id: str,
        conversation_id: str,
        after_seq: int,
        limit: int,
        max_lsn: int,
    ) -> list[LogEntry]:
        return await self.around(
            "read_conversation",
            True,
            lambda: self._inner.read_conversation(
                shard, tenant_id, conversation_id, after_seq, limit, max_lsn
            ),
        )

    async def read_page_snapshot(
        self,
        shard: int,
        tenant_id: str,
        conversation_id: str,
        after_seq: int,
        limit: int,
        max_lsn: int,
    ) -> PageSnapshot:
        return await self.around(
            "read_page_snapshot",
            True,
            lambda: self._inner.read_page_snapshot(
                shard, tenant_id, conversation_id, after_seq, limit, max_lsn
            ),
        )

    async def list_conversations(
        self, shard: int, active_since_ms: int, max_lsn: int, limit: int
    ) -> list[ConversationSummary]:
        return await self.around(
            "list_conversations",
            True,
            lambda: self._inner.list_conversations(shard, active_since_ms, max_lsn, limit),
        )

    async def identity(self) -> str:
        return await self.around("identity", True, self._inner.identity)

    async def registry(self) -> dict[str, IdentityRecord]:
        return await self.around("registry", True, self._inner.registry)

    async def record_identity(self, region: str, record: IdentityRecord) -> None:
        await self.around(
            "record_identity", False, lambda: self._inner.record_identity(region, record)
        )

    async def close(self) -> None:
        await self._inner.close()
