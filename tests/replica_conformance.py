"""Every ReplicaStore behaves like the reference MemoryReplica (the contract in eventlog.replica).

``ReplicaConformance`` is the suite; a test module subclasses it and provides a
``replica_opener`` fixture (opens a store on the same data every time it is called). It runs on
MemoryReplica (tests/unit/test_replica_conformance.py), the SQLite store
(tests/integration/test_sqlite_replica.py) and PostgreSQL (tests/integration/test_pg_replica.py).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventlog.errors import InvariantViolation
from eventlog.identity import IdentityRecord
from eventlog.memory_replica import MemoryReplica
from eventlog.model import (
    Accepted,
    HeldPosition,
    IdentityMismatch,
    LogEntry,
    Mismatch,
    Promised,
    Rejected,
    ShardStatus,
    leader_barrier,
)
from eventlog.replica import ReplicaStore


class ReplicaOpener:
    """Opens stores over one location; closes all of them at the end of the test."""

    def __init__(self, make: Callable[[], Awaitable[ReplicaStore]]) -> None:
        self._make = make
        self._opened: list[ReplicaStore] = []

    async def __call__(self) -> ReplicaStore:
        store = await self._make()
        self._opened.append(store)
        return store

    async def close_all(self) -> None:
        for store in self._opened:
            await store.close()


def entry(
    lsn: int, epoch: int, conversation: str = "c1", seq: int | None = None, **fields: Any
) -> LogEntry:
    values: dict[str, Any] = {
        "tenant_id": f"tenant-of-{conversation}",
        "event_type": "message.user",
        "idempotency_key": None,
        "attempt_id": None,
        "token_count": 10,
        "created_at_ms": 1_000 + lsn,
        "body": f'{{"lsn": {lsn}, "epoch": {epoch}}}',
    }
    values.update(fields)
    return LogEntry(
        lsn=lsn,
        epoch=epoch,
        conversation_id=conversation,
        seq=lsn if seq is None else seq,
        **values,
    )


def run(first_lsn: int, last_lsn: int, epoch: int, **fields: Any) -> list[LogEntry]:
    return [entry(lsn, epoch, **fields) for lsn in range(first_lsn, last_lsn + 1)]


async def fill(
    store: ReplicaStore, shard: int, last_lsn: int, epoch: int = 1, commit: int = 0
) -> None:
    assert isinstance(await store.prepare(shard, epoch, 0), Promised)
    reply = await store.append(shard, epoch, 0, 0, run(1, last_lsn, epoch), commit)
    assert reply == Accepted(last_lsn)


class ReplicaConformance:
    @pytest.fixture
    async def replica(self, replica_opener: ReplicaOpener) -> ReplicaStore:
        return await replica_opener()

    # --- prepare -------------------------------------------------------------------------

    async def test_prepare_promises_higher_epochs_only(self, replica: ReplicaStore) -> None:
        first = await replica.prepare(0, 1, 10)
        assert first == Promised(ShardStatus(1, 0, 0, 0), (), True)
        assert await replica.prepare(0, 1, 10) == Rejected(1)
        assert await replica.prepare(0, 0, 10) == Rejected(1)
        second = await replica.prepare(0, 5, 10)
        assert isinstance(second, Promised) and second.status.promised_epoch == 5
        assert (await replica.status(0)).promised_epoch == 5
        assert (await replica.status(1)) == ShardStatus(0, 0, 0, 0)  # shards are independent

    async def test_prepare_returns_tail_after_commit_bounded(self, replica: ReplicaStore) -> None:
        await fill(replica, 3, last_lsn=5, commit=1)
        partial = await replica.prepare(3, 2, 2)
        assert isinstance(partial, Promised)
        assert [e.lsn for e in partial.tail] == [2, 3]
        assert partial.tail_complete is False
        assert partial.status == ShardStatus(2, 5, 1, 1)
        whole = await replica.prepare(3, 3, 10)
        assert isinstance(whole, Promised)
        assert [e.lsn for e in whole.tail] == [2, 3, 4, 5] and whole.tail_complete is True
        assert whole.tail[0] == entry(2, 1)

    # --- append --------------------------------------------------------------------------

    async def test_append_fences_lower_epochs(self, replica: ReplicaStore) -> None:
        assert isinstance(await replica.prepare(0, 2, 0), Promised)
        assert await replica.append(0, 1, 0, 0, run(1, 1, 1), 0) == Rejected(2)
        assert await replica.read_log(0, 0, 10) == []
        assert await replica.append(0, 3, 0, 0, run(1, 1, 3), 0) == Accepted(1)
        assert (await replica.status(0)).promised_epoch == 3  # append raises the promise
        assert await replica.append(0, 2, 1, 3, run(2, 2, 2), 0) == Rejected(3)
        assert await replica.prepare(0, 3, 0) == Rejected(3)

    async def test_last_epoch_is_the_last_entrys_stamp(self, replica: ReplicaStore) -> None:
        """Not the epoch of the append that wrote it: recovery picks the most up-to-date log by
        (last_epoch, last_lsn), so overstating it could make a new leader adopt a log that
        misses committed entries."""
        # A leader at epoch 5 re-sends a recovered tail stamped 3 (no barrier yet in this batch).
        assert isinstance(await replica.prepare(0, 5, 0), Promised)
        assert await replica.append(0, 5, 0, 0, run(1, 2, 3), 0) == Accepted(2)
        status = await replica.status(0)
        assert (status.promised_epoch, status.last_lsn, status.last_epoch) == (5, 2, 3)
        assert await replica.append(0, 5, 2, 3, run(3, 3, 5), 2) == Accepted(3)
        assert (await replica.status(0)).last_epoch == 5

    async def test_prev_mismatch(self, replica: ReplicaStore) -> None:
        await fill(replica, 0, last_lsn=3)
        assert await replica.append(0, 1, 5, 1, run(6, 6, 1), 0) == Mismatch(3)
        assert await replica.append(0, 2, 3, 2, run(4, 4, 2), 0) == Mismatch(3)
        assert (await replica.status(0)).promised_epoch == 2  # a mismatch still promises
        assert await replica.append(0, 2, 3, 1, run(4, 4, 2), 0) == Accepted(4)
        assert (await replica.status(0)) == ShardStatus(2, 4, 2, 0)

    async def test_conflicting_suffix_is_truncated(self, replica: ReplicaStore) -> None:
        await fill(replica, 0, last_lsn=5)
        assert await replica.append(0, 2, 2, 1, [entry(3, 2, body="new")], 0) == Accepted(3)
        log = await replica.read_log(0, 0, 10)
        assert [(e.lsn, e.epoch) for e in log] == [(1, 1), (2, 1), (3, 2)]
        assert log[2].body == "new"
        assert await replica.status(0) == ShardStatus(2, 3, 2, 0)

    async def test_non_conflicting_later_entries_are_kept(self, replica: ReplicaStore) -> None:
        await fill(replica, 0, last_lsn=5)
        # a delayed re-send of lsn 1..2 (same epoch) must not cut 3..5
        resent = [entry(1, 1, body="resent"), entry(2, 1, body="resent")]
        assert await replica.append(0, 1, 0, 0, resent, 0) == Accepted(2)
        log = await replica.read_log(0, 0, 10)
        assert [e.lsn for e in log] == [1, 2, 3, 4, 5]
        assert log[0] == entry(1, 1)  # the stored entry is kept, not rewritten
        assert await replica.status(0) == ShardStatus(1, 5, 1, 0)

    async def test_recovered_tail_keeps_older_epochs(self, replica: ReplicaStore) -> None:
        await fill(replica, 0, last_lsn=2)
        tail = [entry(3, 1), leader_barrier(4, 3, "eu", 5_000)]
        assert await replica.append(0, 3, 2, 1, tail, 0) == Accepted(4)
        assert await replica.status(0) == ShardStatus(3, 4, 3, 0)
        assert [(e.lsn, e.epoch) for e in await replica.read_log(0, 0, 10)] == [
            (1, 1), (2, 1), (3, 1), (4, 3),
        ]  # fmt: skip

    async def test_commit_hint_rule(self, replica: ReplicaStore) -> None:
        await fill(replica, 0, last_lsn=3, commit=10)
        assert (await replica.status(0)).commit_lsn == 3  # min(leader_commit, match)
        assert await replica.append(0, 1, 1, 1, [], 1) == Accepted(1)
        assert (await replica.status(0)).commit_lsn == 3  # never goes back
        assert await replica.append(0, 1, 3, 1, run(4, 5, 1), 4) == Accepted(5)
        assert (await replica.status(0)).commit_lsn == 4

    async def test_truncating_a_committed_entry_is_a_bug(self, replica: ReplicaStore) -> None:
        await fill(replica, 0, last_lsn=4, commit=3)
        with pytest.raises(InvariantViolation):
            await replica.append(0, 2, 1, 1, [entry(2, 2)], 0)
        assert [e.epoch for e in await replica.read_log(0, 0, 10)] == [1, 1, 1, 1]
        assert await replica.append(0, 2, 4, 1, run(5, 5, 2), 0) == Accepted(5)

    async def test_malformed_batch_is_a_bug(self, replica: ReplicaStore) -> None:
        with pytest.raises(InvariantViolation):
            await replica.append(0, 1, 0, 0, [entry(2, 1)], 0)  # not contiguous
        with pytest.raises(InvariantViolation):
            await replica.append(0, 1, 0, 0, [entry(1, 2)], 0)  # above the append's epoch
        with pytest.raises(InvariantViolation):
            await replica.append(0, 2, 0, 0, [entry(1, 2), entry(2, 1)], 0)  # epochs go down

    # --- reads ---------------------------------------------------------------------------

    async def test_read_log_bounds(self, replica: ReplicaStore) -> None:
        await fill(replica, 0, last_lsn=6)
        assert [e.lsn for e in await replica.read_log(0, 2, 3)] == [3, 4, 5]
        assert [e.lsn for e in await replica.read_log(0, 5, 10)] == [6]
        assert await replica.read_log(0, 6, 10) == []
        assert await replica.read_log(0, 0, 0) == []
        assert await replica.read_log(9, 0, 10) == []

    async def test_read_conversation_bounds(self, replica: ReplicaStore) -> None:
        assert isinstance(await replica.prepare(0, 1, 0), Promised)
        batch = [
            entry(1, 1, "a", seq=0),
            entry(2, 1, "b", seq=0),
            entry(3, 1, "a", seq=1),
            entry(4, 1, "a", seq=2),
            entry(5, 1, "b", seq=1),
            entry(6, 1, "a", seq=3),
        ]
        assert await replica.append(0, 1, 0, 0, batch, 6) == Accepted(6)
        found = await replica.read_conversation(0, "tenant-of-a", "a", -1, 10, 6)
        assert [(e.lsn, e.seq) for e in found] == [(1, 0), (3, 1), (4, 2), (6, 3)]
        assert [
            e.seq for e in await replica.read_conversation(0, "tenant-of-a", "a", 1, 10, 6)
        ] == [2, 3]
        assert [e.seq for e in await replica.read_conversation(0, "tenant-of-a", "a", 0, 1, 6)] == [
            1
        ]
        assert [
            e.seq for e in await replica.read_conversation(0, "tenant-of-a", "a", -1, 10, 4)
        ] == [0, 1, 2]
        assert await replica.read_conversation(0, "tenant-of-zz", "zz", -1, 10, 6) == []
        assert await replica.read_conversation(0, "tenant-of-b", "a", -1, 10, 6) == []

    async def test_a_page_snapshot_is_the_page_the_identity_and_the_status(
        self, replica: ReplicaStore
    ) -> None:
        """``read_page_snapshot`` answers what ``read_conversation``, ``identity`` and
        ``status`` answer in turn while nothing writes (that it reads them in one snapshot is
        each store's own test: a physical restore under the read, tests/unit/test_read_sources.py,
        and PostgreSQL's one statement)."""
        assert isinstance(await replica.prepare(0, 2, 0), Promised)
        batch = [entry(1, 2, "a", seq=0), entry(2, 2, "b", seq=0), entry(3, 2, "a", seq=1)]
        assert await replica.append(0, 2, 0, 0, batch, 2) == Accepted(3)
        store_id = await replica.identity()
        for args in (("tenant-of-a", "a", -1, 10, 3), ("tenant-of-a", "a", 0, 10, 2),
                     ("tenant-of-a", "a", -1, 1, 3), ("tenant-of-b", "a", -1, 10, 3),
                     ("tenant-of-a", "a", -1, 0, 3)):  # fmt: skip
            page = await replica.read_page_snapshot(0, *args)
            assert page.entries == await replica.read_conversation(0, *args), args
            assert (page.store_id, page.status) == (store_id, ShardStatus(2, 3, 2, 2)), args
        never_prepared = await replica.read_page_snapshot(9, "tenant-of-a", "a", -1, 10, 3)
        assert never_prepared.entries == []
        assert never_prepared.status == await replica.status(9) == ShardStatus(0, 0, 0, 0)

    async def test_two_tenants_one_conversation_id(self, replica: ReplicaStore) -> None:
        """A conversation is keyed by (tenant, id): the same id under two tenants is two
        conversations, each with its own seqs, read and listed apart."""
        assert isinstance(await replica.prepare(0, 1, 0), Promised)
        batch = [
            entry(1, 1, "same", seq=0, tenant_id="t1", created_at_ms=100, token_count=3),
            entry(2, 1, "same", seq=0, tenant_id="t2", created_at_ms=200, token_count=5),
            entry(3, 1, "same", seq=1, tenant_id="t2", created_at_ms=300, token_count=7),
        ]
        assert await replica.append(0, 1, 0, 0, batch, 3) == Accepted(3)
        assert [e.lsn for e in await replica.read_conversation(0, "t1", "same", -1, 10, 3)] == [1]
        t2 = await replica.read_conversation(0, "t2", "same", -1, 10, 3)
        assert [(e.lsn, e.seq) for e in t2] == [(2, 0), (3, 1)]
        summaries = await replica.list_conversations(0, 0, 3, 10)
        assert [(s.tenant_id, s.conversation_id, s.token_count, s.last_seq) for s in summaries] == [
            ("t2", "same", 12, 1), ("t1", "same", 3, 0),
        ]  # fmt: skip

    async def test_list_conversations_bounds(self, replica: ReplicaStore) -> None:
        assert isinstance(await replica.prepare(0, 1, 0), Promised)
        batch = [
            leader_barrier(1, 1, "eu", 9_999),
            entry(2, 1, "a", seq=0, created_at_ms=100, token_count=5),
            entry(3, 1, "b", seq=0, created_at_ms=200, token_count=7),
            entry(4, 1, "a", seq=1, created_at_ms=300, token_count=11),
            entry(5, 1, "c", seq=0, created_at_ms=300, token_count=1),
            entry(6, 1, "b", seq=1, created_at_ms=400, token_count=2),
        ]
        assert await replica.append(0, 1, 0, 0, batch, 6) == Accepted(6)
        summaries = await replica.list_conversations(0, 0, 6, 10)
        assert [(s.conversation_id, s.last_activity_ms) for s in summaries] == [
            ("b", 400), ("a", 300), ("c", 300),
        ]  # fmt: skip
        b = summaries[0]
        assert (b.tenant_id, b.token_count, b.last_seq) == ("tenant-of-b", 9, 1)
        bounded = await replica.list_conversations(0, 0, 5, 10)  # max_lsn hides lsn 6
        assert [(s.conversation_id, s.last_activity_ms, s.token_count) for s in bounded] == [
            ("a", 300, 16), ("c", 300, 1), ("b", 200, 7),
        ]  # fmt: skip
        assert [s.conversation_id for s in await replica.list_conversations(0, 300, 6, 10)] == [
            "b", "a", "c",
        ]  # fmt: skip
        # active since 301: only b, with the totals of all its entries, the older one too
        [recent] = await replica.list_conversations(0, 301, 6, 10)
        assert (recent.conversation_id, recent.token_count, recent.last_seq) == ("b", 9, 1)
        assert await replica.list_conversations(0, 301, 5, 10) == []  # its new entry is hidden
        assert len(await replica.list_conversations(0, 0, 6, 2)) == 2

    # --- group commit and durability -----------------------------------------------------

    async def test_many_concurrent_appends_across_shards(self, replica: ReplicaStore) -> None:
        shards, rounds = 64, 4
        for shard in range(shards):
            assert isinstance(await replica.prepare(shard, 1, 0), Promised)

        async def leader(shard: int) -> list[object]:
            replies: list[object] = []
            for r in range(rounds):
                batch = run(r * 2 + 1, r * 2 + 2, 1, conversation=f"s{shard}")
                replies.append(await replica.append(shard, 1, r * 2, 1 if r else 0, batch, r * 2))
            return replies

        results = await asyncio.gather(*(leader(s) for s in range(shards)))
        expected = [Accepted(r * 2 + 2) for r in range(rounds)]
        assert all(replies == expected for replies in results)
        for shard in range(shards):
            log = await replica.read_log(shard, 0, 100)
            assert [e.lsn for e in log] == list(range(1, rounds * 2 + 1))
            assert {e.conversation_id for e in log} == {f"s{shard}"}
            assert await replica.status(shard) == ShardStatus(1, rounds * 2, 1, rounds * 2 - 2)
        groups = getattr(replica, "groups_committed", None)
        if groups is not None:  # the SQL stores merge concurrent callers into groups
            assert groups < shards * rounds

    async def test_sub_batches_of_one_shard_apply_in_arrival_order(
        self, replica: ReplicaStore
    ) -> None:
        assert isinstance(await replica.prepare(0, 1, 0), Promised)
        replies = await asyncio.gather(
            replica.append(0, 1, 0, 0, run(1, 2, 1), 0),
            replica.append(0, 1, 2, 1, run(3, 3, 1), 1),
            replica.append(0, 1, 7, 1, run(8, 8, 1), 0),  # gap: mismatch
            replica.append(0, 0, 3, 1, run(4, 4, 0), 0),  # stale epoch
            replica.append(0, 2, 1, 1, run(2, 2, 2), 0),  # new leader truncates 2..3
            replica.append(1, 1, 0, 0, run(1, 1, 1), 1),  # another shard in the same group
        )
        assert list(replies) == [
            Accepted(2), Accepted(3), Mismatch(3), Rejected(1), Accepted(2), Accepted(1),
        ]  # fmt: skip
        assert [(e.lsn, e.epoch) for e in await replica.read_log(0, 0, 10)] == [(1, 1), (2, 2)]
        assert await replica.status(0) == ShardStatus(2, 2, 2, 1)

    async def test_durable_across_close_and_reopen(
        self, replica: ReplicaStore, replica_opener: ReplicaOpener
    ) -> None:
        await fill(replica, 4, last_lsn=3, commit=2)
        assert isinstance(await replica.prepare(4, 7, 0), Promised)
        await replica.close()
        reopened = await replica_opener()
        assert await reopened.status(4) == ShardStatus(7, 3, 1, 2)
        assert await reopened.read_log(4, 0, 10) == run(1, 3, 1)
        assert await reopened.append(4, 6, 3, 1, run(4, 4, 6), 0) == Rejected(7)

    async def test_identity_is_durable_and_the_registry_keeps_the_highest_generation(
        self, replica: ReplicaStore, replica_opener: ReplicaOpener
    ) -> None:
        store_id = await replica.identity()
        assert store_id and await replica.registry() == {}
        await replica.record_identity("a", IdentityRecord("a-1", 0))
        await replica.record_identity("a", IdentityRecord("a-2", 2))
        await replica.record_identity("a", IdentityRecord("a-3", 1))  # lower: ignored
        await replica.record_identity("b", IdentityRecord("b-1", 0))
        await replica.close()
        reopened = await replica_opener()
        assert await reopened.identity() == store_id
        assert await reopened.registry() == {
            "a": IdentityRecord("a-2", 2),
            "b": IdentityRecord("b-1", 0),
        }

    async def test_an_append_naming_another_store_writes_nothing(
        self, replica: ReplicaStore
    ) -> None:
        """``expected_store_id``: an append meant for another store (the one this store's
        region had before it was wiped) is refused with nothing written, not even the promise;
        one naming this store, or none, is applied."""
        store_id = await replica.identity()
        assert isinstance(await replica.prepare(0, 1, 0), Promised)
        refused = await replica.append(0, 2, 0, 0, run(1, 2, 2), 1, "another-store")
        assert refused == IdentityMismatch()
        assert await replica.status(0) == ShardStatus(1, 0, 0, 0)
        assert await replica.read_log(0, 0, 10) == []
        assert await replica.append(0, 2, 0, 0, run(1, 2, 2), 1, store_id) == Accepted(2)
        assert await replica.append(0, 2, 2, 2, run(3, 3, 2), 2) == Accepted(3)
        assert await replica.status(0) == ShardStatus(2, 3, 2, 2)

    async def test_a_group_with_both_names_refuses_only_the_other_stores(
        self, replica: ReplicaStore
    ) -> None:
        """Sub-batches of one group commit that name different stores (a sweep re-admitted
        a store between two leaders' sends): each is judged by its own name."""
        store_id = await replica.identity()
        replies = await asyncio.gather(
            replica.append(0, 1, 0, 0, run(1, 1, 1), 0, store_id),
            replica.append(1, 1, 0, 0, run(1, 1, 1), 0, "another-store"),
            replica.append(2, 1, 0, 0, run(1, 1, 1), 0),
            replica.append(0, 1, 1, 1, run(2, 2, 1), 1, store_id),
        )
        assert list(replies) == [Accepted(1), IdentityMismatch(), Accepted(1), Accepted(2)]
        assert await replica.status(1) == ShardStatus(0, 0, 0, 0)
        assert await replica.status(0) == ShardStatus(1, 2, 1, 1)

    async def test_an_accepted_append_keeps_the_highest_positions(
        self, replica: ReplicaStore, replica_opener: ReplicaOpener
    ) -> None:
        """``positions``: kept per shard and region, only ever raised, only by an accepted
        append, durable, and shards are independent."""
        assert await replica.positions(0) == {}
        assert isinstance(await replica.prepare(0, 2, 0), Promised)
        high, low = HeldPosition(2, 5), HeldPosition(2, 3)
        assert await replica.append(0, 1, 0, 0, run(1, 1, 1), 0, None, {"a": high}) == Rejected(2)
        assert await replica.append(0, 2, 4, 2, run(5, 5, 2), 0, None, {"a": high}) == Mismatch(0)
        assert await replica.positions(0) == {}
        reply = await replica.append(0, 2, 0, 0, run(1, 1, 2), 0, None, {"a": low, "b": high})
        assert reply == Accepted(1)
        reply = await replica.append(0, 2, 1, 2, run(2, 2, 2), 0, None, {"a": high, "b": low})
        assert reply == Accepted(2)
        older_epoch_longer = HeldPosition(1, 9)
        assert await replica.append(0, 2, 2, 2, [], 0, None, {"c": older_epoch_longer}) == (
            Accepted(2)
        )
        assert await replica.append(0, 2, 2, 2, [], 0, None, {"c": HeldPosition(2, 1)}) == (
            Accepted(2)
        )
        await replica.close()
        reopened = await replica_opener()
        assert await reopened.positions(0) == {"a": high, "b": high, "c": HeldPosition(2, 1)}
        assert await reopened.positions(1) == {}

    async def test_positions_of_one_shard_in_one_group(self, replica: ReplicaStore) -> None:
        """Several sub-batches of one shard in a group commit, each with positions: the
        highest per region is kept."""
        replies = await asyncio.gather(
            replica.append(0, 1, 0, 0, run(1, 1, 1), 0, None, {"a": HeldPosition(1, 1)}),
            replica.append(0, 1, 1, 1, run(2, 2, 1), 1, None, {"a": HeldPosition(1, 2)}),
            replica.append(0, 1, 2, 1, run(3, 3, 1), 2, None, {"a": HeldPosition(1, 1)}),
        )
        assert list(replies) == [Accepted(1), Accepted(2), Accepted(3)]
        assert await replica.positions(0) == {"a": HeldPosition(1, 2)}

    # --- the same replies as the reference, for random operation sequences ---------------

    @settings(
        max_examples=100,
        deadline=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.differing_executors,  # one suite, run by a subclass per store
        ],
    )
    @given(
        ops=st.lists(st.tuples(st.integers(0, 6), st.randoms(use_true_random=False)), max_size=40)
    )
    async def test_random_operations_match_the_reference(
        self, replica: ReplicaStore, ops: list[tuple[int, Any]]
    ) -> None:
        reference = MemoryReplica("reference")
        base = next(_SHARD_BASES) * 4  # fresh shards per example: the store outlives examples
        for kind, rng in ops:
            calls = _random_calls(kind, rng)
            mine = await _outcomes(replica, base, calls)
            theirs = await _outcomes(reference, 0, calls)
            assert mine == theirs, calls
        for shard in range(3):
            assert await replica.status(base + shard) == await reference.status(shard)
            assert await replica.read_log(base + shard, 0, 100) == await reference.read_log(
                shard, 0, 100
            )


