"""A replica's last_epoch is the stamp of its last entry, not the epoch of the append that wrote
it: recovery picks the most up-to-date log by (last_epoch, last_lsn), so overstating it could make
a new leader adopt a log that misses committed entries."""

from __future__ import annotations

from pathlib import Path

from eventlog.memory_replica import MemoryReplica
from eventlog.model import Accepted, LogEntry
from eventlog.replica import ReplicaStore
from eventlog.stores import open_replica_store


def _entry(lsn: int, epoch: int) -> LogEntry:
    return LogEntry(
        lsn=lsn,
        epoch=epoch,
        tenant_id="t",
        conversation_id="c",
        seq=lsn,
        event_type="note",
        idempotency_key=None,
        attempt_id=None,
        token_count=1,
        created_at_ms=lsn,
        body="{}",
    )


async def _check(replica: ReplicaStore) -> None:
    # A leader at epoch 5 re-sends a recovered tail stamped 3 (no barrier yet in this batch).
    reply = await replica.append(0, 5, 0, 0, [_entry(1, 3), _entry(2, 3)], 0)
    assert reply == Accepted(2)
    status = await replica.status(0)
    assert (status.promised_epoch, status.last_lsn, status.last_epoch) == (5, 2, 3)
    reply = await replica.append(0, 5, 2, 3, [_entry(3, 5)], 2)
    assert reply == Accepted(3)
    assert (await replica.status(0)).last_epoch == 5


async def test_memory_replica_last_epoch_is_the_last_entrys() -> None:
    await _check(MemoryReplica("a"))


async def test_sqlite_replica_last_epoch_is_the_last_entrys(tmp_path: Path) -> None:
    store = await open_replica_store(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}", "a")
    try:
        await _check(store)
    finally:
        await store.close()
