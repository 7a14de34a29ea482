"""The SQLite replica store (a real database file, driven through aiosqlite's thread): the
conformance suite, re-provisioning, and a schema upgrade that keeps old conversations."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiosqlite
import pytest

from eventlog.model import Accepted, LogEntry, Promised
from eventlog.replica import ReplicaStore
from eventlog.stores import SqlReplicaStore, StoreConfig, migrate, open_replica_store
from eventlog.stores._engine import make_engine
from tests.replica_conformance import ReplicaConformance, ReplicaOpener


@pytest.fixture
async def replica_opener(tmp_path: Path) -> AsyncIterator[ReplicaOpener]:
    dsn = f"sqlite+aiosqlite:///{tmp_path / 'replica.db'}"

    async def make() -> ReplicaStore:
        return await open_replica_store(dsn, "r1")

    opener = ReplicaOpener(make)
    yield opener
    await opener.close_all()


class TestSqliteReplicaConformance(ReplicaConformance):
    """The suite on the SQLite store."""


async def test_a_new_sqlite_database_in_the_same_place_is_a_new_identity(tmp_path: Path) -> None:
    """Deleting and re-creating a replica's database (re-provisioning) changes its identity."""
    dsn = f"sqlite+aiosqlite:///{tmp_path / 'replica.db'}"
    store = await open_replica_store(dsn, "r1")
    first = await store.identity()
    await store.close()
    for suffix in ("", "-wal", "-shm"):
        (tmp_path / f"replica.db{suffix}").unlink(missing_ok=True)
    store = await open_replica_store(dsn, "r1")
    assert await store.identity() != first
    await store.close()


async def test_a_replica_written_before_namespacing_keeps_its_conversations(
    tmp_path: Path,
) -> None:
    """Migration 0003 changes no row: a conversation written at schema 0002 is read, after the
    upgrade, under its creator's (tenant, id) and under nobody else's; the conversation index
    now leads with the tenant."""
    dsn = f"sqlite+aiosqlite:///{tmp_path / 'replica.db'}"
    await migrate(dsn, "0002")
    old = SqlReplicaStore(make_engine(dsn, StoreConfig()), "r1", StoreConfig())
    try:
        assert isinstance(await old.prepare(0, 1, 0), Promised)
        batch = [_entry(1, "t1", 0), _entry(2, "t1", 1)]
        assert await old.append(0, 1, 0, 0, batch, 2) == Accepted(2)
    finally:
        await old.close()
    store = await open_replica_store(dsn, "r1")  # migrates to the newest schema
    try:
        assert [e.seq for e in await store.read_conversation(0, "t1", "old", -1, 10, 2)] == [0, 1]
        assert await store.read_conversation(0, "t2", "old", -1, 10, 2) == []
    finally:
        await store.close()
    async with aiosqlite.connect(tmp_path / "replica.db") as db:
        rows = await db.execute_fetchall("PRAGMA index_info('ix_entries_conversation')")
    assert [r[2] for r in rows] == ["shard", "tenant_id", "conversation_id", "seq"]


def _entry(lsn: int, tenant_id: str, seq: int) -> LogEntry:
    return LogEntry(lsn=lsn, epoch=1, tenant_id=tenant_id, conversation_id="old", seq=seq,
                    event_type="conversation.created" if seq == 0 else "note",
                    idempotency_key=None, attempt_id=None, token_count=1,
                    created_at_ms=1_000 + lsn, body="{}")  # fmt: skip
