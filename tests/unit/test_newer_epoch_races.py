"""Reading a replica's log while a newer leader writes to it: recovery and a replica rebuild
must not carry the newer epoch's entries under their own, older epoch.

Both read entries *after* they fixed their epoch (a promise; the others' statuses). A newer
leader that overwrites the source in between makes the read return entries stamped above that
epoch; appending them at the older epoch breaks ``append``'s contract, which every store checks
(``InvariantViolation``): the leader or the operator's rebuild crashed. Found by the whole-plane
simulation (seed 7729: a rebuild raced a control-shard leader's barrier).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from eventlog.config import LogConfig
from eventlog.errors import NoQuorum
from eventlog.memory_replica import MemoryReplica
from eventlog.model import Accepted, LogEntry, Promised, leader_barrier
from eventlog.rebuild import rebuild_replica
from eventlog.recovery import recover_log

SHARD = 0


def entries(first: int, last: int, epoch: int) -> list[LogEntry]:
    return [leader_barrier(lsn, epoch, "x", 0) for lsn in range(first, last + 1)]


class OvertakenOnRead(MemoryReplica):
    """A replica a newer leader writes to just before its first ``read_log`` answers."""

    def __init__(self, region: str) -> None:
        super().__init__(region)
        self.before_first_read: Callable[[], Awaitable[None]] | None = None

    async def read_log(self, shard: int, after_lsn: int, limit: int) -> list[LogEntry]:
        hook, self.before_first_read = self.before_first_read, None
        if hook is not None:
            await hook()
        return await super().read_log(shard, after_lsn, limit)


async def fill(store: MemoryReplica, epoch: int, log: list[LogEntry], commit_lsn: int) -> None:
    reply = await store.append(SHARD, epoch, 0, 0, log, commit_lsn)
    assert isinstance(reply, Accepted)


async def test_a_rebuild_overtaken_on_its_source_starts_again_at_the_newer_epoch() -> None:
    a, b, c = MemoryReplica("a"), MemoryReplica("b"), OvertakenOnRead("c")
    for store in (b, c):
        await fill(store, 2, entries(1, 3, 2), commit_lsn=3)

    async def newer_leader_writes() -> None:  # epoch 5 leads and appends its barrier, lsn 4
        for store in (b, c):
            assert isinstance(await store.prepare(SHARD, 5, 16), Promised)
            assert await store.append(SHARD, 5, 3, 2, entries(4, 4, 5), 3) == Accepted(4)

    c.before_first_read = newer_leader_writes  # c is the source (ties go to the last name)
    report = await rebuild_replica({"a": a, "b": b, "c": c}, "a", [SHARD], LogConfig())
    assert report.entries_copied == 4
    copied = await a.read_log(SHARD, 0, 10)
    assert [(e.lsn, e.epoch) for e in copied] == [(1, 2), (2, 2), (3, 2), (4, 5)]
    assert (await a.status(SHARD)).promised_epoch == 5


async def test_recovery_refuses_a_tail_a_newer_epoch_rewrote_after_the_promise() -> None:
    b, c = OvertakenOnRead("b"), MemoryReplica("c")
    await fill(b, 2, entries(1, 1, 1) + entries(2, 4, 2), commit_lsn=1)
    promises = {}
    for name, store in (("b", b), ("c", c)):
        promise = await store.prepare(SHARD, 3, 1)  # a tail of 1: recovery must read the rest
        assert isinstance(promise, Promised)
        promises[name] = promise
    assert not promises["b"].tail_complete

    async def newer_leader_rewrites() -> None:  # epoch 4 replaces entry 4 with its barrier
        assert isinstance(await b.prepare(SHARD, 4, 16), Promised)
        assert await b.append(SHARD, 4, 3, 2, entries(4, 4, 4), 1) == Accepted(4)

    b.before_first_read = newer_leader_rewrites
    with pytest.raises(NoQuorum, match="raced with a newer epoch"):
        await recover_log(SHARD, promises, {"b": b, "c": c}, LogConfig())
