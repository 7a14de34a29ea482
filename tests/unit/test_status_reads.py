"""A replica's status reads go many shards to a query, one query at a time
(``eventlog.stores.status_reads``), and a read is always sent after its call began."""

from __future__ import annotations

import asyncio

import pytest

from eventlog.errors import ReplicaUnavailable
from eventlog.model import ShardStatus
from eventlog.stores.status_reads import StatusReads


class GatedReads:
    """``read_many`` that records each query's shards and answers when released."""

    def __init__(self) -> None:
        self.queries: list[list[int]] = []
        self.release = asyncio.Event()
        self.fail_next: Exception | None = None
        self.epoch = 1

    async def read_many(self, shards: list[int]) -> dict[int, ShardStatus]:
        self.queries.append(shards)
        epoch = self.epoch  # what the server holds when the query reaches it
        await self.release.wait()
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        return {shard: ShardStatus(epoch, shard, 1, 0) for shard in shards}


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_calls_during_a_query_wait_for_the_next_which_reads_them_all() -> None:
    reads = GatedReads()
    store = StatusReads("r1", reads.read_many)
    first = asyncio.ensure_future(store.status(0))
    await _settle()
    assert reads.queries == [[0]]
    reads.epoch = 2  # a newer promise lands; calls made from now on must see it
    later = [asyncio.ensure_future(store.status(s)) for s in (3, 1, 3, 0)]
    await _settle()
    assert reads.queries == [[0]]  # nothing joins the query under way
    reads.release.set()
    assert (await first).promised_epoch == 1
    answers = await asyncio.gather(*later)
    assert reads.queries == [[0], [0, 1, 3]]  # one more query, each shard once
    assert [(a.promised_epoch, a.last_lsn) for a in answers] == [(2, 3), (2, 1), (2, 3), (2, 0)]


async def test_a_caller_that_stops_waiting_leaves_the_query_running() -> None:
    reads = GatedReads()
    store = StatusReads("r1", reads.read_many)
    abandoned = asyncio.ensure_future(store.status(0))
    kept = asyncio.ensure_future(store.status(0))
    await _settle()
    abandoned.cancel()
    await _settle()
    reads.release.set()
    assert (await kept).promised_epoch == 1
    assert reads.queries == [[0]]


async def test_a_failed_query_fails_its_callers_and_the_next_one_runs() -> None:
    reads = GatedReads()
    store = StatusReads("r1", reads.read_many)
    reads.fail_next = ReplicaUnavailable("r1 down")
    first = asyncio.ensure_future(store.status(0))
    await _settle()
    second = asyncio.ensure_future(store.status(1))
    reads.release.set()
    with pytest.raises(ReplicaUnavailable, match="r1 down"):
        await first
    assert (await second).last_lsn == 1
    assert reads.queries == [[0], [1]]


async def test_closing_fails_the_calls_waiting_and_every_later_one() -> None:
    reads = GatedReads()
    store = StatusReads("r1", reads.read_many)
    under_way = asyncio.ensure_future(store.status(0))
    await _settle()
    waiting = asyncio.ensure_future(store.status(1))
    await _settle()
    await store.close(wait_s=0.01)  # the query under way never answers: cancelled
    for call in (under_way, waiting):
        with pytest.raises(ReplicaUnavailable, match="closed"):
            await call
    with pytest.raises(ReplicaUnavailable, match="closed"):
        await store.status(2)