_SHARD_BASES = itertools.count(1_000)
Call = tuple[str, tuple[Any, ...]]


def _random_calls(kind: int, rng: Any) -> list[Call]:
    """One operation, or (kind 6) several appends issued concurrently."""
    if kind == 6:
        return [_random_append(rng) for _ in range(rng.randint(2, 5))]
    shard = rng.randint(0, 2)
    if kind == 0:
        return [("prepare", (shard, rng.randint(0, 3), rng.randint(0, 4)))]
    if kind in (1, 2):
        return [_random_append(rng)]
    if kind == 3:
        return [("read_log", (shard, rng.randint(0, 6), rng.randint(0, 5)))]
    if kind == 4:
        conversation = rng.choice(["c0", "c1", "c2"])
        tenant = rng.choice([f"tenant-of-{conversation}", "tenant-of-c0"])
        args = (
            shard, tenant, conversation, rng.randint(-1, 4), rng.randint(0, 5), rng.randint(0, 8),
        )  # fmt: skip
        return [("read_conversation", args), ("page_snapshot", args)]
    return [("list_conversations", (shard, rng.randint(1_000, 1_012), rng.randint(0, 8), 4))]


def _random_append(rng: Any) -> Call:
    # small ranges on purpose: prev checks should often pass and batches often overlap
    shard, epoch, prev_lsn = rng.randint(0, 1), rng.randint(0, 2), rng.randint(0, 4)
    epochs = sorted(
        rng.choice([epoch, epoch, rng.randint(0, epoch)]) for _ in range(rng.randint(0, 3))
    )
    batch = []
    for offset, entry_epoch in enumerate(epochs, start=1):
        conversation = rng.choice(["c0", "c1", "c2", ""])
        batch.append(
            entry(
                prev_lsn + offset,
                entry_epoch,
                conversation,
                seq=rng.randint(0, 4),
                tenant_id=rng.choice([f"tenant-of-{conversation}", "tenant-of-c0"]),
                created_at_ms=1_000 + rng.randint(0, 12),
                token_count=rng.randint(0, 50),
                body=f"{rng.random()}",
            )
        )
    args = (shard, epoch, prev_lsn, rng.randint(0, 2), tuple(batch), rng.randint(0, 6))
    return ("append", args)


async def _outcomes(store: ReplicaStore, base: int, calls: list[Call]) -> list[object]:
    async def one(name: str, args: tuple[Any, ...]) -> object:
        try:
            if name == "page_snapshot":  # the store's identity is its own: not compared
                page = await store.read_page_snapshot(base + args[0], *args[1:])
                return page.entries, page.status
            return await getattr(store, name)(base + args[0], *args[1:])
        except InvariantViolation:
            return "InvariantViolation"

    return list(await asyncio.gather(*(one(name, args) for name, args in calls)))
